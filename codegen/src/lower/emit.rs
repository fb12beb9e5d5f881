//! Instantiates a [`Segment`] for one layer and micro-batch: its forward, and its backward
//! (one `grad` per differentiated op as `ir::autodiff::backward` builds them, except ops whose
//! gradient reads no operand value, which become forward ops on the output gradient: `add` →
//! the gradient itself, `split` → `concat`, `dropout` → the same dropout, `scale` → the same
//! scale, `transpose` → the inverse transpose, `reshape` → the reshape back, `reduce_mean` and
//! `reduce_sum` → the gradient expanded over the axis, scaled by 1/width for the mean), with the
//! collectives' conjugates (all-gather ↔ reduce-scatter, all-reduce ↔ identity).
//!
//! What the forward keeps for the backward is what the backward reads, so the buffers alive
//! between them are Korthikanti et al.'s saved activations, except what is cheaper made again:
//! a gathered input is kept as its shard and gathered again in the backward (Megatron-LM's
//! sequence parallelism), a re-split one (an all-to-all) as its source and re-split again, and
//! a few values are recomputed from what is kept anyway ([`rebuilt_activation`]).

use std::collections::BTreeMap;

use ir::OpKind;

use super::builder::Builder;
use super::partial::Partial;
use super::segment::{Lay, SVal, Segment, Source, Step};
use crate::ids::{BufferId, ParamId};
use crate::program::{Algorithm, CollectiveOp, Elem, Instr, Purpose, Role, Slot, VocabOp};
use planner::Recompute;

/// What the backward needs of a segment, computed once per segment.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Values the forward keeps for the backward.
    pub keep: Vec<bool>,
    /// Values the backward gathers (or re-splits) again from their kept source.
    pub regather: Vec<bool>,
    /// Values the backward recomputes from their kept operand ([`rebuilt_activation`]), with
    /// the forward step that defines them.
    pub rebuild: Vec<Option<usize>>,
    /// Per value, the step (forward order) of its first backward read, or `usize::MAX`.
    pub last_bwd_read: Vec<usize>,
    pub keep_scores: bool,
    pub full: bool,
}

/// Operand values the backward of `step` reads.
pub fn bwd_reads(seg: &Segment, step: &Step) -> Vec<SVal> {
    match step {
        Step::Compute {
            kind, ins, outs, ..
        } => match kind {
            OpKind::Add | OpKind::Sub => {
                let dy = outs.first().map(|&o| &seg.vals[o].shape);
                ins.iter()
                    .copied()
                    .filter(|&i| Some(&seg.vals[i].shape) != dy)
                    .collect()
            }
            OpKind::Split { .. }
            | OpKind::Dropout { .. }
            | OpKind::Scale { .. }
            | OpKind::Transpose { .. }
            | OpKind::Reshape { .. }
            // Slicing and concatenating move the gradient by shape alone.
            | OpKind::Slice { .. }
            | OpKind::Concat { .. }
            // A rotation's adjoint is the inverse rotation of the output gradient.
            | OpKind::Rotary { .. }
            // A mean's or sum's gradient is the output gradient spread over the axis.
            | OpKind::ReduceMean
            | OpKind::ReduceSum => vec![],
            _ => ins.clone(),
        },
        _ => vec![],
    }
}

pub fn plan(seg: &Segment, recompute: Recompute) -> Plan {
    let n = seg.vals.len();
    let mut reads = vec![false; n];
    let mut last = vec![usize::MAX; n];
    for (i, s) in seg.steps.iter().enumerate() {
        for v in bwd_reads(seg, s) {
            reads[v] = true;
            if last[v] == usize::MAX || i < last[v] {
                last[v] = i;
            }
        }
    }
    let mut keep = vec![false; n];
    let mut regather = vec![false; n];
    let mut gathered_from = vec![None; n];
    // A value all-gathered from a shard, or re-split from another split (an extraction's
    // all-to-all), is made again for the backward from its source, which is kept instead: as
    // large (a shard) or no larger (a re-split), and often kept anyway for its own readers.
    for s in &seg.steps {
        if let Step::Coll {
            op: CollectiveOp::AllGather | CollectiveOp::Reshard { .. },
            x,
            y,
            ..
        } = s
        {
            gathered_from[*y] = Some(*x);
        }
    }
    for v in 0..n {
        if !reads[v] || !matches!(seg.vals[v].source, Source::Step | Source::Input) {
            continue;
        }
        match gathered_from[v] {
            Some(mut x) => {
                regather[v] = true;
                // A gather of a gather (an expert layer's tokens over the expert-parallel group
                // after the sequence-parallel one) is rebuilt from the first one's shard.
                while let Some(x0) = gathered_from[x].filter(|_| !reads[x]) {
                    regather[x] = true;
                    x = x0;
                }
                keep[x] = true;
            }
            None => keep[v] = true,
        }
    }
    // The kept sources of regathered values: the backward gathers from them, so they stay
    // kept, not made again.
    let mut regathered_from = vec![false; n];
    for v in (0..n).filter(|&v| regather[v]) {
        if let Some(x) = gathered_from[v] {
            regathered_from[x] = true;
        }
    }
    let mut rebuild = vec![None; n];
    for (i, st) in seg.steps.iter().enumerate() {
        let Some(v) = rebuilt_activation(seg, st, &reads) else {
            continue;
        };
        // Made again from kept operands only: not from one itself made again, nor in place
        // of a regathered value's source.
        if regathered_from[v] || step_ins(st).iter().any(|&x| rebuild[x].is_some()) {
            continue;
        }
        keep[v] = false;
        rebuild[v] = Some(i);
        // Its operands are freed no earlier than it (freed at its last backward read): a
        // piece's whole may have no backward reader left when the piece is made again.
        for x in step_ins(st) {
            if last[v] < last[x] {
                last[x] = last[v];
            }
        }
    }
    // A regathered value's shard is read (by the gather) just before the value; later values
    // first, so that a chain of gathers carries the read back to its first shard.
    for v in (0..n).rev() {
        if regather[v]
            && let Some(x) = gathered_from[v]
            && (last[x] == usize::MAX || last[v] < last[x])
        {
            last[x] = last[v];
        }
    }
    Plan {
        keep,
        regather,
        rebuild,
        last_bwd_read: last,
        keep_scores: recompute != Recompute::Selective,
        full: recompute == Recompute::Full,
    }
}

