//! A decoder layer lowered as the sharding extraction chose it (`plan.block_plan`): every op
//! runs in the layouts the e-graph's optimum gives its operands and its result, parameters are
//! stored as it stores them, and between them each change of layout is the collective (or
//! local slice) it implies. Nothing here decides a layout: where the extraction needs a form
//! this lowering does not have (an expert layer other than on whole tokens with its FFN or its
//! experts split; attention or rotary on a piece of the sequence; a split norm row), it says
//! which op, and the caller falls back to the segment rules ([`super::segment::lower`]), whose
//! layout the plan then names. Context and expert parallelism run as the rules run them, around
//! whatever tensor-parallel layout the extraction chose.
//!
//! Backward conjugates follow from the forward: an activation read replicated by an op whose
//! result differs per rank (split or partial) gets a partial gradient (Megatron's f/ḡ pair,
//! `partial_input_grads`), and so does a replicated parameter read so (`partial_param_grads`);
//! the emitter reduces them. A gathered weight's gradient is cut back to the rank's shard.

use ir::{OpId, OpKind, ValueId};
use planner::sharding::{BlockPlan, Layout, OpPlan};

use super::segment::{
    B, Ctx, Lay, Placed, SVal, Segment, Source, Step, Val, bind, check_local, local, saves_of,
    select_kv_head, set_split,
};
use crate::program::{CollectiveOp, Elem, Slot};

/// Why the extraction could not be lowered as chosen: the op (position, mnemonic) and what it
/// needs.
pub type Unsupported = String;

/// Lowers the layer `ops` as `bp` lays it out; `Err` names the first op this lowering cannot
/// give the extraction's layout.
pub fn lower(cx: &Ctx<'_>, ops: &[OpId], bp: &BlockPlan) -> Result<Segment, Unsupported> {
    let mut b = B::new(cx, ops);
    let boundary = if cx.sp {
        Lay::Split { axis: 1, blocks: 1 }
    } else {
        Lay::Rep
    };
    let inside: std::collections::HashSet<OpId> = ops.iter().copied().collect();
    for (pos, &o) in ops.iter().enumerate() {
        let plan = bp
            .ops
            .iter()
            .find(|p| p.position == pos)
            .ok_or_else(|| format!("op {pos} has no layout in the extraction"))?;
        if plan.instances > 1 {
            return Err(at(plan, "computed in more than one layout"));
        }
        lower_op(&mut b, &inside, boundary, pos, o, plan)?;
    }
    let last = ops
        .iter()
        .rev()
        .find(|&&o| !cx.graph.op(o).kind.is_source())
        .copied()
        .ok_or("an empty layer")?;
    let out = cx.graph.op(last).results[0];
    let y = *b
        .map
        .get(&out)
        .ok_or("the layer's output is not computed")?;
    b.seg.output = relayout(&mut b, y, boundary).map_err(|m| format!("the layer's output: {m}"))?;
    Ok(b.seg)
}

fn at(p: &OpPlan, what: &str) -> Unsupported {
    format!("{} at position {}: {what}", p.mnemonic, p.position)
}

fn lay(l: &Layout) -> Lay {
    match *l {
        Layout::Replicated => Lay::Rep,
        Layout::Partial => Lay::Partial,
        Layout::Split { axis, blocks } => Lay::Split {
            axis,
            blocks: u32::from(blocks),
        },
    }
}

fn rank_variant(l: Lay) -> bool {
    l != Lay::Rep
}

