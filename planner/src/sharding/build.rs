//! Lowering an IR op list (one block) into the e-graph, and saturating it with the rules.
//!
//! Values used by the list but defined outside it (the residual stream entering the block) are
//! leaves `vN`; parameters defined inside it are leaves too. The list's outputs (values read
//! after it, or the graph's scalar outputs: the loss a training step reports) are the roots. The block boundary has one layout on both sides,
//! so repeated layers chain: replicated, or split along the sequence (axis 1) under sequence
//! parallelism, where the input is the leaf `vN@1` and the whole `vN` is not available (it can
//! only be all-gathered).

use std::collections::{HashMap, HashSet};

use egg::{Id, Runner, StopReason};
use ir::{Dim, Graph, OpId, OpKind, Sym};

use super::ShardOptions;
use super::analysis::{Ctx, ShardAnalysis, ShardGraph};
use super::error::ShardError;
use super::lang::{Atom, Axis, Shard};
use super::rules::all_rules;

/// The saturated e-graph of one op list.
#[derive(Debug)]
pub struct Built {
    pub egraph: ShardGraph,
    /// (value, class of the value in its required boundary layout).
    pub roots: Vec<(u32, Id)>,
    /// Leaves that exist for the rules but may not be extracted (the whole block input under
    /// sequence parallelism).
    pub unavailable: HashSet<Atom>,
    /// Values held split that no collective may make whole: an expert-parallel group's
    /// experts (gathering them is ZeRO-3 over the group, not expert parallelism, and no
    /// program runs it; the outer search prices ZeRO-3 itself).
    pub never_gathered: HashSet<u32>,
    /// Position of each op in the list.
    pub positions: HashMap<u32, usize>,
    pub ops: Vec<OpId>,
    pub iterations: usize,
    pub stop_reason: String,
    /// How many times each rule added something.
    pub applied: std::collections::BTreeMap<String, usize>,
}

impl Built {
    pub fn root_classes(&self) -> Vec<Id> {
        self.roots
            .iter()
            .map(|&(_, id)| self.egraph.find(id))
            .collect()
    }
}

/// Whether a value of this type is a token activation `[B, S, ..]` that sequence parallelism
/// splits along axis 1.
fn token_activation(ty: &ir::TensorType) -> bool {
    ty.dtype.is_float()
        && ty.shape.rank() >= 2
        && ty.shape.0[0] == Dim::Sym(Sym::Batch)
        && ty.shape.0[1] == Dim::Sym(Sym::Seq)
}