/// One instantiated segment.
#[derive(Debug, Clone)]
pub struct Inst {
    pub bufs: Vec<Option<BufferId>>,
    pub saves: Vec<Vec<BufferId>>,
    pub layer: Option<u32>,
}

/// Where a segment's operands come from.
#[derive(Debug)]
pub struct Env<'a> {
    /// Buffer of the parameter at each op position (`None`: not a parameter).
    pub params: &'a [Option<(ParamId, BufferId)>],
    pub input_ids: Option<BufferId>,
    pub targets: Option<BufferId>,
    pub layer: Option<u32>,
    pub tag: String,
    /// This instance's own dropout seeds and attention masks (empty: the segment's).
    pub instance: &'a Instance,
    /// Gradient accumulators a backward adds each whole (not tensor-parallel partial)
    /// parameter gradient into as soon as it is computed, so no layer's gradients wait
    /// together (Megatron's gradient-accumulation fusion). Empty: returned as contributions.
    pub accumulators: BTreeMap<ParamId, BufferId>,
}

impl<'a> Env<'a> {
    /// The embedding's or the head's instance of micro-batch tokens `input_ids`/`targets`.
    pub fn edge(
        params: &'a [Option<(ParamId, BufferId)>],
        input_ids: Option<BufferId>,
        targets: Option<BufferId>,
        tag: String,
    ) -> Env<'a> {
        Env {
            params,
            input_ids,
            targets,
            layer: None,
            tag,
            instance: &SEGMENT_INSTANCE,
            accumulators: BTreeMap::new(),
        }
    }

    /// Layer `layer`'s instance, with that layer's dropout seeds and attention masks.
    pub fn layer(
        params: &'a [Option<(ParamId, BufferId)>],
        layer: u32,
        instance: &'a Instance,
        tag: String,
    ) -> Env<'a> {
        Env {
            params,
            input_ids: None,
            targets: None,
            layer: Some(layer),
            tag,
            instance,
            accumulators: BTreeMap::new(),
        }
    }
}

/// What each instance of a layer's segment sets for itself, in segment order: its dropout ops'
/// seeds, its attention ops' masks (sliding windows, chunks) and its rotary embeddings' bases and
/// scalings (the segment is lowered from the first layer of its run; Gemma 2's and gpt-oss's
/// layers alternate windowed and full attention, Llama 4's chunked and full, Gemma 3's windowed
/// layers rotate by their own base).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Instance {
    pub seeds: Vec<u64>,
    pub masks: Vec<ir::KeyMask>,
    pub rotaries: Vec<(f64, ir::RopeScaling)>,
}

/// An instance with no attributes of its own: the segment's stand.
pub static SEGMENT_INSTANCE: Instance = Instance {
    seeds: Vec::new(),
    masks: Vec::new(),
    rotaries: Vec::new(),
};

impl Instance {
    /// The seeds, masks and rotaries of `ops` (one layer's, in order).
    pub fn of_ops(g: &ir::Graph, ops: &[ir::OpId]) -> Instance {
        let mut own = Instance::default();
        for &o in ops {
            match g.op(o).kind {
                OpKind::Dropout { seed, .. } => own.seeds.push(seed),
                OpKind::Attention { .. } => own.masks.push(g.op(o).kind.attention_mask()),
                OpKind::Rotary { theta, scaling, .. } => own.rotaries.push((theta, scaling)),
                _ => {}
            }
        }
        own
    }
}

/// `kind` of step `i` for this instance: a dropout takes the instance's seed, an attention its
/// mask, a rotary embedding its base and scaling (the segment's own where the instance names
/// none).
fn instance_kind(seg: &Segment, i: usize, kind: &OpKind, env: &Env<'_>) -> OpKind {
    let before = |is: fn(&OpKind) -> bool| {
        seg.steps[..i]
            .iter()
            .filter(|s| matches!(s, Step::Compute { kind, .. } if is(kind)))
            .count()
    };
    match kind {
        OpKind::Dropout { p, seed } => {
            let k = before(|k| matches!(k, OpKind::Dropout { .. }));
            OpKind::Dropout {
                p: *p,
                seed: env.instance.seeds.get(k).copied().unwrap_or(*seed),
            }
        }
        OpKind::Attention { .. } => {
            let k = before(|k| matches!(k, OpKind::Attention { .. }));
            match env.instance.masks.get(k) {
                Some(&mask) => kind.clone().with_mask(mask),
                None => kind.clone(),
            }
        }
        OpKind::Rotary { heads, .. } => {
            let k = before(|k| matches!(k, OpKind::Rotary { .. }));
            match env.instance.rotaries.get(k) {
                Some(&(theta, scaling)) => OpKind::Rotary {
                    heads: *heads,
                    theta,
                    scaling,
                },
                None => kind.clone(),
            }
        }
        other => other.clone(),
    }
}