fn lower_op(
    b: &mut B,
    inside: &std::collections::HashSet<OpId>,
    boundary: Lay,
    pos: usize,
    o: OpId,
    plan: &OpPlan,
) -> Result<(), Unsupported> {
    let cx = b.cx;
    let g = cx.graph;
    let op = g.op(o);
    let out_lay = plan
        .output
        .as_ref()
        .map(lay)
        .ok_or_else(|| at(plan, "not computed"))?;
    if let OpKind::Param { name } = &op.kind {
        let v = b.param(pos, op.results[0], name);
        match out_lay {
            Lay::Rep => {}
            Lay::Split { axis, blocks } => {
                set_split(b, v, axis, blocks, u64::from(cx.tp)).map_err(|m| at(plan, &m))?
            }
            Lay::Partial => return Err(at(plan, "a parameter stored as a partial sum")),
        }
        return Ok(());
    }
    if matches!(
        op.kind,
        OpKind::Input { .. } | OpKind::Buffer { .. } | OpKind::State { .. }
    ) {
        return Err(at(plan, "an input or constant inside the layer"));
    }
    let mut ins = Vec::new();
    for (k, &x) in op.inputs.iter().enumerate() {
        let v = operand(b, inside, boundary, x).map_err(|m| at(plan, &m))?;
        let want = plan
            .inputs
            .get(k)
            .map(lay)
            .ok_or_else(|| at(plan, "an operand without a layout"))?;
        let is_param = matches!(b.seg.vals[v].source, Source::Param { .. });
        let v = if is_param && b.seg.vals[v].lay != want && want != Lay::Rep {
            return Err(at(plan, "a weight read re-split"));
        } else {
            relayout(b, v, want).map_err(|m| at(plan, &format!("operand {k}: {m}")))?
        };
        ins.push(v);
    }
    let t = u64::from(cx.tp);
    // The operands in the extraction's layouts, before the op's own local selection (a rank's
    // kv head of whole keys and values): what `differs_from` compares.
    let read = ins.clone();
    let (mut kind_local, post_bias) =
        local_kind(b, o, &mut ins, out_lay, t).map_err(|m| at(plan, &m))?;
    // Expert parallelism, as the segment rules run it around the group's layout (Megatron-Core's
    // all-gather dispatcher): the expert-parallel group's tokens gathered, this rank's block of
    // the experts run on them, the partial sum reduce-scattered back.
    let expert_parallel = cx.ep > 1 && matches!(op.kind, OpKind::MoeExperts { .. });
    if expert_parallel {
        kind_local = b
            .expert_parallel(o, &mut ins)
            .map_err(|e| at(plan, &e.to_string()))?;
    }
    // Context parallelism, as the segment rules run it: attention gathers the group's keys
    // and values along the sequence, rotary and iota take the rank's positions.
    let mut context_grads = Vec::new();
    let context = cx.cp > 1
        && b.context_parallel(o, &mut ins, &mut context_grads)
            .map_err(|e| at(plan, &e.to_string()))?;
    // A product whose bias is added in another layout than the product comes out in (a
    // row-parallel partial sum): the product, brought into the extraction's layout, then the
    // bias added.
    let computed = post_bias.map_or(out_lay, |(_, l)| l);
    if post_bias.is_some() {
        ins.truncate(2); // the product alone; its bias is added after
    }
    let needs = ins.iter().any(|&v| b.seg.vals[v].needs_grad);
    let mut outs = Vec::new();
    for &r in &op.results {
        let elem = if g.ty(r).dtype == ir::DType::I64 {
            Elem::I64
        } else {
            cx.act
        };
        let mut shape = local(&cx.global_shape(r), computed, cx.tp);
        if expert_parallel && let Some(d) = shape.first_mut() {
            *d *= u64::from(cx.ep);
        }
        let v = b.val(Val {
            shape,
            elem,
            grad_elem: elem,
            lay: computed,
            source: Source::Step,
            needs_grad: needs,
            name: format!("{}{}", op.kind.mnemonic(), b.seg.vals.len()),
        });
        outs.push(v);
    }
    check_local(b, o, &kind_local, &ins, &outs).map_err(|e| at(plan, &e.to_string()))?;
    let variant = rank_variant(computed);
    let param = |b: &B, v: SVal| matches!(b.seg.vals[v].source, Source::Param { .. });
    let replicated_reads = |want_param: bool| -> Vec<usize> {
        (0..ins.len())
            .filter(|&k| variant && param(b, ins[k]) == want_param)
            .filter(|&k| b.seg.vals[ins[k]].lay == Lay::Rep && b.seg.vals[ins[k]].elem != Elem::I64)
            .collect()
    };
    let partial_param_grads = replicated_reads(true);
    let partial_input_grads = replicated_reads(false)
        .into_iter()
        .map(|k| (k, Slot::Tp))
        .chain(context_grads)
        .chain(expert_parallel.then_some((0, Slot::Ep)))
        .collect();
    let saves = saves_of(cx, &b.seg, &kind_local, &ins, &outs);
    b.seg.placed[pos] = Some(Placed {
        inputs: read,
        output: outs[0],
    });
    b.seg.steps.push(Step::Compute {
        kind: kind_local,
        ins,
        outs: outs.clone(),
        saves,
        partial_param_grads,
        partial_input_grads,
        vocab_parallel: false,
        context,
    });
    let mut result = outs[0];
    if expert_parallel {
        result = b.combine_ep(result, computed == Lay::Partial);
    }
    if let Some((bias, _)) = post_bias {
        let reduced = relayout(b, result, out_lay).map_err(|m| at(plan, &m))?;
        let z = b.derived(reduced, out_lay, "bias");
        // Rows (tokens) split: each rank's bias gradient sums its rows only.
        let rank = b.seg.vals[reduced].shape.len() as u8;
        let split_rows = matches!(out_lay, Lay::Split { axis, .. } if axis + 1 < rank);
        let partial = if split_rows { vec![1] } else { vec![] };
        b.seg.steps.push(Step::plain(
            OpKind::Add,
            vec![reduced, bias],
            vec![z],
            partial,
        ));
        if let Some(Some(p)) = b.seg.placed.get_mut(pos) {
            p.output = z;
        }
        result = z;
    }
    b.map.insert(op.results[0], result);
    for (&r, &v) in op.results.iter().zip(&outs).skip(1) {
        b.map.insert(r, v);
    }
    Ok(())
}

