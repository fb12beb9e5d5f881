//! Per-e-class facts: the global type of the tensor a class stands for and how it is laid out
//! across the tensor-parallel group ([`Dist`]). Every e-node's fact follows from its children's
//! ([`node_fact`]), so a rewrite is sound only if its right-hand side has the same fact as the
//! class it joins; the rule applier checks exactly that before adding anything, and a merge of
//! two classes with different facts is recorded as a conflict (a bug in a rule).

use std::collections::{HashMap, HashSet};

use egg::{Analysis, DidMerge, EGraph, Id, Language};
use ir::{Dim, OpKind, TensorType};
use serde::{Deserialize, Serialize};

use super::lang::{Atom, Axis, Shard};

/// How a tensor is held across the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dist {
    /// Every rank holds the whole tensor.
    Replicated,
    /// Rank r holds its slice along an axis.
    Sharded(Axis),
    /// Every rank holds a tensor of the full shape; the value is their sum.
    Partial,
}

impl Dist {
    /// Whether ranks hold different data (a sharded or partial tensor).
    pub fn rank_variant(self) -> bool {
        self != Dist::Replicated
    }
}

/// A tensor's global type and its layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorFact {
    pub ty: TensorType,
    pub dist: Dist,
}

/// What an e-class stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact {
    /// A leaf that is not a tensor: op tag, axis, result index.
    Meta(Atom),
    Tensor(TensorFact),
    /// The node does not type-check (the reason says why).
    Invalid(String),
}