/// Splits an op's gradient operands into those computed together and the weight matrices
/// computed one at a time, each added into its accumulator before the next is computed: an op
/// with several weight matrices (an expert layer's gate, up and down projections) holds one
/// weight gradient at a time, as an engine's grouped GEMM writes each weight gradient into the
/// main gradient buffer (Megatron's gradient-accumulation fusion) instead of holding them all.
fn one_weight_gradient_at_a_time(
    wrt: &[usize],
    accumulated_matrix: impl Fn(usize) -> bool,
) -> (Vec<usize>, Vec<usize>) {
    let (alone, together): (Vec<usize>, Vec<usize>) =
        wrt.iter().partition(|&&k| accumulated_matrix(k));
    if alone.len() < 2 {
        return (wrt.to_vec(), vec![]);
    }
    (together, alone)
}

/// A compute instruction; on this rank's chunks of the sequence (`Instr::Context` over the
/// context-parallel group) when `context`.
fn compute(
    kind: OpKind,
    inputs: Vec<BufferId>,
    outputs: Vec<BufferId>,
    saves: Vec<BufferId>,
    layer: Option<u32>,
    context: bool,
) -> Instr {
    if context {
        Instr::Context {
            kind,
            group: Slot::Cp,
            inputs,
            outputs,
            saves,
            layer,
        }
    } else {
        Instr::Compute {
            kind,
            inputs,
            outputs,
            saves,
            layer,
        }
    }
}

fn coll(
    op: CollectiveOp,
    group: Slot,
    axis: Option<u8>,
    x: BufferId,
    y: BufferId,
    purpose: Purpose,
) -> Instr {
    Instr::Collective {
        op,
        group,
        algorithm: Algorithm::Ring,
        axis,
        pairs: vec![(x, y)],
        purpose,
        bucket: None,
    }
}

/// Emits the forward. `input` is owned by the instance; `keep` says what survives it.
pub fn forward(
    b: &mut Builder,
    seg: &Segment,
    env: &Env<'_>,
    input: Option<BufferId>,
    keep: &[bool],
    keep_scores: bool,
    keep_saves: bool,
) -> Inst {
    let n = seg.vals.len();
    let mut bufs: Vec<Option<BufferId>> = vec![None; n];
    for (v, val) in seg.vals.iter().enumerate() {
        bufs[v] = match val.source {
            Source::Param { pos } => env.params.get(pos).copied().flatten().map(|(_, b)| b),
            Source::Tokens { targets } => {
                if targets {
                    env.targets
                } else {
                    env.input_ids
                }
            }
            Source::Input => input,
            Source::Step => None,
        };
    }
    // Last forward use of each value.
    let mut last_fwd = vec![None; n];
    for (i, s) in seg.steps.iter().enumerate() {
        for v in step_ins(s) {
            last_fwd[v] = Some(i);
        }
    }
    let owned = |v: SVal| matches!(seg.vals[v].source, Source::Step | Source::Input);
    let mut saves = vec![Vec::new(); seg.steps.len()];
    for (i, s) in seg.steps.iter().enumerate() {
        for v in step_outs(s) {
            let val = &seg.vals[v];
            let role = if Some(v) == seg.loss {
                Role::Loss
            } else {
                Role::Activation
            };
            let buf = b.alloc(
                format!("{}.{}", env.tag, val.name),
                val.elem,
                val.shape.clone(),
                role,
            );
            if val.lay == Lay::Partial {
                b.mark_partial(buf);
            }
            bufs[v] = Some(buf);
        }
        let get = |v: SVal| bufs[v].unwrap_or(BufferId(u32::MAX));
        match s {
            Step::Compute {
                kind,
                ins,
                outs,
                saves: sd,
                vocab_parallel,
                context,
                ..
            } => {
                let sv: Vec<BufferId> = sd
                    .iter()
                    .map(|d| {
                        b.alloc(
                            format!("{}.{}", env.tag, d.name),
                            d.elem,
                            d.shape.clone(),
                            Role::Saved,
                        )
                    })
                    .collect();
                if *vocab_parallel {
                    let inputs = ins.iter().map(|&v| get(v)).collect();
                    let outputs = outs.iter().map(|&v| get(v)).collect();
                    vocab_forward(b, env, seg, kind, inputs, outputs, &sv);
                } else {
                    b.push(compute(
                        instance_kind(seg, i, kind, env),
                        ins.iter().map(|&v| get(v)).collect(),
                        outs.iter().map(|&v| get(v)).collect(),
                        sv.clone(),
                        env.layer,
                        *context,
                    ));
                }
                for (d, &buf) in sd.iter().zip(&sv) {
                    if (d.scores && !keep_scores) || !keep_saves {
                        b.free(buf);
                    } else {
                        saves[i].push(buf);
                    }
                }
            }
            Step::Coll {
                op,
                axis,
                x,
                y,
                group,
            } => {
                b.push(coll(
                    *op,
                    *group,
                    Some(*axis),
                    get(*x),
                    get(*y),
                    Purpose::Activation,
                ));
            }
            Step::Chunk { axis, x, y, group } => b.push(Instr::Chunk {
                src: get(*x),
                dst: get(*y),
                axis: Some(*axis),
                group: *group,
            }),
        }
        for v in step_ins(s) {
            if last_fwd[v] == Some(i)
                && owned(v)
                && !keep[v]
                && v != seg.output
                && let Some(bb) = bufs[v]
            {
                b.free(bb);
            }
        }
    }
    Inst {
        bufs,
        saves,
        layer: env.layer,
    }
}

fn step_ins(s: &Step) -> Vec<SVal> {
    match s {
        Step::Compute { ins, .. } => ins.clone(),
        Step::Coll { x, .. } | Step::Chunk { x, .. } => vec![*x],
    }
}

