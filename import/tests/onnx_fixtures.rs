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
    let text = std::fs::read_to_string(fixture_dir(name).join("meta.json"))
        .expect("meta.json is readable");
    let v: serde_json::Value = serde_json::from_str(&text).expect("meta.json is JSON");
    let nums = |x: &serde_json::Value| -> Vec<f64> {
        let mut out = Vec::new();
        let mut stack = vec![x];
        while let Some(x) = stack.pop() {
            match x {
                serde_json::Value::Array(a) => stack.extend(a.iter().rev()),
                other => out.push(other.as_f64().expect("meta.json arrays hold numbers")),
            }
        }
        out
    };
    Meta {
        param_count: v["param_count"].as_u64().expect("param_count"),
        batch: v["batch"].as_u64().expect("batch"),
        seq: v["seq"].as_u64().expect("seq"),
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
    let imported = import_onnx(&fixture_dir(name).join("model.onnx"), m.batch, m.seq)
        .expect("fixture imports");
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
    // The causal mask and any tables folded into recognized ops: no buffers are left.
    assert_eq!(imported.weights.len(), imported.graph.params().len());
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
    assert_eq!(imported.weights.len(), imported.graph.params().len());
    for op in imported.graph.order() {
        if let ir::OpKind::Attention {
            heads,
            kv_heads,
            causal,
            scale,
            ..
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

/// The inputs for token ids `ids`: the importer attaches a next-token loss, whose `targets`
/// these logits-only checks fill with zeros.
fn with_targets(ids: Tensor) -> BTreeMap<String, Tensor> {
    let targets = Tensor::new(ids.shape.clone(), vec![0.0; ids.data.len()]);
    BTreeMap::from([
        ("input_ids".to_string(), ids),
        ("targets".to_string(), targets),
    ])
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
    let inputs = with_targets(ids);
    let env = ir::interp::Env {
        weights: &imported.weights,
        inputs: &inputs,
        binding,
    };
    let eval =
        ir::interp::evaluate(&imported.graph, &env).expect("interpreter runs the imported graph");
    let logits = eval.output("logits").expect("graph has logits");
    let want = Tensor::new(meta.logits_shape.clone(), meta.logits.clone());
    let diff = logits
        .max_abs_diff(&want)
        .expect("logits shape matches PyTorch");
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

/// Folding is redone per (batch, seq): importing one sequence, or a prefix of it, must give
/// the matching slice of PyTorch's logits (causal attention makes prefixes independent).
#[test]
fn other_shapes_fold_consistently() {
    for name in ["gpt2_tiny", "llama_gqa_tiny"] {
        let meta = meta(name);
        let (s, v) = (meta.seq as usize, *meta.logits_shape.last().unwrap());
        let prefix = 5;
        let imported =
            import_onnx(&fixture_dir(name).join("model.onnx"), 1, prefix as u64).unwrap();
        let ids = Tensor::new(vec![1, prefix], meta.input_ids[s..s + prefix].to_vec());
        let inputs = with_targets(ids);
        let binding = Binding {
            batch: 1,
            seq: prefix as u64,
        };
        let env = ir::interp::Env {
            weights: &imported.weights,
            inputs: &inputs,
            binding,
        };
        let eval = ir::interp::evaluate(&imported.graph, &env).unwrap();
        let got = eval.output("logits").unwrap();
        // Row 1 of the batch, positions 0..prefix.
        let want = Tensor::new(
            vec![1, prefix, v],
            meta.logits[s * v..(s + prefix) * v].to_vec(),
        );
        let diff = got.max_abs_diff(&want).unwrap();
        assert!(diff <= 1e-4, "{name}: prefix logits differ by {diff}");
        let h: BTreeMap<String, usize> = histogram(&imported);
        assert!(
            h.contains_key("attention") && !h.contains_key("softmax"),
            "{name}: {h:?}"
        );
    }
}

/// Imported graphs satisfy every IR invariant, and the repeated decoder layers are found (the
/// config builder's block name, one tag per layer).
#[test]
fn imported_graphs_verify_with_layers_detected() {
    for (name, layers) in [("gpt2_tiny", 2), ("llama_gqa_tiny", 3)] {
        let (imported, _) = import(name);
        let g = &imported.graph;
        if let Err(e) = ir::verify::verify(g) {
            panic!("{name} does not verify:\n{e}");
        }
        assert_eq!(g.num_layers(), layers, "{name}");
        assert_eq!(g.block_name.as_deref(), Some(import::build::BLOCK_NAME));
        assert_eq!(
            g.name, name,
            "a file called model.onnx is named after its directory"
        );
        let block = ir::blocks::layer_summary(g).expect("tagged block");
        assert!(block.uniform().is_some(), "{name}: {block}");
        // Every layer owns its weights: the tagged params plus the untagged ones (embeddings,
        // final norm, head) are all of them.
        let per_layer = block.uniform().map_or(0, |l| l.params);
        assert!(per_layer * u64::from(layers) < g.param_count());
    }
}
