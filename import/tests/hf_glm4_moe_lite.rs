//! GLM-4.7-Flash (transformers' `Glm4MoeLiteForCausalLM`): DeepSeek-V3's latent attention
//! before GLM-4.5's experts, counted module by module from transformers' shapes.

use std::path::Path;

use import::{build_forward, hf};
use ir::DType;

fn parse(json: &str) -> Result<import::ModelSpec, String> {
    hf::parse_config(json, Path::new("config.json")).map_err(|e| e.to_string())
}

/// zai-org/GLM-4.7-Flash's config.json fields (as vLLM's tests transcribe them): 47 layers of
/// hidden 2048, 20 latent-attention heads (q rank 768, kv rank 512, 192 + 64 wide keys, 256
/// wide values), layer 0 a SwiGLU of 10240, the others 64 experts of 1536, 4 a token, beside
/// one shared; untied embeddings of 154880.
const FLASH: &str = r#"{"model_type":"glm4_moe_lite","architectures":["Glm4MoeLiteForCausalLM"],
    "vocab_size":154880,"hidden_size":2048,"intermediate_size":10240,
    "moe_intermediate_size":1536,"num_hidden_layers":47,"num_attention_heads":20,
    "num_key_value_heads":20,"hidden_act":"silu","rms_norm_eps":1e-5,"attention_dropout":0.0,
    "attention_bias":false,"max_position_embeddings":202752,"rope_theta":1000000.0,
    "rope_scaling":null,"partial_rotary_factor":1.0,"q_lora_rank":768,"kv_lora_rank":512,
    "qk_nope_head_dim":192,"qk_rope_head_dim":64,"v_head_dim":256,"n_routed_experts":64,
    "n_shared_experts":1,"num_experts_per_tok":4,"norm_topk_prob":true,
    "routed_scaling_factor":1.8,"n_group":1,"topk_group":1,"topk_method":"noaux_tc",
    "first_k_dense_replace":1,"num_nextn_predict_layers":1,"tie_word_embeddings":false}"#;

/// Per layer q_a_proj (2048 × 768) and its norm, q_b_proj (768 → 20 × 256),
/// kv_a_proj_with_mqa (2048 → 512 + 64) and its norm, kv_b_proj (512 → 20 × (192 + 256)),
/// o_proj (20 × 256 → 2048), two RMSNorms; layer 0's SwiGLU of 10240, the others' router
/// (64 × 2048), 64 experts and a shared one of 1536. The card's 30B.
fn flash_modules() -> u64 {
    let (h, layers, vocab, heads) = (2048u64, 47u64, 154_880u64, 20u64);
    let attention =
        h * 768 + 768 + 768 * heads * 256 + h * 576 + 512 + 512 * heads * 448 + heads * 256 * h;
    let moe = 64 * h + 64 * 3 * h * 1536 + 3 * h * 1536;
    2 * vocab * h + layers * (attention + 2 * h) + 3 * h * 10240 + (layers - 1) * moe + h
}

#[test]
fn glm_4_7_flash_is_latent_attention_before_glm_4_5s_experts() {
    let spec = parse(FLASH).unwrap();
    assert_eq!(flash_modules(), 29_943_390_976);
    assert_eq!(spec.param_count(), flash_modules());
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), flash_modules());
    let v = &spec.variant;
    let mla = v.mla.expect("latent attention");
    assert_eq!(
        (
            mla.q_lora_rank,
            mla.kv_lora_rank,
            mla.qk_nope_head_dim,
            mla.v_head_dim
        ),
        (Some(768), 512, 192, 256)
    );
    assert!(v.routing.sigmoid && v.routing.normalize && v.routing.groups == 1);
    assert_eq!(
        (v.routed_scale, v.shared_expert_ffn),
        (Some(1.8), Some(1536))
    );
    let dense = v.dense_layers.as_ref().expect("layer 0 dense");
    assert_eq!((dense.count(47), dense.ffn), (1, 10240));
    let notes = hf::approximations(FLASH);
    for said in [
        "GLM-4.7-Flash's e_score_correction_bias",
        "num_nextn_predict_layers 1",
    ] {
        assert!(notes.iter().any(|n| n.contains(said)), "{said}: {notes:?}");
    }
}

/// Glm4MoeLiteConfig's defaults where the file is silent (its attention widths, a routed
/// scale of 1.8, one shared expert, layer 0 dense), and `mlp_layer_types` read where given:
/// one entry per layer, each "dense" or "sparse".
#[test]
fn glm_4_7_flash_follows_its_configs_defaults_and_layer_types() {
    let bare = r#"{"model_type":"glm4_moe_lite","hidden_size":64,"intermediate_size":96,
        "moe_intermediate_size":16,"num_hidden_layers":3,"num_attention_heads":4,
        "n_routed_experts":8,"num_experts_per_tok":2,"vocab_size":100}"#;
    let spec = parse(bare).unwrap();
    let mla = spec.variant.mla.expect("latent attention");
    assert_eq!(
        (mla.q_lora_rank, mla.qk_nope_head_dim, mla.v_head_dim),
        (Some(768), 192, 256)
    );
    assert_eq!(spec.variant.routed_scale, Some(1.8));
    assert_eq!(spec.variant.shared_expert_ffn, Some(16));
    assert_eq!(
        spec.variant.dense_layers.as_ref().map(|d| d.count(3)),
        Some(1)
    );
    let typed = |list: &str| {
        parse(&bare.replace(
            "\"vocab_size\"",
            &format!("\"mlp_layer_types\":{list},\"vocab_size\""),
        ))
    };
    let sparse_first = typed(r#"["sparse","dense","dense"]"#).unwrap();
    let d = sparse_first.variant.dense_layers.expect("two dense");
    assert_eq!(d.dense, vec![false, true, true]);
    assert!(
        typed(r#"["sparse","sparse","sparse"]"#)
            .unwrap()
            .variant
            .dense_layers
            .is_none()
    );
    let short = typed(r#"["dense","sparse"]"#).unwrap_err();
    assert!(short.contains("mlp_layer_types lists 2 layers"), "{short}");
    let wrong = typed(r#"["dense","moe","sparse"]"#).unwrap_err();
    assert!(wrong.contains("mlp_layer_types"), "{wrong}");
}