/// The output of `step` if the backward rebuilds it instead of keeping it: a SiLU whose
/// operand the backward reads anyway (SiLU's own gradient needs it). SwiGLU's gate is then kept
/// once, as the planner counts it (gate, up and their product), and SiLU runs again before the
/// product's backward, as Megatron-LM's fused SwiGLU backward does (`bias_swiglu_back`); a
/// GELU gate (GeGLU: Gemma) likewise, as its fused GeGLU backward does (`geglu_back`).
///
/// Likewise a look-up in a parameter table by indices the backward keeps anyway (a learned
/// position embedding): a broadcast add's backward reads the look-up's output only for its
/// shape, and PyTorch's add keeps nothing, so the engines hold no `[s, h]` copy per micro-batch.
///
/// Likewise a transposed copy of a weight (a tied head's `wteᵀ`): the weight is stored anyway,
/// so the backward transposes it again rather than keeping a vocabulary-sized copy per
/// micro-batch in flight (GPipe's last stage held eight). The engines keep none (their GEMM
/// reads the table transposed); the planner counts the copy only while the head runs.
///
/// Likewise a rank's piece of a value the backward reads whole anyway (an extraction's
/// row-parallel key projection reading its slice of the normalized input that the query
/// projection reads whole): the piece is cut again, not kept beside the whole.
fn rebuilt_activation(seg: &Segment, step: &Step, reads: &[bool]) -> Option<SVal> {
    let owned = |v: SVal| matches!(seg.vals[v].source, Source::Step | Source::Input);
    if let Step::Chunk { x, y, .. } = *step {
        return (owned(x) && owned(y) && reads[x] && reads[y]).then_some(y);
    }
    let Step::Compute {
        kind,
        ins,
        outs,
        vocab_parallel,
        ..
    } = step
    else {
        return None;
    };
    let param = |v: SVal| matches!(seg.vals[v].source, Source::Param { .. });
    match (kind, ins.as_slice(), outs.as_slice()) {
        (OpKind::Silu, &[x], &[y]) => (owned(x) && owned(y) && reads[x] && reads[y]).then_some(y),
        // Only a gate: GPT's GELU output is the second linear's input, which Megatron keeps
        // (Korthikanti's two 4h tensors).
        (OpKind::Gelu { .. }, &[x], &[y]) if gates_a_product(seg, y) => {
            (owned(x) && owned(y) && reads[x] && reads[y]).then_some(y)
        }
        (OpKind::Embedding, &[table, idx], &[y]) if !vocab_parallel => {
            (param(table) && owned(idx) && owned(y) && reads[idx] && reads[y]).then_some(y)
        }
        (OpKind::Transpose { .. }, &[w], &[y]) => (param(w) && owned(y) && reads[y]).then_some(y),
        _ => None,
    }
}

/// Whether every step that reads `v` is a product (the gate of a GLU).
fn gates_a_product(seg: &Segment, v: SVal) -> bool {
    let mut readers = seg.steps.iter().filter(|s| step_ins(s).contains(&v));
    readers.all(|s| {
        matches!(
            s,
            Step::Compute {
                kind: OpKind::Mul,
                ..
            }
        )
    })
}

fn step_outs(s: &Step) -> Vec<SVal> {
    match s {
        Step::Compute { outs, .. } => outs.clone(),
        Step::Coll { y, .. } | Step::Chunk { y, .. } => vec![*y],
    }
}

/// A parameter gradient produced by the backward.
#[derive(Debug, Clone, Copy)]
pub struct Contribution {
    pub param: ParamId,
    pub buf: BufferId,
    /// A partial sum over the tensor-parallel group.
    pub partial: bool,
}

