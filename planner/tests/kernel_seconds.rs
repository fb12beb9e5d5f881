//! `predicted.stages[].kernel_s`: each stage's predicted seconds per step by instruction
//! kind, which `plait run --op-times` shows beside what it measures. The kinds add up to the
//! stage's finish (nothing priced is lost or counted twice), and each sits on the stage that
//! runs it.
#![allow(clippy::unwrap_used)]

mod common;

use import::build_forward;
use planner::estimate::{Pricing, estimate_traced};
use planner::{Cluster, ModelInfo, Recompute, Strategy};

fn spec() -> import::ModelSpec {
    common::small_gpt2()
}

/// `pp` stages of one GPU each, micro-batches of 1 sequence of 128 tokens, bf16.
fn strategy(pp: u32, recompute: Recompute) -> Strategy {
    Strategy {
        pp,
        recompute,
        seq: 128,
        ..common::tp_strategy(1, false, 1)
    }
}

#[test]
fn each_stage_s_kinds_add_up_to_its_finish() {
    let g = build_forward(&spec(), ir::DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-h100").unwrap();
    for pp in [1, 2] {
        let s = strategy(pp, Recompute::None);
        let e = estimate_traced(&info, &cluster, u64::from(pp), &s, Pricing::SEARCH).unwrap();
        assert_eq!(e.predicted.stages.len(), pp as usize);
        for st in &e.predicted.stages {
            let sum: f64 = st.kernel_s.values().sum();
            assert!(
                (sum - st.finish_s).abs() <= 1e-9 * st.finish_s,
                "stage {}: kinds {sum} against finish {}",
                st.stage,
                st.finish_s
            );
            for k in [
                "linear",
                "grad.linear",
                "attention",
                "grad.attention",
                "adamw",
            ] {
                assert!(st.kernel_s.contains_key(k), "no {k}: {:?}", st.kernel_s);
            }
        }
        let first = &e.predicted.stages[0].kernel_s;
        let last = &e.predicted.stages[pp as usize - 1].kernel_s;
        assert!(first.contains_key("embedding") && last.contains_key("cross_entropy"));
        if pp == 2 {
            assert!(!first.contains_key("cross_entropy") && !last.contains_key("embedding"));
        }
        // The search's estimate breaks nothing down (it prices thousands of candidates).
        let plain = planner::estimate::estimate(&info, &cluster, u64::from(pp), &s).unwrap();
        assert!(plain.predicted.stages.iter().all(|s| s.kernel_s.is_empty()));
        assert_eq!(
            plain.predicted.iteration_time_s,
            e.predicted.iteration_time_s
        );
    }
}

/// Full recomputation repeats each forward kernel in the backward: the forward kinds take it,
/// the backward kinds do not change.
#[test]
fn a_recomputed_forward_is_counted_under_its_own_kind_again() {
    let g = build_forward(&spec(), ir::DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-h100").unwrap();
    let kinds = |r| {
        estimate_traced(&info, &cluster, 1, &strategy(1, r), Pricing::SEARCH)
            .unwrap()
            .predicted
            .stages[0]
            .kernel_s
            .clone()
    };
    let (none, full) = (kinds(Recompute::None), kinds(Recompute::Full));
    let layer_share = |k: &str| full[k] / none[k];
    assert!((layer_share("grad.linear") - 1.0).abs() < 1e-9);
    // Every linear in the layers runs twice (a head outside them, were it one, once).
    assert!(layer_share("linear") > 1.5 && layer_share("linear") <= 2.0 + 1e-9);
    assert!((layer_share("attention") - 2.0).abs() < 1e-9);
}

/// Fused kernels are shared out among their ops (the runtime times each op apart): every op
/// kind of the eager breakdown is named in the fused one too, and the step still adds up.
#[test]
fn a_fused_group_s_time_is_shared_among_its_ops() {
    let mut spec = spec();
    spec.dropout = 0.1;
    let g = build_forward(&spec, ir::DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-h100").unwrap();
    let kinds = |kernels| {
        let s = Strategy {
            kernels,
            ..strategy(1, Recompute::None)
        };
        let e = estimate_traced(&info, &cluster, 1, &s, Pricing::SEARCH).unwrap();
        let st = e.predicted.stages[0].clone();
        let sum: f64 = st.kernel_s.values().sum();
        assert!((sum - st.finish_s).abs() <= 1e-9 * st.finish_s);
        st.kernel_s
    };
    let fused = kinds(planner::cost::compute::Kernels::Fused);
    let eager = kinds(planner::cost::compute::Kernels::Eager);
    for k in eager.keys().filter(|k| !k.starts_with('(')) {
        assert!(fused.get(k).is_some_and(|&s| s > 0.0), "{k}: {fused:?}");
    }
    // Fused, the point-wise ops stream once per group: they take less than eager.
    assert!(fused["dropout"] + fused["add"] < eager["dropout"] + eager["add"]);
}

/// Attention under context parallelism is timed by the runtime as a context instruction
/// (`attention (cp)`), and the loss over a vocabulary split across tensor-parallel ranks as the
/// vocabulary's statistics and gradient: the prediction names them so.
#[test]
fn kinds_take_the_runtime_s_names_under_context_and_tensor_parallelism() {
    let g = build_forward(&spec(), ir::DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-h100").unwrap();
    let kinds = |s: Strategy| {
        let gpus = u64::from(s.tp * s.cp);
        estimate_traced(&info, &cluster, gpus, &s, Pricing::SEARCH)
            .unwrap()
            .predicted
            .stages[0]
            .kernel_s
            .clone()
    };
    let cp = kinds(Strategy {
        cp: 2,
        attention: planner::cost::compute::AttentionKernel::Fused,
        ..strategy(1, Recompute::None)
    });
    assert!(cp.contains_key("attention (cp)") && cp.contains_key("grad.attention (cp)"));
    assert!(!cp.contains_key("attention"), "{cp:?}");
    let tp = kinds(Strategy {
        tp: 2,
        ..strategy(1, Recompute::None)
    });
    assert!(tp.contains_key("vocab_loss_stats") && tp.contains_key("vocab_loss_grad"));
    assert!(!tp.contains_key("cross_entropy"), "{tp:?}");
}
