//! Each pipeline stage's predicted seconds per step by instruction kind, named as
//! `plait run --op-times` names the runtime's instructions (an op's mnemonic forward,
//! `grad.` and the mnemonic backward, `adamw` for the optimizer), so that a run on the
//! plan's hardware shows where the prediction and the measurement part. Only the plan's
//! own strategy is broken down so (`compile`); the search prices totals.

use std::collections::BTreeMap;

use ir::{OpId, OpKind};

use super::setup::Setup;
use super::work::Pricer;
use crate::cost::compute::{OpTime, TpLayout};

/// Seconds per step (or per micro-batch, while being summed) by instruction kind.
pub type KernelSeconds = BTreeMap<String, f64>;

/// The rest of a stage's step: its communication not hidden behind compute, and its waits
/// in the pipeline (its finish less its kernels).
pub const REST: &str = "(communication, waiting)";

/// One micro-batch of `ops`' kernels by kind: an op's forward under its runtime name
/// ([`runtime_names`]), its backward under its gradient's, a forward the recomputation repeats
/// once more under the forward's. A fused group's time is shared among its ops in proportion
/// to their times unfused, as the runtime runs each op on its own.
pub(super) fn by_kind(
    pricer: &Pricer<'_, '_, '_>,
    ops: &[OpId],
    groups: &[Vec<OpId>],
    layout_of: &dyn Fn(OpId) -> TpLayout,
) -> KernelSeconds {
    let cx = pricer.cx;
    let mut out = KernelSeconds::new();
    pricer.each_kernel(ops, groups, layout_of, |group, t| {
        let alone: Vec<OpTime> = match group {
            [_] => vec![*t],
            _ => group
                .iter()
                .map(|&o| {
                    cx.device
                        .op_time(cx.g, o, cx.b, cx.tp, layout_of(o), cx.act_scale)
                })
                .collect(),
        };
        let share = |part: f64, whole: f64, total: f64| {
            if whole > 0.0 {
                total * part / whole
            } else {
                total / group.len() as f64
            }
        };
        let (fwd_all, bwd_all): (f64, f64) = alone
            .iter()
            .map(|a| (a.fwd, a.bwd))
            .fold((0.0, 0.0), |(f, b), (x, y)| (f + x, b + y));
        for (&o, a) in group.iter().zip(&alone) {
            let (fwd, bwd) = (share(a.fwd, fwd_all, t.fwd), share(a.bwd, bwd_all, t.bwd));
            let again = if pricer.recomputes(o) { fwd } else { 0.0 };
            let (fwd_name, bwd_name) = runtime_names(cx, &cx.g.op(o).kind);
            *out.entry(fwd_name).or_default() += fwd + again;
            *out.entry(bwd_name).or_default() += bwd;
        }
    });
    out
}

/// The instruction kinds the runtime times op `kind`'s forward and backward under
/// (`runtime::exec::op_times::kind`): its mnemonic and `grad.` before it; attention under
/// context parallelism is a context instruction (` (cp)` after); the loss over a vocabulary
/// split across tensor-parallel ranks runs as the vocabulary's loss statistics and gradient.
fn runtime_names(cx: &Setup<'_, '_>, kind: &OpKind) -> (String, String) {
    let vocab_parallel = cx.tp > 1 && cx.info.vocabulary_splits(cx.tp as u32);
    match kind {
        OpKind::Attention { .. } if cx.cp > 1 => (
            "attention (cp)".to_string(),
            "grad.attention (cp)".to_string(),
        ),
        OpKind::CrossEntropy if vocab_parallel => (
            "vocab_loss_stats".to_string(),
            "vocab_loss_grad".to_string(),
        ),
        _ => {
            let name = kind.mnemonic();
            (name.to_string(), format!("grad.{name}"))
        }
    }
}

/// What one stage's kernels are made of: one micro-batch of each run of identical layers
/// (`runs[k]`), of the embedding side and of the head side, and each chunk's layers per run.
pub(super) struct StageKernels<'a> {
    pub pre: &'a KernelSeconds,
    pub post: &'a KernelSeconds,
    pub runs: &'a [KernelSeconds],
    pub chunk_runs: &'a [Vec<u32>],
}

impl StageKernels<'_> {
    /// Stage `d`'s seconds per step by kind: its chunks' layers (chunk c is on stage c mod pp)
    /// over every micro-batch, the embedding on the first chunk's stage, the head on the last
    /// one's, its optimizer step (`optimizer` seconds), and the rest of its `finish` seconds.
    pub fn stage(
        &self,
        cx: &Setup<'_, '_>,
        d: usize,
        optimizer: f64,
        finish: f64,
    ) -> KernelSeconds {
        let (pp, n) = (cx.s.pp.max(1) as usize, self.chunk_runs.len());
        let mb = cx.s.micro_batches() as f64;
        let mut out = KernelSeconds::new();
        let mut add = |kinds: &KernelSeconds, times: f64| {
            for (k, s) in kinds {
                *out.entry(k.clone()).or_default() += s * times;
            }
        };
        for c in (0..n).filter(|c| c % pp == d) {
            for (kinds, &layers) in self.runs.iter().zip(&self.chunk_runs[c]) {
                add(kinds, f64::from(layers) * mb);
            }
            if c == 0 {
                add(self.pre, mb);
            }
            if c + 1 == n {
                add(self.post, mb);
            }
        }
        if optimizer > 0.0 {
            out.insert("adamw".to_string(), optimizer);
        }
        let kernels: f64 = out.values().sum();
        // The stage's kernels run inside its finish: a rest below zero would mean the kinds
        // and the timeline priced the stage apart.
        debug_assert!(kernels <= finish * (1.0 + 1e-9), "{kernels} > {finish}");
        out.insert(REST.to_string(), (finish - kernels).max(0.0));
        // Above a rounding error: the timeline and the kinds sum the same seconds apart.
        out.retain(|_, s| *s > 1e-12 * finish.max(1e-9));
        out
    }
}
