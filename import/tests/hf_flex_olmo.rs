//! FlexOlmo (transformers' `FlexOlmoForCausalLM`): OLMo 2's block — norms after attention and
//! after the MLP, q and k normed over their whole projections — with OLMoE's experts, counted
//! module by module from transformers' shapes.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

/// FlexOlmoConfig's defaults, which transformers documents as allenai/FlexOlmo-7x7B-1T's:
/// 32 layers of hidden 4096 and 32 heads, 7 experts of 11008 (5 a token), untied embeddings
/// of 100352.
const FLEX_OLMO: &str = r#"{"model_type":"flex_olmo","hidden_size":4096,
    "intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,
    "num_experts":7,"num_experts_per_tok":5,"vocab_size":100352}"#;

/// Per layer q, k, v and o (4096² each), q_norm and k_norm (4096 each, the whole
/// projections'), the router (7 × 4096), 7 SwiGLU experts (3 × 4096 × 11008) and the two norms
/// after attention and the MLP; the embedding, the head and the final norm. The paper's 33B.
fn flex_olmo_modules() -> u64 {
    let (h, f, experts, layers, vocab) = (4096u64, 11008u64, 7u64, 32u64, 100_352u64);
    let layer = 4 * h * h + 2 * h + experts * h + experts * 3 * h * f + 2 * h;
    2 * vocab * h + layers * layer + h
}

#[test]
fn flex_olmo_is_olmo_2s_block_with_olmoes_experts() {
    let spec = parse(FLEX_OLMO);
    assert_eq!(flex_olmo_modules(), 33_270_665_216);
    assert_eq!(spec.param_count(), flex_olmo_modules());
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), flex_olmo_modules());
    let v = &spec.variant;
    assert!(v.post_norms && v.qk_norm && v.qk_norm_whole);
    // OLMoE's router: shares of a softmax over every expert, not renormalized by default.
    assert!(!v.routing.sigmoid && !v.routing.normalize);
    assert_eq!((spec.experts, spec.experts_per_token), (7, 5));
    assert_eq!(
        (spec.norm_eps, spec.rope_theta, spec.kv_heads),
        (1e-6, 500000.0, 32)
    );
    assert!(!spec.tied_embeddings);
    // q's and k's norms and the two after attention and the MLP, then the final norm; none
    // before attention.
    let norms = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, OpKind::RmsNorm { .. }))
        .count();
    assert_eq!(norms, 4 * 32 + 1);
    assert!(
        !g.params()
            .iter()
            .any(|(name, _)| name.contains("input_layernorm")),
        "FlexOlmo's layers have no norm before attention"
    );
    let normalized = parse(&FLEX_OLMO.replace(
        "\"num_experts\":7",
        "\"num_experts\":7,\"norm_topk_prob\":true",
    ));
    assert!(normalized.variant.routing.normalize);
}