/// Emits the backward of `inst`, consuming `dy` (the output's gradient; for the head segment
/// the loss seed). Returns the input's gradient (owned by the caller) and the contributions.
pub fn backward(
    b: &mut Builder,
    seg: &Segment,
    p: &Plan,
    env: &Env<'_>,
    inst: &mut Inst,
    dy: BufferId,
) -> (Option<BufferId>, Vec<Contribution>) {
    let n = seg.vals.len();
    let mut grads: Vec<Option<(BufferId, Partial)>> = vec![None; n];
    grads[seg.output] = Some((dy, Partial::NONE));
    let mut contribs = Vec::new();
    let param_of = |v: SVal| match seg.vals[v].source {
        Source::Param { pos } => env.params.get(pos).copied().flatten().map(|(p, _)| p),
        _ => None,
    };
    let param_buf = |v: SVal| match seg.vals[v].source {
        Source::Param { pos } => env.params.get(pos).copied().flatten().map(|(_, w)| w),
        _ => None,
    };
    // A weight gathered from its shard for its readers: their gradient with respect to it is
    // a contribution to the parameter's (cut back to the shard after).
    let gathered_param = |v: SVal| {
        seg.steps.iter().find_map(|s| match s {
            Step::Coll {
                op: CollectiveOp::AllGather,
                x,
                y,
                ..
            } if *y == v => param_of(*x),
            _ => None,
        })
    };
    let gname = |v: SVal| format!("{}.d{}", env.tag, seg.vals[v].name);
    // The forward freed these after their last use; the backward runs their step again.
    let mut rebuilt = vec![false; n];
    // Values gathered again for this backward (the forward's copies were freed).
    let mut regathered = vec![false; n];
    for (i, s) in seg.steps.iter().enumerate().rev() {
        // Regather what this step's backward reads.
        for v in bwd_reads(seg, s) {
            regather(b, seg, (p, env), inst, v, &mut regathered);
        }
        for v in bwd_reads(seg, s) {
            if let Some(j) = p.rebuild[v]
                && !rebuilt[v]
            {
                // Its operands first, where the forward freed them to be made again (a gate
                // whose input was gathered or re-split).
                for x in seg.steps.get(j).map(step_ins).unwrap_or_default() {
                    regather(b, seg, (p, env), inst, x, &mut regathered);
                }
                rebuild_value(b, seg, env, inst, v, j);
                rebuilt[v] = true;
            }
        }
        let get = |inst: &Inst, v: SVal| inst.bufs[v].unwrap_or(BufferId(u32::MAX));
        match s {
            Step::Compute {
                kind,
                ins,
                outs,
                saves,
                partial_param_grads,
                partial_input_grads,
                vocab_parallel,
                context,
            } => {
                // This instance's own attributes (its dropout seeds, its attention masks).
                let own = instance_kind(seg, i, kind, env);
                let kind = &own;
                // Output gradients, reduced if partial.
                let mut dys = Vec::new();
                for &o in outs {
                    let d = match grads[o].take() {
                        Some((d, partial)) => {
                            complete(b, d, partial);
                            d
                        }
                        None => {
                            let val = &seg.vals[o];
                            let d =
                                b.alloc(gname(o), val.grad_elem, val.shape.clone(), Role::ActGrad);
                            b.push(Instr::Fill { buf: d, value: 0.0 });
                            d
                        }
                    };
                    dys.push(d);
                }
                let wrt: Vec<usize> = (0..ins.len())
                    .filter(|&k| seg.vals[ins[k]].needs_grad)
                    .collect();
                // Selective recompute: rebuild the attention scores.
                let scores = matches!(kind, OpKind::Attention { .. })
                    && !p.keep_scores
                    && saves.iter().any(|d| d.scores);
                let mut temp_saves = Vec::new();
                if scores {
                    b.push(Instr::RecomputeBegin {
                        layer: env.layer.unwrap_or(0),
                    });
                    for d in saves {
                        temp_saves.push(b.alloc(
                            format!("{}.{}", env.tag, d.name),
                            d.elem,
                            d.shape.clone(),
                            Role::Saved,
                        ));
                    }
                    let out = b.alloc_like(dys[0], format!("{}.attn.re", env.tag), Role::Temp);
                    b.push(compute(
                        kind.clone(),
                        ins.iter().map(|&v| get(inst, v)).collect(),
                        vec![out],
                        temp_saves.clone(),
                        env.layer,
                        *context,
                    ));
                    b.free(out);
                    b.push(Instr::RecomputeEnd {
                        layer: env.layer.unwrap_or(0),
                    });
                }
                let mut dxs: Vec<(usize, BufferId)> = Vec::new();
                if !wrt.is_empty() {
                    let alloc_dx = |b: &mut Builder, k: usize| {
                        let v = ins[k];
                        let val = &seg.vals[v];
                        let role = match param_of(v).or_else(|| gathered_param(v)) {
                            Some(p) => Role::GradPart(p),
                            None => Role::ActGrad,
                        };
                        // A parameter's gradient is named after this instance's parameter
                        // buffer (the segment's values carry layer 0's names).
                        let name = match param_buf(v).and_then(|w| b.buffers.get(w.index())) {
                            Some(w) => {
                                let n = w.name.strip_prefix("w.").unwrap_or(&w.name);
                                format!("{}.d{n}", env.tag)
                            }
                            None => gname(v),
                        };
                        let dx = b.alloc(name, val.grad_elem, val.shape.clone(), role);
                        if Partial::of_operand(partial_input_grads, k).any()
                            && param_of(v).is_none()
                        {
                            b.mark_partial(dx);
                        }
                        dx
                    };
                    let one = |b: &mut Builder, k: usize, kind: OpKind, input: Vec<BufferId>| {
                        let dx = alloc_dx(b, k);
                        b.push(Instr::Compute {
                            kind,
                            inputs: input,
                            outputs: vec![dx],
                            saves: vec![],
                            layer: env.layer,
                        });
                        dx
                    };
                    match kind {
                        OpKind::CrossEntropy if *vocab_parallel => {
                            let dx = alloc_dx(b, 0);
                            let lse = inst.saves[i].first().copied().unwrap_or(BufferId(u32::MAX));
                            b.push(Instr::Vocab {
                                op: VocabOp::LossGrad,
                                group: Slot::Tp,
                                inputs: vec![get(inst, ins[0]), get(inst, ins[1]), lse, dys[0]],
                                outputs: vec![dx],
                                vocab: seg.padded_vocab,
                            });
                            dxs.push((0, dx));
                        }
                        OpKind::Embedding if *vocab_parallel => {
                            // The table shard's gradient from the ids and the whole dy.
                            let dx = alloc_dx(b, 0);
                            b.push(Instr::Vocab {
                                op: VocabOp::EmbeddingGrad,
                                group: Slot::Tp,
                                inputs: vec![get(inst, ins[1]), dys[0]],
                                outputs: vec![dx],
                                vocab: seg.padded_vocab,
                            });
                            dxs.push((0, dx));
                        }
                        OpKind::Add | OpKind::Sub
                            if wrt
                                .iter()
                                .all(|&k| seg.vals[ins[k]].shape == *b.shape(dys[0])) =>
                        {
                            for &k in &wrt {
                                let dx = if matches!(kind, OpKind::Sub) && k == 1 {
                                    one(b, k, OpKind::Scale { factor: -1.0 }, vec![dys[0]])
                                } else {
                                    let dx = alloc_dx(b, k);
                                    b.push(Instr::Copy {
                                        src: dys[0],
                                        dst: dx,
                                    });
                                    dx
                                };
                                dxs.push((k, dx));
                            }
                        }
                        OpKind::Split { axis, .. } => {
                            dxs.push((0, one(b, 0, OpKind::Concat { axis: *axis }, dys.clone())));
                        }
                        OpKind::Concat { axis } => {
                            // Each input's gradient is its window of the output's.
                            let mut start = 0;
                            for (k, &v) in ins.iter().enumerate() {
                                let width = seg.vals[v].shape[*axis];
                                if wrt.contains(&k) {
                                    let window = OpKind::Slice {
                                        axis: *axis,
                                        start,
                                        end: start + width,
                                    };
                                    dxs.push((k, one(b, k, window, vec![dys[0]])));
                                }
                                start += width;
                            }
                        }
                        OpKind::Slice { axis, start, end } => {
                            // The output's gradient between zeros (buffers read before any
                            // write are zero) on either side of the window.
                            let shape = &seg.vals[ins[0]].shape;
                            let elem = seg.vals[ins[0]].grad_elem;
                            let side = |b: &mut Builder, width: u64, at: &str| {
                                let mut dims = shape.clone();
                                dims[*axis] = width;
                                b.alloc(
                                    format!("{}.{at}", gname(ins[0])),
                                    elem,
                                    dims,
                                    Role::ActGrad,
                                )
                            };
                            let mut parts = Vec::new();
                            if *start > 0 {
                                parts.push(side(b, *start, "before"));
                            }
                            parts.push(dys[0]);
                            if *end < shape[*axis] {
                                parts.push(side(b, shape[*axis] - end, "after"));
                            }
                            let zeros: Vec<BufferId> =
                                parts.iter().copied().filter(|&p| p != dys[0]).collect();
                            let dx = one(b, 0, OpKind::Concat { axis: *axis }, parts);
                            for z in zeros {
                                b.free(z);
                            }
                            dxs.push((0, dx));
                        }
                        OpKind::Dropout { .. } | OpKind::Scale { .. } => {
                            let k = instance_kind(seg, i, kind, env);
                            dxs.push((0, one(b, 0, k, vec![dys[0]])));
                        }
                        OpKind::Transpose { perm } => {
                            let mut inv = vec![0; perm.len()];
                            for (a, &q) in perm.iter().enumerate() {
                                if let Some(x) = inv.get_mut(q) {
                                    *x = a;
                                }
                            }
                            dxs.push((0, one(b, 0, OpKind::Transpose { perm: inv }, vec![dys[0]])));
                        }
                        OpKind::ReduceMean | OpKind::ReduceSum => {
                            let shape = &seg.vals[ins[0]].shape;
                            let width = shape.last().copied().unwrap_or(1).max(1);
                            let expand = OpKind::Expand {
                                shape: shape.iter().map(|&d| ir::Dim::Fixed(d)).collect(),
                            };
                            let dx = if matches!(kind, OpKind::ReduceMean) {
                                let name = format!("{}.mean", gname(ins[0]));
                                let spread = b.alloc_like(dys[0], name, Role::ActGrad);
                                let factor = 1.0 / width as f64;
                                b.push(compute(
                                    OpKind::Scale { factor },
                                    vec![dys[0]],
                                    vec![spread],
                                    vec![],
                                    env.layer,
                                    false,
                                ));
                                let dx = one(b, 0, expand, vec![spread]);
                                b.free(spread);
                                dx
                            } else {
                                one(b, 0, expand, vec![dys[0]])
                            };
                            dxs.push((0, dx));
                        }
                        OpKind::Reshape { .. } => {
                            let shape = seg.vals[ins[0]]
                                .shape
                                .iter()
                                .map(|&d| ir::Dim::Fixed(d))
                                .collect();
                            dxs.push((0, one(b, 0, OpKind::Reshape { shape }, vec![dys[0]])));
                        }
                        _ => {
                            // Operands whose values the gradient does not read stand in as dy.
                            let reads = bwd_reads(seg, s);
                            let mut inputs: Vec<BufferId> = ins
                                .iter()
                                .map(|&v| {
                                    if reads.contains(&v) {
                                        get(inst, v)
                                    } else {
                                        dys[0]
                                    }
                                })
                                .collect();
                            inputs.extend(dys.iter().copied());
                            // A grouped-GEMM expert layer's backward holds the gradients of its
                            // inner activations (the product's, then the gate's and the up
                            // projection's: as wide as what it saved) beside the saved ones;
                            // plait's CPU kernel holds them inside, so the program sizes them.
                            let workspace = match (kind, inst.saves[i].first()) {
                                (OpKind::MoeExperts { .. }, Some(&saved)) => Some(b.alloc_like(
                                    saved,
                                    format!("{}.expert_grads", env.tag),
                                    Role::Temp,
                                )),
                                _ => None,
                            };
                            let accumulated = |k: usize| {
                                param_of(ins[k])
                                    .filter(|_| !partial_param_grads.contains(&k))
                                    .and_then(|p| env.accumulators.get(&p).copied())
                            };
                            let (together, alone) = one_weight_gradient_at_a_time(&wrt, |k| {
                                accumulated(k).is_some() && seg.vals[ins[k]].shape.len() >= 2
                            });
                            let grad = |wrt: Vec<usize>| OpKind::Grad {
                                of: Box::new(kind.clone()),
                                wrt,
                            };
                            if !together.is_empty() {
                                let outs_b: Vec<BufferId> =
                                    together.iter().map(|&k| alloc_dx(b, k)).collect();
                                b.push(compute(
                                    grad(together.clone()),
                                    inputs.clone(),
                                    outs_b.clone(),
                                    vec![],
                                    env.layer,
                                    *context,
                                ));
                                dxs.extend(together.iter().copied().zip(outs_b));
                            }
                            for k in alone {
                                let (dx, acc) = (alloc_dx(b, k), accumulated(k));
                                b.push(compute(
                                    grad(vec![k]),
                                    inputs.clone(),
                                    vec![dx],
                                    vec![],
                                    env.layer,
                                    *context,
                                ));
                                if let Some(acc) = acc {
                                    b.push(Instr::Compute {
                                        kind: OpKind::Add,
                                        inputs: vec![acc, dx],
                                        outputs: vec![acc],
                                        saves: vec![],
                                        layer: None,
                                    });
                                    b.free(dx);
                                }
                            }
                            if let Some(w) = workspace {
                                b.free(w);
                            }
                        }
                    }
                }
                for &t in &temp_saves {
                    b.free(t);
                }
                for (k, dx) in dxs {
                    let v = ins[k];
                    if let Some(param) = param_of(v) {
                        let partial = partial_param_grads.contains(&k);
                        match env.accumulators.get(&param) {
                            Some(&acc) if !partial => {
                                b.push(Instr::Compute {
                                    kind: OpKind::Add,
                                    inputs: vec![acc, dx],
                                    outputs: vec![acc],
                                    saves: vec![],
                                    layer: None,
                                });
                                b.free(dx);
                            }
                            _ => contribs.push(Contribution {
                                param,
                                buf: dx,
                                partial,
                            }),
                        }
                    } else {
                        let partial = Partial::of_operand(partial_input_grads, k);
                        accumulate(b, &mut grads, v, dx, partial);
                    }
                }
                for d in dys {
                    b.free(d);
                }
                for sv in inst.saves[i].drain(..) {
                    b.free(sv);
                }
            }
            Step::Coll {
                op,
                axis,
                x,
                y,
                group,
            } => {
                if let Some((d, partial)) = grads[*y].take() {
                    let val = &seg.vals[*x];
                    // A gathered weight's gradient is its shard's.
                    let role = param_of(*x).map_or(Role::ActGrad, Role::GradPart);
                    let (dx, dx_partial) = match op {
                        CollectiveOp::AllGather => {
                            let dx = b.alloc(gname(*x), val.grad_elem, val.shape.clone(), role);
                            if partial.has(*group) {
                                b.push(coll(
                                    CollectiveOp::ReduceScatter,
                                    *group,
                                    Some(*axis),
                                    d,
                                    dx,
                                    Purpose::Activation,
                                ));
                            } else {
                                b.push(Instr::Chunk {
                                    src: d,
                                    dst: dx,
                                    axis: Some(*axis),
                                    group: *group,
                                });
                            }
                            b.free(d);
                            // Still partial over any other group (an expert layer's tokens
                            // under tensor parallelism too).
                            (dx, partial.minus(Partial::over(*group)))
                        }
                        CollectiveOp::ReduceScatter => {
                            let dx = b.alloc(gname(*x), val.grad_elem, val.shape.clone(), role);
                            b.push(coll(
                                CollectiveOp::AllGather,
                                *group,
                                Some(*axis),
                                d,
                                dx,
                                Purpose::Activation,
                            ));
                            b.free(d);
                            (dx, partial.minus(Partial::over(*group)))
                        }
                        CollectiveOp::Reshard { from } => {
                            // Back from the new split to the old one.
                            let dx = b.alloc(gname(*x), val.grad_elem, val.shape.clone(), role);
                            b.push(coll(
                                CollectiveOp::Reshard { from: *axis },
                                *group,
                                Some(*from),
                                d,
                                dx,
                                Purpose::Activation,
                            ));
                            b.free(d);
                            (dx, partial)
                        }
                        _ => (d, partial),
                    };
                    match param_of(*x) {
                        // A weight gathered for its readers: the gradient of the rank's shard.
                        Some(param) => contribs.push(Contribution {
                            param,
                            buf: dx,
                            partial: dx_partial.has(Slot::Tp),
                        }),
                        None => accumulate(b, &mut grads, *x, dx, dx_partial),
                    }
                }
            }
            Step::Chunk { axis, x, y, group } => {
                // Every rank's piece of the gradient, gathered: the whole value's gradient.
                if let Some((d, partial)) = grads[*y].take() {
                    let val = &seg.vals[*x];
                    let dx = b.alloc(gname(*x), val.grad_elem, val.shape.clone(), Role::ActGrad);
                    b.push(coll(
                        CollectiveOp::AllGather,
                        *group,
                        Some(*axis),
                        d,
                        dx,
                        Purpose::Activation,
                    ));
                    b.free(d);
                    accumulate(b, &mut grads, *x, dx, partial.minus(Partial::over(*group)));
                }
            }
        }
        // Free kept values whose last backward read was this step.
        for v in 0..n {
            if p.last_bwd_read[v] == i
                && matches!(seg.vals[v].source, Source::Step | Source::Input)
                && let Some(bb) = inst.bufs[v].take()
                && (p.keep[v] || p.regather[v] || p.rebuild[v].is_some())
            {
                b.free(bb);
            }
        }
    }
    let dx = seg.input.and_then(|x| {
        grads[x].take().map(|(d, partial)| {
            complete(b, d, partial);
            d
        })
    });
    (dx, contribs)
}

