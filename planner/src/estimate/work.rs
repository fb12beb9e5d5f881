//! The per-micro-batch work of a layer, the embedding side and the head side: each group of
//! fused kernels' compute, and the tensor-, context- and expert-parallel communication beside
//! it, priced for the layouts the strategy's [`Pricing`](super::Pricing) names.

use ir::OpId;

use super::setup::{CpRing, Setup};
use super::{ExpertDispatch, LayerTpComm, Mode, TpPricing, Work, row_parallel_ops};
use crate::cost::compute::{Kernels, OpTime, TpLayout, outer_tp_layout, tp_layout};
use crate::layer_tp::{LayerTp, OuterTp};
use crate::model::ModelInfo;
use crate::strategy::Recompute;

/// The tensor-parallel layouts and collective seconds (forward, backward per micro-batch) of
/// the layer and of the ops before and after the layers.
pub(super) struct TpPrices {
    pub layer: Option<Result<LayerTp, String>>,
    outer: Option<Result<OuterTp, String>>,
    pub layer_times: (f64, f64),
    pub pre_times: (f64, f64),
    pub post_times: (f64, f64),
}

impl TpPrices {
    /// The collectives of the layer of `run` (one run of identical layers of the model): those
    /// of the layout the sharding extraction chose for its block, where it has one; of the ops
    /// before and after the layers, the extraction of them, else Megatron-LM's (a
    /// vocabulary-parallel embedding reduces its output).
    pub fn of_run(cx: &Setup<'_, '_>, mode: Mode<'_>, run: &ModelInfo<'_>) -> TpPrices {
        let (info, cluster, s) = (cx.info, cx.cluster, cx.s);
        let rule = |ops: &[OpId]| {
            let n = row_parallel_ops(cx.g, ops, info.hidden);
            let t = cx.tp_collective(n);
            (t, t + cx.tp_regather(n))
        };
        let layer = (cx.tp > 1).then(|| match mode.tp.layer {
            TpPricing::Extraction => crate::layer_tp::layer_tp(run, cluster, s),
            TpPricing::Lowered => crate::layer_tp::layer_tp_as_lowered(run, cluster, s),
            TpPricing::Rules(why) => Err(why.to_string()),
        });
        let layer_times = match &layer {
            Some(Ok(t)) => (t.fwd_s, t.bwd_per_micro_batch(s.micro_batches())),
            _ => rule(&run.layer_ops),
        };
        let outer = (cx.tp > 1).then(|| match mode.tp.embedding_head {
            TpPricing::Extraction => crate::layer_tp::outer_tp(info, cluster, s),
            TpPricing::Lowered => crate::layer_tp::outer_tp_as_lowered(info, cluster, s),
            TpPricing::Rules(why) => Err(why.to_string()),
        });
        let mb = s.micro_batches();
        let (pre_times, post_times) = match &outer {
            Some(Ok(t)) => (
                (t.pre.fwd_s, t.pre.bwd_per_micro_batch(mb)),
                (t.post.fwd_s, t.post.bwd_per_micro_batch(mb)),
            ),
            // A vocabulary that does not split keeps the table whole: no embedding reduction.
            _ if !info.vocabulary_splits(s.tp) => ((0.0, 0.0), rule(&info.post_ops)),
            _ => (rule(&info.pre_ops), rule(&info.post_ops)),
        };
        TpPrices {
            layer,
            outer,
            layer_times,
            pre_times,
            post_times,
        }
    }

    /// What `predicted.layer_tp_comm` reports.
    pub fn layer_comm(&self) -> Option<LayerTpComm> {
        self.layer
            .as_ref()
            .map(|t| LayerTpComm::of(t.as_ref().map(|t| t.collectives), self.layer_times))
    }

    /// What `predicted.embedding_tp_comm` (`pre`) or `predicted.head_tp_comm` reports.
    pub fn outer_comm(&self, pre: bool) -> Option<LayerTpComm> {
        let times = if pre { self.pre_times } else { self.post_times };
        self.outer.as_ref().map(|t| {
            let collectives = t
                .as_ref()
                .map(|t| if pre { &t.pre } else { &t.post }.collectives);
            LayerTpComm::of(collectives, times)
        })
    }

    /// How a layer's op splits its work: as the layer's extraction lays it out where it
    /// priced the layer, else as Megatron-LM's layout.
    pub fn layer_layout(&self, cx: &Setup<'_, '_>, o: OpId) -> TpLayout {
        let rule = || tp_layout(cx.g, o, cx.info.hidden, cx.s.sequence_parallel);
        match &self.layer {
            Some(Ok(t)) => t.layout_of(o).unwrap_or_else(rule),
            _ => rule(),
        }
    }

    /// How an op outside the layers splits its work, likewise.
    pub fn outer_layout(&self, cx: &Setup<'_, '_>, o: OpId) -> TpLayout {
        let info = cx.info;
        let rule = || {
            outer_tp_layout(
                cx.g,
                o,
                info.hidden,
                info.vocab,
                info.vocabulary_splits(cx.s.tp),
                cx.s.sequence_parallel,
            )
        };
        match &self.outer {
            Some(Ok(t)) => t.pre.layout_of(o).unwrap_or_else(rule),
            _ => rule(),
        }
    }
}

