//! The plain-data result: per-op shardings, the collectives inserted, and totals.

use std::collections::HashMap;
use std::fmt;

use egg::Language;
use ir::{Binding, Dim, Graph, OpId, Sym, TensorType, ValueId};
use serde::{Deserialize, Serialize};

use super::analysis::{Dist, Fact};
use super::build::Built;
use super::candidates::{Comm, Pass, Problem};
use super::cost::CollectiveKind;
use super::ilp::{Selection, SolveReport};
use super::lang::{Atom, Shard};

/// How a tensor is laid out across the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layout {
    Replicated,
    /// Split along `axis`; `blocks > 1` means each of that many equal blocks is split (fused
    /// QKV weights are stored permuted so each rank's heads are contiguous).
    Split {
        axis: u8,
        blocks: u8,
    },
    /// Full shape on every rank; the value is the sum over ranks.
    Partial,
}

impl From<Dist> for Layout {
    fn from(d: Dist) -> Layout {
        match d {
            Dist::Replicated => Layout::Replicated,
            Dist::Sharded(a) => Layout::Split {
                axis: a.axis,
                blocks: a.blocks,
            },
            Dist::Partial => Layout::Partial,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Replicated => f.write_str("R"),
            Layout::Split { axis, blocks: 1 } => write!(f, "S{axis}"),
            Layout::Split { axis, blocks } => write!(f, "S{axis}/{blocks}"),
            Layout::Partial => f.write_str("P"),
        }
    }
}

/// Bytes as a formula in the symbolic batch `B` and sequence `S`: `coefficient · Π symbols`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Formula {
    pub coefficient: f64,
    pub symbols: Vec<Sym>,
}

impl Formula {
    pub fn of(ty: &TensorType, divisor: f64) -> Formula {
        let mut coefficient = ty.dtype.size_bytes() as f64 / divisor;
        let mut symbols = Vec::new();
        for d in ty.shape.dims() {
            match d {
                Dim::Fixed(n) => coefficient *= *n as f64,
                Dim::Sym(s) => symbols.push(*s),
            }
        }
        Formula {
            coefficient,
            symbols,
        }
    }

    pub fn eval(&self, b: Binding) -> f64 {
        self.symbols
            .iter()
            .map(|s| Dim::Sym(*s).eval(b) as f64)
            .product::<f64>()
            * self.coefficient
    }
}

impl fmt::Display for Formula {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.coefficient)?;
        for s in &self.symbols {
            write!(f, "·{}", s.name())?;
        }
        Ok(())
    }
}

/// The sharding of one IR op of the block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpPlan {
    /// Index in the op list (`graph.layer_ops(0)`).
    pub position: usize,
    pub op: OpId,
    pub mnemonic: String,
    /// Layout of the op's (first) result as computed; for a parameter, how it is stored.
    /// `None` when the chosen program does not compute the op (never for a needed op).
    pub output: Option<Layout>,
    /// Layouts of the operands as read, in IR operand order.
    pub inputs: Vec<Layout>,
    pub fwd_flops_per_rank: f64,
    pub bwd_flops_per_rank: f64,
    /// How many different layouts the program computes this op in (normally 1).
    pub instances: usize,
}

/// One collective of the program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectivePlan {
    pub kind: CollectiveKind,
    pub pass: Pass,
    /// The op (position in the list) whose result it acts on — for a forward collective the
    /// op it follows; for a backward one, the op whose output gradient it reduces. `None`:
    /// the block input.
    pub after_position: Option<usize>,
    pub after_op: Option<OpId>,
    /// The IR value concerned, if it is one (a partial sum is not an IR value: the value of
    /// the op it completes is given).
    pub value: Option<ValueId>,
    /// Split axis for all-gather / reduce-scatter / all-to-all (destination).
    pub axis: Option<u8>,
    /// Bytes per rank at the plan's binding (the collective's full buffer).
    pub bytes: f64,
    pub bytes_formula: Formula,
    pub seconds: f64,
    pub reason: String,
    /// A parameter's gradient reduction, done once per step (Megatron-LM's
    /// `finalize_model_grads`): `seconds` is its share of one micro-batch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_step: bool,
}

/// Totals per rank for one block pass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub fwd_collectives: usize,
    pub fwd_collective_bytes: f64,
    pub bwd_collectives: usize,
    pub bwd_collective_bytes: f64,
    pub fwd_flops_per_rank: f64,
    pub bwd_flops_per_rank: f64,
    pub param_bytes_per_rank: f64,
    pub activation_bytes_per_rank: f64,
    pub compute_seconds: f64,
    pub comm_seconds: f64,
}

