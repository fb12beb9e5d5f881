//! Sliding-window attention as transformers builds it: which layers of which families attend
//! within a window, read from published configs and from each family's defaults.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind};

fn spec(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

fn fixture(name: &str) -> import::ModelSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/hf")
        .join(name)
        .join("config.json");
    hf::read_config(&path).expect("fixture parses")
}

/// Each layer's attention window in the built graph, in layer order.
fn windows(spec: &import::ModelSpec) -> Vec<Option<u64>> {
    let g = build_forward(spec, DType::F32).expect("graph builds");
    g.order()
        .iter()
        .filter(|&&o| matches!(g.op(o).kind, OpKind::Attention { .. }))
        .map(|&o| g.op(o).kind.attention_window())
        .collect()
}

fn every(layers: usize, window: Option<u64>) -> Vec<Option<u64>> {
    vec![window; layers]
}

/// Layers `(i + 1) % n != 0` windowed: Gemma 2's and gpt-oss's n = 2, OLMo 3's 4, Gemma 3's 6.
fn all_but_every(n: usize, layers: usize, window: u64) -> Vec<Option<u64>> {
    (0..layers)
        .map(|i| ((i + 1) % n != 0).then_some(window))
        .collect()
}

const TINY: &str = r#""hidden_size":64,"intermediate_size":128,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100"#;

