//! Llama 4 as transformers builds it (`Llama4TextConfig`, `Llama4TextDecoderLayer`): its
//! published Scout and Maverick configs counted module by module, and each layer's attention
//! (chunked or full, q/k L2-normed or not, rotated or temperature-scaled) and MLP (experts or
//! dense) as the config's fields say.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, Graph, OpKind, RopeScaling};

fn fixture(name: &str) -> import::ModelSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/hf")
        .join(name)
        .join("config.json");
    let text = std::fs::read_to_string(&path).expect("fixture");
    hf::parse_config(&text, &path).expect("fixture parses")
}

fn spec(json: &str) -> Result<import::ModelSpec, String> {
    hf::parse_config(json, Path::new("config.json")).map_err(|e| e.to_string())
}

/// The parameters of Llama 4's text model, module by module as `modeling_llama4.py` declares
/// them: embeddings and an untied head, per layer q/k/v/o projections and two RMSNorm weights,
/// then on an expert layer the router, `experts` experts' gate_up_proj and down_proj and the
/// shared expert, on a dense layer an MLP of `dense_ffn`; the final norm.
fn llama4_params(experts: u64, moe_layers: u64, dense_ffn: u64) -> u64 {
    let (h, v, layers, heads, kv, d, f) = (5120u64, 202_048, 48, 40, 8, 128, 8192);
    let attention = h * heads * d + 2 * h * kv * d + heads * d * h + 2 * h;
    let expert_layer = h * experts + experts * (h * 2 * f + f * h) + 3 * h * f;
    let dense_layer = 3 * h * dense_ffn;
    2 * v * h
        + layers * attention
        + moe_layers * expert_layer
        + (layers - moe_layers) * dense_layer
        + h
}

/// Scout (16 experts on every layer) and Maverick (128 experts on every other layer, dense
/// MLPs of 16384 between): Meta's cards give 109B and 400B in all (with the vision encoder,
/// which plait does not build); the text models count 107.77B and 400.71B.
#[test]
fn scout_and_maverick_count_their_modules() {
    let scout = fixture("llama-4-scout");
    assert_eq!(scout.param_count(), llama4_params(16, 48, 0));
    assert_eq!(scout.param_count(), 107_769_861_120);
    let maverick = fixture("llama-4-maverick");
    assert_eq!(maverick.param_count(), llama4_params(128, 24, 16384));
    assert_eq!(maverick.param_count(), 400_711_848_960);
    for s in [&scout, &maverick] {
        let g = build_forward(s, DType::F32).expect("builds");
        assert_eq!(g.param_count(), s.param_count(), "{}", s.name);
    }
}

/// One layer's attention as built: (unrotated, its chunk, whether q and k are L2-normed, the
/// queries' rotary).
fn attention_of(g: &Graph, layer: u32) -> (bool, Option<u64>, bool, RopeScaling) {
    let ops = g.layer_ops(layer);
    let rotaries: Vec<RopeScaling> = ops
        .iter()
        .filter_map(|&o| match g.op(o).kind {
            OpKind::Rotary { scaling, .. } => Some(scaling),
            _ => None,
        })
        .collect();
    let chunk = ops.iter().find_map(|&o| match g.op(o).kind {
        OpKind::Attention { chunk, .. } => Some(chunk),
        _ => None,
    });
    let normed = ops
        .iter()
        .filter(|&&o| matches!(g.op(o).kind, OpKind::ReduceMean))
        .count();
    assert!(normed == 0 || normed == 2, "q and k alike");
    (
        rotaries[1].is_nope(),
        chunk.flatten(),
        normed == 2,
        rotaries[0],
    )
}

