//! The tensor-parallel communication of one layer, read off the sharding extraction of its
//! block ([`crate::sharding_costs::block_plan`]): what the estimate charges a layer per
//! micro-batch is the sum of the collectives of the layout the e-graph chose, not a rule. The
//! embedding and the head are priced the same way from one extraction of the ops outside the
//! layers ([`outer_tp`]).
//!
//! Extractions are cached on the model ([`TpCache`] in [`ModelInfo`]): the search asks for the
//! same block shape (tp, SP, micro-batch, the rank's sequence, precision, kernels) for many
//! strategies. The one input that varies among them without changing the block's work is the
//! number of micro-batches m, through the share 1/m of a parameter gradient's once-per-step
//! reduction. The extraction's objective is `A(L) + G(L)/m` for a layout L (A: its
//! per-micro-batch seconds, G: its per-step reductions), a convex combination of the objectives
//! at share 0 and share 1. So a layout optimal at both ends is optimal for every m: the cache
//! solves those two (one, where the share-0 layout has no per-step reduction) and keys the
//! answer on the shape alone; only where the two ends disagree is the extraction solved again
//! for the strategy's own m.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ir::OpId;

use crate::cost::comm::{Collective, collective_time, mesh_ep};
use crate::cost::compute::{AttentionKernel, Kernels, TpLayout, outer_tp_layout, tp_layout};
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::precision::Precision;
use crate::sharding::{BlockPlan, CollectiveKind, CollectivePlan, Layout, Pass};
use crate::sharding_costs::{block_plan_with_share, embedding_head_plan_with_share};
use crate::strategy::Strategy;

/// One layer's tensor-parallel collectives as the extraction laid them out, in seconds, and
/// how it lays out each op's work.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerTp {
    /// Forward collectives per micro-batch.
    pub fwd_s: f64,
    /// Backward collectives per micro-batch (activation gradients, gathered weights'
    /// gradients), without the once-per-step reductions.
    pub bwd_s: f64,
    /// Parameter gradients reduced once per step (replicated parameters that split ops read:
    /// the sequence-parallel norm weights, row-parallel biases, a router on sequence shards).
    pub per_step_s: f64,
    /// Collectives of one micro-batch's forward and backward, and of the step's reductions.
    pub collectives: usize,
    /// Each computed op of the block: split across the group (reads or writes a piece) or
    /// whole on every rank.
    pub layouts: Arc<BTreeMap<OpId, TpLayout>>,
    /// Each collective of the layout, as the report's communication table lists it.
    pub calls: Arc<Vec<TpCall>>,
}

/// One collective of an extraction's layout, for the report's communication table.
#[derive(Clone, Debug, PartialEq)]
pub struct TpCall {
    pub kind: CollectiveKind,
    /// It runs in the forward (again in the backward under full recomputation).
    pub forward: bool,
    /// A parameter gradient's reduction, once per step rather than per micro-batch.
    pub per_step: bool,
    /// What its buffer holds: `activations`, `activation gradients`, `weights`, `weight
    /// gradients` or `parameter gradients` (the once-per-step reductions).
    pub payload: &'static str,
    /// Its full buffer per rank, bytes at the graph's dtype (as the extraction lists it).
    pub bytes: f64,
}

impl TpCall {
    fn of(bp: &BlockPlan, c: &CollectivePlan) -> TpCall {
        let forward = c.pass == Pass::Forward;
        let of_param = c
            .after_position
            .and_then(|p| bp.ops.iter().find(|o| o.position == p))
            .is_some_and(|o| o.mnemonic == "param");
        // A value gathered (or re-split) again for the backward moves values, not gradients.
        let values = forward
            || c.reason == crate::sharding::REGATHER
            || c.reason == crate::sharding::RESPLIT;
        let payload = match (c.per_step, values, of_param) {
            (true, _, _) => "parameter gradients",
            (false, true, true) => "weights",
            (false, false, true) => "weight gradients",
            (false, true, false) => "activations",
            (false, false, false) => "activation gradients",
        };
        TpCall {
            kind: c.kind,
            forward,
            per_step: c.per_step,
            payload,
            bytes: c.bytes,
        }
    }
}

impl LayerTp {
    /// Reads the price of an extraction made at gradient share `share` (its per-step
    /// reductions' seconds are that share of their time), counting the collectives `mine`
    /// keeps.
    fn of(bp: &BlockPlan, share: f64, mine: impl Fn(&CollectivePlan) -> bool) -> LayerTp {
        let mut t = LayerTp::default();
        let layouts = bp
            .ops
            .iter()
            .filter_map(|op| Some((op.op, split_work(op)?)))
            .map(|(o, split)| {
                (
                    o,
                    if split {
                        TpLayout::Split
                    } else {
                        TpLayout::Replicated
                    },
                )
            });
        t.layouts = Arc::new(layouts.collect());
        let mut calls = Vec::new();
        for c in bp.collectives.iter().filter(|c| mine(c)) {
            t.collectives += 1;
            calls.push(TpCall::of(bp, c));
            match (c.per_step, c.pass) {
                (true, _) if share > 0.0 => t.per_step_s += c.seconds / share,
                (true, _) => {}
                (false, Pass::Forward) => t.fwd_s += c.seconds,
                (false, Pass::Backward) => t.bwd_s += c.seconds,
            }
        }
        t.calls = Arc::new(calls);
        t
    }

