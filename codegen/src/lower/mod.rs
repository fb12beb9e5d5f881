//! Lowering: training graph + plan + cluster → one program template per pipeline stage.
//!
//! Each template runs, once, an initialization (the reserve, persistent parameter, gradient
//! and optimizer buffers by ZeRO stage, parameter loading), then per iteration: zeroed gradient
//! accumulators; the device's (chunk, micro-batch, forward|backward) tasks in the schedule's
//! order (`planner::cost::pipeline::device_order`, with warm-up, steady state and cool-down
//! marked); tied-embedding gradient sums; the optimizer step on the rank's own state.
//!
//! ZeRO (Rajbhandari et al. SC'20), as the cost model counts it: stage 0 all-reduces each
//! layer's gradients (one bucket per layer, issued right after that layer's backward of the
//! last micro-batch, so it overlaps the remaining backward); stage 1 reduce-scatters them there
//! instead and all-gathers the updated weights; stage 2 reduce-scatters every micro-batch's
//! gradients of a layer right after its backward (they are never held whole); stage 3 also
//! keeps only the rank's slice of the weights and all-gathers a layer's parameters before its
//! forward, its recompute and its backward, freeing them after.

pub mod builder;
pub mod emit;
mod extracted;
mod grads;
pub mod partial;
pub mod segment;
mod stage;
mod tasks;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use ir::{Graph, OpId, OpKind};
use planner::cost::compute::AttentionKernel;
use planner::cost::pipeline::device_order;
use planner::plan::Plan;
use planner::{ModelInfo, Precision, Recompute};

use self::builder::Builder;
use self::emit::{Contribution, Env, Inst, Instance};
use self::segment::{Ctx, Kind, Lay, Segment, Source};
use crate::error::CodegenError;
use crate::ids::{BucketId, BufferId, ParamId, TemplateId};
use crate::program::{
    Algorithm, CollectiveOp, Elem, FORMAT, Instr, MeshInfo, ParamInfo, ParamShard, Pass, Peer,
    Phase, Predicted, ProgramSet, Purpose, Role, Slot, Template, TpSplit, tag,
};

/// Lowering options.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Options {
    pub adamw: ir::AdamWConfig,
}

/// The plan's model graph, parsed from the IR text the plan carries (`model.ir`).
pub fn load_graph(plan: &Plan) -> Result<Graph, CodegenError> {
    let text = plan.model.ir.as_deref().ok_or_else(|| {
        CodegenError::plan(
            "model.ir",
            format!(
                "the plan does not carry its model's graph (plans written before it was \
                 recorded); load `{}` and set it, or compile the model again",
                plan.model.reference
            ),
        )
    })?;
    ir::text::parse(text).map_err(|source| CodegenError::ModelIr { source })
}

/// The segment lowering's context for `plan`, whose context parallelism of degree `cp` is
/// already folded into data parallelism ([`context_as_data`]): degrees, shapes, element types
/// and the vocabulary-parallel choice.
fn segment_ctx<'g>(plan: &Plan, graph: &'g Graph, info: &ModelInfo<'_>, cp: u32) -> Ctx<'g> {
    let s = &plan.strategy;
    let tp = s.tp;
    let (act, weight) = match s.precision {
        Precision::Fp32 => (Elem::F32, Elem::F32),
        Precision::Fp16 => (Elem::F16, Elem::F16),
        Precision::Bf16 | Precision::Fp8 | Precision::Fp8Tensorwise => (Elem::Bf16, Elem::Bf16),
    };
    Ctx {
        graph,
        tp,
        sp: s.sequence_parallel && tp > 1,
        batch: s.micro_batch,
        seq: s.seq / u64::from(cp),
        act,
        weight,
        logits_grad: if s.engine.logits_grad_in_compute_dtype() {
            act
        } else {
            Elem::F32
        },
        seq_shard: false,
        fused_attention: s.attention == AttentionKernel::Fused,
        vocab_parallel: tp > 1 && info.vocabulary_splits(tp),
        padded_vocab: info.vocabulary_padding(tp),
        ep: s.ep.max(1),
        cp,
    }
}

/// `plan` with its context parallelism folded into data parallelism ([`context_as_data`]),
/// and the context-parallel degree it had.
fn with_context_folded(plan: &Plan) -> Result<(Cow<'_, Plan>, u32), CodegenError> {
    let cp = plan.strategy.cp.max(1);
    let plan = if cp > 1 {
        Cow::Owned(context_as_data(plan, cp)?)
    } else {
        Cow::Borrowed(plan)
    };
    Ok((plan, cp))
}