/// The forward of a vocabulary-parallel step: the embedding's lookup on the rank's rows, or the
/// cross-entropy's statistics, their all-gather over the group and the combined loss (whose
/// log-sum-exp goes to the step's save).
fn vocab_forward(
    b: &mut Builder,
    env: &Env<'_>,
    seg: &Segment,
    kind: &OpKind,
    inputs: Vec<BufferId>,
    outputs: Vec<BufferId>,
    saves: &[BufferId],
) {
    if !matches!(kind, OpKind::CrossEntropy) {
        b.push(Instr::Vocab {
            op: VocabOp::Embedding,
            group: Slot::Tp,
            inputs,
            outputs,
            vocab: seg.padded_vocab,
        });
        return;
    }
    let positions = saves
        .first()
        .and_then(|&l| b.buffers.get(l.index()))
        .map_or(0, |d| d.shape.iter().product::<u64>());
    let stats = b.alloc(
        format!("{}.ce_stats", env.tag),
        Elem::F32,
        vec![1, positions, 3],
        Role::Temp,
    );
    b.push(Instr::Vocab {
        op: VocabOp::LossStats,
        group: Slot::Tp,
        inputs,
        outputs: vec![stats],
        vocab: seg.padded_vocab,
    });
    let size = u64::from(seg.tp);
    let gathered = b.alloc(
        format!("{}.ce_stats_all", env.tag),
        Elem::F32,
        vec![size, positions, 3],
        Role::Temp,
    );
    b.push(coll(
        CollectiveOp::AllGather,
        Slot::Tp,
        Some(0),
        stats,
        gathered,
        Purpose::Activation,
    ));
    b.free(stats);
    b.push(Instr::Vocab {
        op: VocabOp::LossCombine,
        group: Slot::Tp,
        inputs: vec![gathered],
        outputs: outputs.into_iter().chain(saves.iter().copied()).collect(),
        vocab: seg.padded_vocab,
    });
    b.free(gathered);
}