impl Fact {
    pub fn tensor(&self) -> Option<&TensorFact> {
        match self {
            Fact::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// What the analysis knows about the IR block.
#[derive(Clone, Debug, Default)]
pub struct Ctx {
    pub tp: u64,
    /// Result types by op id.
    pub op_results: HashMap<u32, Vec<TensorType>>,
    pub op_kinds: HashMap<u32, OpKind>,
    /// Types of leaf values by value id.
    pub values: HashMap<u32, TensorType>,
    /// Values defined by `Param` ops.
    pub params: HashSet<u32>,
    /// A dimension that may split padded ([`crate::sharding::ShardOptions::padded_dim`]).
    pub padded_dim: Option<u64>,
}

impl Ctx {
    fn result(&self, op: u32, i: usize) -> Result<TensorType, String> {
        self.op_results
            .get(&op)
            .and_then(|r| r.get(i))
            .cloned()
            .ok_or_else(|| format!("op {op} has no result {i}"))
    }

    /// Heads of an attention/rotary op's operand of width `w`.
    fn head_dim(&self, op: u32) -> Option<u64> {
        let kind = self.op_kinds.get(&op)?;
        let width = self.op_results.get(&op)?.first()?.shape.last()?.fixed()?;
        match kind {
            OpKind::Attention { heads, .. } | OpKind::Rotary { heads, .. } if *heads > 0 => {
                Some(width / heads)
            }
            _ => None,
        }
    }

    /// Whether `ty` can be split `tp` ways along `a` (each of `a.blocks` blocks evenly).
    /// Symbolic dimensions (batch, sequence) are assumed divisible; the plan states it.
    pub fn splittable(&self, ty: &TensorType, a: Axis) -> bool {
        match ty.shape.0.get(usize::from(a.axis)) {
            Some(Dim::Fixed(n)) => {
                let parts = self.tp * u64::from(a.blocks);
                (*n >= parts && n.is_multiple_of(parts)) || self.pads(ty, a)
            }
            Some(Dim::Sym(_)) => a.blocks == 1,
            None => false,
        }
    }

    /// Whether splitting `ty` along `a` pads it: the padded dimension, not a multiple of tp.
    pub fn pads(&self, ty: &TensorType, a: Axis) -> bool {
        match ty.shape.0.get(usize::from(a.axis)) {
            Some(Dim::Fixed(n)) => {
                a.blocks == 1
                    && Some(*n) == self.padded_dim
                    && *n >= self.tp
                    && !n.is_multiple_of(self.tp)
            }
            _ => false,
        }
    }
}

/// The e-graph analysis: [`Fact`]s plus the IR context and a log of conflicting merges.
#[derive(Debug, Default)]
pub struct ShardAnalysis {
    pub ctx: Ctx,
    pub conflicts: Vec<String>,
}

pub type ShardGraph = EGraph<Shard, ShardAnalysis>;

impl Analysis<Shard> for ShardAnalysis {
    type Data = Fact;

    fn make(egraph: &mut ShardGraph, enode: &Shard, _id: Id) -> Fact {
        let kids: Vec<Fact> = enode
            .children()
            .iter()
            .map(|&c| egraph[c].data.clone())
            .collect();
        node_fact(&egraph.analysis.ctx, enode, &kids)
    }

    fn merge(&mut self, a: &mut Fact, b: Fact) -> DidMerge {
        if *a == b {
            return DidMerge(false, false);
        }
        self.conflicts.push(format!(
            "merged classes with different facts: {a:?} and {b:?}"
        ));
        DidMerge(false, true)
    }
}

fn tensor(ty: TensorType, dist: Dist) -> Fact {
    Fact::Tensor(TensorFact { ty, dist })
}

/// Whether every operand in `ins` has the rank of `out` and its extent along `d`: none
/// broadcasts along the split axis.
fn unbroadcast(ins: &[&TensorType], out: &TensorType, d: Axis) -> bool {
    let extent = |t: &TensorType| t.shape.0.get(usize::from(d.axis)).cloned();
    extent(out).is_some()
        && ins
            .iter()
            .all(|t| t.shape.rank() == out.shape.rank() && extent(t) == extent(out))
}

/// Whether `t` broadcasts along axis `d` of `out` (numpy's trailing alignment): it has no such
/// axis, or one of extent 1.
fn broadcasts(t: &TensorType, out: &TensorType, d: Axis) -> bool {
    let (rank, out_rank) = (t.shape.rank(), out.shape.rank());
    let from_end = out_rank - usize::from(d.axis).min(out_rank);
    match rank.checked_sub(from_end) {
        None => true,
        Some(i) => t.shape.0.get(i) == Some(&Dim::Fixed(1)),
    }
}

/// The fact of `node` given its children's facts (in `node.children()` order).
pub fn node_fact(ctx: &Ctx, node: &Shard, kids: &[Fact]) -> Fact {
    match fact_of(ctx, node, kids) {
        Ok(f) => f,
        Err(e) => Fact::Invalid(e),
    }
}

fn fact_of(ctx: &Ctx, node: &Shard, kids: &[Fact]) -> Result<Fact, String> {
    use Dist::{Partial as P, Replicated as R, Sharded as S};
    let t = |i: usize| -> Result<&TensorFact, String> {
        match kids.get(i) {
            Some(Fact::Tensor(t)) => Ok(t),
            Some(Fact::Invalid(e)) => Err(e.clone()),
            _ => Err(format!("operand {i} of {node} is not a tensor")),
        }
    };
    let meta = |i: usize| -> Result<Atom, String> {
        match kids.get(i) {
            Some(Fact::Meta(a)) => Ok(*a),
            _ => Err(format!("operand {i} of {node} is not an atom")),
        }
    };
    let axis = |i: usize| -> Result<Axis, String> {
        match meta(i)? {
            Atom::Axis(a) => Ok(a),
            a => Err(format!("{a} is not an axis")),
        }
    };
    let op = || -> Result<u32, String> {
        match meta(0)? {
            Atom::Op(o) => Ok(o),
            a => Err(format!("{a} is not an op tag")),
        }
    };
    let out = |i: usize| -> Result<TensorType, String> { ctx.result(op()?, i) };
    let last = |ty: &TensorType| ty.shape.rank().saturating_sub(1) as u8;
    let not_last = |d: Axis, ty: &TensorType| d.blocks == 1 && d.axis < last(ty);
    let fail = || {
        Err(format!(
            "{node}: no sharding rule for these operand layouts"
        ))
    };
    let sharded = |ty: TensorType, a: Axis| -> Result<Fact, String> {
        if ctx.splittable(&ty, a) {
            Ok(tensor(ty, S(a)))
        } else {
            Err(format!("{} cannot be split {} ways along {a}", ty, ctx.tp))
        }
    };
    // A collective moves whole pieces: it never makes or takes a padded split (a slice of a
    // whole tensor may pad: each rank cuts its piece and fills the rest with zeros).
    let unpadded = |ty: &TensorType, a: Axis| -> Result<(), String> {
        if ctx.pads(ty, a) {
            Err(format!("{ty} along {a} is padded: no collective moves it"))
        } else {
            Ok(())
        }
    };
    Ok(match node {
        Shard::Atom(a) => match *a {
            Atom::Val(v) => tensor(
                ctx.values
                    .get(&v)
                    .cloned()
                    .ok_or(format!("unknown value {v}"))?,
                R,
            ),
            Atom::Stored(v, ax) => {
                let ty = ctx
                    .values
                    .get(&v)
                    .cloned()
                    .ok_or(format!("unknown value {v}"))?;
                sharded(ty, ax)?
            }
            a => Fact::Meta(a),
        },
        Shard::Shard(_) => {
            let (a, x) = (axis(0)?, t(1)?);
            if x.dist != R {
                return Err(format!("{node}: only a replicated tensor can be sliced"));
            }
            sharded(x.ty.clone(), a)?
        }
        Shard::AllReduce(_) => match t(0)? {
            TensorFact { ty, dist: P } => tensor(ty.clone(), R),
            _ => return Err("all-reduce takes a partial sum".into()),
        },
        Shard::AllGather(_) => {
            let (a, x) = (axis(0)?, t(1)?);
            if x.dist != S(a) {
                return Err(format!("all-gather {a} takes a tensor split along {a}"));
            }
            unpadded(&x.ty, a)?;
            tensor(x.ty.clone(), R)
        }
        Shard::ReduceScatter(_) => {
            let (a, x) = (axis(0)?, t(1)?);
            if x.dist != P {
                return Err("reduce-scatter takes a partial sum".into());
            }
            unpadded(&x.ty, a)?;
            sharded(x.ty.clone(), a)?
        }
        Shard::AllToAll(_) => {
            let (a, b, x) = (axis(0)?, axis(1)?, t(2)?);
            if x.dist != S(a) || a == b {
                return Err(format!("all-to-all {a}→{b} takes a tensor split along {a}"));
            }
            unpadded(&x.ty, a)?;
            unpadded(&x.ty, b)?;
            sharded(x.ty.clone(), b)?
        }
        Shard::Linear(_) => {
            let (x, w, ty) = (t(1)?, t(2)?, out(0)?);
            match (x.dist, w.dist) {
                (R, R) => tensor(ty, R),
                (S(d), R) if not_last(d, &x.ty) => sharded(ty, d)?,
                (R, S(d)) if d.axis == 1 && w.ty.shape.rank() == 2 => sharded(
                    ty.clone(),
                    Axis {
                        axis: last(&ty),
                        blocks: d.blocks,
                    },
                )?,
                (S(d), S(e)) if d.blocks == 1 && e == Axis::new(0) && d.axis == last(&x.ty) => {
                    tensor(ty, P)
                }
                _ => return fail(),
            }
        }
        Shard::Bias(_) => {
            let (y, b, ty) = (t(1)?, t(2)?, out(0)?);
            match (y.dist, b.dist) {
                (R, R) => tensor(ty, R),
                (S(d), S(e)) if d.axis == last(&y.ty) && e.axis == 0 && d.blocks == e.blocks => {
                    tensor(ty, S(d))
                }
                (S(d), R) if not_last(d, &y.ty) => tensor(ty, S(d)),
                _ => return fail(),
            }
        }
        Shard::Map(_) => {
            let x = t(1)?;
            match x.dist {
                R | S(_) => tensor(out(0)?, x.dist),
                P => return fail(),
            }
        }
        Shard::Zip(_) => {
            let (a, b, ty) = (t(1)?, t(2)?, out(0)?);
            let additive = matches!(ctx.op_kinds.get(&op()?), Some(OpKind::Add | OpKind::Sub));
            match (a.dist, b.dist) {
                (R, R) => tensor(ty, R),
                (S(d), S(e)) if d == e && a.ty == b.ty => tensor(ty, S(d)),
                // A broadcast (Qwen2-MoE's `sigmoid(gate) · shared_expert`, `[b, s, 1]` times
                // `[b, s, h]`): split along an axis both operands have whole-sized, where
                // neither broadcasts, each rank's pieces broadcast as the whole did.
                (S(d), S(e)) if d == e && d.blocks == 1 && unbroadcast(&[&a.ty, &b.ty], &ty, d) => {
                    tensor(ty, S(d))
                }
                (P, P) if additive && a.ty == b.ty => tensor(ty, P),
                // The second operand whole and broadcast along the split axis (a scalar:
                // Llama 4's eps): each rank's piece of the first meets the whole, as the whole
                // did.
                (S(d), R) if d.blocks == 1 && a.ty == ty && broadcasts(&b.ty, &ty, d) => {
                    tensor(ty, S(d))
                }
                _ => return fail(),
            }
        }
        Shard::Reduce(_) => {
            let x = t(1)?;
            match x.dist {
                R => tensor(out(0)?, R),
                S(d) if not_last(d, &x.ty) => tensor(out(0)?, S(d)),
                _ => return fail(),
            }
        }
        Shard::LayerNorm(_) | Shard::RmsNorm(_) => {
            let x = t(1)?;
            let params_replicated = (2..kids.len()).all(|i| t(i).is_ok_and(|p| p.dist == R));
            match x.dist {
                R if params_replicated => tensor(out(0)?, R),
                S(d) if params_replicated && not_last(d, &x.ty) => tensor(out(0)?, S(d)),
                _ => return fail(),
            }
        }
        Shard::Attention(_) | Shard::SinkAttention(_) => {
            let (q, k, v, ty) = (t(1)?, t(2)?, t(3)?, out(0)?);
            // A sink per query head goes where the heads go: whole unless they are split.
            let sinks_follow = |heads_split: bool| match kids.get(4) {
                None => true,
                Some(_) => t(4).is_ok_and(|s| match s.dist {
                    R => !heads_split,
                    S(d) => heads_split && d == Axis::new(0),
                    P => false,
                }),
            };
            let (heads, kv) = match ctx.op_kinds.get(&op()?) {
                Some(OpKind::Attention {
                    heads, kv_heads, ..
                }) => (*heads, *kv_heads),
                _ => return Err("attn tag is not an attention op".into()),
            };
            let same = q.dist == k.dist && k.dist == v.dist;
            let by_heads = matches!(q.dist, S(d) if d == Axis::new(2));
            if !sinks_follow(by_heads) {
                return fail();
            }
            match q.dist {
                R if same => tensor(ty, R),
                S(d) if same && d == Axis::new(0) => sharded(ty, d)?,
                S(d) if same
                    && d == Axis::new(2)
                    && heads.is_multiple_of(ctx.tp)
                    && kv.is_multiple_of(ctx.tp) =>
                {
                    sharded(ty, d)?
                }
                // Fewer key/value heads than ranks (vLLM's replicated KV heads): K and V whole
                // on every rank, each taking the one head its query heads share.
                S(d) if d == Axis::new(2)
                    && k.dist == R
                    && v.dist == R
                    && heads.is_multiple_of(ctx.tp)
                    && kv < ctx.tp
                    && ctx.tp.is_multiple_of(kv) =>
                {
                    sharded(ty, d)?
                }
                _ => return fail(),
            }
        }
        Shard::Rotary(_) => {
            let (x, ty) = (t(1)?, out(0)?);
            let hd = ctx.head_dim(op()?).ok_or("rotary without a head size")?;
            let width = ty.shape.last().and_then(Dim::fixed).unwrap_or(0);
            match x.dist {
                R => tensor(ty, R),
                S(d) if d == Axis::new(0) => sharded(ty, d)?,
                S(d) if d == Axis::new(2) && hd > 0 && (width / hd).is_multiple_of(ctx.tp) => {
                    sharded(ty, d)?
                }
                _ => return fail(),
            }
        }
        Shard::Part(_) => {
            let i = match meta(1)? {
                Atom::Part(i) => i as usize,
                a => return Err(format!("{a} is not a result index")),
            };
            let (x, ty) = (t(2)?, out(i)?);
            let (split_axis, parts) = match ctx.op_kinds.get(&op()?) {
                Some(OpKind::Split { axis, sizes }) => (*axis as u8, sizes.len()),
                _ => return Err("part tag is not a split op".into()),
            };
            match x.dist {
                R => tensor(ty, R),
                S(d) if d.axis == split_axis && usize::from(d.blocks) == parts => {
                    sharded(ty, Axis::new(d.axis))?
                }
                S(d) if d.axis != split_axis && d.blocks == 1 => sharded(ty, d)?,
                _ => return fail(),
            }
        }
        Shard::Embed(_) => {
            let (w, ids, ty) = (t(1)?, t(2)?, out(0)?);
            match (w.dist, ids.dist) {
                (R, R) => tensor(ty, R),
                (S(d), R) if d == Axis::new(1) => sharded(ty.clone(), Axis::new(last(&ty)))?,
                (R, S(d)) if d.blocks == 1 => sharded(ty, d)?,
                _ => return fail(),
            }
        }
        Shard::VocabEmbed(_) => {
            let (w, ids, ty) = (t(1)?, t(2)?, out(0)?);
            match (w.dist, ids.dist) {
                (S(d), R) if d == Axis::new(0) => tensor(ty, P),
                _ => return fail(),
            }
        }
        Shard::CrossEntropy(_) => match (t(1)?.dist, t(2)?.dist) {
            (R, R) => tensor(out(0)?, R),
            _ => return fail(),
        },
        Shard::VocabCrossEntropy(_) => {
            let (l, tg) = (t(1)?, t(2)?);
            match (l.dist, tg.dist) {
                (S(d), R) if d == Axis::new(last(&l.ty)) => tensor(out(0)?, R),
                _ => return fail(),
            }
        }
        Shard::Transpose(_) => {
            let (x, ty) = (t(1)?, out(0)?);
            match x.dist {
                R => tensor(ty, R),
                S(d) if ty.shape.rank() == 2 && d.blocks == 1 && d.axis < 2 => {
                    sharded(ty, Axis::new(1 - d.axis))?
                }
                _ => return fail(),
            }
        }
        Shard::Reshape(_) => {
            let (x, ty) = (t(1)?, out(0)?);
            match x.dist {
                R => tensor(ty, R),
                // Rank r holds the r-th contiguous run of every row of the dimensions before
                // the split axis; a reshape that keeps those dimensions keeps the runs.
                S(d) if d.blocks == 1
                    && same_prefix(&x.ty, &ty, d.axis)
                    && !ctx.pads(&x.ty, d)
                    && !ctx.pads(&ty, d) =>
                {
                    sharded(ty, d)?
                }
                _ => return fail(),
            }
        }
        Shard::Slice(_) => {
            let (x, ty) = (t(1)?, out(0)?);
            let along = match ctx.op_kinds.get(&op()?) {
                Some(OpKind::Slice { axis, .. }) => *axis,
                _ => return Err("slice tag is not a slice op".into()),
            };
            match x.dist {
                R => tensor(ty, R),
                S(d) if d.blocks == 1 && usize::from(d.axis) != along => sharded(ty, d)?,
                _ => return fail(),
            }
        }
        Shard::Concat(_) => {
            let (a, b, ty) = (t(1)?, t(2)?, out(0)?);
            let along = match ctx.op_kinds.get(&op()?) {
                Some(OpKind::Concat { axis }) => *axis,
                _ => return Err("concat tag is not a concat op".into()),
            };
            match (a.dist, b.dist) {
                (R, R) => tensor(ty, R),
                (S(d), S(e)) if d == e && d.blocks == 1 && usize::from(d.axis) != along => {
                    sharded(ty, d)?
                }
                _ => return fail(),
            }
        }
        Shard::Expand(_) => {
            let (x, ty) = (t(1)?, out(0)?);
            let kept = |d: Axis| {
                let axis = usize::from(d.axis);
                x.ty.shape.0.get(axis).is_some() && x.ty.shape.0.get(axis) == ty.shape.0.get(axis)
            };
            match x.dist {
                R => tensor(ty, R),
                // Broadcast along other axes: each rank broadcasts its piece.
                S(d) if d.blocks == 1 && x.ty.shape.rank() == ty.shape.rank() && kept(d) => {
                    sharded(ty, d)?
                }
                _ => return fail(),
            }
        }
        Shard::Router(_) | Shard::BiasedRouter(_) => {
            let (x, w, ty) = (t(1)?, t(2)?, out(0)?);
            if kids.len() > 3 && t(3)?.dist != R {
                return fail();
            }
            match (x.dist, w.dist) {
                (R, R) => tensor(ty, R),
                (S(d), R) if not_last(d, &x.ty) => sharded(ty, d)?,
                _ => return fail(),
            }
        }
        Shard::Moe(_) | Shard::BiasedMoe(_) => {
            let (x, g, ty) = (t(1)?, t(2)?, out(0)?);
            // w1, w3, w2, and gpt-oss's biases b1, b3 (`[E, F]`) where the node has them.
            let w: Vec<Dist> = (3..kids.len())
                .map(|i| t(i).map(|f| f.dist))
                .collect::<Result<_, _>>()?;
            let all_w = |d: Dist| w.iter().all(|&x| x == d);
            let e0 = S(Axis::new(0));
            let by_ffn = [2, 2, 1, 1, 1].map(|a| S(Axis::new(a)));
            match (x.dist, g.dist) {
                (R, R) if all_w(R) => tensor(ty, R),
                (S(d), S(e)) if d == e && not_last(d, &x.ty) && all_w(R) => sharded(ty, d)?,
                (R, S(d)) if d.axis == last(&g.ty) && d.blocks == 1 && all_w(e0) => tensor(ty, P),
                (R, R) if w == by_ffn[..w.len()] => tensor(ty, P),
                _ => return fail(),
            }
        }
        Shard::Opaque(_) => {
            for i in 1..kids.len() {
                if t(i)?.dist != R {
                    return fail();
                }
            }
            tensor(out(0)?, R)
        }
    })
}

/// Whether `a` and `b` share their dimensions before `axis` and both have an axis there.
fn same_prefix(a: &TensorType, b: &TensorType, axis: u8) -> bool {
    let n = usize::from(axis);
    n < a.shape.rank() && n < b.shape.rank() && a.shape.0[..n] == b.shape.0[..n]
}

/// The fact of the class `id`.
pub fn class_fact(eg: &ShardGraph, id: Id) -> &Fact {
    &eg[id].data
}

/// The fact an e-node would have, from its children's classes.
pub fn enode_fact(eg: &ShardGraph, node: &Shard) -> Fact {
    let kids: Vec<Fact> = node
        .children()
        .iter()
        .map(|&c| eg[c].data.clone())
        .collect();
    node_fact(&eg.analysis.ctx, node, &kids)
}