/// Builds the e-graph of `ops` (unsaturated).
pub fn lower(graph: &Graph, ops: &[OpId], opts: &ShardOptions) -> Result<Built, ShardError> {
    if ops.is_empty() {
        return Err(ShardError::EmptyBlock);
    }
    if let Some(bad) = ops.iter().find(|o| o.index() >= graph.num_ops()) {
        return Err(ShardError::UnknownOp {
            op: bad.0,
            ops: graph.num_ops(),
        });
    }
    let in_list: HashSet<OpId> = ops.iter().copied().collect();
    let mut ctx = Ctx {
        tp: u64::from(opts.tp),
        padded_dim: opts.padded_dim,
        ..Ctx::default()
    };
    let mut defined = HashSet::new();
    for &o in ops {
        let op = graph.op(o);
        if op
            .inputs
            .iter()
            .chain(&op.results)
            .any(|v| v.index() >= graph.num_values())
        {
            return Err(ShardError::Unsupported {
                op: o.0,
                mnemonic: op.kind.mnemonic().into(),
                reason: "it refers to an undefined value".into(),
            });
        }
        ctx.op_kinds.insert(o.0, op.kind.clone());
        ctx.op_results.insert(
            o.0,
            op.results.iter().map(|&v| graph.ty(v).clone()).collect(),
        );
        if op.kind.is_source() {
            for &v in &op.results {
                ctx.values.insert(v.0, graph.ty(v).clone());
                if matches!(op.kind, OpKind::Param { .. }) {
                    ctx.params.insert(v.0);
                }
            }
        }
        defined.extend(op.results.iter().copied());
    }
    let mut external = Vec::new();
    for &o in ops {
        for &v in &graph.op(o).inputs {
            if !defined.contains(&v) && !ctx.values.contains_key(&v.0) {
                ctx.values.insert(v.0, graph.ty(v).clone());
                external.push(v);
            }
        }
    }

    let mut eg = ShardGraph::new(ShardAnalysis {
        ctx,
        conflicts: Vec::new(),
    });
    let mut class: HashMap<u32, Id> = HashMap::new();
    for &v in &external {
        class.insert(v.0, eg.add(Shard::Atom(Atom::Val(v.0))));
    }
    for &o in ops {
        let op = graph.op(o);
        if op.kind.is_source() {
            for &v in &op.results {
                class.insert(v.0, eg.add(Shard::Atom(Atom::Val(v.0))));
            }
            continue;
        }
        let unsupported = |reason: &str| ShardError::Unsupported {
            op: o.0,
            mnemonic: op.kind.mnemonic().into(),
            reason: reason.into(),
        };
        let kids: Vec<Id> = op
            .inputs
            .iter()
            .map(|v| class.get(&v.0).copied())
            .collect::<Option<_>>()
            .ok_or_else(|| unsupported("an operand is defined after it"))?;
        let tag = eg.add(Shard::Atom(Atom::Op(o.0)));
        let k = |i: usize| {
            kids.get(i)
                .copied()
                .ok_or_else(|| unsupported("missing operand"))
        };
        let results = &op.results;
        match &op.kind {
            OpKind::Split { .. } => {
                for (i, &r) in results.iter().enumerate() {
                    let part = eg.add(Shard::Atom(Atom::Part(i as u32)));
                    let id = eg.add(Shard::Part([tag, part, k(0)?]));
                    class.insert(r.0, id);
                }
                continue;
            }
            _ if results.len() != 1 => return Err(unsupported("only split has several results")),
            _ => {}
        }
        let node = match &op.kind {
            OpKind::Linear { bias: true } => {
                let lin = eg.add(Shard::Linear([tag, k(0)?, k(1)?]));
                Shard::Bias([tag, lin, k(2)?])
            }
            OpKind::Linear { bias: false } => Shard::Linear([tag, k(0)?, k(1)?]),
            kind if kind.is_binary_pointwise() => Shard::Zip([tag, k(0)?, k(1)?]),
            kind if kind.is_unary_pointwise() => Shard::Map([tag, k(0)?]),
            OpKind::ReduceMean | OpKind::ReduceSum => Shard::Reduce([tag, k(0)?]),
            OpKind::LayerNorm { bias: true, .. } => Shard::LayerNorm([tag, k(0)?, k(1)?, k(2)?]),
            // Without a beta it shards as an RMSNorm: a per-row norm with one replicated weight.
            OpKind::LayerNorm { bias: false, .. } => Shard::RmsNorm([tag, k(0)?, k(1)?]),
            OpKind::RmsNorm { .. } => Shard::RmsNorm([tag, k(0)?, k(1)?]),
            OpKind::Attention { sinks: false, .. } => Shard::Attention([tag, k(0)?, k(1)?, k(2)?]),
            OpKind::Attention { sinks: true, .. } => {
                Shard::SinkAttention([tag, k(0)?, k(1)?, k(2)?, k(3)?])
            }
            OpKind::Rotary { .. } => Shard::Rotary([tag, k(0)?]),
            OpKind::Embedding => Shard::Embed([tag, k(0)?, k(1)?]),
            OpKind::CrossEntropy => Shard::CrossEntropy([tag, k(0)?, k(1)?]),
            OpKind::Transpose { perm } if perm == &[1, 0] => Shard::Transpose([tag, k(0)?]),
            OpKind::Reshape { .. } => Shard::Reshape([tag, k(0)?]),
            OpKind::Slice { .. } => Shard::Slice([tag, k(0)?]),
            OpKind::Concat { .. } if kids.len() == 2 => Shard::Concat([tag, k(0)?, k(1)?]),
            OpKind::Expand { .. } => Shard::Expand([tag, k(0)?]),
            OpKind::TopKRouter { bias: false, .. } => Shard::Router([tag, k(0)?, k(1)?]),
            OpKind::TopKRouter { bias: true, .. } => {
                Shard::BiasedRouter([tag, k(0)?, k(1)?, k(2)?])
            }
            OpKind::MoeExperts { form, .. } if !form.bias => {
                Shard::Moe([tag, k(0)?, k(1)?, k(2)?, k(3)?, k(4)?])
            }
            OpKind::MoeExperts { .. } => {
                Shard::BiasedMoe([tag, k(0)?, k(1)?, k(2)?, k(3)?, k(4)?, k(5)?, k(6)?])
            }
            _ => {
                let mut v = vec![tag];
                v.extend(&kids);
                Shard::Opaque(v.into_boxed_slice())
            }
        };
        let id = eg.add(node);
        class.insert(results[0].0, id);
    }

    // Roots: values defined here and read after the list, and the graph's scalar outputs (the
    // loss). A training step reports only the loss: requiring the logits output whole would
    // all-gather the vocabulary-parallel logits every micro-batch for nothing.
    let uses = graph.uses();
    let outputs: HashSet<u32> = graph
        .outputs
        .iter()
        .filter(|(_, v)| graph.ty(*v).shape.rank() == 0)
        .map(|(_, v)| v.0)
        .collect();
    let mut roots = Vec::new();
    let mut seen = HashSet::new();
    for &o in ops {
        for &r in &graph.op(o).results {
            let read_after = uses
                .get(r.index())
                .is_some_and(|u| u.iter().any(|x| !in_list.contains(x)));
            if (read_after || outputs.contains(&r.0)) && seen.insert(r.0) {
                roots.push(r);
            }
        }
    }
    // Seeds: under sequence parallelism every value of the residual stream's type (the type of
    // the block's input and output), and each norm's `[batch, seq, width]` output, may live on
    // sequence shards, so norms, dropout and residual
    // adds can run there and all-gathers sit right before the column-parallel linears. (Seeding
    // every activation too — the 4h-wide MLP inside, QKV — only adds layouts that lose, and
    // makes the ILP slower.) With the batch split allowed, every batched value may live on
    // batch shards.
    let stream: HashSet<&ir::TensorType> = external
        .iter()
        .chain(&roots)
        .map(|&v| graph.ty(v))
        .filter(|ty| token_activation(ty))
        .collect();
    for &o in ops {
        if graph.op(o).kind.is_source() {
            continue;
        }
        for &r in &graph.op(o).results {
            let id = class[&r.0];
            let ty = graph.ty(r);
            // A norm's output too (multi-head latent attention's latent norms): Megatron-LM
            // runs every norm on sequence shards under sequence parallelism.
            let norm = matches!(
                graph.op(o).kind,
                OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. }
            );
            if opts.sequence_parallel
                && (stream.contains(ty) || (norm && token_activation(ty) && ty.shape.rank() == 3))
            {
                let ax = eg.add(Shard::Atom(Atom::Axis(Axis::new(1))));
                eg.add(Shard::Shard([ax, id]));
            }
            if (opts.allow_batch_split || opts.expert_parallel)
                && ty.shape.0.first() == Some(&Dim::Sym(Sym::Batch))
            {
                let ax = eg.add(Shard::Atom(Atom::Axis(Axis::new(0))));
                eg.add(Shard::Shard([ax, id]));
            }
        }
    }
    let mut unavailable = HashSet::new();
    let mut never_gathered = HashSet::new();
    let sp = Atom::Axis(Axis::new(1));
    let mut root_ids = Vec::new();
    let batch = Atom::Axis(Axis::new(0));
    for &r in &roots {
        let id = class[&r.0];
        let ty = graph.ty(r);
        let boundary = if opts.sequence_parallel {
            Some(sp)
        } else if opts.expert_parallel {
            Some(batch)
        } else {
            None
        };
        match boundary {
            Some(axis) if token_activation(ty) => {
                let ax = eg.add(Shard::Atom(axis));
                root_ids.push((r.0, eg.add(Shard::Shard([ax, id]))));
            }
            _ => root_ids.push((r.0, id)),
        }
    }
    if opts.expert_parallel {
        // The block input arrives split along the batch; the experts' weights are held split
        // along their expert axis.
        let experts = routed_expert_weights(graph, ops);
        for (v, axis) in external
            .iter()
            .filter(|v| token_activation(graph.ty(**v)))
            .map(|v| (v.0, 0))
            .chain(experts.iter().map(|&w| (w, 0)))
        {
            let ax = eg.add(Shard::Atom(Atom::Axis(Axis::new(axis))));
            let whole = class[&v];
            let slice = eg.add(Shard::Shard([ax, whole]));
            let stored = eg.add(Shard::Atom(Atom::Stored(v, Axis::new(axis))));
            eg.union(slice, stored);
            unavailable.insert(Atom::Val(v));
        }
        // Expert parallelism splits the experts, not each expert's FFN (that would be expert
        // tensor parallelism over this group): no other stored split of their weights, and
        // none gathered whole.
        never_gathered.extend(experts.iter().copied());
        for &w in &experts {
            let rank = graph.ty(ir::ValueId(w)).shape.rank();
            for axis in 1..rank {
                unavailable.insert(Atom::Stored(w, Axis::new(axis as u8)));
            }
        }
    }
    if opts.sequence_parallel {
        for &v in &external {
            if token_activation(graph.ty(v)) {
                let ax = eg.add(Shard::Atom(sp));
                let whole = class[&v.0];
                let slice = eg.add(Shard::Shard([ax, whole]));
                let stored = eg.add(Shard::Atom(Atom::Stored(v.0, Axis::new(1))));
                eg.union(slice, stored);
                unavailable.insert(Atom::Val(v.0));
            }
        }
    }
    without_clock(|| eg.rebuild());
    let positions = ops.iter().enumerate().map(|(i, o)| (o.0, i)).collect();
    Ok(Built {
        egraph: eg,
        roots: root_ids,
        unavailable,
        never_gathered,
        positions,
        ops: ops.to_vec(),
        iterations: 0,
        stop_reason: "not saturated (no rewrites applied)".into(),
        applied: Default::default(),
    })
}