/// The segment value of IR value `x`: already lowered, a parameter of the layer, or the layer's
/// input (in the boundary layout).
fn operand(
    b: &mut B,
    inside: &std::collections::HashSet<OpId>,
    boundary: Lay,
    x: ValueId,
) -> Result<SVal, String> {
    if let Some(&v) = b.map.get(&x) {
        return Ok(v);
    }
    let d = b.cx.graph.def_op(x);
    if inside.contains(&d) || b.seg.input.is_some() {
        return Err(format!("operand {x} comes from outside the layer"));
    }
    let v = b.val(Val {
        shape: local(&b.cx.global_shape(x), boundary, b.cx.tp),
        elem: b.cx.act,
        grad_elem: b.cx.act,
        lay: boundary,
        source: Source::Input,
        needs_grad: true,
        name: "x".into(),
    });
    b.seg.input = Some(v);
    b.map.insert(x, v);
    Ok(v)
}

/// `x` in layout `to`: itself, its piece (a local slice), or the collective the change needs.
fn relayout(b: &mut B, x: SVal, to: Lay) -> Result<SVal, String> {
    let from = b.seg.vals[x].lay;
    let step = |op, axis| (op, axis);
    let (op, axis) = match (from, to) {
        _ if from == to => return Ok(x),
        (Lay::Rep, Lay::Split { axis, blocks: 1 }) => {
            let y = b.derived(x, to, "piece");
            b.seg.steps.push(Step::Chunk {
                axis,
                x,
                y,
                group: Slot::Tp,
            });
            return Ok(y);
        }
        (Lay::Split { axis, blocks: 1 }, Lay::Rep) => step(CollectiveOp::AllGather, axis),
        (Lay::Partial, Lay::Rep) => step(CollectiveOp::AllReduce, 1),
        (Lay::Partial, Lay::Split { axis, blocks: 1 }) => step(CollectiveOp::ReduceScatter, axis),
        (
            Lay::Split {
                axis: from,
                blocks: 1,
            },
            Lay::Split { axis, blocks: 1 },
        ) => step(CollectiveOp::Reshard { from }, axis),
        (Lay::Split { axis: a, blocks: 1 }, Lay::Split { axis, blocks }) if a != axis => {
            return resplit_into_blocks(b, x, a, axis, blocks);
        }
        (Lay::Split { axis, blocks }, Lay::Split { axis: a, blocks: 1 }) if a != axis => {
            return resplit_out_of_blocks(b, x, axis, blocks, a);
        }
        _ => return Err(format!("no lowering from {from:?} to {to:?}")),
    };
    let y = b.derived(x, to, op.name());
    b.seg.steps.push(Step::Coll {
        op,
        axis,
        x,
        y,
        group: Slot::Tp,
    });
    Ok(y)
}

