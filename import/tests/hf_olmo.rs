//! OLMo 1 (transformers' `OlmoForCausalLM`): Llama's block with LayerNorms of neither weight nor
//! bias (`OlmoLayerNorm`), and OLMo's and OLMoE's `clip_qkv`.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

fn count(g: &ir::Graph, pred: impl Fn(&OpKind) -> bool) -> usize {
    g.op_ids().filter(|&o| pred(&g.op(o).kind)).count()
}

/// allenai/OLMo-1B-hf's and OLMo-7B-hf's shapes, counted module by module: per layer q, k, v
/// and o (h² each) and the SwiGLU MLP (3·h·f), no norm parameters; the embedding (tied in
/// the 1B). The cards' 1.18B and 6.89B.
const OLMO_1B: &str = r#"{"model_type":"olmo","hidden_size":2048,"intermediate_size":8192,
    "num_hidden_layers":16,"num_attention_heads":16,"num_key_value_heads":16,
    "vocab_size":50304,"max_position_embeddings":2048,"rope_theta":10000.0,
    "attention_bias":false,"clip_qkv":null,"hidden_act":"silu","tie_word_embeddings":true}"#;

fn olmo_modules(h: u64, f: u64, layers: u64, vocab: u64, tied: bool) -> u64 {
    let embeddings = if tied { 1 } else { 2 };
    layers * (4 * h * h + 3 * h * f) + embeddings * vocab * h
}

#[test]
fn olmo_counts_no_norm_parameters() {
    let one_b = parse(OLMO_1B);
    let want = olmo_modules(2048, 8192, 16, 50304, true);
    assert_eq!(want, 1_176_764_416);
    assert_eq!(one_b.param_count(), want);
    assert_eq!(
        build_forward(&one_b, DType::F32).unwrap().param_count(),
        want
    );
    let seven_b = OLMO_1B
        .replace(
            "2048,\"intermediate_size\":8192",
            "4096,\"intermediate_size\":11008",
        )
        .replace(":16,", ":32,")
        .replace(
            "\"tie_word_embeddings\":true",
            "\"tie_word_embeddings\":false",
        );
    let want = olmo_modules(4096, 11008, 32, 50304, false);
    assert_eq!(want, 6_888_095_744);
    let spec = parse(&seven_b);
    assert_eq!((spec.hidden, spec.layers), (4096, 32));
    assert_eq!(spec.param_count(), want);
    assert_eq!(
        build_forward(&spec, DType::F32).unwrap().param_count(),
        want
    );
}

/// Every norm (two a layer and the final one) is composed: two means each, and no norm op.
/// Evaluated, each composed norm's rows have mean 0 and variance 1 − eps/(var + eps), as
/// `F.layer_norm` without weight or bias gives.
#[test]
fn olmo_norms_are_weightless_layer_norms() {
    let mut spec = parse(OLMO_1B);
    // OlmoLayerNorm's eps is 1e-5 whatever the config says.
    let with_eps = OLMO_1B.replace("\"clip_qkv\"", "\"rms_norm_eps\":0.1,\"clip_qkv\"");
    assert_eq!(parse(&with_eps).norm_eps, 1e-5);
    (
        spec.hidden,
        spec.ffn,
        spec.heads,
        spec.kv_heads,
        spec.layers,
    ) = (16, 32, 2, 2, 2);
    spec.vocab = 40;
    let g = build_forward(&spec, DType::F32).unwrap();
    assert_eq!(
        count(&g, |k| matches!(
            k,
            OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. }
        )),
        0
    );
    assert_eq!(count(&g, |k| *k == OpKind::ReduceMean), 2 * (2 * 2 + 1));
    let mut rng = ir::testing::Rng::new(3);
    let weights = ir::testing::random_weights(&g, &mut rng, 0.5);
    let binding = ir::Binding { batch: 2, seq: 5 };
    let mut inputs = ir::testing::random_batch(&mut rng, binding, spec.vocab);
    let tokens = inputs.remove("tokens").expect("tokens");
    inputs.insert("input_ids".to_string(), tokens);
    let env = ir::interp::Env {
        weights: &weights,
        inputs: &inputs,
        binding,
    };
    let eval = ir::interp::evaluate(&g, &env).expect("interpreter runs");
    // The norms' outputs: the product of the centred input and the rsqrt.
    let outputs: Vec<ir::ValueId> = g
        .op_ids()
        .filter(|&o| {
            let op = g.op(o);
            op.kind == OpKind::Mul
                && op
                    .inputs
                    .iter()
                    .any(|&v| g.op(g.def_op(v)).kind == OpKind::Rsqrt)
        })
        .map(|o| g.op(o).results[0])
        .collect();
    assert_eq!(outputs.len(), 5);
    for v in outputs {
        for row in eval.value(v).data.chunks(16) {
            let mean = row.iter().sum::<f64>() / 16.0;
            let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 16.0;
            assert!(mean.abs() < 1e-9, "mean {mean}");
            assert!((var - 1.0).abs() < 1e-3, "variance {var}");
        }
    }
}

#[test]
fn clip_qkv_clamps_q_k_and_v() {
    let clipped = OLMO_1B.replace("\"clip_qkv\":null", "\"clip_qkv\":8.0");
    let spec = parse(&clipped);
    assert_eq!(spec.variant.clip_qkv, Some(8.0));
    let g = build_forward(&spec, DType::F32).unwrap();
    assert_eq!(count(&g, |k| *k == OpKind::Clamp { limit: 8.0 }), 3 * 16);
    // Each clamp reads a projection directly (OLMo clamps before the rotary).
    assert!(
        g.op_ids()
            .all(|o| g.op(o).kind != OpKind::Clamp { limit: 8.0 }
                || matches!(
                    g.op(g.def_op(g.op(o).inputs[0])).kind,
                    OpKind::Linear { .. }
                ))
    );
    assert_eq!(spec.param_count(), parse(OLMO_1B).param_count());
    for bad in ["0", "-1.5"] {
        let err = hf::parse_config(
            &OLMO_1B.replace("\"clip_qkv\":null", &format!("\"clip_qkv\":{bad}")),
            Path::new("config.json"),
        )
        .expect_err(bad)
        .to_string();
        assert!(
            err.contains("clip_qkv") && err.contains("positive"),
            "{err}"
        );
    }
}

/// OLMoE clamps after its q and k norms (transformers' `OlmoeAttention`).
#[test]
fn olmoe_clamps_after_its_q_and_k_norms() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/olmoe-1b-7b/config.json"
    );
    let text = std::fs::read_to_string(fixture).unwrap();
    let clipped = text.replace("\"clip_qkv\": null", "\"clip_qkv\": 8.0");
    let g = build_forward(&parse(&clipped), DType::F32).unwrap();
    let clamps: Vec<ir::OpId> = g
        .op_ids()
        .filter(|&o| g.op(o).kind == OpKind::Clamp { limit: 8.0 })
        .collect();
    assert_eq!(clamps.len(), 3 * 16);
    let read = |o: ir::OpId| g.op(g.def_op(g.op(o).inputs[0])).kind.clone();
    assert!(matches!(read(clamps[0]), OpKind::RmsNorm { .. }));
    assert!(matches!(read(clamps[1]), OpKind::RmsNorm { .. }));
    assert!(matches!(read(clamps[2]), OpKind::Linear { .. }));
}
