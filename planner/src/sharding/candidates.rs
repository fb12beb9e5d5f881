//! The extraction problem: which e-nodes may be chosen (they type-check, are available and
//! derivable from leaves), what each costs, and which gradient reductions the backward pass
//! needs.

use std::collections::{HashMap, HashSet};

use egg::{Id, Language};
use ir::{Binding, Graph, OpId, OpKind, TensorType};

use super::ShardOptions;
use super::analysis::{Dist, Fact, TensorFact, enode_fact};
use super::build::Built;
use super::cost::{CollectiveKind, ComputeKind, CostOracle};
use super::lang::{Atom, Shard};

/// Forward or backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Pass {
    Forward,
    Backward,
}

/// Why a backward all-gather runs where the program gathers a value again for the backward
/// that reads it (it kept the shard, not the gathered value).
pub const REGATHER: &str = "gathered again for the backward (the shard is kept)";

/// Why a backward all-to-all runs where the program re-splits a value again for the backward
/// that reads it (it kept the value it was re-split from).
pub const RESPLIT: &str = "re-split again for the backward (its source is kept)";

/// A collective a node performs.
#[derive(Clone, Debug, PartialEq)]
pub struct Comm {
    pub kind: CollectiveKind,
    pub pass: Pass,
    /// Bytes per rank (the collective's full buffer) at the binding.
    pub bytes: f64,
    /// The tensor whose bytes these are (global type) and the divisor applied.
    pub ty: TensorType,
    pub divisor: f64,
    pub seconds: f64,
    pub reason: &'static str,
    /// A parameter's gradient reduction, done once per step: `seconds` is its share of one
    /// micro-batch ([`CostOracle::weight_gradient_share`]).
    pub per_step: bool,
}

/// One choosable e-node.
#[derive(Clone, Debug)]
pub struct Cand {
    pub class: usize,
    pub node: Shard,
    /// Tensor child classes (dense indices), in child order.
    pub kids: Vec<usize>,
    pub compute_s: f64,
    pub fwd_flops: f64,
    pub bwd_flops: f64,
    pub param_bytes: f64,
    pub act_bytes: f64,
    pub comms: Vec<Comm>,
}

impl Cand {
    pub fn seconds(&self) -> f64 {
        self.compute_s + self.comms.iter().map(|c| c.seconds).sum::<f64>()
    }
    pub fn memory(&self) -> f64 {
        self.param_bytes + self.act_bytes
    }
}

/// One e-class of the problem.
#[derive(Clone, Debug)]
pub struct Class {
    pub id: Id,
    pub fact: TensorFact,
    pub nodes: Vec<usize>,
    /// The backward reduction of this replicated class's gradient when a split (rank-variant)
    /// node reads it ([`GradReduce::pick`]).
    pub grad_reduce: Option<GradReduce>,
    /// Rank-variant candidates that read this class.
    pub variant_readers: Vec<usize>,
}

/// How a replicated tensor's gradient is completed when rank-variant nodes read it
/// (Megatron's conjugate collectives).
#[derive(Clone, Debug)]
pub struct GradReduce {
    /// Split ops each add a partial gradient of the whole tensor: all-reduced.
    pub all_reduce: Comm,
    /// ... of a tensor an all-gather made: reduce-scattered back onto its shards.
    pub reduce_scatter: Comm,
    /// Only slices read it (each rank its piece, as `scatter_to_sequence_parallel_region`):
    /// each rank holds its piece's gradient, all-gathered.
    pub all_gather: Comm,
}

impl GradReduce {
    /// The reduction the program runs when the chosen rank-variant readers are `pieces_only`
    /// slices or not, of a tensor that an all-gather made (`gathered`) or not: the pieces'
    /// all-gather (Megatron's `scatter_to_sequence_parallel_region` backward), else the
    /// reduce-scatter back onto the all-gather's shards, else an all-reduce. (Every
    /// collective model plait has prices an activation's all-gather below its all-reduce, so
    /// an extra split reader never makes a gradient cheaper.)
    pub fn pick(&self, pieces_only: bool, gathered: bool) -> &Comm {
        if pieces_only {
            &self.all_gather
        } else if gathered {
            &self.reduce_scatter
        } else {
            &self.all_reduce
        }
    }