/// `x`, split along `from`, re-split into `blocks` blocks along `axis` (a fused QKV product's
/// output, sequence pieces to heads): `axis` viewed as `[blocks, n / blocks]`, the all-to-all
/// onto the second of them (each block split alike), and the view merged back, so each rank
/// holds its piece of every block.
fn resplit_into_blocks(
    b: &mut B,
    x: SVal,
    from: u8,
    axis: u8,
    blocks: u32,
) -> Result<SVal, String> {
    let from_viewed = if from > axis { from + 1 } else { from };
    let out = Lay::Split { axis, blocks };
    resplit_viewed(b, x, (axis, blocks), from_viewed, axis + 1, out)
}

/// The converse of [`resplit_into_blocks`]: `x`, split into `blocks` blocks along `axis`,
/// re-split along `to` whole.
fn resplit_out_of_blocks(
    b: &mut B,
    x: SVal,
    axis: u8,
    blocks: u32,
    to: u8,
) -> Result<SVal, String> {
    let to_viewed = if to > axis { to + 1 } else { to };
    let out = Lay::Split {
        axis: to,
        blocks: 1,
    };
    resplit_viewed(b, x, (axis, blocks), axis + 1, to_viewed, out)
}

/// `x` with `axis` viewed as `blocks` blocks (`[blocks, n / blocks]`), the all-to-all from
/// the view's axis `from` to its axis `to`, and the view merged back, laid out `out`.
fn resplit_viewed(
    b: &mut B,
    x: SVal,
    (axis, blocks): (u8, u32),
    from: u8,
    to: u8,
    out: Lay,
) -> Result<SVal, String> {
    let split = |axis| Lay::Split { axis, blocks: 1 };
    let view = blocked_view(&b.seg.vals[x].shape, axis, blocks)?;
    let viewed = reshape(b, x, view, split(from), "blocks");
    let t = u64::from(b.cx.tp);
    if !b.seg.vals[viewed].shape[usize::from(to)].is_multiple_of(t) {
        return Err(format!(
            "axis {to} of axis {axis}'s view in blocks does not split over {t} ranks"
        ));
    }
    let moved = b.derived(viewed, split(to), "reshard");
    b.seg.steps.push(Step::Coll {
        op: CollectiveOp::Reshard { from },
        axis: to,
        x: viewed,
        y: moved,
        group: Slot::Tp,
    });
    let merged = merged_view(&b.seg.vals[moved].shape, axis);
    Ok(reshape(b, moved, merged, out, "merged"))
}

/// `shape` with its `axis` (of local extent `n`) viewed as `[blocks, n / blocks]`.
fn blocked_view(shape: &[u64], axis: u8, blocks: u32) -> Result<Vec<u64>, String> {
    let a = usize::from(axis);
    let n = *shape.get(a).ok_or("no such axis")?;
    let k = u64::from(blocks);
    if !n.is_multiple_of(k) {
        return Err(format!("{n} does not split into {k} blocks"));
    }
    Ok([&shape[..a], &[k, n / k], &shape[a + 1..]].concat())
}

/// `shape` with its axes `axis` and `axis + 1` merged.
fn merged_view(shape: &[u64], axis: u8) -> Vec<u64> {
    let a = usize::from(axis);
    [&shape[..a], &[shape[a] * shape[a + 1]], &shape[a + 2..]].concat()
}

/// A local reshape of `x` into `shape`, laid out `lay`: a view, whose gradient is the
/// gradient's reshape.
fn reshape(b: &mut B, x: SVal, shape: Vec<u64>, lay: Lay, suffix: &str) -> SVal {
    let y = b.val(Val {
        shape: shape.clone(),
        lay,
        name: format!("{}.{suffix}", b.seg.vals[x].name),
        source: Source::Step,
        ..b.seg.vals[x].clone()
    });
    let kind = OpKind::Reshape {
        shape: shape.into_iter().map(ir::Dim::Fixed).collect(),
    };
    b.seg
        .steps
        .push(Step::plain(kind, vec![x], vec![y], vec![]));
    y
}

