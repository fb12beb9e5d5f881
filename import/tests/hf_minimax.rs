//! MiniMax-M2 (transformers' `MiniMaxM2ForCausalLM`): Mixtral's block with q and k normed over
//! their whole projections, half of each head rotated and a sigmoid router, counted module by
//! module from transformers' shapes.

use std::path::Path;

use import::{build_forward, hf};
use ir::DType;

/// lukealonso/MiniMax-M2.7-NVFP4's config.json (MiniMax-M2.7 quantized; the shapes are the
/// BF16 model's).
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/hf/minimax-m2.7-nvfp4/config.json"
);

fn parse(json: &str) -> Result<import::ModelSpec, String> {
    hf::parse_config(json, Path::new("config.json")).map_err(|e| e.to_string())
}

fn fixture() -> String {
    std::fs::read_to_string(FIXTURE).expect("fixture")
}

/// MiniMaxM2's modules per layer: q_proj 3072 → 48 × 128, k_proj and v_proj 3072 → 8 × 128,
/// o_proj back; q_norm of 6144 and k_norm of 1024 (the whole projections'); the router's
/// 256 × 3072 and 256 experts of gate_up_proj 2 × 1536 × 3072 and down_proj 3072 × 1536; two
/// RMSNorms. Untied embeddings of 200064 and the final norm. The card's "230B".
fn minimax_m2_modules() -> u64 {
    let (h, q, kv, vocab, layers, experts, ffn) = (
        3072u64, 6144u64, 1024u64, 200_064u64, 62u64, 256u64, 1536u64,
    );
    let attention = 2 * h * q + 2 * h * kv + q + kv;
    let layer = attention + experts * h + experts * 3 * h * ffn + 2 * h;
    2 * vocab * h + layers * layer + h
}

#[test]
fn minimax_m2_is_mixtrals_block_with_whole_qk_norms_and_a_sigmoid_router() {
    let spec = parse(&fixture()).unwrap();
    assert_eq!(minimax_m2_modules(), 228_689_748_992);
    assert_eq!(spec.param_count(), minimax_m2_modules());
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), minimax_m2_modules());
    let v = &spec.variant;
    assert!(v.qk_norm && v.qk_norm_whole);
    assert_eq!(v.rotary_dims, Some(64));
    assert_eq!((spec.heads, spec.kv_heads, spec.head_dim()), (48, 8, 128));
    assert_eq!((spec.experts, spec.experts_per_token), (256, 8));
    assert_eq!(
        v.routing,
        ir::Routing {
            sigmoid: true,
            normalize: true,
            groups: 1,
            groups_kept: 1,
            group_top: 2,
        }
    );
    assert_eq!((v.routed_scale, v.shared_expert_ffn), (None, None));
    assert_eq!((spec.rope_theta, spec.norm_eps), (5e6, 1e-6));
    let q_norm = g
        .params()
        .iter()
        .find(|(name, _)| name.contains("layers.0.") && name.contains("q_norm"))
        .map(|&(_, v)| g.ty(v).shape.fixed_numel());
    assert_eq!(q_norm, Some(Some(6144)), "{:?}", g.params());
    let notes = hf::approximations(&fixture());
    for said in ["e_score_correction_bias", "num_mtp_modules 3"] {
        assert!(notes.iter().any(|n| n.contains(said)), "{said}: {notes:?}");
    }
}

/// MiniMaxM2Config's defaults where a config leaves them out: heads of 128, eight KV heads,
/// the whole head rotated (transformers' partial_rotary_factor 1), q and k normed whole; the
/// checkpoint's own switches honoured where given.
#[test]
fn minimax_m2_follows_its_configs_defaults_and_switches() {
    let bare = r#"{"model_type":"minimax_m2","hidden_size":256,"intermediate_size":64,
        "num_hidden_layers":2,"num_attention_heads":16,"num_local_experts":8,
        "num_experts_per_tok":2,"vocab_size":100}"#;
    let spec = parse(bare).unwrap();
    assert_eq!((spec.head_dim(), spec.kv_heads), (128, 8));
    assert_eq!(spec.variant.rotary_dims, None);
    assert!(spec.variant.qk_norm && spec.variant.qk_norm_whole);
    let with =
        |field: &str| parse(&bare.replace("\"vocab_size\"", &format!("{field},\"vocab_size\"")));
    assert_eq!(
        with("\"rotary_dim\":32").unwrap().variant.rotary_dims,
        Some(32)
    );
    let per_head = with("\"qk_norm_type\":\"per_head\"").unwrap().variant;
    assert!(per_head.qk_norm && !per_head.qk_norm_whole);
    assert!(!with("\"use_qk_norm\":false").unwrap().variant.qk_norm);
    assert!(with("\"attn_type_list\":[1,1]").is_ok());
}

/// What transformers' MiniMax-M2 would build differently from the file is refused naming the
/// field: MiniMax-Text-01's lightning attention layers, a shared expert, a softmax router, a
/// rotary width its two fields disagree on.
#[test]
fn minimax_m2_refuses_what_transformers_would_not_build() {
    let text = fixture();
    let refused = |from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        parse(&text.replacen(from, to, 1)).expect_err(to)
    };
    let lightning = refused(
        "\"attn_type_list\": [\n    1,",
        "\"attn_type_list\": [\n    0,",
    );
    assert!(lightning.contains("attn_type_list[0] = 0") && lightning.contains("lightning"));
    let shared = refused(
        "\"shared_intermediate_size\": 0",
        "\"shared_intermediate_size\": 512",
    );
    assert!(shared.contains("shared_intermediate_size"), "{shared}");
    let softmax = refused(
        "\"scoring_func\": \"sigmoid\"",
        "\"scoring_func\": \"softmax\"",
    );
    assert!(softmax.contains("scoring_func = \"softmax\""), "{softmax}");
    let rotary = refused("\"rotary_dim\": 64", "\"rotary_dim\": 32");
    assert!(
        rotary.contains("rotary_dim = 32") && rotary.contains("partial_rotary_factor"),
        "{rotary}"
    );
    let norm = refused(
        "\"qk_norm_type\": \"per_layer\"",
        "\"qk_norm_type\": \"global\"",
    );
    assert!(norm.contains("qk_norm_type"), "{norm}");
}
