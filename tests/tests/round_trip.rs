//! The IR text form round-trips (print → parse → print is byte-identical) for every graph plait
//! produces — the ONNX fixtures' imports, every zoo model's forward graph, and training graphs —
//! and each of those graphs, and its parsed copy, passes the verifier.

use std::path::PathBuf;

use ir::autodiff::training_graph;
use ir::testing::{TinyConfig, tiny_gpt2, tiny_llama};
use ir::{AdamWConfig, DType, Graph};

/// Checks one graph; returns the printed text's line count.
fn round_trip(what: &str, g: &Graph) -> usize {
    if let Err(e) = ir::verify::verify(g) {
        panic!("{what} does not verify:\n{e}");
    }
    let text = ir::text::print(g);
    let parsed = ir::text::parse(&text).unwrap_or_else(|e| panic!("{what}: parse: {e}"));
    if let Err(e) = ir::verify::verify(&parsed) {
        panic!("{what}: the parsed graph does not verify:\n{e}");
    }
    let again = ir::text::print(&parsed);
    if again != text {
        let line = text
            .lines()
            .zip(again.lines())
            .position(|(a, b)| a != b)
            .map_or(text.lines().count().min(again.lines().count()), |i| i);
        panic!(
            "{what}: print → parse → print differs at line {}:\n  first:  {:?}\n  second: {:?}",
            line + 1,
            text.lines().nth(line),
            again.lines().nth(line)
        );
    }
    assert_eq!(parsed.param_count(), g.param_count(), "{what}");
    assert_eq!(parsed.num_layers(), g.num_layers(), "{what}");
    text.lines().count()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/onnx")
        .join(name)
        .join("model.onnx")
}

#[test]
fn onnx_fixtures_round_trip() {
    for name in ["gpt2_tiny", "llama_gqa_tiny"] {
        for (batch, seq) in [(2, 8), (1, 5)] {
            let imported = import::import_onnx(&fixture(name), batch, seq).expect("imports");
            let lines = round_trip(&format!("{name} at {batch}x{seq}"), &imported.graph);
            eprintln!("{name} {batch}x{seq}: {lines} lines");
        }
    }
}

#[test]
fn zoo_forward_graphs_round_trip() {
    let zoo = import::zoo::zoo();
    assert!(zoo.len() >= 10);
    for spec in &zoo {
        let g = import::build_forward(spec, DType::F32).expect("builds");
        let lines = round_trip(&spec.name, &g);
        eprintln!("{}: {lines} lines", spec.name);
    }
}

#[test]
fn training_graphs_round_trip() {
    let cfg = AdamWConfig::default();
    let gpt2 = tiny_gpt2(&TinyConfig::gpt2()).expect("tiny gpt2 builds");
    let llama = tiny_llama(&TinyConfig::llama()).expect("tiny llama builds");
    let moe = tiny_llama(&TinyConfig {
        moe: Some((4, 2)),
        ..TinyConfig::llama()
    })
    .expect("tiny moe builds");
    let dropout = tiny_gpt2(&TinyConfig {
        dropout: 0.1,
        ..TinyConfig::gpt2()
    })
    .expect("tiny gpt2 with dropout builds");
    let zoo_gpt2 = import::zoo::find("gpt2")
        .map(|s| import::build_forward(&s, DType::F32).expect("gpt2 builds"))
        .expect("gpt2 in the zoo");
    for (what, forward) in [
        ("tiny gpt2", &gpt2),
        ("tiny llama", &llama),
        ("tiny llama moe", &moe),
        ("tiny gpt2 dropout", &dropout),
        ("zoo gpt2", &zoo_gpt2),
    ] {
        round_trip(&format!("{what} forward"), forward);
        let train = training_graph(forward, cfg).expect("training graph builds");
        let lines = round_trip(&format!("{what} training"), &train);
        eprintln!("{what} training: {lines} lines");
    }
}
