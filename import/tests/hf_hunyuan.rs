//! Hunyuan's dense models (transformers' `HunYuanDenseV1ForCausalLM`): Llama's block with
//! per-head q/k RMSNorms after the rotary, whose base an NTK alpha raises.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

/// tencent/Hunyuan-7B's shapes: 32 layers of hidden 4096, 32 heads of 128 beside 8 KV heads,
/// q and k normed per head (128 each), a SwiGLU of 14336, tied embeddings of 128167.
const HUNYUAN_7B: &str = r#"{"model_type":"hunyuan_v1_dense","hidden_size":4096,
    "intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,
    "num_key_value_heads":8,"head_dim":128,"vocab_size":128167,
    "max_position_embeddings":32768,"rope_theta":10000.0,"tie_word_embeddings":true,
    "rope_scaling":{"alpha":1000.0,"beta_fast":32,"beta_slow":1,"factor":1.0,"mscale":1.0,
    "mscale_all_dim":1.0,"type":"dynamic"}}"#;

#[test]
fn hunyuan_norms_q_and_k_after_the_rotary() {
    let spec = parse(HUNYUAN_7B);
    let (h, kv) = (4096u64, 1024u64);
    let layer = 2 * h * h + 2 * h * kv + 2 * 128 + 3 * h * 14336 + 2 * h;
    let want = 128_167 * h + 32 * layer + h;
    assert_eq!(want, 7_504_568_320);
    assert_eq!(spec.param_count(), want);
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), want);
    // Every per-head norm reads a rotated head (through its [.., heads, d] view).
    let mut per_head = 0;
    for o in g.op_ids() {
        if !matches!(g.op(o).kind, OpKind::RmsNorm { .. }) {
            continue;
        }
        let mut x = g.op(o).inputs[0];
        while matches!(g.op(g.def_op(x)).kind, OpKind::Reshape { .. }) {
            x = g.op(g.def_op(x)).inputs[0];
        }
        if g.ty(g.op(o).inputs[1]).shape.fixed_numel() == Some(128) {
            per_head += 1;
            assert!(matches!(g.op(g.def_op(x)).kind, OpKind::Rotary { .. }));
        }
    }
    assert_eq!(per_head, 2 * 32);
}

/// HunYuanDenseV1RotaryEmbedding: with a dynamic alpha the base is rope_theta ·
/// alpha^(d / (d − 2)), computed once; nothing to note. Without an alpha a dynamic scaling is
/// Llama's (plain frequencies up to the context, noted).
#[test]
fn hunyuan_alpha_raises_the_rotary_base() {
    let spec = parse(HUNYUAN_7B);
    let want = 10_000.0 * 1000f64.powf(128.0 / 126.0);
    assert!(
        (spec.rope_theta - want).abs() < 1e-6 * want,
        "{}",
        spec.rope_theta
    );
    assert_eq!(spec.rope_scaling, ir::RopeScaling::None);
    assert!(hf::approximations(HUNYUAN_7B).is_empty());
    let bad = HUNYUAN_7B.replace("\"alpha\":1000.0", "\"alpha\":0.5");
    let err = hf::parse_config(&bad, Path::new("config.json"))
        .expect_err("alpha below 1")
        .to_string();
    assert!(err.contains("alpha"), "{err}");
}