    /// The once-per-step gradient reductions as the program runs them: one all-reduce of
    /// them all, bucketed (codegen's per-layer `tpgradreduce`, as Megatron-LM's
    /// `finalize_model_grads` reduces them from one buffer), not one latency each.
    fn bucketed(mut self, info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy) -> LayerTp {
        let (per_step, mut calls): (Vec<TpCall>, Vec<TpCall>) =
            self.calls.iter().cloned().partition(|c| c.per_step);
        let Some(first) = per_step.first() else {
            return self;
        };
        let bytes: f64 = per_step.iter().map(|c| c.bytes).sum();
        let scale = crate::sharding_costs::traffic_scale(info, cluster, s);
        let u = u64::from;
        let group = mesh_ep(cluster, u(s.tp), 1, u(s.dp), u(s.pp), u(s.ep.max(1))).tp;
        self.per_step_s = collective_time(cluster, &group, Collective::AllReduce, bytes * scale);
        self.collectives -= per_step.len() - 1;
        calls.push(TpCall {
            bytes,
            ..first.clone()
        });
        self.calls = Arc::new(calls);
        self
    }

    /// How the extraction lays out op `o`'s work (`None` for an op it does not place).
    pub fn layout_of(&self, o: OpId) -> Option<TpLayout> {
        self.layouts.get(&o).copied()
    }

    /// Backward seconds per micro-batch with the step's reductions shared over `m` of them.
    pub fn bwd_per_micro_batch(&self, micro_batches: u64) -> f64 {
        self.bwd_s + self.per_step_s / micro_batches.max(1) as f64
    }
}

impl OuterTp {
    /// Each side's once-per-step reductions bucketed ([`LayerTp::bucketed`]).
    fn bucketed(self, info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy) -> OuterTp {
        OuterTp {
            pre: self.pre.bucketed(info, cluster, s),
            post: self.post.bucketed(info, cluster, s),
        }
    }
}

/// The embedding's and the head's tensor-parallel collectives as one extraction of the ops
/// outside the layers laid them out ([`embedding_head_plan_with_share`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OuterTp {
    /// The ops before the first layer (token and position embeddings).
    pub pre: LayerTp,
    /// The ops after the last layer (final norm, head, loss).
    pub post: LayerTp,
}

/// Which ops an extraction lays out: one layer's block, or the ops outside the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Segment {
    Layer,
    Outer,
}

/// A segment's price: the layer's, or the embedding's and the head's.
#[derive(Clone, Debug)]
enum Priced {
    Layer(LayerTp),
    Outer(OuterTp),
}

/// What a block's extraction depends on besides the model and the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Shape {
    segment: Segment,
    tp: u32,
    sequence_parallel: bool,
    micro_batch: u64,
    local_seq: u64,
    precision: Precision,
    attention: AttentionKernel,
    kernels: Kernels,
    ep: u32,
    /// The cluster's name (its whole description is checked on a hit: [`TpCache::get`]).
    cluster: String,
    /// `Some(m)` only where the layout depends on the micro-batch count.
    micro_batches: Option<u64>,
}

impl Shape {
    fn of(segment: Segment, cluster: &Cluster, s: &Strategy, micro_batches: Option<u64>) -> Shape {
        Shape {
            segment,
            tp: s.tp,
            sequence_parallel: s.sequence_parallel,
            micro_batch: s.micro_batch,
            local_seq: s.local_seq(),
            precision: s.precision,
            attention: s.attention,
            kernels: s.kernels,
            ep: s.ep,
            cluster: cluster.name.clone(),
            micro_batches,
        }
    }
}

/// A cached answer: the segment's price, or why the extraction cannot price it (the estimate
/// then prices Megatron-LM's rule and says why), or `Depends` where the layout changes with
/// the micro-batch count.
#[derive(Clone, Debug)]
enum Cached {
    Priced(Result<Priced, String>),
    Depends,
}

/// Extractions of one model's block, per [`Shape`], with the cluster each was priced on.
#[derive(Debug, Default)]
pub struct TpCache(Mutex<HashMap<Shape, (Cluster, Cached)>>);

impl Clone for TpCache {
    fn clone(&self) -> TpCache {
        TpCache(Mutex::new(self.entries().clone()))
    }
}

