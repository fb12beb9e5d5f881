//! NanoChat (transformers' `NanoChatForCausalLM`): Llama's block with RMSNorms of no weight
//! (the embedding normed too), q and k normed per head after the rotary, an ungated
//! squared-ReLU MLP and soft-capped logits, counted module by module.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn parse(json: &str) -> Result<import::ModelSpec, String> {
    hf::parse_config(json, Path::new("config.json")).map_err(|e| e.to_string())
}

fn count(g: &ir::Graph, pred: impl Fn(&OpKind) -> bool) -> usize {
    g.op_ids().filter(|&o| pred(&g.op(o).kind)).count()
}

/// nanochat d20 as transformers' converter writes it (`convert_nanochat_checkpoints.py`):
/// 20 layers of hidden 1280, 10 heads, an MLP of 4 × hidden, vocabulary 65536, untied.
const D20: &str = r#"{"architectures":["NanoChatForCausalLM"],"model_type":"nanochat",
    "vocab_size":65536,"hidden_size":1280,"intermediate_size":5120,"num_hidden_layers":20,
    "num_attention_heads":10,"num_key_value_heads":10,"max_position_embeddings":2048,
    "hidden_act":"relu2","attention_dropout":0.0,"rms_norm_eps":1e-6,"initializer_range":0.02,
    "rope_parameters":{"rope_theta":10000.0,"rope_type":"default"},"use_cache":true,
    "final_logit_softcapping":15.0,"attention_bias":false,"tie_word_embeddings":false}"#;

/// Six weights a layer (q, k, v and o of h², fc1 and fc2 of h × 4h), the embedding and the
/// head; no norm parameters. nanochat's 561M for d20.
fn nanochat_modules(h: u64, layers: u64, vocab: u64) -> u64 {
    layers * (4 * h * h + 2 * h * 4 * h) + 2 * vocab * h
}

#[test]
fn nanochat_norms_have_no_weights_and_its_logits_are_capped() {
    let spec = parse(D20).unwrap();
    assert_eq!(nanochat_modules(1280, 20, 65536), 560_988_160);
    assert_eq!(spec.param_count(), nanochat_modules(1280, 20, 65536));
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), spec.param_count());
    // Two weights of attention and the MLP's two a layer beside q, k, v and o; nothing else.
    assert_eq!(g.params().len(), 20 * 6 + 2, "{:?}", g.params());
    assert_eq!(count(&g, |k| matches!(k, OpKind::RmsNorm { .. })), 0);
    // Each layer's two block norms and q's and k's, the embedding's and the final norm.
    assert_eq!(count(&g, |k| matches!(k, OpKind::ReduceMean)), 4 * 20 + 2);
    assert_eq!(count(&g, |k| matches!(k, OpKind::Tanh)), 1);
    let v = &spec.variant;
    assert!(v.weightless_rms_norms && v.embed_norm && !v.qk_norm);
    assert_eq!(
        v.qk_l2_norm.as_deref().map(|l| l.iter().all(|&n| n)),
        Some(true)
    );
    assert_eq!((v.final_softcap, v.qkv_bias), (Some(15.0), false));
    assert_eq!(v.ungated_mlp, Some(import::spec::Ungated::SquaredRelu));
    let notes = hf::approximations(D20);
    assert!(notes.iter().any(|n| n.contains("rotate_half")), "{notes:?}");
}

/// nanochat d32's shapes (hidden 2048, 32 layers of 16 heads): its 1.9B. A gated MLP's
/// activation is refused naming the field; the cap may be turned off.
#[test]
fn nanochat_d32_counts_and_its_fields_are_read() {
    let d32 = D20
        .replace("\"hidden_size\":1280", "\"hidden_size\":2048")
        .replace("\"intermediate_size\":5120", "\"intermediate_size\":8192")
        .replace("\"num_hidden_layers\":20", "\"num_hidden_layers\":32")
        .replace("\"num_attention_heads\":10", "\"num_attention_heads\":16")
        .replace("\"num_key_value_heads\":10", "\"num_key_value_heads\":16");
    let spec = parse(&d32).unwrap();
    assert_eq!(nanochat_modules(2048, 32, 65536), 1_879_048_192);
    assert_eq!(spec.param_count(), 1_879_048_192);
    assert_eq!(spec.head_dim(), 128);
    let silu = parse(&D20.replace("\"relu2\"", "\"silu\"")).unwrap_err();
    assert!(
        silu.contains("hidden_act") && silu.contains("relu2"),
        "{silu}"
    );
    let uncapped = parse(&D20.replace(
        "\"final_logit_softcapping\":15.0",
        "\"final_logit_softcapping\":null",
    ));
    assert_eq!(uncapped.unwrap().variant.final_softcap, None);
}