/// The op each rank runs on its operands' layouts, and, for a biased product whose bias the
/// extraction adds in another layout than the product comes out in, that bias and the
/// product's layout (the product is brought into the result's layout, then the bias added).
fn local_kind(
    b: &mut B,
    o: OpId,
    ins: &mut [SVal],
    out: Lay,
    t: u64,
) -> Result<(OpKind, Option<(SVal, Lay)>), String> {
    let cx = b.cx;
    let kind = bind(&cx.graph.op(o).kind, cx.batch, cx.seq);
    let lay_of = |b: &B, v: SVal| b.seg.vals[v].lay;
    let rank = |b: &B, v: SVal| b.seg.vals[v].shape.len() as u8;
    let heads_split = |l: Lay, r: u8| matches!(l, Lay::Split { axis, .. } if axis + 1 == r);
    let sequence_split = |l: Lay| matches!(l, Lay::Split { axis: 1, .. });
    match &kind {
        OpKind::Linear { bias: false } => Ok((kind, None)),
        OpKind::Linear { bias: true } => {
            let r = rank(b, ins[0]);
            let product = product_layout(lay_of(b, ins[0]), lay_of(b, ins[1]), r)
                .ok_or("a product of operands in layouts no rule multiplies")?;
            // Every rank adds the bias: to a partial sum it would be counted tp times.
            if out == Lay::Partial {
                return Err("a bias added to a partial sum".into());
            }
            let bias_lay = match out {
                Lay::Split { axis, blocks } if axis + 1 == r => Lay::Split { axis: 0, blocks },
                _ => Lay::Rep,
            };
            if lay_of(b, ins[2]) != bias_lay {
                return Err(format!(
                    "a bias in {:?} added to a result in {out:?}",
                    lay_of(b, ins[2])
                ));
            }
            if product == out {
                return Ok((kind, None));
            }
            // The extraction moves the product (a row-parallel partial sum, or a piece along
            // another axis than the bias's) before adding the bias: the product, brought
            // into the bias's layout, then the bias.
            Ok((OpKind::Linear { bias: false }, Some((ins[2], product))))
        }
        OpKind::Attention {
            heads,
            kv_heads,
            scale,
            causal,
            softcap,
            sinks,
            window,
            chunk,
        } => {
            let q = lay_of(b, ins[0]);
            if sequence_split(q) {
                return Err("attention on a piece of the sequence".into());
            }
            let by_heads = heads_split(q, rank(b, ins[0]));
            // A sink per query head is split as the heads are, and whole where they are.
            let sinks_lay = by_heads.then_some(Lay::Split { axis: 0, blocks: 1 });
            if *sinks && lay_of(b, ins[3]) != sinks_lay.unwrap_or(Lay::Rep) {
                return Err(format!(
                    "attention sinks in {:?} beside queries in {q:?}",
                    lay_of(b, ins[3])
                ));
            }
            if !by_heads {
                return Ok((kind, None));
            }
            let mut kv = kv_heads / t;
            if (1..3).all(|k| lay_of(b, ins[k]) == Lay::Rep) && *kv_heads < t {
                for k in [1, 2] {
                    ins[k] =
                        select_kv_head(b, o, ins[k], *kv_heads, t).map_err(|e| e.to_string())?;
                }
                kv = 1;
            }
            Ok((
                OpKind::Attention {
                    heads: heads / t,
                    kv_heads: kv,
                    scale: *scale,
                    causal: *causal,
                    softcap: *softcap,
                    sinks: *sinks,
                    window: *window,
                    chunk: *chunk,
                },
                None,
            ))
        }
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => match lay_of(b, ins[0]) {
            l if sequence_split(l) => Err("rotary on a piece of the sequence".into()),
            l if heads_split(l, rank(b, ins[0])) => Ok((
                OpKind::Rotary {
                    heads: heads / t,
                    theta: *theta,
                    scaling: *scaling,
                },
                None,
            )),
            _ => Ok((kind, None)),
        },
        OpKind::Split { axis, sizes } => match lay_of(b, ins[0]) {
            // Each rank holds its piece of every block only when the blocks are the parts and
            // the parts are equal (a fused QKV of equal widths); otherwise its columns do not
            // line up with the parts.
            Lay::Split { axis: a, blocks }
                if usize::from(a) == *axis
                    && (blocks as usize != sizes.len()
                        || sizes.iter().any(|&s| Some(&s) != sizes.first())) =>
            {
                Err("a split of a tensor cut into other blocks than its parts".into())
            }
            Lay::Split { axis: a, .. } if usize::from(a) == *axis => Ok((
                OpKind::Split {
                    axis: *axis,
                    sizes: sizes.iter().map(|s| s / t).collect(),
                },
                None,
            )),
            _ => Ok((kind, None)),
        },
        OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. } | OpKind::Softmax { .. } => {
            if heads_split(lay_of(b, ins[0]), rank(b, ins[0])) {
                return Err("a row reduction over a split row".into());
            }
            Ok((kind, None))
        }
        // A mean or sum over the last axis of a tensor split along another.
        OpKind::ReduceMean | OpKind::ReduceSum => match lay_of(b, ins[0]) {
            Lay::Rep => Ok((kind, None)),
            Lay::Split { axis, .. } if axis + 1 < rank(b, ins[0]) => Ok((kind, None)),
            l => Err(format!("a reduction over the last axis on {l:?}")),
        },
        OpKind::Dropout { .. } => match lay_of(b, ins[0]) {
            // The runtime draws masks on global indices for whole and sequence-split tensors.
            Lay::Rep => Ok((kind, None)),
            Lay::Split { axis: 1, .. } if cx.sp => Ok((kind, None)),
            l => Err(format!("dropout on {l:?}")),
        },
        // Partial sums only through a linear point-wise op whose operands are all partial
        // (a sum of partials is the partial of the sum; a whole operand would count t times).
        k if k.is_pointwise() => {
            let partial = ins
                .iter()
                .filter(|&&v| lay_of(b, v) == Lay::Partial)
                .count();
            let linear = matches!(
                k,
                OpKind::Add | OpKind::Sub | OpKind::Neg | OpKind::Scale { .. }
            );
            if partial == 0 || (linear && partial == ins.len()) {
                Ok((kind, None))
            } else {
                Err("a point-wise op on partial sums it does not pass through".into())
            }
        }
        OpKind::Reshape { .. }
        | OpKind::Expand { .. }
        | OpKind::Slice { .. }
        | OpKind::Concat { .. } => view_local(b, o, ins, out, kind),
        OpKind::MoeExperts { experts, form } => moe_local(b, ins, out, (*experts, *form), t),
        OpKind::TopKRouter { .. } => {
            // Routes each token it holds with the whole router (and bias): any split of the
            // tokens' axes (not of the hidden one it reads whole) passes through.
            let x = lay_of(b, ins[0]);
            let per_token = match x {
                Lay::Rep => true,
                Lay::Split { axis, .. } => axis + 1 < rank(b, ins[0]),
                Lay::Partial => false,
            };
            let whole = ins[1..].iter().all(|&w| lay_of(b, w) == Lay::Rep);
            if per_token && whole && out == x {
                Ok((kind, None))
            } else {
                Err("a router off whole tokens' hidden axis or with a split weight".into())
            }
        }
        _ if ins.iter().all(|&v| lay_of(b, v) == Lay::Rep) && out == Lay::Rep => Ok((kind, None)),
        _ => Err("no lowering for this op on split operands".into()),
    }
}