/// The head's context: with sequence parallelism the head and loss run on the rank's sequence
/// shard (the logits are [b, s/tp, V] and the loss is the mean of the shards' means), except
/// a vocabulary-parallel head, which runs on the whole sequence, gathered before its
/// column-parallel product.
fn head_ctx<'g>(cx: &Ctx<'g>) -> Ctx<'g> {
    let seq_shard = cx.sp && !cx.vocab_parallel;
    Ctx {
        seq: if seq_shard {
            cx.seq / u64::from(cx.tp)
        } else {
            cx.seq
        },
        seq_shard,
        ..*cx
    }
}

/// Whether the embedding and the head lower as the plan's extraction of them
/// (`plan.embedding_head_plan`) lays them out: `Ok(None)` where they do (or nothing was
/// recorded), `Ok(Some(why))` naming the first op where the program differs (it runs the
/// segment rules: the vocabulary-parallel embedding and head where the vocabulary splits,
/// both whole otherwise).
pub fn embedding_head_mismatch(plan: &Plan, graph: &Graph) -> Result<Option<String>, CodegenError> {
    let Some(bp) = &plan.embedding_head_plan else {
        return Ok(None);
    };
    let (plan, cp) = with_context_folded(plan)?;
    let info = ModelInfo::new(graph).map_err(|e| CodegenError::plan("model", e.to_string()))?;
    let cx = segment_ctx(plan.as_ref(), graph, &info, cp);
    let pre = segment::lower(&cx, &info.pre_ops, Kind::Pre)?;
    let post = segment::lower(&head_ctx(&cx), &info.post_ops, Kind::Post)?;
    let n = info.pre_ops.len();
    Ok(segment::differs_in(&pre, bp, 0..n)
        .map(|d| format!("the embedding: {d}"))
        .or_else(|| {
            segment::differs_in(&post, bp, n..n + info.post_ops.len())
                .map(|d| format!("the head: {d}"))
        }))
}

/// A layer of run `run` of identical layers as the plan's sharding extraction of that run lays
/// it out when this lowering has every form it needs ([`extracted::lower`]), otherwise by the
/// segment rules.
fn layer_segment(
    plan: &Plan,
    cx: &Ctx<'_>,
    run: usize,
    layer_ops: &[OpId],
) -> Result<Segment, CodegenError> {
    layer_or_why(plan, cx, run, layer_ops).map(|(layer, _)| layer)
}

/// [`layer_segment`], and why the extraction did not lower where the rules lowered the layer.
fn layer_or_why(
    plan: &Plan,
    cx: &Ctx<'_>,
    run: usize,
    layer_ops: &[OpId],
) -> Result<(Segment, Option<String>), CodegenError> {
    let why = match plan.run_block_plan(run).filter(|_| cx.tp > 1) {
        Some(bp) => match extracted::lower(cx, layer_ops, bp) {
            Ok(layer) => return Ok((layer, None)),
            Err(why) => Some(why),
        },
        None => None,
    };
    Ok((segment::lower(cx, layer_ops, Kind::Layer)?, why))
}

/// Whether the segment rules alone lay every run's layer out as the plan's extractions do
/// (then the extraction is Megatron's layout and lowering it changes nothing). `true` without
/// one; `false` where the rules do not lower the layer at all (a layout only the extraction
/// has: two key/value heads over four ranks beside a partial rotary) or the plan does not
/// lower (which lowering it says).
pub fn rules_match_extraction(plan: &Plan, graph: &Graph) -> bool {
    let rules_only = |_: &Plan, cx: &Ctx<'_>, _: usize, layer_ops: &[OpId]| {
        segment::lower(cx, layer_ops, Kind::Layer).map(|layer| (layer, None))
    };
    layer_against_extraction(plan, graph, rules_only).is_ok_and(|m| m.is_none())
}

/// Whether the layer `lower` emits for `plan` is the plan's recorded sharding extraction
/// (`plan.block_plan`): every op of the block computes its result, and reads its activation
/// operands, in the layout the extraction chose, and its parameters are held as the
/// extraction holds them. `Ok(None)`: it is; `Ok(Some(why))`: the first op where they differ
/// (the program then follows the segment lowering's own rules); `Err`: the layer does not
/// lower at all. A plan without a recorded extraction is trivially its own.
pub fn extraction_mismatch(plan: &Plan, graph: &Graph) -> Result<Option<String>, CodegenError> {
    layer_against_extraction(plan, graph, layer_or_why)
}