    /// The three, in the order all-reduce, reduce-scatter, all-gather.
    pub fn options(&self) -> [&Comm; 3] {
        [&self.all_reduce, &self.reduce_scatter, &self.all_gather]
    }
}

/// Whether candidate `i` takes the rank's piece of its operand (a slice).
pub fn is_slice(p: &Problem, i: usize) -> bool {
    matches!(p.cands[i].node, Shard::Shard(_))
}

/// The reduction class `c`'s gradient needs when the candidates `chosen` run, if any: the
/// pieces' all-gather where only slices of it are rank-variant readers, else a partial sum's
/// reduction (a reduce-scatter where an all-gather made it).
pub fn grad_comm<'p>(p: &'p Problem, c: usize, chosen: &[bool]) -> Option<&'p Comm> {
    let class = &p.classes[c];
    let gr = class.grad_reduce.as_ref()?;
    let mut readers = class.variant_readers.iter().filter(|&&i| chosen[i]);
    let first = readers.next()?;
    let pieces = is_slice(p, *first) && readers.all(|&i| is_slice(p, i));
    let gathered = class
        .nodes
        .iter()
        .any(|&i| chosen[i] && matches!(p.cands[i].node, Shard::AllGather(_)));
    Some(gr.pick(pieces, gathered))
}

/// The whole extraction problem.
#[derive(Clone, Debug)]
pub struct Problem {
    pub classes: Vec<Class>,
    pub cands: Vec<Cand>,
    pub roots: Vec<usize>,
    pub tp: u32,
    pub binding: Binding,
}

/// Bytes of a rank's piece of `f`: 1/tp of a split tensor, or ⌈d / tp⌉ of its d rows where
/// the split pads them.
fn local_bytes(f: &TensorFact, b: Binding, tp: f64) -> f64 {
    let bytes = f.ty.bytes(b) as f64;
    match f.dist {
        Dist::Sharded(a) => match f
            .ty
            .shape
            .0
            .get(usize::from(a.axis))
            .and_then(|d| d.fixed())
        {
            Some(n) if a.blocks == 1 && n > 0 => bytes / n as f64 * (n as f64 / tp).ceil(),
            _ => bytes / tp,
        },
        _ => bytes,
    }
}

#[allow(clippy::too_many_arguments)]
fn comm(
    costs: &dyn CostOracle,
    tp: u32,
    kind: CollectiveKind,
    pass: Pass,
    ty: &TensorType,
    divisor: f64,
    b: Binding,
    reason: &'static str,
) -> Comm {
    let bytes = ty.bytes(b) as f64 / divisor;
    Comm {
        kind,
        pass,
        bytes,
        ty: ty.clone(),
        divisor,
        seconds: costs.collective_seconds(kind, bytes, tp),
        reason,
        per_step: false,
    }
}