impl TpCache {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Shape, (Cluster, Cached)>> {
        // A panic while the lock was held cannot leave a half-written entry (one insert).
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer for `k` if it was priced on this very cluster (two cluster files may share
    /// a name).
    fn get(&self, k: &Shape, cluster: &Cluster) -> Option<Cached> {
        self.entries()
            .get(k)
            .filter(|(c, _)| c == cluster)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, k: Shape, cluster: &Cluster, v: Cached) {
        self.entries().insert(k, (cluster.clone(), v));
    }
}

/// The layer's tensor-parallel communication as its program runs the extraction codegen
/// lowered (`plan.block_plan`, solved at the strategy's own micro-batch count): no check of
/// its layout against the memory model, which `compile` checked on the lowered program.
pub fn layer_tp_as_lowered(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
) -> Result<LayerTp, String> {
    let (bp, share) = as_lowered(info, cluster, s, Segment::Layer)?;
    Ok(LayerTp::of(&bp, share, |_| true).bucketed(info, cluster, s))
}

/// The embedding's and head's tensor-parallel communication as the program runs the
/// extraction `compile` recorded and codegen lowered (`plan.embedding_head_plan`).
pub fn outer_tp_as_lowered(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
) -> Result<OuterTp, String> {
    let (bp, share) = as_lowered(info, cluster, s, Segment::Outer)?;
    Ok(outer_of(info, &bp, share).bucketed(info, cluster, s))
}

/// A segment's extraction at the strategy's own micro-batch count, as `compile` recorded it,
/// and the gradient share it was solved at.
fn as_lowered(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    segment: Segment,
) -> Result<(BlockPlan, f64), String> {
    let share = 1.0 / s.micro_batches().max(1) as f64;
    extract(info, cluster, s, segment, share).map(|bp| (bp, share))
}

/// The layer's tensor-parallel communication under strategy `s` (tp > 1), from the extraction
/// of its block; `Err` says why the extraction cannot price it. Beside expert or context
/// parallelism too: codegen runs them around the extraction's layout, whose collectives
/// inside the tensor-parallel group are the extraction's.
pub fn layer_tp(info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy) -> Result<LayerTp, String> {
    match segment_tp(info, cluster, s, Segment::Layer)? {
        Priced::Layer(t) => Ok(t),
        Priced::Outer(_) => Err("the layer's extraction priced as the embedding's".into()),
    }
}

/// The embedding's and head's tensor-parallel communication under strategy `s` (tp > 1),
/// from the extraction of the ops outside the layers; `Err` says why it cannot price them.
pub fn outer_tp(info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy) -> Result<OuterTp, String> {
    match segment_tp(info, cluster, s, Segment::Outer)? {
        Priced::Outer(t) => Ok(t),
        Priced::Layer(_) => Err("the embedding's extraction priced as a layer's".into()),
    }
}

/// A segment's price from the cache, solving what is missing.
fn segment_tp(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    segment: Segment,
) -> Result<Priced, String> {
    let shape = Shape::of(segment, cluster, s, None);
    let cached = match info.tp_extractions.get(&shape, cluster) {
        Some(c) => c,
        None => {
            let c = solve_both_ends(info, cluster, s, segment);
            info.tp_extractions.put(shape, cluster, c.clone());
            c
        }
    };
    match cached {
        Cached::Priced(p) => p,
        Cached::Depends => {
            let m = s.micro_batches().max(1);
            let own = Shape::of(segment, cluster, s, Some(m));
            if let Some(Cached::Priced(p)) = info.tp_extractions.get(&own, cluster) {
                return p;
            }
            let share = 1.0 / m as f64;
            let p = extract(info, cluster, s, segment, share)
                .and_then(|bp| price(info, cluster, s, &bp, share, segment));
            info.tp_extractions
                .put(own, cluster, Cached::Priced(p.clone()));
            p
        }
    }
}

fn extract(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    segment: Segment,
    share: f64,
) -> Result<BlockPlan, String> {
    match segment {
        Segment::Layer => block_plan_with_share(info, cluster, s, Some(share)),
        Segment::Outer => embedding_head_plan_with_share(info, cluster, s, Some(share)),
    }
    .map_err(|e| e.to_string())
}

/// Solves the extraction at gradient share 0, and at share 1 where needed: a share-0 layout
/// without per-step reductions costs the same at every share and nothing costs less (G >= 0),
/// so it is optimal for every micro-batch count; otherwise the share-1 layout is, when its
/// per-micro-batch seconds are also the share-0 optimum.
fn solve_both_ends(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    segment: Segment,
) -> Cached {
    let free = match extract(info, cluster, s, segment, 0.0) {
        Ok(bp) => bp,
        Err(e) => return Cached::Priced(Err(e)),
    };
    if !free.collectives.iter().any(|c| c.per_step) {
        return Cached::Priced(price(info, cluster, s, &free, 0.0, segment));
    }
    let whole = match extract(info, cluster, s, segment, 1.0) {
        Ok(bp) => bp,
        Err(e) => return Cached::Priced(Err(e)),
    };
    let per_step = LayerTp::of(&whole, 1.0, |_| true).per_step_s;
    let per_micro_batch = whole.solve.objective_seconds - per_step;
    let best_free = free.solve.objective_seconds;
    if per_micro_batch <= best_free + 1e-12 * best_free.abs() {
        Cached::Priced(price(info, cluster, s, &whole, 1.0, segment))
    } else {
        Cached::Depends
    }
}

/// The extraction's price, where its layout computes what the estimate's compute and memory
/// model charge: each product, attention, norm, dropout and loss split across the group
/// exactly where Megatron-LM's layout splits it ([`tp_layout`]; with SP the norms and dropout
/// on sequence shards), and none computed twice. A layout that keeps more of the block whole
/// (the e-graph's optimum where the activations it keeps cost nothing in its objective) is not
/// what the plan's memory was proven for, so its collectives are not priced as the plan's.
/// (Weights the extraction gathers from their stored shards are priced: `compile` checks the
/// lowered program's memory against the plan's, and a plan whose program runs Megatron's
/// rules instead is priced by them, [`crate::estimate::TpPricing::Rules`].)
fn price(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    bp: &BlockPlan,
    share: f64,
    segment: Segment,
) -> Result<Priced, String> {
    let g = info.graph;
    for op in &bp.ops {
        if !carries_work(&g.op(op.op).kind) {
            continue;
        }
        // A norm over all of q's or k's heads has no Megatron layout (its heads split): the
        // estimate charges it as the extraction computes it (on sequence shards or whole
        // rows), and `compile` checks the program's memory against the plan's.
        if info.norms_across_heads.contains(&op.op) && op.instances == 1 {
            continue;
        }
        let split = split_work(op).unwrap_or(false);
        let megatron = match segment {
            Segment::Layer => tp_layout(g, op.op, info.hidden, s.sequence_parallel),
            Segment::Outer => outer_tp_layout(
                g,
                op.op,
                info.hidden,
                info.vocab,
                info.vocabulary_splits(s.tp),
                s.sequence_parallel,
            ),
        } == TpLayout::Split;
        if split != megatron || op.instances > 1 {
            return Err(format!(
                "the extraction computes {} (position {}) {}, which the plan's compute and memory \
                 model does not price",
                op.mnemonic,
                op.position,
                match (split, op.instances > 1) {
                    (_, true) => "in two layouts",
                    (true, _) => "split across the group",
                    (false, _) => "whole on every rank",
                }
            ));
        }
    }
    Ok(match segment {
        Segment::Layer => {
            Priced::Layer(LayerTp::of(bp, share, |_| true).bucketed(info, cluster, s))
        }
        Segment::Outer => Priced::Outer(outer_of(info, bp, share).bucketed(info, cluster, s)),
    })
}

/// Splits the outer extraction's collectives between the embedding (those after, or of a
/// value made by, an op before the layers) and the head (the rest).
fn outer_of(info: &ModelInfo<'_>, bp: &BlockPlan, share: f64) -> OuterTp {
    let g = info.graph;
    let before_layers = |c: &CollectivePlan| {
        c.after_op
            .or_else(|| c.value.map(|v| g.def_op(v)))
            .is_some_and(|o| info.pre_ops.contains(&o))
    };
    OuterTp {
        pre: LayerTp::of(bp, share, before_layers),
        post: LayerTp::of(bp, share, |c| !before_layers(c)),
    }
}

/// The ops whose layout decides a segment's compute and kept activations: products,
/// attention, norms, dropout and the loss (reshapes, splits, point-wise ops and table lookups
/// follow their neighbours).
fn carries_work(kind: &ir::OpKind) -> bool {
    use ir::OpKind as K;
    matches!(
        kind,
        K::Linear { .. }
            | K::MatMul
            | K::Attention { .. }
            | K::MoeExperts { .. }
            | K::LayerNorm { .. }
            | K::RmsNorm { .. }
            | K::Dropout { .. }
            | K::CrossEntropy
    )
}

/// Whether the extraction splits op `op`'s work across the group: it writes a piece or a
/// partial sum, or reads a piece (a row-parallel product reads split operands and records its
/// reduced output). `None` for an op the program does not compute.
fn split_work(op: &crate::sharding::OpPlan) -> Option<bool> {
    let out = op.output.as_ref()?;
    Some(
        matches!(out, Layout::Split { .. } | Layout::Partial)
            || op.inputs.iter().any(|l| matches!(l, Layout::Split { .. })),
    )
}