/// Scout: layers 0–2 of each four rotated, chunked and L2-normed, layer 3 unrotated, full,
/// unnormed, its queries scaled by the temperature (floor 8192, scale 0.1); every layer has
/// experts weighing their input, a top-1 sigmoid router and a shared expert. The block runs in
/// two structures, a run starting wherever the norms come or go.
#[test]
fn scout_layers_alternate_chunked_normed_and_unrotated() {
    let scout = fixture("llama-4-scout");
    let g = build_forward(&scout, DType::F32).expect("builds");
    let temperature = RopeScaling::Temperature {
        floor: 8192.0,
        scale: 0.1,
    };
    for layer in 0..48u32 {
        let got = attention_of(&g, layer);
        if layer % 4 == 3 {
            assert_eq!(got, (true, None, false, temperature), "layer {layer}");
        } else {
            assert!(
                !got.0 && got.1 == Some(8192) && got.2,
                "layer {layer}: {got:?}"
            );
            assert!(matches!(got.3, RopeScaling::Llama3 { factor: 8.0, .. }));
        }
    }
    let starts: Vec<u32> = (1..48).filter(|l| l % 4 == 3 || l % 4 == 0).collect();
    assert_eq!(g.kind_starts, starts);
    let v = &scout.variant;
    assert!(v.expert_form.scales_input && v.dense_layers.is_none());
    assert!(v.routing.sigmoid && !v.routing.normalize);
    assert_eq!((scout.experts, scout.experts_per_token), (16, 1));
    assert_eq!(v.shared_expert_ffn, Some(8192));
}

/// Maverick: no q/k norms (use_qk_norm false), dense MLPs of intermediate_size_mlp on the even
/// layers and experts on the odd ones (interleave_moe_layer_step 2), no rope scaling.
#[test]
fn maverick_interleaves_dense_and_expert_layers() {
    let maverick = fixture("llama-4-maverick");
    let g = build_forward(&maverick, DType::F32).expect("builds");
    for layer in 0..48u32 {
        let (nope, chunk, normed, _) = attention_of(&g, layer);
        assert_eq!(
            (nope, chunk.is_some(), normed),
            (layer % 4 == 3, layer % 4 != 3, false)
        );
        let experts = g
            .layer_ops(layer)
            .iter()
            .any(|&o| matches!(g.op(o).kind, OpKind::MoeExperts { .. }));
        assert_eq!(experts, layer % 2 == 1, "layer {layer}");
    }
    assert_eq!(g.kind_starts, (1..48).collect::<Vec<u32>>());
    assert_eq!(maverick.rope_scaling, RopeScaling::None);
}

/// transformers' defaults where a config leaves the fields out: no_rope_layers empty or absent
/// (every fourth layer unrotated), layer_types from them, moe_layers from the step; and the
/// switches: a null chunk size attends fully, attn_temperature_tuning false scales nothing.
#[test]
fn defaults_and_switches_follow_llama4_text_config() {
    let base = r#""model_type":"llama4_text","hidden_size":64,"intermediate_size":32,
        "num_hidden_layers":8,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
        "vocab_size":100,"num_local_experts":4,"num_experts_per_tok":1"#;
    let defaults = spec(&format!(r#"{{{base},"no_rope_layers":[]}}"#)).unwrap();
    let nope: Vec<bool> = (0..8).map(|i| i % 4 == 3).collect();
    assert_eq!(defaults.variant.nope.as_deref(), Some(&nope[..]));
    let chunks = defaults.variant.chunked_attention.as_ref().unwrap();
    assert_eq!(chunks.keys, 8192);
    assert_eq!(chunks.chunked, nope.iter().map(|n| !n).collect::<Vec<_>>());
    assert!(defaults.variant.attn_temperature.is_some());
    assert_eq!(defaults.variant.dense_layers, None);
    let off = spec(&format!(
        r#"{{{base},"attention_chunk_size":null,"attn_temperature_tuning":false,
        "interleave_moe_layer_step":2,"intermediate_size_mlp":48}}"#
    ))
    .unwrap();
    assert!(off.variant.chunked_attention.is_none() && off.variant.attn_temperature.is_none());
    let dense = off.variant.dense_layers.as_ref().unwrap();
    assert_eq!((dense.count(8), dense.ffn), (4, 48));
    assert!(dense.is_dense(0) && !dense.is_dense(1));
    // A wrong field is named.
    let bad = spec(&format!(r#"{{{base},"moe_layers":"all"}}"#)).unwrap_err();
    assert!(bad.contains("moe_layers"), "{bad}");
    let none = spec(&format!(r#"{{{base},"moe_layers":[]}}"#)).unwrap_err();
    assert!(none.contains("moe_layers names no layer"), "{none}");
    let wrong = spec(&format!(
        r#"{{{base},"layer_types":["sliding_attention"]}}"#
    ))
    .unwrap_err();
    assert!(wrong.contains("chunked_attention"), "{wrong}");
}