/// The sharding plan of one block for a TP degree and sequence-parallel flag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockPlan {
    pub tp: u32,
    pub sequence_parallel: bool,
    pub binding: Binding,
    pub ops: Vec<OpPlan>,
    pub collectives: Vec<CollectivePlan>,
    pub totals: Totals,
    pub solve: SolveReport,
    /// The extracted program as e-graph terms, one per root (for reading and debugging).
    pub program: Vec<String>,
    /// E-graph size after saturation and why saturation stopped.
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    pub saturation: String,
}

impl BlockPlan {
    /// Collectives of one pass and kind.
    pub fn count(&self, pass: Pass, kind: CollectiveKind) -> usize {
        self.collectives
            .iter()
            .filter(|c| c.pass == pass && c.kind == kind)
            .count()
    }

    /// The plan of the op at `position`.
    pub fn op_at(&self, position: usize) -> Option<&OpPlan> {
        self.ops.iter().find(|o| o.position == position)
    }
}

/// Reads the plan off a selection.
pub fn assemble(
    graph: &Graph,
    built: &Built,
    p: &Problem,
    sel: Selection,
    sequence_parallel: bool,
) -> BlockPlan {
    let eg = &built.egraph;
    let chosen = &sel.chosen;
    let pick: HashMap<usize, usize> = (0..p.cands.len())
        .filter(|&i| chosen[i])
        .map(|i| (p.cands[i].class, i))
        .collect();
    let op_of = |i: usize| -> Option<u32> {
        let first = *p.cands[i].node.children().first()?;
        match eg[first].data {
            Fact::Meta(Atom::Op(o)) if p.cands[i].node.is_tagged() => Some(o),
            _ => None,
        }
    };
    let value_op = |v: u32| -> Option<u32> {
        let o = graph.def_op(ValueId(v)).0;
        built.positions.contains_key(&o).then_some(o)
    };
    // The IR op that produced a class's value (through layout changes), and the value.
    let producer = |mut c: usize| -> (Option<u32>, Option<ValueId>) {
        for _ in 0..64 {
            let Some(&i) = pick.get(&c) else {
                return (None, None);
            };
            match &p.cands[i].node {
                Shard::Atom(Atom::Val(v) | Atom::Stored(v, _)) => {
                    return (value_op(*v), Some(ValueId(*v)));
                }
                n if n.is_tagged() => {
                    let o = op_of(i);
                    let v = o.and_then(|o| graph.op(OpId(o)).results.first().copied());
                    return (o, v);
                }
                _ => match p.cands[i].kids.first() {
                    Some(&k) => c = k,
                    None => return (None, None),
                },
            }
        }
        (None, None)
    };

    // Ops.
    let mut ops: Vec<OpPlan> = built
        .ops
        .iter()
        .enumerate()
        .map(|(position, &o)| OpPlan {
            position,
            op: o,
            mnemonic: graph.op(o).kind.mnemonic().into(),
            output: None,
            inputs: Vec::new(),
            fwd_flops_per_rank: 0.0,
            bwd_flops_per_rank: 0.0,
            instances: 0,
        })
        .collect();
    let mut totals = Totals::default();
    let mut collectives = Vec::new();
    let mut push = |c: &Comm, after: (Option<u32>, Option<ValueId>), axis: Option<u8>| {
        let (o, v) = after;
        collectives.push(CollectivePlan {
            kind: c.kind,
            pass: c.pass,
            after_position: o.and_then(|o| built.positions.get(&o).copied()),
            after_op: o.map(OpId),
            value: v,
            axis,
            bytes: c.bytes,
            bytes_formula: Formula::of(&c.ty, c.divisor),
            seconds: c.seconds,
            reason: c.reason.into(),
            per_step: c.per_step,
        });
    };
    for (i, cand) in p.cands.iter().enumerate() {
        if !chosen[i] {
            continue;
        }
        totals.fwd_flops_per_rank += cand.fwd_flops;
        totals.bwd_flops_per_rank += cand.bwd_flops;
        totals.param_bytes_per_rank += cand.param_bytes;
        totals.activation_bytes_per_rank += cand.act_bytes;
        totals.compute_seconds += cand.compute_s;
        let layout: Layout = p.classes[cand.class].fact.dist.into();
        let axis_of = |k: usize| -> Option<u8> {
            let id = *cand.node.children().get(k)?;
            match eg[id].data {
                Fact::Meta(Atom::Axis(a)) => Some(a.axis),
                _ => None,
            }
        };
        let axis = match &cand.node {
            Shard::AllGather(_) | Shard::ReduceScatter(_) => axis_of(0),
            Shard::AllToAll(_) => axis_of(1),
            _ => None,
        };
        let after = if cand.node.is_collective() {
            cand.kids.first().map_or((None, None), |&k| producer(k))
        } else {
            (op_of(i), None)
        };
        for c in &cand.comms {
            push(c, after, axis);
        }
        // Per-op records.
        let kid_layouts: Vec<Layout> = cand
            .kids
            .iter()
            .map(|&k| p.classes[k].fact.dist.into())
            .collect();
        match &cand.node {
            Shard::Atom(Atom::Val(v) | Atom::Stored(v, _)) => {
                if let Some(&pos) = value_op(*v).and_then(|o| built.positions.get(&o)) {
                    let op = &mut ops[pos];
                    op.output.get_or_insert(layout);
                    op.instances += 1;
                }
            }
            n if n.is_tagged() => {
                let Some(&pos) = op_of(i).and_then(|o| built.positions.get(&o)) else {
                    continue;
                };
                let op = &mut ops[pos];
                op.fwd_flops_per_rank += cand.fwd_flops;
                op.bwd_flops_per_rank += cand.bwd_flops;
                match n {
                    // The linear node of a biased linear: its operands come first; the bias
                    // node gives the op's output.
                    Shard::Linear(_)
                        if matches!(
                            graph.op(OpId(op_of(i).unwrap_or(0))).kind,
                            ir::OpKind::Linear { bias: true }
                        ) =>
                    {
                        let mut ins = kid_layouts;
                        ins.append(&mut op.inputs);
                        op.inputs = ins;
                    }
                    Shard::Bias(_) => {
                        op.output = Some(layout);
                        op.instances += 1;
                        op.inputs.extend(kid_layouts.into_iter().skip(1));
                    }
                    Shard::Part(_) => {
                        if op.output.is_none() {
                            op.output = Some(layout);
                            op.inputs = kid_layouts;
                        }
                        op.instances = op.instances.max(1);
                    }
                    _ => {
                        if op.output.is_none() {
                            op.output = Some(layout);
                            op.inputs = kid_layouts;
                        }
                        op.instances += 1;
                    }
                }
            }
            _ => {}
        }
    }
    // Backward gradient reductions.
    let axis_of = |i: usize| {
        let id = *p.cands[i].node.children().first()?;
        match eg[id].data {
            Fact::Meta(Atom::Axis(a)) => Some(a.axis),
            _ => None,
        }
    };
    for (c, class) in p.classes.iter().enumerate() {
        if let Some(comm) = super::candidates::grad_comm(p, c, chosen) {
            // A reduce-scatter onto the all-gather's axis; an all-gather of the pieces along
            // the slices' axis; an all-reduce along none.
            let axis = match comm.kind {
                CollectiveKind::ReduceScatter => pick.get(&c).and_then(|&i| axis_of(i)),
                CollectiveKind::AllGather => class
                    .variant_readers
                    .iter()
                    .find(|&&i| chosen[i])
                    .and_then(|&i| axis_of(i)),
                _ => None,
            };
            push(comm, producer(c), axis);
        }
    }
    collectives.sort_by(|a, b| {
        (a.pass == Pass::Backward)
            .cmp(&(b.pass == Pass::Backward))
            .then(a.after_position.cmp(&b.after_position))
    });
    for c in &collectives {
        match c.pass {
            Pass::Forward => {
                totals.fwd_collectives += 1;
                totals.fwd_collective_bytes += c.bytes;
            }
            Pass::Backward => {
                totals.bwd_collectives += 1;
                totals.bwd_collective_bytes += c.bytes;
            }
        }
        totals.comm_seconds += c.seconds;
    }
    let program = p.roots.iter().map(|&r| term(p, eg, &pick, r, 0)).collect();
    BlockPlan {
        tp: p.tp,
        sequence_parallel,
        binding: p.binding,
        ops,
        collectives,
        totals,
        solve: sel.report,
        program,
        egraph_nodes: eg.total_size(),
        egraph_classes: eg.number_of_classes(),
        saturation: format!(
            "{} after {} iterations",
            built.stop_reason, built.iterations
        ),
    }
}

/// The chosen term rooted at class `c`, as text.
fn term(
    p: &Problem,
    eg: &super::analysis::ShardGraph,
    pick: &HashMap<usize, usize>,
    c: usize,
    depth: usize,
) -> String {
    let Some(&i) = pick.get(&c) else {
        return "?".into();
    };
    if depth > 200 {
        return "…".into();
    }
    let node = &p.cands[i].node;
    if node.children().is_empty() {
        return node.to_string();
    }
    let mut kid_terms = p.cands[i].kids.iter();
    let mut s = format!("({node}");
    for &k in node.children() {
        s.push(' ');
        match &eg[k].data {
            Fact::Meta(a) => s.push_str(&a.to_string()),
            _ => match kid_terms.next() {
                Some(&kc) => s.push_str(&term(p, eg, pick, kc, depth + 1)),
                None => s.push('?'),
            },
        }
    }
    s.push(')');
    s
}
