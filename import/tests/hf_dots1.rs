//! dots.llm1 (transformers' `Dots1ForCausalLM`): Qwen3's attention before DeepSeek-V3's
//! experts, counted module by module from transformers' shapes.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

/// rednote-hilab/dots.llm1.base's shapes: 62 layers of hidden 4096, 32 heads of 128 (q/k
/// normed per head), layer 0 a SwiGLU of 10944, the others 128 experts of 1408, top 6, beside
/// two shared ones; untied embeddings of 152064. The card's 142B.
const DOTS: &str = r#"{"model_type":"dots1","hidden_size":4096,"intermediate_size":10944,
    "moe_intermediate_size":1408,"num_hidden_layers":62,"num_attention_heads":32,
    "num_key_value_heads":32,"n_routed_experts":128,"n_shared_experts":2,
    "num_experts_per_tok":6,"first_k_dense_replace":1,"norm_topk_prob":true,
    "routed_scaling_factor":2.5,"n_group":1,"topk_group":1,"vocab_size":152064,
    "max_position_embeddings":32768,"rope_theta":10000000,"rms_norm_eps":1e-5,
    "sliding_window":null,"max_window_layers":62,"tie_word_embeddings":false}"#;

#[test]
fn dots1_is_qwen3_attention_before_deepseek_experts() {
    let (h, layers, vocab) = (4096u64, 62u64, 152_064u64);
    let attention = 4 * h * h + 2 * 128 + 2 * h;
    let dense = 3 * h * 10944;
    let moe = 128 * h + 128 * 3 * h * 1408 + 3 * h * 2 * 1408;
    let want = 2 * vocab * h + layers * attention + dense + (layers - 1) * moe + h;
    assert_eq!(want, 142_774_373_888);
    let spec = parse(DOTS);
    assert_eq!(spec.param_count(), want);
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), want);
    assert_eq!(
        spec.variant.routing,
        ir::Routing {
            sigmoid: true,
            normalize: true,
            groups: 1,
            groups_kept: 1,
            group_top: 2,
        }
    );
    assert_eq!(spec.variant.routed_scale, Some(2.5));
    assert!(spec.variant.qk_norm && !spec.variant.qk_norm_whole);
    assert!(spec.variant.mla.is_none() && spec.variant.sliding_window.is_none());
    // Two per-head norms a layer (q's and k's weights of 128) beside the block's two.
    let norms = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, OpKind::RmsNorm { .. }))
        .count();
    assert_eq!(norms as u64, 4 * layers + 1);
    let notes = hf::approximations(DOTS);
    assert!(
        notes.iter().any(|n| n.contains("e_score_correction_bias")),
        "{notes:?}"
    );
}

/// Dots1Config's defaults: norm_topk_prob false, routed_scaling_factor 1 (none), no shared
/// experts unless named, no dense layer; a window from max_window_layers (62) on.
#[test]
fn dots1_follows_its_configs_defaults() {
    let bare = r#"{"model_type":"dots1","hidden_size":64,"intermediate_size":96,
        "moe_intermediate_size":16,"num_hidden_layers":64,"num_attention_heads":4,
        "n_routed_experts":8,"num_experts_per_tok":2,"vocab_size":100}"#;
    let spec = parse(bare);
    assert!(spec.variant.routing.sigmoid && !spec.variant.routing.normalize);
    assert_eq!(spec.variant.routed_scale, None);
    assert_eq!(spec.variant.shared_expert_ffn, None);
    assert_eq!(spec.variant.dense_layers, None);
    let window = spec.variant.sliding_window.expect("layers 62 and 63 slide");
    assert_eq!((window.keys, window.windowed_layers()), (4096, 2));
    let picked = hf::parse_config(
        &bare.replace("\"num_experts_per_tok\":2", "\"num_experts_per_tok\":9"),
        Path::new("config.json"),
    )
    .expect_err("more than every expert")
    .to_string();
    assert!(picked.contains("n_routed_experts = 8"), "{picked}");
}