/// The first op where a layer `lower_layer` makes for `plan` differs from its run's
/// extraction, naming the run's layers where the block changes structure.
fn layer_against_extraction(
    plan: &Plan,
    graph: &Graph,
    lower_layer: impl Fn(
        &Plan,
        &Ctx<'_>,
        usize,
        &[OpId],
    ) -> Result<(Segment, Option<String>), CodegenError>,
) -> Result<Option<String>, CodegenError> {
    if plan.block_plan.is_none() {
        return Ok(None);
    }
    let (plan, cp) = with_context_folded(plan)?;
    let plan = plan.as_ref();
    let info = ModelInfo::new(graph).map_err(|e| CodegenError::plan("model", e.to_string()))?;
    let cx = segment_ctx(plan, graph, &info, cp);
    let runs = info.runs();
    for (r, run) in runs.iter().enumerate() {
        let Some(bp) = plan.run_block_plan(r) else {
            continue;
        };
        let (layer, why_not_extracted) = lower_layer(plan, &cx, r, &run.info.layer_ops)?;
        let Some(differs) = segment::differs_from(&layer, bp) else {
            continue;
        };
        let differs = match why_not_extracted {
            Some(why) => {
                format!("the extraction does not lower ({why}), and the rules differ: {differs}")
            }
            None => differs,
        };
        return Ok(Some(if runs.len() > 1 {
            let last = run.first + run.count - 1;
            format!("layers {}-{last}: {differs}", run.first)
        } else {
            differs
        }));
    }
    Ok(None)
}

