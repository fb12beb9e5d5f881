//! The plan's per-op table (`sharding.ops`) is the layout its program runs: where
//! `sharding.method` names the e-graph, the extraction's layouts and collectives, checked here
//! against Megatron-LM's layout (Shoeybi et al. 2019, Fig. 3; Korthikanti et al. 2022, Fig. 5):
//! per layer one all-reduce after the attention output projection and one after the MLP's down
//! projection in the forward, and their conjugates (the gradients of the norm outputs the
//! column-parallel products read) in the backward; with sequence parallelism an all-gather
//! after each norm and a reduce-scatter after each row-parallel product instead, and the norm
//! weights' gradients reduced once per step.

mod common;

use common::{compile, dir, plait};

fn table(plan: &std::path::Path) -> (String, Vec<serde_json::Value>, usize) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan).expect("plan")).expect("plan JSON");
    let method = v["sharding"]["method"]
        .as_str()
        .expect("method")
        .to_string();
    let ops = v["sharding"]["ops"].as_array().expect("ops").clone();
    let collectives = v["block_plan"]["collectives"]
        .as_array()
        .expect("block_plan")
        .len();
    (method, ops, collectives)
}

/// Ops whose `field` collective list names `kind`, as (op mnemonic, how many times).
fn with(ops: &[serde_json::Value], field: &str, kind: &str) -> Vec<String> {
    ops.iter()
        .flat_map(|o| {
            let names = o[field].as_str().unwrap_or("");
            let n = names.split(", ").filter(|c| *c == kind).count();
            std::iter::repeat_n(o["op"].as_str().unwrap_or("").to_string(), n)
        })
        .collect()
}

fn listed(ops: &[serde_json::Value]) -> usize {
    ops.iter()
        .flat_map(|o| [&o["forward_collective"], &o["backward_collective"]])
        .filter_map(|c| c.as_str())
        .map(|c| c.split(", ").count())
        .sum()
}

/// GPT-2 at tp 4 without SP on 8 A100 (the program runs the extraction).
#[test]
fn the_table_is_the_extractions_megatron_layout() {
    let pins: Vec<&str> = "--tp 4 --pp 1 --dp 2 --micro-batch 4 --zero 1 --sequence-parallel off"
        .split_whitespace()
        .collect();
    let (method, ops, collectives) = table(&compile("table", "plan.json", &pins));
    assert!(method.starts_with("e-graph"), "{method}");
    assert_eq!(listed(&ops), collectives, "{ops:#?}");
    assert_eq!(
        with(&ops, "forward_collective", "all-reduce"),
        ["linear"; 2]
    );
    assert_eq!(
        with(&ops, "backward_collective", "all-reduce"),
        ["layernorm"; 2]
    );
    assert_eq!(collectives, 4);
}

/// A small Llama at tp 2 with SP on CPU ranks, one 64-token sequence per micro-batch (the
/// program runs the extraction). With more tokens than three weight rows per rank's shard
/// (hidden 64, 8 × 64 tokens) the extraction gathers the smaller weights instead of the
/// activations: a layout the rules cannot express, and not this test's oracle.
#[test]
fn the_table_of_a_sequence_parallel_layer() {
    let d = dir("table-sp");
    let model = d.join("llama.json");
    std::fs::write(
        &model,
        serde_json::json!({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "vocab_size": 1024, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false})
        .to_string(),
    )
    .expect("config");
    let plan = d.join("plan.json");
    let (m, p) = (model.to_string_lossy(), plan.to_string_lossy());
    let args = [
        "compile",
        &m,
        "--cluster",
        "cpu",
        "--gpus",
        "2",
        "--tp",
        "2",
        "--pp",
        "1",
        "--dp",
        "1",
        "--seq",
        "64",
        "--global-batch",
        "8",
        "--sequence-parallel",
        "on",
        "-o",
        &p,
    ];
    let (code, _, err) = plait(&args);
    assert_eq!(code, 0, "{err}");
    let (method, ops, collectives) = table(&plan);
    assert!(method.starts_with("e-graph"), "{method}");
    assert_eq!(listed(&ops), collectives, "{ops:#?}");
    let rms = || vec!["rmsnorm".to_string(); 2];
    let linear = || vec!["linear".to_string(); 2];
    assert_eq!(with(&ops, "forward_collective", "all-gather"), rms());
    assert_eq!(with(&ops, "forward_collective", "reduce-scatter"), linear());
    assert_eq!(with(&ops, "backward_collective", "reduce-scatter"), rms());
    // The reduce-scatters' conjugates, and each norm's output gathered again for the
    // products' weight gradients (its sequence shard is what the forward kept).
    let mut gathered = with(&ops, "backward_collective", "all-gather");
    gathered.sort();
    let mut want = [rms(), linear()].concat();
    want.sort();
    assert_eq!(gathered, want);
    // The two norm weights, where their gradients are reduced.
    assert_eq!(
        with(&ops, "backward_collective", "all-reduce (once per step)"),
        vec!["param".to_string(); 2]
    );
    assert_eq!(collectives, 12, "{ops:#?}");
}
