//! Granite's mixture-of-experts families (transformers' `GraniteMoeForCausalLM` and
//! `GraniteMoeSharedForCausalLM`): Mixtral's block with Granite's four multipliers, counted
//! module by module from transformers' shapes.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/hf/granite-3.1-3b-a800m/config.json"
);

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

/// ibm-granite/granite-3.1-3b-a800m's modules: per layer q and o (1536²), k and v (1536 × 512,
/// eight KV heads of 64), the router (`router.layer`, 40 × 1536), 40 experts whose
/// `input_linear` is 1024 × 1536 (gate and up) and `output_linear` 1536 × 512, two RMSNorms;
/// the tied embedding and the final norm. The card's "3.3B".
fn granite_3b_modules() -> u64 {
    let (h, kv, vocab, layers, experts, ffn) = (1536u64, 512u64, 49155u64, 32u64, 40u64, 512u64);
    let attention = 2 * h * h + 2 * h * kv;
    let layer = attention + experts * h + experts * 3 * h * ffn + 2 * h;
    vocab * h + layers * layer + h
}

#[test]
fn granite_moe_is_mixtrals_block_with_granites_multipliers() {
    let text = std::fs::read_to_string(FIXTURE).expect("fixture");
    let spec = parse(&text);
    assert_eq!(granite_3b_modules(), 3_298_793_472);
    assert_eq!(spec.param_count(), granite_3b_modules());
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), granite_3b_modules());
    // JetMoe's gating: a softmax over the top 8 logits, which is Mixtral's renormalized top 8.
    assert_eq!(spec.variant.routing, ir::Routing::default());
    assert_eq!((spec.experts, spec.experts_per_token), (40, 8));
    let scales: Vec<f64> = g
        .op_ids()
        .filter_map(|o| match g.op(o).kind {
            OpKind::Scale { factor } => Some(factor),
            _ => None,
        })
        .collect();
    // The embedding, both branches of each of 32 layers, the logits (divided by 6).
    assert_eq!(scales.len(), 1 + 2 * 32 + 1);
    assert_eq!((scales[0], scales[1], scales[65]), (12.0, 0.22, 1.0 / 6.0));
    assert!(g.op_ids().all(|o| match g.op(o).kind {
        OpKind::Attention { scale, .. } => scale == 0.015625,
        _ => true,
    }));
    assert!(
        g.params()
            .iter()
            .any(|(name, _)| name == "model.layers.0.block_sparse_moe.router.layer.weight")
    );
}

#[test]
fn granite_moe_shared_adds_an_ungated_mlp_beside_the_experts() {
    let text = std::fs::read_to_string(FIXTURE).expect("fixture");
    let shared = |width: &str| {
        text.replace("\"granitemoe\"", "\"granitemoeshared\"")
            .replace(
                "\"num_local_experts\"",
                &format!("\"shared_intermediate_size\": {width},\n  \"num_local_experts\""),
            )
    };
    // GraniteMoeSharedMLP: input_linear 2·1024 × 1536, output_linear 1536 × 1024, per layer.
    let spec = parse(&shared("1024"));
    let want = granite_3b_modules() + 32 * 3 * 1536 * 1024;
    assert_eq!(spec.param_count(), want);
    let g = build_forward(&spec, DType::F32).expect("builds");
    assert_eq!(g.param_count(), want);
    assert!(
        g.params()
            .iter()
            .any(|(name, _)| name.starts_with("model.layers.31.shared_mlp."))
    );
    // The shared MLP's output is added, not gated: no sigmoid in the graph.
    assert!(g.op_ids().all(|o| g.op(o).kind != OpKind::Sigmoid));
    // shared_intermediate_size 0 (GraniteMoeSharedConfig's default) builds none.
    assert_eq!(parse(&shared("0")).param_count(), granite_3b_modules());
    let err = hf::parse_config(&shared("-1"), Path::new("config.json"))
        .expect_err("negative width")
        .to_string();
    assert!(err.contains("shared_intermediate_size"), "{err}");
}

#[test]
fn granite_moe_refuses_what_its_modeling_code_would() {
    let text = std::fs::read_to_string(FIXTURE).expect("fixture");
    let err = |from: &str, to: &str| {
        hf::parse_config(&text.replace(from, to), Path::new("config.json"))
            .expect_err(to)
            .to_string()
    };
    let picked = err("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 41");
    assert!(
        picked.contains("num_experts_per_tok = 41") && picked.contains("num_local_experts = 40"),
        "{picked}"
    );
    let act = err("\"silu\"", "\"relu\"");
    assert!(act.contains("hidden_act"), "{act}");
}