/// The layout of `x · w` for a product's input and weight layouts (`rank`: the input's), as
/// the e-graph's matmul rules give it: tokens split, output columns split, a partial sum of a
/// split contraction, or whole.
fn product_layout(x: Lay, w: Lay, rank: u8) -> Option<Lay> {
    match (x, w) {
        (Lay::Rep, Lay::Rep) => Some(Lay::Rep),
        (Lay::Split { axis, blocks: 1 }, Lay::Rep) if axis + 1 < rank => Some(x),
        (Lay::Rep, Lay::Split { axis: 1, blocks }) => Some(Lay::Split {
            axis: rank - 1,
            blocks,
        }),
        (Lay::Split { axis, blocks: 1 }, Lay::Split { axis: 0, blocks: 1 }) if axis + 1 == rank => {
            Some(Lay::Partial)
        }
        _ => None,
    }
}

/// A view or copy (reshape, broadcast, slice, concatenation) on operands split along one axis
/// it leaves alone, as the e-graph's shape rules admit them: each rank runs the op on its
/// pieces, a reshape or broadcast to its piece of the result. A reshape must keep the
/// dimensions before the split axis (so each rank's contiguous runs stay its own), a
/// broadcast must not widen the split axis, and a slice or concatenation must cut along
/// another axis; anything else is named.
fn view_local(
    b: &B,
    o: OpId,
    ins: &[SVal],
    out: Lay,
    kind: OpKind,
) -> Result<(OpKind, Option<(SVal, Lay)>), String> {
    let cx = b.cx;
    let lays: Vec<Lay> = ins.iter().map(|&v| b.seg.vals[v].lay).collect();
    if out == Lay::Rep && lays.iter().all(|&l| l == Lay::Rep) {
        return Ok((kind, None));
    }
    let Lay::Split { axis, blocks: 1 } = out else {
        return Err(format!("a {} into {out:?}", kind.mnemonic()));
    };
    if lays.iter().any(|&l| l != out) {
        return Err(format!("a {} of {lays:?} into {out:?}", kind.mnemonic()));
    }
    let op = cx.graph.op(o);
    let from = cx.global_shape(op.inputs[0]);
    let to = cx.global_shape(op.results[0]);
    let a = usize::from(axis);
    let local_to = || {
        local(&to, out, cx.tp)
            .into_iter()
            .map(ir::Dim::Fixed)
            .collect::<Vec<_>>()
    };
    match kind {
        OpKind::Reshape { .. } if a < from.len() && a < to.len() && from[..a] == to[..a] => {
            Ok((OpKind::Reshape { shape: local_to() }, None))
        }
        OpKind::Expand { .. } if from.len() == to.len() && from.get(a) == to.get(a) => {
            Ok((OpKind::Expand { shape: local_to() }, None))
        }
        OpKind::Slice { axis: along, .. } | OpKind::Concat { axis: along } if along != a => {
            Ok((kind, None))
        }
        _ => Err(format!(
            "a {} whose split along axis {a} does not pass through",
            kind.mnemonic()
        )),
    }
}

