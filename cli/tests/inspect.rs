//! `plait inspect`: the issue's headline figures, read through the command line.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn plait(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_plait"))
        .args(args)
        .output()
        .expect("plait runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "plait {args:?} failed: {stderr}");
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn json(args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    serde_json::from_str(&plait(&args)).expect("--json prints JSON")
}

fn repo(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

fn config(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("plait-inspect-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join("config.json");
    std::fs::write(&p, text).expect("write");
    p.to_string_lossy().into_owned()
}

fn int(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("`{field}` is an integer in {v}"))
}

/// meta.json's `param_count`: what PyTorch counted.
fn pytorch_params(fixture: &str) -> u64 {
    let text = std::fs::read_to_string(repo(&format!("fixtures/onnx/{fixture}/meta.json")))
        .expect("meta.json");
    let meta: Value = serde_json::from_str(&text).expect("meta.json is JSON");
    int(&meta, "param_count")
}

#[test]
fn onnx_fixtures() {
    for (fixture, layers, kv_heads) in [("gpt2_tiny", 2, 4), ("llama_gqa_tiny", 3, 2)] {
        let path = repo(&format!("fixtures/onnx/{fixture}/model.onnx"));
        let v = json(&["inspect", &path, "--batch", "2", "--seq", "8"]);
        assert_eq!(int(&v, "params"), pytorch_params(fixture), "{fixture}");
        assert_eq!(int(&v, "layers"), layers, "{fixture}");
        assert_eq!(int(&v, "hidden"), 64, "{fixture}");
        assert_eq!(int(&v, "heads"), 4, "{fixture}");
        assert_eq!(int(&v, "kv_heads"), kv_heads, "{fixture}");
        assert_eq!(int(&v, "vocab"), 256, "{fixture}");
        assert_eq!((int(&v, "batch"), int(&v, "seq")), (2, 8), "{fixture}");
        assert!(v["flops_per_token"].as_f64().is_some_and(|f| f > 0.0));
        assert_eq!(v["model"], fixture);

        let text = plait(&["inspect", &path, "--batch", "2", "--seq", "8"]);
        let want = format!("repeated block   decoder_layer x{layers}, ");
        assert!(text.contains(&want), "{text}");
    }
    assert_eq!(pytorch_params("gpt2_tiny"), 120_576);
}

#[test]
fn gpt2_and_llama2_7b_configs() {
    let gpt2 = config(
        "gpt2",
        r#"{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}"#,
    );
    assert_eq!(int(&json(&["inspect", &gpt2]), "params"), 124_439_808);
    // The committed copy of GPT-2 small's published config.json (README's example).
    let published = repo("fixtures/hf/gpt2/config.json");
    let v = json(&["inspect", &published]);
    assert_eq!(int(&v, "params"), 124_439_808);
    assert_eq!((int(&v, "layers"), int(&v, "seq")), (12, 1024));
    let llama = config(
        "llama2-7b",
        r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": false}"#,
    );
    assert_eq!(int(&json(&["inspect", &llama]), "params"), 6_738_415_616);
}

#[test]
fn gpt3_flops_per_token_match_the_formula() {
    let v = json(&["inspect", "gpt3-175b", "--seq", "2048"]);
    let (l, h, s, vocab) = (96.0, 12288.0, 2048.0, 51200.0);
    let want = 72.0 * l * h * h * (1.0 + s / (6.0 * h) + vocab / (12.0 * l * h));
    let got = v["flops_per_token"].as_f64().expect("a number");
    eprintln!("gpt3-175b: {got:.6e} FLOPs/token, formula {want:.6e}");
    assert!((got - want).abs() / want <= 0.01, "{got} vs {want}");
}

/// `--ir` prints the text form, which parses back to the same graph.
#[test]
fn ir_flag_prints_the_text_form() {
    let path = repo("fixtures/onnx/llama_gqa_tiny/model.onnx");
    let text = plait(&["inspect", &path, "--batch", "2", "--seq", "8", "--ir"]);
    assert!(text.starts_with("graph \"llama_gqa_tiny\"\nblock \"decoder_layer\"\n"));
    let g = ir::text::parse(&text).expect("--ir output parses");
    ir::verify::verify(&g).expect("and verifies");
    assert_eq!(ir::text::print(&g), text);
    assert_eq!(g.num_layers(), 3);

    let text = plait(&["inspect", "gpt2", "--ir"]);
    let g = ir::text::parse(&text).expect("--ir output parses");
    assert_eq!(g.param_count(), 124_439_808);
}

/// A Mistral config inspects as the Llama architecture it is, in its sliding window (every
/// layer's, as transformers' Mistral), with no note of an approximation.
#[test]
fn mistral_inspects_with_its_sliding_window() {
    let dir = std::env::temp_dir().join(format!("plait-inspect-mistral-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join("config.json");
    std::fs::write(
        &p,
        r#"{"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":32000,"sliding_window":4096}"#,
    )
    .expect("write");
    let out = plait(&["inspect", &p.to_string_lossy()]);
    assert!(out.contains("7241732096"), "{out}");
    assert!(
        out.contains("sliding window   4096 keys, in 32 of 32 attention layers"),
        "{out}"
    );
    assert!(!out.contains("note "), "{out}");
}

/// An ONNX export whose token ids are fixed at [2, 8] (exported without dynamic axes) inspects
/// at that batch and sequence when neither is given, rather than failing on the default batch 1.
#[test]
fn an_onnx_file_that_fixes_its_batch_is_inspected_at_that_batch() {
    use import::onnx::proto::{Dimension, ModelProto};
    use prost::Message;
    let bytes = std::fs::read(repo("fixtures/onnx/gpt2_tiny/model.onnx")).expect("fixture");
    let mut m = ModelProto::decode(bytes.as_slice()).expect("fixture decodes");
    let graph = m.graph.as_mut().expect("a graph");
    let input = graph
        .input
        .iter_mut()
        .find(|i| i.name.as_deref() == Some("input_ids"))
        .expect("input_ids");
    let shape = input
        .r#type
        .as_mut()
        .and_then(|t| t.tensor_type.as_mut())
        .and_then(|t| t.shape.as_mut())
        .expect("a shape");
    shape.dim = [2, 8]
        .into_iter()
        .map(|n| Dimension {
            dim_value: Some(n),
            ..Default::default()
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("plait-inspect-{}-fixed", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("model.onnx");
    std::fs::write(&path, m.encode_to_vec()).expect("write");
    let p = path.to_string_lossy();
    let v = json(&["inspect", &p]);
    assert_eq!((int(&v, "batch"), int(&v, "seq")), (2, 8));
}

/// A Hugging Face Hub id names a model downloaded to the local Hub cache (`HF_HUB_CACHE`, as
/// huggingface_hub reads it): `inspect` reads the cached config.json of `main`; an id not in
/// the cache exits 2 saying plait does not download and how to fetch the file.
#[test]
fn hub_ids_read_the_local_hub_cache() {
    let cache = std::env::temp_dir().join(format!("plait-hub-cache-{}", std::process::id()));
    let snapshot = cache.join("models--HuggingFaceTB--SmolLM3-3B/snapshots/4567def");
    std::fs::create_dir_all(&snapshot).expect("snapshot");
    std::fs::copy(
        repo("fixtures/hf/smollm3-3b/config.json"),
        snapshot.join("config.json"),
    )
    .expect("config");
    std::fs::create_dir_all(cache.join("models--HuggingFaceTB--SmolLM3-3B/refs")).expect("refs");
    std::fs::write(
        cache.join("models--HuggingFaceTB--SmolLM3-3B/refs/main"),
        "4567def\n",
    )
    .expect("ref");
    let run = |id: &str| {
        Command::new(env!("CARGO_BIN_EXE_plait"))
            .args(["inspect", id, "--json"])
            .env("HF_HUB_CACHE", &cache)
            .output()
            .expect("plait runs")
    };
    let out = run("HuggingFaceTB/SmolLM3-3B");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (int(&v, "params"), v["model"].as_str()),
        (3_075_098_624, Some("SmolLM3-3B"))
    );
    let out = run("meta-llama/Llama-3.1-8B");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for said in [
        "meta-llama/Llama-3.1-8B",
        "models--meta-llama--Llama-3.1-8B",
        "huggingface-cli download meta-llama/Llama-3.1-8B config.json",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
}
