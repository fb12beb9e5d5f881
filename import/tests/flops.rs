//! Training FLOPs per token against the closed form of Narayanan et al. (SC'21).

use import::{build_forward, zoo};
use ir::{Binding, DType, cost};

/// 72·l·h²·(1 + s/(6h) + V/(12·l·h)): forward + backward FLOPs per token without recompute.
fn megatron(l: f64, h: f64, s: f64, v: f64) -> f64 {
    72.0 * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h))
}

#[test]
fn gpt3_175b_within_one_percent_of_the_closed_form() {
    let spec = zoo::find("gpt3-175b").expect("in zoo");
    let g = build_forward(&spec, DType::Bf16).expect("builds");
    for seq in [512u64, 2048] {
        let got = cost::training_flops_per_token(&g, Binding { batch: 1, seq });
        let want = megatron(96.0, 12288.0, seq as f64, 51200.0);
        let err = (got - want).abs() / want;
        assert!(
            err < 0.01,
            "seq {seq}: {got:.4e} vs {want:.4e} ({:.3} %)",
            100.0 * err
        );
    }
}

#[test]
fn flops_per_token_do_not_depend_on_batch() {
    let spec = zoo::find("gpt2").expect("in zoo");
    let g = build_forward(&spec, DType::F32).expect("builds");
    let a = cost::training_flops_per_token(
        &g,
        Binding {
            batch: 1,
            seq: 1024,
        },
    );
    let b = cost::training_flops_per_token(
        &g,
        Binding {
            batch: 8,
            seq: 1024,
        },
    );
    // Only the [S, H] position-embedding path is computed once per batch instead of per sequence.
    assert!((a - b).abs() / a < 1e-4, "{a} vs {b}");
}