/// Generates every rank's program for `plan` on the model's forward `graph`.
pub fn lower(plan: &Plan, graph: &Graph, opts: Options) -> Result<ProgramSet, CodegenError> {
    let (plan, cp) = with_context_folded(plan)?;
    let plan = plan.as_ref();
    let s = &plan.strategy;
    let info = ModelInfo::new(graph).map_err(|e| CodegenError::plan("model", e.to_string()))?;
    let (tp, dp, pp) = (s.tp, s.dp, s.pp);
    if u64::from(tp) * u64::from(dp) * u64::from(pp) != plan.gpus {
        return Err(CodegenError::plan(
            "strategy",
            "tp x dp x pp differs from gpus",
        ));
    }
    let m = u32::try_from(s.micro_batches())
        .map_err(|_| CodegenError::plan("strategy", "too many micro-batches"))?;
    if m == 0 {
        return Err(CodegenError::plan("strategy", "no micro-batches"));
    }
    let zero = if dp > 1 { s.zero } else { 0 };
    let mixed = s.precision != Precision::Fp32;
    let cx = segment_ctx(plan, graph, &info, cp);
    if cx.ep > 1 && !dp.is_multiple_of(cx.ep) {
        return Err(CodegenError::plan(
            "strategy.ep",
            format!("ep {} must divide dp {}", cx.ep, dp),
        ));
    }
    let pre = segment::lower(&cx, &info.pre_ops, Kind::Pre)?;
    let layer = layer_segment(plan, &cx, 0, &info.layer_ops)?;
    // Each later run of identical layers (a block that changes structure) by its own
    // extraction where the plan records one.
    let mut later_runs = Vec::new();
    for (r, run) in info.runs().iter().enumerate().skip(1) {
        later_runs.push(layer_segment(plan, &cx, r, &run.info.layer_ops)?);
    }
    let run_of_layer: Vec<usize> = (0..info.layers)
        .map(|l| graph.kind_starts.iter().filter(|&&s| s <= l).count())
        .collect();
    let post = segment::lower(&head_ctx(&cx), &info.post_ops, Kind::Post)?;
    if layer.input.is_none() || post.input.is_none() {
        return Err(CodegenError::plan(
            "model",
            "a layer or the head reads no activation",
        ));
    }
    // Parameters.
    let params_list = graph.params();
    let pid_of: HashMap<OpId, ParamId> = params_list
        .iter()
        .enumerate()
        .map(|(i, (_, v))| (graph.def_op(*v), ParamId(i as u32)))
        .collect();
    let params: Vec<ParamInfo> = params_list
        .iter()
        .map(|(name, v)| ParamInfo {
            name: name.clone(),
            shape: graph.ty(*v).shape.eval(ir::Binding {
                batch: s.micro_batch,
                seq: s.seq,
            }),
        })
        .collect();
    let seg_params = |seg: &Segment, ops: &[OpId]| -> Vec<Option<ParamId>> {
        seg.vals
            .iter()
            .filter_map(|v| match v.source {
                Source::Param { pos } => Some(pos),
                _ => None,
            })
            .fold(vec![None; seg.ops.len()], |mut acc, pos| {
                if let Some(o) = ops.get(pos).or(seg.ops.get(pos)) {
                    acc[pos] = pid_of.get(o).copied();
                }
                acc
            })
    };
    let pre_pids = seg_params(&pre, &pre.ops);
    let post_pids = seg_params(&post, &post.ops);
    let run_segs: Vec<&Segment> = std::iter::once(&layer).chain(&later_runs).collect();
    let ops_by_layer = graph.ops_by_layer();
    let layer_pids: Vec<Vec<Option<ParamId>>> = ops_by_layer
        .iter()
        .enumerate()
        .map(|(l, ops)| seg_params(run_segs[run_of_layer[l]], ops))
        .collect();
    // Local shard shape and split of every parameter.
    let mut local: HashMap<ParamId, LocalShard> = HashMap::new();
    let mut note = |seg: &Segment, pids: &[Option<ParamId>]| {
        for (k, v) in seg.vals.iter().enumerate() {
            if let Source::Param { pos } = v.source
                && let Some(Some(p)) = pids.get(pos)
            {
                let split = match v.lay {
                    Lay::Split { axis, blocks } => Some(TpSplit {
                        axis,
                        blocks,
                        part: None,
                        // The table's rows or the head's columns of a padded vocabulary.
                        padded: seg.padded_vocab.is_some_and(|vocab| {
                            params
                                .get(p.index())
                                .and_then(|i| i.shape.get(usize::from(axis)))
                                == Some(&vocab)
                        }),
                    }),
                    _ => None,
                };
                local.insert(
                    *p,
                    LocalShard {
                        shape: v.shape.clone(),
                        split,
                        expert: seg.expert_params.contains(&k),
                    },
                );
            }
        }
    };
    note(&pre, &pre_pids);
    note(&post, &post_pids);
    for (l, pids) in layer_pids.iter().enumerate() {
        note(run_segs[run_of_layer[l]], pids);
    }
    // Chunks.
    let n_chunks = plan.chunks.len() as u32;
    if n_chunks != pp * s.virtual_stages
        || plan
            .chunks
            .iter()
            .enumerate()
            .any(|(i, c)| c.chunk != i as u32 || c.stage != c.chunk % pp)
    {
        return Err(CodegenError::plan(
            "chunks",
            "expected pp x virtual stages chunks, chunk c on stage c mod pp",
        ));
    }
    let tied: BTreeSet<ParamId> = pre_pids
        .iter()
        .flatten()
        .filter(|p| post_pids.contains(&Some(**p)))
        .copied()
        .collect();
    let plans = [
        emit::plan(&pre, Recompute::None),
        emit::plan(&layer, s.recompute),
        emit::plan(&post, Recompute::None),
    ];
    let layer_runs: Vec<(&Segment, emit::Plan)> = run_segs
        .iter()
        .map(|&seg| (seg, emit::plan(seg, s.recompute)))
        .collect();
    let names: Vec<String> = params.iter().map(|p| p.name.clone()).collect();
    let layer_instances: Vec<Instance> = ops_by_layer
        .iter()
        .map(|ops| Instance::of_ops(graph, ops))
        .collect();
    let mut templates = Vec::new();
    for d in 0..pp {
        let st = Stage {
            plan,
            cx: &cx,
            segs: [&pre, &layer, &post],
            plans: &plans,
            pre_pids: &pre_pids,
            post_pids: &post_pids,
            layer_pids: &layer_pids,
            layer_instances: &layer_instances,
            layer_runs: &layer_runs,
            run_of_layer: &run_of_layer,
            local: &local,
            tied: &tied,
            zero,
            mixed,
            m,
            d,
            opts,
            names: &names,
            b: Builder::default(),
            ps: BTreeMap::new(),
            reduced: HashMap::new(),
            tp_pending: BTreeMap::new(),
        };
        templates.push(st.build()?);
    }
    let ids: Vec<TemplateId> = (0..pp).map(TemplateId).collect();
    let (groups, ranks) = crate::mesh::build([tp, dp, pp, cx.ep, cp], !tied.is_empty(), &ids);
    Ok(ProgramSet {
        format: FORMAT.into(),
        model: plan.model.name.clone(),
        mesh: MeshInfo {
            tp,
            dp,
            pp,
            virtual_stages: s.virtual_stages,
            micro_batches: m,
            micro_batch: s.micro_batch,
            seq: s.seq,
            schedule: s.schedule.name().into(),
            zero: s.zero,
            recompute: s.recompute.name().into(),
            sequence_parallel: cx.sp,
            precision: s.precision.name().into(),
            ep: cx.ep,
            cp,
            attention: if cx.fused_attention {
                "fused"
            } else {
                "materialized"
            }
            .into(),
        },
        params,
        groups,
        predicted: plan
            .predicted
            .stages
            .iter()
            .map(|st| Predicted {
                stage: st.stage,
                peak_memory_bytes: st.peak_memory_bytes,
            })
            .collect(),
        ranks,
        templates,
    })
}