/// Runs forward step `j` again to rebuild value `v` (its only output) from its kept operands.
fn rebuild_value(
    b: &mut Builder,
    seg: &Segment,
    env: &Env<'_>,
    inst: &mut Inst,
    v: SVal,
    j: usize,
) {
    let val = &seg.vals[v];
    let alloc = |b: &mut Builder| {
        b.alloc(
            format!("{}.{}.re", env.tag, val.name),
            val.elem,
            val.shape.clone(),
            Role::Activation,
        )
    };
    let (kind, ins, context) = match seg.steps.get(j) {
        Some(Step::Compute {
            kind, ins, context, ..
        }) => (kind, ins, context),
        Some(&Step::Chunk { axis, x, group, .. }) => {
            let y = alloc(b);
            b.push(Instr::Chunk {
                src: inst.bufs[x].unwrap_or(BufferId(u32::MAX)),
                dst: y,
                axis: Some(axis),
                group,
            });
            inst.bufs[v] = Some(y);
            return;
        }
        _ => return,
    };
    let y = alloc(b);
    let inputs = ins
        .iter()
        .map(|&x| inst.bufs[x].unwrap_or(BufferId(u32::MAX)))
        .collect();
    b.push(compute(
        instance_kind(seg, j, kind, env),
        inputs,
        vec![y],
        vec![],
        env.layer,
        *context,
    ));
    inst.bufs[v] = Some(y);
}