/// Prices the work of op groups for one strategy.
pub(super) struct Pricer<'c, 'a, 'g> {
    pub cx: &'c Setup<'a, 'g>,
    pub ring: CpRing,
    pub ep: ExpertDispatch,
}

impl Pricer<'_, '_, '_> {
    /// One micro-batch of `ops` (fused into `groups` with fused kernels), with tensor-parallel
    /// collectives of `tp_times` (forward, backward), each op's work split as `layout_of` says.
    pub fn work(
        &self,
        ops: &[OpId],
        groups: &[Vec<OpId>],
        tp_times: (f64, f64),
        layout_of: &dyn Fn(OpId) -> TpLayout,
    ) -> Work {
        let mut w = self.compute(ops, groups, layout_of);
        (w.tp_fwd, w.tp_bwd) = tp_times;
        let cx = self.cx;
        let s = cx.s;
        if cx.overlaps(s.overlap.tp_comm) && s.engine.tp_overlap_runs(cx.info) {
            // Transformer Engine's userbuffer overlap pipelines each TP all-gather and
            // reduce-scatter with the GEMM that consumes or produces it: only communication
            // longer than those GEMMs shows.
            w.tp_fwd = (w.tp_fwd - w.gemm_fwd).max(0.0);
            w.tp_bwd = (w.tp_bwd - w.gemm_bwd).max(0.0);
        }
        let (ring_fwd, ring_bwd) = self.ring.exposed(w.attn_fwd, w.attn_bwd);
        w.fwd += ring_fwd;
        w.bwd += ring_bwd;
        w.cp_comm = ring_fwd + ring_bwd;
        let (ep_fwd, ep_bwd) = self.ep.times(cx.g, ops);
        w.fwd += ep_fwd;
        w.bwd += ep_bwd;
        w.ep_comm = ep_fwd + ep_bwd;
        w.ep_fwd = ep_fwd;
        if s.recompute == Recompute::Full {
            w.recompute += w.tp_fwd + ep_fwd;
        }
        w
    }

    /// Each kernel of `ops` (each fused group with fused kernels, else each op) timed on the
    /// device for one micro-batch: `visit` gets its ops (first op first) and its time.
    pub fn each_kernel(
        &self,
        ops: &[OpId],
        groups: &[Vec<OpId>],
        layout_of: &dyn Fn(OpId) -> TpLayout,
        mut visit: impl FnMut(&[OpId], &OpTime),
    ) {
        let cx = self.cx;
        let (g, s) = (cx.g, cx.s);
        let mut priced = |group: &[OpId]| {
            let Some(&o) = group.first() else {
                return;
            };
            let t = cx
                .device
                .fused_time(g, group, cx.b, cx.tp, layout_of(o), cx.act_scale);
            visit(group, &t);
        };
        if s.kernels == Kernels::Fused {
            groups.iter().for_each(|group| priced(group));
        } else {
            ops.iter().for_each(|&o| priced(&[o]));
        }
    }

    /// Whether the backward repeats `o`'s forward: what the strategy's recomputation repeats,
    /// and a transposed copy of a weight (a tied head's `wteᵀ`), which plait's program
    /// transposes again for the backward rather than keeping per micro-batch in flight
    /// (codegen's `rebuilt_activation`).
    pub fn recomputes(&self, o: OpId) -> bool {
        let g = self.cx.g;
        let op = g.op(o);
        let attention_core = matches!(op.kind, ir::OpKind::Attention { .. });
        let r = self.cx.s.recompute;
        r == Recompute::Full
            || (r == Recompute::Selective && attention_core)
            || transposes_a_weight(g, o)
    }

    /// The kernels' compute alone: each fused group (or each op) timed on the device, the
    /// attention core and the GEMMs noted apart, what recomputation repeats.
    fn compute(
        &self,
        ops: &[OpId],
        groups: &[Vec<OpId>],
        layout_of: &dyn Fn(OpId) -> TpLayout,
    ) -> Work {
        let g = self.cx.g;
        let mut w = Work::default();
        self.each_kernel(ops, groups, layout_of, |group, t| {
            let o = group[0];
            w.fwd += t.fwd;
            w.bwd += t.bwd;
            w.fwd_flops += t.fwd_flops;
            if matches!(g.op(o).kind, ir::OpKind::Attention { .. }) {
                w.attn_fwd += t.fwd;
                w.attn_bwd += t.bwd;
            }
            if matches!(
                g.op(o).kind,
                ir::OpKind::Linear { .. } | ir::OpKind::MoeExperts { .. }
            ) {
                w.gemm_fwd += t.fwd;
                w.gemm_bwd += t.bwd;
            }
            if self.recomputes(o) {
                w.recompute += t.fwd;
                w.recompute_flops += t.fwd_flops;
            }
        });
        w
    }
}

/// Whether `o` transposes a parameter (its result a copy of the weight, not an activation).
fn transposes_a_weight(g: &ir::Graph, o: OpId) -> bool {
    let op = g.op(o);
    matches!(op.kind, ir::OpKind::Transpose { .. })
        && op
            .inputs
            .first()
            .is_some_and(|&x| matches!(g.op(g.def_op(x)).kind, ir::OpKind::Param { .. }))
}
