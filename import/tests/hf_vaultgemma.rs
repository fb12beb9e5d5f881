//! VaultGemma (transformers' `VaultGemmaForCausalLM`): Gemma 2's attention — soft-capped
//! scores, the query scale, every other layer in a window — in a block of two norms, before
//! attention and before the MLP (Gemma 2 without its sandwich), counted module by module.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

/// google/vaultgemma-1b's shapes (as KerasHub's converter test transcribes them): 26 layers of
/// hidden 1152, 4 heads of 256, a GeGLU of 6912, a window of 512; the tied vocabulary of
/// 256000.
const VAULTGEMMA_1B: &str = r#"{"model_type":"vaultgemma","vocab_size":256000,
    "num_hidden_layers":26,"num_attention_heads":4,"num_key_value_heads":4,
    "hidden_size":1152,"intermediate_size":6912,"head_dim":256,"query_pre_attn_scalar":256,
    "sliding_window":512}"#;

/// Per layer q, k and v (1152 → 4 × 256), o back, the GeGLU (3 × 1152 × 6912) and two norms;
/// the tied embedding and the final norm. The card's 1B.
fn vaultgemma_1b_modules() -> u64 {
    let (h, q, f, layers, vocab) = (1152u64, 1024u64, 6912u64, 26u64, 256_000u64);
    layers * (4 * h * q + 3 * h * f + 2 * h) + vocab * h + h
}

#[test]
fn vaultgemma_is_gemma_2s_attention_in_a_two_norm_block() {
    let spec = parse(VAULTGEMMA_1B);
    assert_eq!(vaultgemma_1b_modules(), 1_038_741_120);
    assert_eq!(spec.param_count(), vaultgemma_1b_modules());
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), vaultgemma_1b_modules());
    let v = &spec.variant;
    assert!(!v.sandwich_norms && v.gelu_gate && v.embed_scale);
    // Gemma2Config's soft-caps and query_pre_attn_scalar.
    assert_eq!(
        (v.attn_softcap, v.final_softcap, v.query_scale),
        (Some(50.0), Some(30.0), Some(256.0))
    );
    let window = v
        .sliding_window
        .as_ref()
        .expect("every other layer windowed");
    assert_eq!((window.keys, window.windowed_layers()), (512, 13));
    assert_eq!(
        g.op_ids()
            .filter(|&o| matches!(g.op(o).kind, OpKind::RmsNorm { .. }))
            .count(),
        2 * 26 + 1
    );
    assert!(
        g.params()
            .iter()
            .any(|(name, _)| name == "model.layers.0.pre_feedforward_layernorm.weight"),
        "{:?}",
        g.params()
    );
}
