//! ERNIE 4.5 (transformers' `Ernie4_5ForCausalLM` and `Ernie4_5_MoeForCausalLM`), counted
//! module by module from transformers' shapes.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

fn refusal(json: &str) -> String {
    hf::parse_config(json, Path::new("config.json"))
        .expect_err("refused")
        .to_string()
}

/// baidu/ERNIE-4.5-21B-A3B-PT's shapes: 28 layers of hidden 2560, 20 query heads of 128
/// beside 4 KV heads; layer 0 dense (SwiGLU of 12288), the others 64 experts of 1536, top 6,
/// beside two shared ones (one MLP of 3072); tied embeddings of 103424.
const ERNIE_21B: &str = r#"{"model_type":"ernie4_5_moe","hidden_size":2560,
    "intermediate_size":12288,"moe_intermediate_size":1536,"num_hidden_layers":28,
    "num_attention_heads":20,"num_key_value_heads":4,"moe_num_experts":64,"moe_k":6,
    "moe_num_shared_experts":2,"moe_layer_start_index":1,"moe_layer_interval":1,
    "vocab_size":103424,"max_position_embeddings":131072,"rope_theta":500000,
    "rms_norm_eps":1e-5,"tie_word_embeddings":true,"use_bias":false}"#;

fn ernie_21b_modules(expert_layers: u64) -> u64 {
    let (h, kv, layers, vocab) = (2560u64, 512u64, 28u64, 103_424u64);
    let attention = 2 * h * h + 2 * h * kv + 2 * h;
    let dense = 3 * h * 12288;
    let moe = 64 * h + 64 * 3 * h * 1536 + 3 * h * 3072;
    vocab * h + layers * attention + (layers - expert_layers) * dense + expert_layers * moe + h
}

#[test]
fn ernie_moe_has_a_dense_first_layer_and_shared_experts() {
    let spec = parse(ERNIE_21B);
    let want = ernie_21b_modules(27);
    assert_eq!(want, 21_825_436_160);
    assert_eq!(spec.param_count(), want);
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), want);
    // Ernie4_5_MoeSparseMoeBlock: a softmax over all 64, the top 6 renormalized.
    assert_eq!(spec.variant.routing, ir::Routing::default());
    let expert_ops = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, OpKind::MoeExperts { .. }))
        .count();
    assert_eq!(expert_ops, 27);
    let notes = hf::approximations(ERNIE_21B);
    assert!(notes.iter().any(|n| n.contains("interleaved")), "{notes:?}");
    assert!(
        notes.iter().any(|n| n.contains("e_score_correction_bias")),
        "{notes:?}"
    );
}

/// Experts on every second layer from layer 1 to layer 20: (i + 1) % 2 == 0 and 1 ≤ i ≤ 20
/// gives layers 1, 3, …, 19 (ten); no shared experts.
#[test]
fn ernie_moe_layer_fields_place_the_expert_layers() {
    let every_other = ERNIE_21B
        .replace(
            "\"moe_layer_interval\":1",
            "\"moe_layer_interval\":2,\"moe_layer_end_index\":20",
        )
        .replace(
            "\"moe_num_shared_experts\":2",
            "\"moe_num_shared_experts\":0",
        );
    let spec = parse(&every_other);
    let dense = spec.variant.dense_layers.as_ref().expect("dense layers");
    let experts: Vec<u64> = (0..28).filter(|&l| !dense.is_dense(l)).collect();
    assert_eq!(experts, (1..20).step_by(2).collect::<Vec<u64>>());
    assert_eq!(spec.variant.shared_expert_ffn, None);
    let shared = 3 * 2560u64 * 3072;
    let want = ernie_21b_modules(10) - 10 * shared;
    assert_eq!(spec.param_count(), want);
    assert_eq!(
        build_forward(&spec, DType::F32).unwrap().param_count(),
        want
    );
}

/// baidu/ERNIE-4.5-0.3B-PT's shapes: 18 layers of hidden 1024, 16 query heads of 128 (wider
/// than hidden / heads) beside 2 KV heads, a SwiGLU of 3072, tied embeddings of 103424.
#[test]
fn ernie_dense_has_heads_of_128() {
    let small = r#"{"model_type":"ernie4_5","hidden_size":1024,"intermediate_size":3072,
        "num_hidden_layers":18,"num_attention_heads":16,"num_key_value_heads":2,
        "vocab_size":103424,"max_position_embeddings":131072,"tie_word_embeddings":true}"#;
    let spec = parse(small);
    assert_eq!(spec.head_dim(), 128);
    let (h, q, kv) = (1024u64, 2048u64, 256u64);
    let layer = 2 * h * q + 2 * h * kv + 3 * h * 3072 + 2 * h;
    let want = 103_424 * h + 18 * layer + h;
    assert_eq!(want, 360_748_032);
    assert_eq!(spec.param_count(), want);
    assert_eq!(
        build_forward(&spec, DType::F32).unwrap().param_count(),
        want
    );
}

#[test]
fn ernie_refuses_what_it_would_build_otherwise() {
    let biased = refusal(&ERNIE_21B.replace("\"use_bias\":false", "\"use_bias\":true"));
    assert!(biased.contains("use_bias"), "{biased}");
    let picked = refusal(&ERNIE_21B.replace("\"moe_k\":6", "\"moe_k\":65"));
    assert!(
        picked.contains("moe_k = 65") && picked.contains("moe_num_experts = 64"),
        "{picked}"
    );
    let missing = refusal(&ERNIE_21B.replace("\"moe_k\":6,", ""));
    assert!(missing.contains("moe_k"), "{missing}");
}