/// The routed experts' weights among `ops` (the parameter operands of expert layers).
fn routed_expert_weights(graph: &Graph, ops: &[OpId]) -> Vec<u32> {
    ops.iter()
        .filter(|&&o| matches!(graph.op(o).kind, OpKind::MoeExperts { .. }))
        .flat_map(|&o| graph.op(o).inputs.iter().skip(2).copied())
        .filter(|&w| matches!(graph.op(graph.def_op(w)).kind, OpKind::Param { .. }))
        .map(|w| w.0)
        .collect()
}

/// Rules left out of an expert-parallel group's saturation (see
/// [`ShardOptions::expert_parallel`]): the all-to-all that turns a batch split into an expert
/// split (the routing weights), which codegen lowers as the gather and its chunk instead.
const NOT_IN_EXPERT_GROUPS: [&str; 1] = ["all-to-all"];

/// Runs `f` with egg's clock (quanta's `Instant`) stopped. The saturation is then bounded by
/// iterations and e-nodes alone, so the e-graph, and the layout extracted from it, never
/// depend on the machine's speed or load; and egg's timing statistics no longer start quanta's
/// clock, whose calibration against the OS clock spins for about 10 ms on its first reading
/// (measured: 8 % of a 1,000-layer `compile`).
fn without_clock<T>(f: impl FnOnce() -> T) -> T {
    let (stopped, _control) = quanta::Clock::mock();
    quanta::with_clock(&stopped, f)
}

