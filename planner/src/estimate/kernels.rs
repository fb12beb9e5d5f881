//! Each pipeline stage's predicted seconds per step by instruction kind, named as
//! `plait run --op-times` names the runtime's instructions (an op's mnemonic forward,
//! `grad.` and the mnemonic backward, `adamw` for the optimizer), so that a run on the
//! plan's hardware shows where the prediction and the measurement part. Only the plan's
//! own strategy is broken down so (`compile`); the search prices totals.

use std::collections::BTreeMap;

use ir::OpId;

use super::setup::Setup;
use super::work::Pricer;
use crate::cost::compute::TpLayout;

/// Seconds per step (or per micro-batch, while being summed) by instruction kind.
pub type KernelSeconds = BTreeMap<String, f64>;

/// The rest of a stage's step: its communication not hidden behind compute, and its waits
/// in the pipeline (its finish less its kernels).
pub const REST: &str = "(communication, waiting)";

/// One micro-batch of `ops`' kernels by kind: a kernel's forward under its first op's
/// mnemonic, its backward under `grad.` and the mnemonic, a forward the recomputation repeats
/// once more under the forward's.
pub(super) fn by_kind(
    pricer: &Pricer<'_, '_, '_>,
    ops: &[OpId],
    groups: &[Vec<OpId>],
    layout_of: &dyn Fn(OpId) -> TpLayout,
) -> KernelSeconds {
    let g = pricer.cx.g;
    let mut out = KernelSeconds::new();
    pricer.each_kernel(ops, groups, layout_of, |o, t| {
        let name = g.op(o).kind.mnemonic();
        let again = if pricer.recomputes(o) { t.fwd } else { 0.0 };
        *out.entry(name.to_string()).or_default() += t.fwd + again;
        *out.entry(format!("grad.{name}")).or_default() += t.bwd;
    });
    out
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
        out.insert(REST.to_string(), finish - kernels);
        // Above a rounding error: the timeline and the kinds sum the same seconds apart.
        out.retain(|_, s| *s > 1e-12 * finish.max(1e-9));
        out
    }
}