impl Problem {
    /// Builds the problem from a saturated e-graph.
    pub fn new(
        graph: &Graph,
        built: &Built,
        opts: &ShardOptions,
        costs: &dyn CostOracle,
    ) -> Option<Problem> {
        let eg = &built.egraph;
        let b = opts.binding;
        let tp = f64::from(opts.tp);
        // 1. Valid nodes per tensor class.
        let mut valid: HashMap<Id, Vec<Shard>> = HashMap::new();
        for c in eg.classes() {
            let Fact::Tensor(cf) = &c.data else { continue };
            let held_split = c.nodes.iter().any(
                |n| matches!(n, Shard::Atom(Atom::Val(v)) if built.never_gathered.contains(v)),
            );
            for n in &c.nodes {
                if let Shard::Atom(a) = n
                    && built.unavailable.contains(a)
                {
                    continue;
                }
                if held_split && n.is_collective() {
                    continue;
                }
                if let Fact::Tensor(nf) = enode_fact(eg, n)
                    && nf == *cf
                {
                    valid.entry(c.id).or_default().push(n.clone());
                }
            }
        }
        let tensor_kids = |n: &Shard| -> Vec<Id> {
            n.children()
                .iter()
                .map(|&k| eg.find(k))
                .filter(|k| matches!(eg[*k].data, Fact::Tensor(_)))
                .collect()
        };
        // 2. Derivable classes (some node whose tensor children are all derivable).
        let mut derivable: HashSet<Id> = HashSet::new();
        loop {
            let before = derivable.len();
            for (id, nodes) in &valid {
                if !derivable.contains(id)
                    && nodes
                        .iter()
                        .any(|n| tensor_kids(n).iter().all(|k| derivable.contains(k)))
                {
                    derivable.insert(*id);
                }
            }
            if derivable.len() == before {
                break;
            }
        }
        // 3. Reachable from the roots through derivable nodes.
        let roots: Vec<Id> = built.root_classes();
        if roots.iter().any(|r| !derivable.contains(r)) {
            return None;
        }
        let mut index: HashMap<Id, usize> = HashMap::new();
        let mut order: Vec<Id> = Vec::new();
        let mut stack = roots.clone();
        while let Some(c) = stack.pop() {
            if index.contains_key(&c) {
                continue;
            }
            index.insert(c, order.len());
            order.push(c);
            for n in valid.get(&c).into_iter().flatten() {
                let kids = tensor_kids(n);
                if kids.iter().all(|k| derivable.contains(k)) {
                    stack.extend(kids);
                }
            }
        }
        let mut classes: Vec<Class> = order
            .iter()
            .filter_map(|&id| {
                let Fact::Tensor(f) = &eg[id].data else {
                    return None;
                };
                Some(Class {
                    id,
                    fact: f.clone(),
                    nodes: Vec::new(),
                    grad_reduce: None,
                    variant_readers: Vec::new(),
                })
            })
            .collect();
        let mut cands = Vec::new();
        for (ci, &id) in order.iter().enumerate() {
            for n in valid.get(&id).into_iter().flatten() {
                let kids = tensor_kids(n);
                if !kids.iter().all(|k| derivable.contains(k)) {
                    continue;
                }
                let kids: Vec<usize> = kids.iter().filter_map(|k| index.get(k).copied()).collect();
                let cand = cost_node(graph, built, &classes, ci, n, kids, opts, costs);
                classes[ci].nodes.push(cands.len());
                cands.push(cand);
            }
        }
        // Backward gradient reductions (Megatron's conjugates f / ḡ): a replicated float tensor
        // read by a rank-variant node gets a partial gradient from it. In an expert-parallel
        // group a whole parameter read by batch shards is a data-parallel weight: its gradient
        // is reduced once per iteration with the data-parallel group's, not in the block.
        let dp_weights: HashSet<usize> = (0..classes.len())
            .filter(|&k| {
                opts.expert_parallel
                    && eg[classes[k].id].nodes.iter().any(|n| {
                        matches!(n, Shard::Atom(Atom::Val(v)) if eg.analysis.ctx.params.contains(v))
                    })
            })
            .collect();
        for (ni, c) in cands.iter().enumerate() {
            if !classes[c.class].fact.dist.rank_variant() {
                continue;
            }
            let mut seen = HashSet::new();
            for &k in &c.kids {
                let kf = &classes[k].fact;
                if kf.dist == Dist::Replicated
                    && kf.ty.dtype.is_float()
                    && !dp_weights.contains(&k)
                    && seen.insert(k)
                {
                    classes[k].variant_readers.push(ni);
                }
            }
        }
        let is_param = |c: &Class| {
            eg[c.id].nodes.iter().any(
                |n| matches!(n, Shard::Atom(Atom::Val(v)) if eg.analysis.ctx.params.contains(v)),
            )
        };
        for c in &mut classes {
            if !c.variant_readers.is_empty() {
                let param = is_param(c);
                let backward = |kind, reason, weight: bool| {
                    let mut x = comm(
                        costs,
                        opts.tp,
                        kind,
                        Pass::Backward,
                        &c.fact.ty,
                        1.0,
                        b,
                        reason,
                    );
                    if weight {
                        // A weight's gradient is reduced once per step, not per micro-batch.
                        x.seconds *= costs.weight_gradient_share();
                        x.per_step = true;
                    }
                    x
                };
                c.grad_reduce = Some(GradReduce {
                    all_reduce: backward(
                        CollectiveKind::AllReduce,
                        "gradient of a replicated tensor read by split ops",
                        param,
                    ),
                    reduce_scatter: backward(
                        CollectiveKind::ReduceScatter,
                        "backward conjugate of all-gather",
                        false,
                    ),
                    all_gather: backward(
                        CollectiveKind::AllGather,
                        "gradient of a replicated tensor read in pieces",
                        param,
                    ),
                });
            }
        }
        let _ = tp;
        Some(Problem {
            roots: roots.iter().filter_map(|r| index.get(r).copied()).collect(),
            classes,
            cands,
            tp: opts.tp,
            binding: b,
        })
    }
}

