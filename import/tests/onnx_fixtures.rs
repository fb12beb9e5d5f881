//! The committed ONNX fixtures (exported from Hugging Face GPT-2 and Llama with GQA) import
//! with the right parameter count, fully recognized, and reproduce PyTorch's logits.

use std::collections::BTreeMap;
use std::path::PathBuf;

use import::{Imported, import_onnx};
use ir::{Binding, Tensor};

struct Meta {
    param_count: u64,
    batch: u64,
    seq: u64,
    input_ids: Vec<f64>,
    logits_shape: Vec<usize>,
    logits: Vec<f64>,
}

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/onnx")
        .join(name)
}

fn meta(name: &str) -> Meta {
    let text = std::fs::read_to_string(fixture_dir(name).join("meta.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let nums = |x: &serde_json::Value| -> Vec<f64> {
        let mut out = Vec::new();
        let mut stack = vec![x];
        while let Some(x) = stack.pop() {
            match x {
                serde_json::Value::Array(a) => stack.extend(a.iter().rev()),
                other => out.push(other.as_f64().unwrap()),
            }
        }
        out
    };
    Meta {
        param_count: v["param_count"].as_u64().unwrap(),
        batch: v["batch"].as_u64().unwrap(),
        seq: v["seq"].as_u64().unwrap(),
        input_ids: nums(&v["input_ids"]),
        logits_shape: nums(&v["logits_shape"])
            .iter()
            .map(|&x| x as usize)
            .collect(),
        logits: nums(&v["logits"]),
    }
}

fn import(name: &str) -> (Imported, Meta) {
    let m = meta(name);
    let imported = import_onnx(&fixture_dir(name).join("model.onnx"), m.batch, m.seq).unwrap();
    (imported, m)
}

fn histogram(imported: &Imported) -> BTreeMap<String, usize> {
    imported.graph.histogram().into_iter().collect()
}

#[test]
fn gpt2_param_count_matches_pytorch() {
    let (imported, meta) = import("gpt2_tiny");
    assert_eq!(imported.graph.param_count(), meta.param_count);
    // The tied embedding / output projection is one parameter.
    let tied = imported
        .graph
        .params()
        .iter()
        .filter(|(n, _)| n == "model.lm_head.weight")
        .count();
    assert_eq!(tied, 1);
}

#[test]
fn llama_param_count_matches_pytorch() {
    let (imported, meta) = import("llama_gqa_tiny");
    assert_eq!(imported.graph.param_count(), meta.param_count);
    // inv_freq is a buffer in PyTorch; here it folds into the rotary op entirely.
    assert!(
        imported
            .graph
            .params()
            .iter()
            .all(|(n, _)| !n.contains("inv_freq"))
    );
}

#[test]
fn gpt2_is_fully_recognized() {
    let (imported, _) = import("gpt2_tiny");
    let h = histogram(&imported);
    eprintln!("gpt2_tiny: {h:?}");
    assert_eq!(h.get("attention"), Some(&2));
    assert_eq!(h.get("layernorm"), Some(&5));
    assert_eq!(h.get("gelu"), Some(&2));
    assert_eq!(h.get("linear"), Some(&9));
    assert_eq!(h.get("softmax"), None);
    assert_eq!(h.get("matmul"), None);
}

#[test]
fn llama_is_fully_recognized() {
    let (imported, _) = import("llama_gqa_tiny");
    let h = histogram(&imported);
    eprintln!("llama_gqa_tiny: {h:?}");
    assert_eq!(h.get("attention"), Some(&3));
    assert_eq!(h.get("rotary"), Some(&6));
    assert_eq!(h.get("rmsnorm"), Some(&7));
    assert_eq!(h.get("silu"), Some(&3));
    assert_eq!(h.get("linear"), Some(&22));
    assert_eq!(h.get("softmax"), None);
    assert_eq!(h.get("matmul"), None);
    for op in imported.graph.order() {
        if let ir::OpKind::Attention {
            heads,
            kv_heads,
            causal,
            scale,
        } = &imported.graph.op(*op).kind
        {
            assert_eq!((*heads, *kv_heads, *causal), (4, 2, true));
            assert!((scale - 0.25).abs() < 1e-7);
        }
        if let ir::OpKind::Rotary { theta, .. } = &imported.graph.op(*op).kind {
            assert_eq!(*theta, 10_000.0);
        }
    }
}

fn max_logits_diff(name: &str) -> f64 {
    let (imported, meta) = import(name);
    let binding = Binding {
        batch: meta.batch,
        seq: meta.seq,
    };
    let ids = Tensor::new(
        vec![meta.batch as usize, meta.seq as usize],
        meta.input_ids.clone(),
    );
    let inputs = BTreeMap::from([("input_ids".to_string(), ids)]);
    let env = ir::interp::Env {
        weights: &imported.weights,
        inputs: &inputs,
        binding,
    };
    let eval = ir::interp::evaluate(&imported.graph, &env).unwrap();
    let logits = eval.output("logits").unwrap();
    let want = Tensor::new(meta.logits_shape.clone(), meta.logits.clone());
    let diff = logits.max_abs_diff(&want).unwrap();
    eprintln!("{name}: max |logits - pytorch| = {diff:e}");
    diff
}

#[test]
fn gpt2_logits_match_pytorch() {
    assert!(max_logits_diff("gpt2_tiny") <= 1e-4);
}

#[test]
fn llama_logits_match_pytorch() {
    assert!(max_logits_diff("llama_gqa_tiny") <= 1e-4);
}