/// Gathers (or re-splits) `v` again for the backward from the shard it was made from (first
/// making that shard, when it was itself gathered and not kept).
fn regather(
    b: &mut Builder,
    seg: &Segment,
    (p, env): (&Plan, &Env<'_>),
    inst: &mut Inst,
    v: SVal,
    done: &mut [bool],
) {
    if !p.regather[v] || done[v] {
        return;
    }
    let Some((op, x, group, axis)) = gathered_source(seg, v) else {
        return;
    };
    done[v] = true;
    regather(b, seg, (p, env), inst, x, done);
    let val = &seg.vals[v];
    let y = b.alloc(
        format!("{}.{}", env.tag, val.name),
        val.elem,
        val.shape.clone(),
        Role::Activation,
    );
    let xb = inst.bufs[x].unwrap_or(BufferId(u32::MAX));
    b.push(coll(op, group, Some(axis), xb, y, Purpose::Activation));
    inst.bufs[v] = Some(y);
}

/// The collective that made `v` (an all-gather or a re-split), its source, group and axis.
fn gathered_source(seg: &Segment, v: SVal) -> Option<(CollectiveOp, SVal, Slot, u8)> {
    seg.steps.iter().find_map(|s| match s {
        Step::Coll {
            op: op @ (CollectiveOp::AllGather | CollectiveOp::Reshard { .. }),
            x,
            y,
            group,
            axis,
        } if *y == v => Some((*op, *x, *group, *axis)),
        _ => None,
    })
}

/// All-reduces `d` in place over every group it is a partial sum over.
fn complete(b: &mut Builder, d: BufferId, partial: Partial) {
    for g in partial.groups() {
        b.push(coll(
            CollectiveOp::AllReduce,
            g,
            None,
            d,
            d,
            Purpose::Activation,
        ));
    }
}

/// Adds `dx` into `v`'s gradient; the sum stays partial over the groups both are partial
/// over, each side first completed over the groups only it is partial over.
fn accumulate(
    b: &mut Builder,
    grads: &mut [Option<(BufferId, Partial)>],
    v: SVal,
    dx: BufferId,
    partial: Partial,
) {
    grads[v] = Some(match grads[v].take() {
        None => (dx, partial),
        Some((prev, pp)) => {
            complete(b, prev, pp.minus(partial));
            complete(b, dx, partial.minus(pp));
            b.push(Instr::Compute {
                kind: OpKind::Add,
                inputs: vec![prev, dx],
                outputs: vec![prev],
                saves: vec![],
                layer: None,
            });
            b.free(dx);
            (prev, pp.intersection(partial))
        }
    });
}
