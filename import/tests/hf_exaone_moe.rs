//! K-EXAONE (transformers' `ExaoneMoeForCausalLM`): EXAONE 4's attention — q and k normed per
//! head, three windowed layers to each unrotated global one — in a pre-norm block, before
//! DeepSeek-V3's sigmoid-routed experts beside a shared one; counted module by module.

use std::path::Path;

use import::{build_forward, hf};
use ir::DType;

fn parse(json: &str) -> Result<import::ModelSpec, String> {
    hf::parse_config(json, Path::new("config.json")).map_err(|e| e.to_string())
}

/// K-EXAONE-236B-A23B's fields as SGLang's test transcribes them (hidden 6144, 64 heads of
/// 128 over 8 KV heads, 128 experts of 2048, 8 a token, beside one shared; a dense first
/// layer of 18432; "LLLG" windows; vocabulary 153600), with the 48 layers its 236B implies
/// and a window of 4096 (ExaoneMoeConfig's default; the test shrinks it).
fn k_exaone() -> String {
    let moe: Vec<&str> = std::iter::once("false")
        .chain(std::iter::repeat_n("true", 47))
        .collect();
    format!(
        r#"{{"architectures":["ExaoneMoEForCausalLM"],"model_type":"exaone_moe",
        "first_last_k_dense_replace":1,"head_dim":128,"hidden_act":"silu","hidden_size":6144,
        "intermediate_size":18432,"is_moe_layer":[{}],"max_position_embeddings":262144,
        "moe_intermediate_size":2048,"n_group":1,"norm_topk_prob":true,
        "num_attention_heads":64,"num_experts":128,"num_experts_per_tok":8,
        "num_hidden_layers":48,"num_key_value_heads":8,"num_shared_experts":1,
        "rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":1000000,
        "routed_scaling_factor":2.5,"scoring_func":"sigmoid","sliding_window":4096,
        "sliding_window_pattern":"LLLG","tie_word_embeddings":false,"topk_group":1,
        "topk_method":"noaux_tc","vocab_size":153600}}"#,
        moe.join(",")
    )
}

/// Per layer q (6144 → 64 × 128), k and v (→ 8 × 128), o back, per-head q/k norms of 128 and
/// two RMSNorms; layer 0's SwiGLU of 18432, the others' router (128 × 6144), 128 experts and a
/// shared one of 2048; untied embeddings and the final norm. The card's 236B.
fn k_exaone_modules() -> u64 {
    let (h, q, kv, layers, vocab) = (6144u64, 8192u64, 1024u64, 48u64, 153_600u64);
    let attention = 2 * h * q + 2 * h * kv + 2 * 128;
    let moe = 128 * h + 128 * 3 * h * 2048 + 3 * h * 2048;
    2 * vocab * h + layers * (attention + 2 * h) + 3 * h * 18432 + (layers - 1) * moe + h
}

#[test]
fn k_exaone_is_exaone_4s_attention_before_deepseek_experts() {
    let spec = parse(&k_exaone()).unwrap();
    assert_eq!(k_exaone_modules(), 236_571_150_336);
    assert_eq!(spec.param_count(), k_exaone_modules());
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), k_exaone_modules());
    let v = &spec.variant;
    assert!(v.qk_norm && !v.qk_norm_whole && !v.post_norms);
    assert!(v.routing.sigmoid && v.routing.normalize);
    assert_eq!(
        (v.routed_scale, v.shared_expert_ffn),
        (Some(2.5), Some(2048))
    );
    let dense = v.dense_layers.as_ref().expect("layer 0 dense");
    assert_eq!((dense.count(48), dense.ffn), (1, 18432));
    let window = v.sliding_window.as_ref().expect("LLLG");
    assert_eq!((window.keys, window.windowed_layers()), (4096, 36));
    // The global layers (every fourth) are unrotated.
    let nope = v.nope.as_ref().expect("global layers unrotated");
    assert_eq!(nope.iter().filter(|&&n| n).count(), 12);
    assert!(nope[3] && !nope[0]);
    let notes = hf::approximations(&k_exaone());
    assert!(
        notes
            .iter()
            .any(|n| n.contains("K-EXAONE's e_score_correction_bias")),
        "{notes:?}"
    );
}

/// ExaoneMoeConfig's defaults where the file is silent (layer 0 dense, one shared expert, a
/// routed scale of 2.5), `mlp_layer_types` over `is_moe_layer`, and a list of the wrong length
/// refused naming it.
#[test]
fn k_exaone_reads_its_layer_lists() {
    let bare = r#"{"model_type":"exaone_moe","hidden_size":64,"intermediate_size":96,
        "moe_intermediate_size":16,"num_hidden_layers":4,"num_attention_heads":4,
        "num_experts":8,"num_experts_per_tok":2,"vocab_size":100}"#;
    let spec = parse(bare).unwrap();
    assert_eq!(
        spec.variant.dense_layers.as_ref().map(|d| d.count(4)),
        Some(1)
    );
    assert_eq!(
        (spec.variant.routed_scale, spec.variant.shared_expert_ffn),
        (Some(2.5), Some(16))
    );
    let with =
        |fields: &str| parse(&bare.replace("\"vocab_size\"", &format!("{fields},\"vocab_size\"")));
    let listed = with(r#""is_moe_layer":[true,false,true,false]"#).unwrap();
    assert_eq!(
        listed.variant.dense_layers.unwrap().dense,
        vec![false, true, false, true]
    );
    let both = with(
        r#""is_moe_layer":[true,false,true,false],"mlp_layer_types":["dense","dense","sparse","sparse"]"#,
    )
    .unwrap();
    assert_eq!(
        both.variant.dense_layers.unwrap().dense,
        vec![true, true, false, false]
    );
    let short = with(r#""is_moe_layer":[true,false]"#).unwrap_err();
    assert!(short.contains("is_moe_layer lists 2 layers"), "{short}");
    let unshared = with(r#""num_shared_experts":0"#).unwrap();
    assert_eq!(unshared.variant.shared_expert_ffn, None);
}