/// An expert layer over the tensor-parallel group, on whole tokens: each expert's FFN split
/// (`moe-ffn`, Megatron-Core's expert tensor parallelism: gate and up projections by columns,
/// the down projection by rows) or the experts themselves split along their axis with the
/// routing weights sliced to the rank's experts (`moe-experts`); either way every rank's
/// output is a partial sum over the group.
/// The biases of the gate and up projections (gpt-oss's, `[E, F]`) go with their weights.
fn moe_local(
    b: &B,
    ins: &[SVal],
    out: Lay,
    (experts, form): (u64, ir::ExpertForm),
    t: u64,
) -> Result<(OpKind, Option<(SVal, Lay)>), String> {
    let lay_of = |k: usize| b.seg.vals[ins[k]].lay;
    let split = |axis| Lay::Split { axis, blocks: 1 };
    if lay_of(0) != Lay::Rep || out != Lay::Partial {
        return Err("an expert layer off whole tokens or not a partial sum".into());
    }
    let weights: Vec<Lay> = (2..ins.len()).map(lay_of).collect();
    let biases = |axis| vec![split(axis); ins.len() - 5];
    let by_ffn = [vec![split(2), split(2), split(1)], biases(1)].concat();
    if lay_of(1) == Lay::Rep && weights == by_ffn {
        return Ok((OpKind::MoeExperts { experts, form }, None));
    }
    let last = (b.seg.vals[ins[1]].shape.len() - 1) as u8;
    let by_experts = vec![split(0); ins.len() - 2];
    if lay_of(1) == split(last) && weights == by_experts && experts.is_multiple_of(t) {
        return Ok((
            OpKind::MoeExperts {
                experts: experts / t,
                form,
            },
            None,
        ));
    }
    Err(format!(
        "an expert layer reading gates {:?} and weights {weights:?}",
        lay_of(1)
    ))
}