#[allow(clippy::too_many_arguments)]
fn cost_node(
    graph: &Graph,
    built: &Built,
    classes: &[Class],
    ci: usize,
    n: &Shard,
    kids: Vec<usize>,
    opts: &ShardOptions,
    costs: &dyn CostOracle,
) -> Cand {
    let b = opts.binding;
    let tp = f64::from(opts.tp);
    let fact = &classes[ci].fact;
    let out_local = local_bytes(fact, b, tp);
    let mut cand = Cand {
        class: ci,
        node: n.clone(),
        kids,
        compute_s: 0.0,
        fwd_flops: 0.0,
        bwd_flops: 0.0,
        param_bytes: 0.0,
        act_bytes: 0.0,
        comms: Vec::new(),
    };
    let params = &built.egraph.analysis.ctx.params;
    let mk = |kind, pass, ty: &TensorType, div, reason| {
        comm(costs, opts.tp, kind, pass, ty, div, b, reason)
    };
    let op_tag = || -> Option<u32> {
        let first = *n.children().first()?;
        match built.egraph[first].data {
            Fact::Meta(Atom::Op(o)) => Some(o),
            _ => None,
        }
    };
    match n {
        Shard::Atom(Atom::Val(v) | Atom::Stored(v, _)) => {
            if params.contains(v) {
                cand.param_bytes = costs.param_memory_bytes(out_local);
            } else {
                cand.act_bytes = costs.activation_memory_bytes(out_local);
            }
        }
        Shard::Atom(_) => {}
        Shard::Shard(_) => {
            // A slice: free in the forward pass (its backward is the reader's gradient
            // reduction). A slice of an activation is a copy kept for the backward pass; a
            // slice of a parameter is transient.
            let of_param = cand.kids.first().is_some_and(|&k| {
                built.egraph[classes[k].id]
                    .nodes
                    .iter()
                    .any(|x| matches!(x, Shard::Atom(Atom::Val(v)) if params.contains(v)))
            });
            if !of_param {
                cand.act_bytes = costs.activation_memory_bytes(out_local);
            }
        }
        Shard::AllReduce(_) => {
            cand.comms.push(mk(
                CollectiveKind::AllReduce,
                Pass::Forward,
                &fact.ty,
                1.0,
                "completes partial sums",
            ));
            cand.act_bytes = costs.activation_memory_bytes(out_local);
        }
        Shard::AllGather(_) => {
            cand.comms.push(mk(
                CollectiveKind::AllGather,
                Pass::Forward,
                &fact.ty,
                1.0,
                "gathers shards",
            ));
            // The program keeps the shard, not the gathered value, and gathers it again for
            // the backward that reads it (codegen's `regather`; Megatron-LM's sequence
            // parallelism does the same for a product's input). Not priced for an
            // expert-parallel group's dispatch: the extraction is held to Megatron-Core's
            // all-gather dispatcher there (`expert_layout_is_lowered`), which keeps it.
            if fact.ty.dtype.is_float() && !opts.expert_parallel {
                cand.comms.push(mk(
                    CollectiveKind::AllGather,
                    Pass::Backward,
                    &fact.ty,
                    1.0,
                    REGATHER,
                ));
            }
            cand.act_bytes = costs.activation_memory_bytes(out_local);
        }
        Shard::ReduceScatter(_) => {
            cand.comms.push(mk(
                CollectiveKind::ReduceScatter,
                Pass::Forward,
                &fact.ty,
                1.0,
                "completes partial sums into shards",
            ));
            cand.comms.push(mk(
                CollectiveKind::AllGather,
                Pass::Backward,
                &fact.ty,
                1.0,
                "backward conjugate of reduce-scatter",
            ));
            cand.act_bytes = costs.activation_memory_bytes(out_local);
        }
        Shard::AllToAll(_) => {
            for pass in [Pass::Forward, Pass::Backward] {
                cand.comms.push(mk(
                    CollectiveKind::AllToAll,
                    pass,
                    &fact.ty,
                    tp,
                    "re-splits along another axis",
                ));
            }
            // As an all-gather's: the program keeps the source and re-splits it again for the
            // backward that reads the result (codegen's `regather`), not a second copy. A
            // re-split into blocks is read through a view (codegen's `resplit_into_blocks`),
            // whose readers keep what they read: nothing is re-split for the backward.
            let into_blocks = matches!(fact.dist, Dist::Sharded(a) if a.blocks > 1);
            if fact.ty.dtype.is_float() && !opts.expert_parallel && !into_blocks {
                cand.comms.push(mk(
                    CollectiveKind::AllToAll,
                    Pass::Backward,
                    &fact.ty,
                    tp,
                    RESPLIT,
                ));
            }
            cand.act_bytes = costs.activation_memory_bytes(out_local);
        }
        Shard::Part(_) => {}
        _ => {
            let Some(o) = op_tag() else { return cand };
            let op = OpId(o);
            let variant = fact.dist.rank_variant()
                || cand
                    .kids
                    .iter()
                    .any(|&k| classes[k].fact.dist.rank_variant());
            let frac = if variant { 1.0 / tp } else { 1.0 };
            let kind = match graph.op(op).kind {
                OpKind::Linear { .. }
                | OpKind::MatMul
                | OpKind::Attention { .. }
                | OpKind::MoeExperts { .. }
                | OpKind::TopKRouter { .. } => ComputeKind::Matmul,
                _ => ComputeKind::Elementwise,
            };
            let (ff, bf, fb, bb) = if let Shard::Bias(_) = n {
                // The bias add of a linear op (the product is costed on the linear node).
                let elems = out_local / fact.ty.dtype.size_bytes() as f64;
                (elems, elems, 3.0 * out_local, 3.0 * out_local)
            } else {
                let c = ir::cost::op_cost(graph, op, b);
                (
                    c.fwd_flops * frac,
                    c.bwd_flops * frac,
                    c.fwd_bytes() * frac,
                    c.bwd_bytes() * frac,
                )
            };
            cand.fwd_flops = ff;
            cand.bwd_flops = bf;
            cand.compute_s =
                costs.compute_seconds(kind, ff, fb) + costs.compute_seconds(kind, bf, bb);
            cand.act_bytes = costs.activation_memory_bytes(out_local);
            // A vocabulary-parallel loss: each rank's max, sum of exponentials and target
            // logit (three floats a token) gathered once over the group, as the program runs
            // the loss (`LossStats`, an all-gather, `LossCombine`): the gathered buffer holds
            // every member's three.
            if let Shard::VocabCrossEntropy(_) = n
                && let Some(&t) = graph.op(op).inputs.get(1)
            {
                let tokens = TensorType::new(ir::DType::F32, graph.ty(t).shape.clone());
                cand.comms.push(mk(
                    CollectiveKind::AllGather,
                    Pass::Forward,
                    &tokens,
                    1.0 / (3.0 * tp),
                    "vocab-parallel cross-entropy statistics",
                ));
            }
        }
    }
    cand
}
