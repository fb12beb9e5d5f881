//! Sliding-window attention in the cost model: a fused kernel skips the key blocks before each
//! query's window, so a windowed layer's attention costs the fraction of (query, key) pairs it
//! sees, and a model whose layers mix windowed and full attention (Gemma 2, gpt-oss) is priced
//! as that mix whatever its representative layer is. Checked against pairs counted one by one.
#![allow(clippy::unwrap_used)]

mod common;

use planner::cost::compute::{AttentionKernel, masked_visible_fraction, windowed_visible_fraction};
use planner::estimate::{Pricing, estimate_traced};
use planner::{Cluster, ModelInfo, Strategy};

/// Pairs (query, key) a causal query sees, counted one by one: `sq` queries ending at the
/// last of `sk` keys, each seeing the `window` keys up to its own position.
fn counted(sq: u64, sk: u64, window: Option<u64>) -> f64 {
    let mut seen = 0u64;
    for i in 0..sq {
        let pos = sk - sq + i;
        for j in 0..sk {
            let visible = j <= pos && window.is_none_or(|w| pos - j < w);
            seen += u64::from(visible);
        }
    }
    seen as f64 / (sq * sk) as f64
}

/// [`counted`] a query at a time: query at position p sees min(p + 1, window) keys.
fn summed(s: u64, window: Option<u64>) -> f64 {
    let seen: u64 = (0..s)
        .map(|p| window.map_or(p + 1, |w| (p + 1).min(w)))
        .sum();
    seen as f64 / (s * s) as f64
}

#[test]
fn the_visible_fraction_counts_the_pairs_a_window_shows() {
    for (sq, sk) in [(1, 1), (7, 7), (64, 64), (5, 64), (64, 200)] {
        for window in [None, Some(1), Some(3), Some(16), Some(64), Some(500)] {
            let (got, want) = (
                windowed_visible_fraction(sq, sk, window),
                counted(sq, sk, window),
            );
            assert!(
                (got - want).abs() < 1e-12,
                "sq {sq} sk {sk} window {window:?}: {got} vs {want}"
            );
            if sq == sk {
                assert!((summed(sq, window) - want).abs() < 1e-12);
            }
        }
    }
}

/// Llama 4's chunks (with and without a window): the fraction against pairs counted one by
/// one, each key seen where it is in the query's own chunk of `chunk` positions.
#[test]
fn the_visible_fraction_counts_the_pairs_a_chunk_shows() {
    for (sq, sk) in [(1, 1), (7, 7), (64, 64), (5, 64), (64, 200)] {
        for chunk in [1, 3, 16, 64, 500] {
            for window in [None, Some(5)] {
                let mask = ir::KeyMask {
                    window,
                    chunk: Some(chunk),
                };
                let mut seen = 0u64;
                for i in 0..sq {
                    let pos = sk - sq + i;
                    for j in 0..=pos {
                        let in_window = window.is_none_or(|w| pos - j < w);
                        seen += u64::from(in_window && j / chunk == pos / chunk);
                    }
                }
                let want = seen as f64 / (sq * sk) as f64;
                let got = masked_visible_fraction(sq, sk, mask);
                assert!(
                    (got - want).abs() < 1e-12,
                    "{sq} {sk} {mask:?}: {got} vs {want}"
                );
            }
        }
    }
}

/// A Mistral-shaped config of 4 layers at 32768 tokens with the window given as JSON
/// (`null`: none) and `layer_types` where given.
fn model(window: &str, layer_types: &str) -> ir::Graph {
    let text = format!(
        r#"{{"model_type":"mistral","hidden_size":4096,"intermediate_size":8192,
        "num_hidden_layers":4,"num_attention_heads":32,"num_key_value_heads":8,
        "vocab_size":1000,"max_position_embeddings":32768,"sliding_window":{window}{layer_types}}}"#
    );
    let spec = import::hf::parse_config(&text, std::path::Path::new("config.json")).unwrap();
    import::build_forward(&spec, ir::DType::F32).unwrap()
}

/// The predicted forward seconds of the fused attention kernels of one step.
fn attention_seconds(g: &ir::Graph) -> f64 {
    attention_seconds_with(g, AttentionKernel::Fused)
}

/// The predicted forward seconds of attention computed by `kernel`.
fn attention_seconds_with(g: &ir::Graph, kernel: AttentionKernel) -> f64 {
    let info = ModelInfo::new(g).unwrap();
    let cluster = Cluster::load("dgx-h100").unwrap();
    let s = Strategy {
        seq: 32768,
        attention: kernel,
        ..common::tp_strategy(1, false, 1)
    };
    let e = estimate_traced(&info, &cluster, 1, &s, Pricing::SEARCH).unwrap();
    let stage = &e.predicted.stages[0];
    stage.kernel_s["attention"]
}

/// All four layers windowed at 4096 keys cost the windowed share of full causal attention; two
/// of four (either two: the representative layer 0 windowed or not) cost the mean of the two.
/// Each kernel's launch is a few microseconds of milliseconds: the ratios hold within 1 %.
#[test]
fn windowed_layers_cost_the_pairs_they_see() {
    let full = attention_seconds(&model("null", ""));
    let windowed = attention_seconds(&model("4096", ""));
    let (f_full, f_window) = (summed(32768, None), summed(32768, Some(4096)));
    let close = |got: f64, want: f64, what: &str| {
        assert!((got / want - 1.0).abs() < 0.01, "{what}: {got} vs {want}");
    };
    close(windowed / full, f_window / f_full, "every layer windowed");
    let half_mix = 0.5 * (f_full + f_window) / f_full;
    for types in [
        r#"["sliding_attention","full_attention","sliding_attention","full_attention"]"#,
        r#"["full_attention","sliding_attention","full_attention","sliding_attention"]"#,
    ] {
        let g = model("4096", &format!(r#","layer_types":{types}"#));
        close(attention_seconds(&g) / full, half_mix, types);
    }
}

/// Scores written to memory are computed whole and then masked: a window saves a
/// materialized attention nothing.
#[test]
fn a_materialized_attention_computes_every_score_in_a_window() {
    let full = attention_seconds_with(&model("null", ""), AttentionKernel::Materialized);
    let windowed = attention_seconds_with(&model("4096", ""), AttentionKernel::Materialized);
    assert!((windowed / full - 1.0).abs() < 1e-9, "{windowed} vs {full}");
}