fn tiny(model_type: &str, extra: &str) -> import::ModelSpec {
    spec(&format!(r#"{{"model_type":"{model_type}",{TINY}{extra}}}"#))
}

/// Published configs: gpt-oss-20b lists its layer types (sliding first, 128 keys); Gemma 2
/// windows its even layers at 4096; Gemma 3 1B five of six at 512; Phi-3-mini every layer at
/// 2047; Qwen2.5 and Qwen3 turn the window off (`use_sliding_window: false`); Mistral-Nemo's
/// is null.
#[test]
fn published_configs_window_the_layers_transformers_does() {
    assert_eq!(windows(&fixture("gpt-oss-20b")), all_but_every(2, 24, 128));
    assert_eq!(windows(&fixture("gemma-2-9b")), all_but_every(2, 42, 4096));
    assert_eq!(windows(&fixture("gemma-3-1b")), all_but_every(6, 26, 512));
    assert_eq!(windows(&fixture("phi-3-mini-4k")), every(32, Some(2047)));
    for none in [
        "qwen2.5-7b",
        "qwen3-8b",
        "mistral-nemo-base",
        "olmo-2-1124-7b",
    ] {
        let w = windows(&fixture(none));
        assert!(w.iter().all(Option::is_none), "{none}: {w:?}");
    }
}

/// transformers' defaults where a config names no window: Mistral 4096 on every layer, OLMo 3
/// 4096 on three of four, Gemma 3 4096 on five of six (or its `sliding_window_pattern`),
/// gpt-oss 128 on alternate layers; Mixtral none. Qwen2 windows the layers from
/// `max_window_layers` on only with `use_sliding_window`. A null or 0 window is off; a window
/// in a family transformers builds without one (Llama) is not built.
#[test]
fn family_defaults_and_switches() {
    assert_eq!(windows(&tiny("mistral", "")), every(4, Some(4096)));
    assert_eq!(windows(&tiny("olmo3", "")), all_but_every(4, 4, 4096));
    assert_eq!(windows(&tiny("gemma2", "")), all_but_every(2, 4, 4096));
    assert_eq!(
        windows(&tiny("gemma3_text", r#","sliding_window_pattern":2"#)),
        all_but_every(2, 4, 4096)
    );
    assert_eq!(
        windows(&tiny(
            "mixtral",
            r#","num_local_experts":4,"num_experts_per_tok":2"#
        )),
        every(4, None)
    );
    let qwen = |extra: &str| windows(&tiny("qwen2", extra));
    assert_eq!(qwen(r#","sliding_window":64"#), every(4, None));
    assert_eq!(
        qwen(r#","sliding_window":64,"use_sliding_window":true,"max_window_layers":2"#),
        [None, None, Some(64), Some(64)]
    );
    // Qwen2-MoE windows its even layers below max_window_layers; Qwen3-MoE every layer; both
    // only with use_sliding_window, which also turns off a listed layer_types' windows.
    let moe = r#","num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":32,"sliding_window":64,"use_sliding_window":true"#;
    assert_eq!(
        windows(&tiny(
            "qwen2_moe",
            &format!(r#"{moe},"shared_expert_intermediate_size":64,"max_window_layers":3"#)
        )),
        [Some(64), None, Some(64), None]
    );
    assert_eq!(windows(&tiny("qwen3_moe", moe)), every(4, Some(64)));
    let listed_but_off = r#","sliding_window":64,"layer_types":["sliding_attention","full_attention","sliding_attention","full_attention"]"#;
    assert_eq!(windows(&tiny("qwen2", listed_but_off)), every(4, None));
    for off in ["null", "0"] {
        let extra = format!(r#","sliding_window":{off}"#);
        assert_eq!(windows(&tiny("mistral", &extra)), every(4, None), "{off}");
    }
    assert_eq!(
        windows(&tiny("llama", r#","sliding_window":64"#)),
        every(4, None)
    );
}

/// Gemma 3's sliding-kind layers rotate by rope_local_base_freq unscaled whether or not a
/// window is set (transformers picks `rotary_emb_local` by layer type); its other layers by
/// rope_theta and its scaling.
#[test]
fn gemma3s_local_rope_follows_the_layer_kind() {
    for window in ["512", "null"] {
        let spec = tiny(
            "gemma3_text",
            &format!(
                r#","sliding_window":{window},"sliding_window_pattern":2,"rope_theta":1000000,"rope_local_base_freq":10000,"rope_scaling":{{"rope_type":"linear","factor":8.0}}"#
            ),
        );
        let g = build_forward(&spec, DType::F32).expect("graph builds");
        let rotaries: Vec<(f64, bool)> = g
            .order()
            .iter()
            .filter_map(|&o| match g.op(o).kind {
                OpKind::Rotary { theta, scaling, .. } => {
                    Some((theta, scaling != ir::RopeScaling::None))
                }
                _ => None,
            })
            .collect();
        let local = (1e4, false);
        let global = (1e6, true);
        assert_eq!(
            rotaries,
            [local, local, global, global, local, local, global, global],
            "window {window}"
        );
    }
}

/// A config's `layer_types` overrides the family's pattern.
#[test]
fn layer_types_name_the_windowed_layers() {
    let types = r#","sliding_window":32,"layer_types":["full_attention","sliding_attention","sliding_attention","full_attention"]"#;
    let want = [None, Some(32), Some(32), None];
    assert_eq!(windows(&tiny("gemma2", types)), want);
    assert_eq!(windows(&tiny("mistral", types)), want);
    // Ministral (MinistralConfig): Mistral's block, every layer sliding unless layer_types
    // names full ones; no q/k/v biases whatever attention_bias says.
    assert_eq!(windows(&tiny("ministral", types)), want);
    assert_eq!(windows(&tiny("ministral", "")), every(4, Some(4096)));
    let biased = tiny("ministral", r#","attention_bias":true"#);
    assert_eq!(biased.param_count(), tiny("ministral", "").param_count());
    assert_eq!(biased.param_count(), tiny("mistral", "").param_count());
}

/// A windowed layer's attention counts `S × min(S, w)` scores where a full layer counts
/// `S × S` (plait's FLOP convention, `ir::cost`): at 4096 tokens a window of 512 counts an
/// eighth of the full layer's products and softmax.
#[test]
fn a_window_counts_the_scores_it_computes() {
    let b = ir::Binding {
        batch: 1,
        seq: 4096,
    };
    let attention_flops = |extra: &str| {
        let g = build_forward(&tiny("mistral", extra), DType::F32).expect("graph builds");
        let o = g
            .order()
            .iter()
            .copied()
            .find(|&o| matches!(g.op(o).kind, OpKind::Attention { .. }))
            .expect("an attention op");
        ir::cost::op_cost(&g, o, b).fwd_flops
    };
    let (windowed, full) = (
        attention_flops(r#","sliding_window":512"#),
        attention_flops(r#","sliding_window":null"#),
    );
    assert!(
        (windowed / full - 512.0 / 4096.0).abs() < 1e-12,
        "{windowed} / {full}"
    );
}