/// Context parallelism lowers as data parallelism over sequence chunks: the `cp` ranks of a
/// sequence hold the same weights and reduce (and ZeRO-shard) their gradients together with
/// the data-parallel replicas, as Megatron's data-parallel group with context parallelism
/// does; each sees its share of every sequence, and only attention (and what depends on
/// positions) looks across the group. So the rest of the lowering sees dp × cp replicas,
/// each with the micro-batches of its data-parallel replica (the global batch counted once
/// per chunk holder), and the loss and gradients averaged over all of them: each rank's loss
/// is the mean over its share of equal size.
fn context_as_data(plan: &Plan, cp: u32) -> Result<Plan, CodegenError> {
    let s = &plan.strategy;
    let chunks = 2 * u64::from(cp);
    if !s.seq.is_multiple_of(chunks) {
        return Err(CodegenError::plan(
            "strategy.cp",
            format!(
                "sequence {} does not split into 2 x cp = {chunks} equal chunks",
                s.seq
            ),
        ));
    }
    if s.ep > 1 {
        return Err(CodegenError::plan(
            "strategy.ep",
            "expert parallelism beside context parallelism is not lowered; compile with --ep 1 or --cp 1",
        ));
    }
    let mut folded = plan.clone();
    folded.strategy.dp = s.dp * cp;
    folded.strategy.global_batch = s.global_batch * u64::from(cp);
    folded.strategy.cp = 1;
    Ok(folded)
}

/// A parameter's shard on its ranks: the local shape, its tensor-parallel split, and whether
/// its experts are split over the expert-parallel group.
#[derive(Clone, Debug)]
struct LocalShard {
    shape: Vec<u64>,
    split: Option<TpSplit>,
    expert: bool,
}

/// Persistent buffers of one parameter on one stage.
#[derive(Debug, Clone, Copy)]
struct PState {
    /// Local shard (persistent below ZeRO-3; gathered per use at ZeRO-3).
    param: BufferId,
    slice: Option<BufferId>,
    master: Option<BufferId>,
    m: BufferId,
    v: BufferId,
    /// Gradient accumulator: full local (`Grad`) below ZeRO-2, the slice (`GradSlice`) above.
    grad: BufferId,
    /// Flat slice length ⌈n / replicas⌉.
    per: u64,
    /// The group its gradient reduces and its ZeRO slices are cut over: `Dp`, or `Edp` for a
    /// routed expert's weight.
    replicas: Slot,
}

struct Stage<'a> {
    plan: &'a Plan,
    cx: &'a Ctx<'a>,
    segs: [&'a Segment; 3],
    plans: &'a [emit::Plan; 3],
    pre_pids: &'a [Option<ParamId>],
    post_pids: &'a [Option<ParamId>],
    layer_pids: &'a [Vec<Option<ParamId>>],
    /// Each layer's own dropout seeds and attention masks in op order.
    layer_instances: &'a [Instance],
    /// Each run of identical layers' segment and its emission plan (one run where every
    /// layer repeats one structure), and the run of each layer.
    layer_runs: &'a [(&'a Segment, emit::Plan)],
    run_of_layer: &'a [usize],
    local: &'a HashMap<ParamId, LocalShard>,
    tied: &'a BTreeSet<ParamId>,
    zero: u8,
    mixed: bool,
    m: u32,
    d: u32,
    opts: Options,
    names: &'a [String],
    b: Builder,
    ps: BTreeMap<ParamId, PState>,
    /// Where each parameter's reduced gradient ends up (ZeRO-1: a slice made at reduction).
    reduced: HashMap<ParamId, BufferId>,
    /// Tensor-parallel partial gradients summed over the micro-batches so far, reduced after
    /// the parameter's last use in the step ([`Stage::contribute`]).
    tp_pending: BTreeMap<ParamId, BufferId>,
}

/// What a forward left for the backward of one (chunk, micro-batch).
struct ChunkState {
    ids: Option<BufferId>,
    targets: Option<BufferId>,
    pre: Option<Inst>,
    layers: Vec<Inst>,
    post: Option<Inst>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Pre = 0,
    Layer = 1,
    Post = 2,
}