/// Saturates the e-graph with every rule `opts` admits (bounded by iterations and nodes; egg's
/// time limit never fires on the stopped clock).
pub fn saturate(mut built: Built, opts: &ShardOptions) -> Result<Built, ShardError> {
    let mut rules = all_rules()?;
    if opts.expert_parallel {
        rules.retain(|r| !NOT_IN_EXPERT_GROUPS.contains(&r.name.as_str()));
    }
    if opts.experts_split_outside {
        rules.retain(|r| !matches!(r.name.as_str(), "moe-experts" | "bmoe-experts"));
    }
    let runner = without_clock(|| {
        Runner::default()
            .with_egraph(built.egraph)
            .with_iter_limit(40)
            .with_node_limit(100_000)
            .run(&rules)
    });
    built.iterations = runner.iterations.len();
    for it in &runner.iterations {
        for (name, n) in &it.applied {
            *built.applied.entry(name.to_string()).or_default() += n;
        }
    }
    built.stop_reason = match &runner.stop_reason {
        Some(StopReason::Saturated) => "saturated".into(),
        Some(r) => format!("{r:?}"),
        None => "unknown".into(),
    };
    built.egraph = runner.egraph;
    let conflicts = &built.egraph.analysis.conflicts;
    if let Some(first) = conflicts.first() {
        return Err(ShardError::Inconsistent {
            count: conflicts.len(),
            first: first.clone(),
        });
    }
    Ok(built)
}

/// Lowers and saturates.
pub fn build(graph: &Graph, ops: &[OpId], opts: &ShardOptions) -> Result<Built, ShardError> {
    saturate(lower(graph, ops, opts)?, opts)
}
