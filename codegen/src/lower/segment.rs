//! One segment of the model (the embedding ops, one decoder layer, or the head and loss)
//! lowered to local steps on the rank's shards: Megatron-LM's tensor parallelism, with
//! sequence parallelism on the residual stream.
//!
//! Layout rules (Shoeybi et al. 2019; Korthikanti et al. 2022): a `linear` whose input is
//! whole is column-parallel (weight and bias split along their output axis; a fused QKV weight
//! that a `split` into k equal parts consumes is split per block); one whose input is split
//! along its last axis is row-parallel (weight split along its input axis, a partial sum that
//! an all-reduce — reduce-scatter along the sequence with SP — completes, the bias added after).
//! `attention` and `rotary` take heads ÷ tp, `split` sizes ÷ tp, elementwise ops keep their
//! operands' layout. With SP the residual stream (layer input and output, norms, dropout,
//! residual adds) is split along the sequence, gathered before each column-parallel linear.
//! The embedding and head segments run replicated on every tensor-parallel rank.
//!
//! A decoder layer is lowered by these rules only where the plan's sharding extraction needs a
//! form [`super::extracted`] does not have; otherwise the layer runs as the e-graph chose.

use ir::{Graph, OpId, OpKind, ValueId};

use crate::error::CodegenError;
use crate::program::{CollectiveOp, Elem, Slot};

/// A value of a segment (local to the segment; instantiated per layer and micro-batch).
pub type SVal = usize;

/// How a value is laid out across the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lay {
    Rep,
    Split {
        axis: u8,
        blocks: u32,
    },
    /// A partial sum (complete after a reduction).
    Partial,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A parameter: the op at this position of the segment's op list.
    Param { pos: usize },
    /// `input_ids` or `targets`.
    Tokens { targets: bool },
    /// The segment's activation input (the previous segment's output).
    Input,
    /// Computed by a step.
    Step,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Val {
    pub shape: Vec<u64>,
    pub elem: Elem,
    /// The element type of its gradient: `elem`, except the logits' and what element-wise
    /// ops make of them where the engine holds their gradient in the compute dtype
    /// ([`Ctx::logits_grad`]).
    pub grad_elem: Elem,
    pub lay: Lay,
    pub source: Source,
    /// Whether the loss's gradient with respect to it is needed.
    pub needs_grad: bool,
    pub name: String,
}

/// A memory-only buffer a step keeps for its backward.
#[derive(Clone, Debug, PartialEq)]
pub struct SaveDecl {
    pub name: String,
    pub shape: Vec<u64>,
    pub elem: Elem,
    /// Attention scores: dropped by selective recompute.
    pub scores: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Compute {
        kind: OpKind,
        ins: Vec<SVal>,
        outs: Vec<SVal>,
        saves: Vec<SaveDecl>,
        /// Replicated parameters (operand index) whose gradient is a partial sum over the
        /// tensor-parallel group (their activation operand is split along the sequence).
        partial_param_grads: Vec<usize>,
        /// Activation operands whose gradient is a partial sum, with the group it sums over:
        /// a column-parallel product's input (operand 0, tensor-parallel), an expert layer's
        /// input and gates (tensor-parallel when its FFN is split; the input also
        /// expert-parallel when its experts are). A tied head's transposed weight, also a
        /// computed value, gets its own shard's gradient.
        partial_input_grads: Vec<(usize, Slot)>,
        /// Runs on this rank's block of the vocabulary ([`crate::program::Instr::Vocab`]): a
        /// token embedding on its rows of the table (the output a partial sum over the
        /// tensor-parallel group), or the cross-entropy of logits split by columns.
        vocab_parallel: bool,
        /// Runs on this rank's chunks of the sequence ([`crate::program::Instr::Context`]):
        /// rotary and iota at whole-sequence positions, attention against the
        /// context-parallel group's gathered keys and values.
        context: bool,
    },
    Coll {
        op: CollectiveOp,
        axis: u8,
        x: SVal,
        y: SVal,
        /// The tensor-parallel group, the expert-parallel one (expert dispatch), or the
        /// context-parallel one (an attention's keys and values).
        group: Slot,
    },
    /// This rank's piece of a replicated value along `axis` over `group` (`Instr::Chunk`);
    /// its backward all-gathers the pieces' gradients.
    Chunk {
        axis: u8,
        x: SVal,
        y: SVal,
        group: Slot,
    },
}

impl Step {
    /// A compute step that keeps nothing for its backward and whose gradients are whole (a
    /// view, a bias added), with the operands in `partial_params` (replicated parameters read
    /// by split rows) summing partial gradients.
    pub(super) fn plain(
        kind: OpKind,
        ins: Vec<SVal>,
        outs: Vec<SVal>,
        partial_params: Vec<usize>,
    ) -> Step {
        Step::Compute {
            kind,
            ins,
            outs,
            saves: vec![],
            partial_param_grads: partial_params,
            partial_input_grads: vec![],
            vocab_parallel: false,
            context: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub vals: Vec<Val>,
    pub steps: Vec<Step>,
    pub input: Option<SVal>,
    pub output: SVal,
    /// The scalar loss (head segment).
    pub loss: Option<SVal>,
    /// The IR ops, by position (params are looked up per layer by position).
    pub ops: Vec<OpId>,
    /// The tensor-parallel group's size.
    pub tp: u32,
    /// Parameters split over the expert-parallel group along their expert axis (0).
    pub expert_params: Vec<SVal>,
    /// The whole vocabulary where a vocabulary-parallel embedding or head pads it (it does
    /// not divide by tp: every rank holds ⌈vocab / tp⌉ rows, the last ones zeros).
    pub padded_vocab: Option<u64>,
    /// By position in `ops`: the op's operands and its first result as the step computes them
    /// (before any collective after it), or its parameter's value; `None` for inputs. Compared
    /// with the sharding extraction ([`differs_from`]).
    pub placed: Vec<Option<Placed>>,
}

/// Where one op of a segment runs: its operands' and its result's values.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    pub inputs: Vec<SVal>,
    pub output: SVal,
}

/// What a segment is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Pre,
    Layer,
    Post,
}

#[derive(Debug)]
pub struct Ctx<'a> {
    pub graph: &'a Graph,
    pub tp: u32,
    pub sp: bool,
    pub batch: u64,
    pub seq: u64,
    pub act: Elem,
    pub weight: Elem,
    /// The element type of the logits' gradient: `act` where the plan's engine holds it in
    /// the compute dtype ([`planner::engine::Engine::logits_grad_in_compute_dtype`]), else f32.
    pub logits_grad: Elem,
    /// The head runs on this rank's sequence shard (sequence parallelism): its parameters'
    /// gradients are partial sums over the tensor-parallel group.
    pub seq_shard: bool,
    /// Fused (FlashAttention-style) attention keeps only its softmax statistics; a
    /// materialized one keeps the scores.
    pub fused_attention: bool,
    /// The token embedding's table is split by rows over the tensor-parallel group (Megatron's
    /// vocabulary-parallel embedding).
    pub vocab_parallel: bool,
    /// The whole vocabulary where the vocabulary-parallel embedding and head pad it
    /// ([`planner::ModelInfo::vocabulary_padding`]).
    pub padded_vocab: Option<u64>,
    /// Expert-parallel degree: routed experts split over `ep` data-parallel ranks.
    pub ep: u32,
    /// Context-parallel degree: each sequence split over `cp` data-parallel ranks (`seq` is
    /// then this rank's share).
    pub cp: u32,
}

impl Ctx<'_> {
    pub(super) fn global_shape(&self, v: ValueId) -> Vec<u64> {
        self.graph.ty(v).shape.eval(ir::Binding {
            batch: self.batch,
            seq: self.seq,
        })
    }
}

/// The local shape of a `shape` tensor under `lay`: a split axis ⌈d / tp⌉ long (a padded
/// vocabulary's; every other split divides, which [`set_split`] and the local type check
/// enforce).
pub(super) fn local(shape: &[u64], lay: Lay, tp: u32) -> Vec<u64> {
    let mut s = shape.to_vec();
    if let Lay::Split { axis, .. } = lay
        && let Some(d) = s.get_mut(usize::from(axis))
    {
        *d = d.div_ceil(u64::from(tp.max(1)));
    }
    s
}

pub(super) struct B<'c, 'g> {
    pub(super) cx: &'c Ctx<'g>,
    pub(super) seg: Segment,
    pub(super) map: std::collections::HashMap<ValueId, SVal>,
}

impl<'c, 'g> B<'c, 'g> {
    /// The parameter at `pos` (IR value `r`), whole until a rule splits it.
    pub(super) fn param(&mut self, pos: usize, r: ValueId, name: &str) -> SVal {
        let v = self.val(Val {
            shape: self.cx.global_shape(r),
            elem: self.cx.weight,
            grad_elem: self.cx.weight,
            lay: Lay::Rep,
            source: Source::Param { pos },
            needs_grad: true,
            name: name.into(),
        });
        self.map.insert(r, v);
        self.seg.placed[pos] = Some(Placed {
            inputs: Vec::new(),
            output: v,
        });
        v
    }

    /// An empty segment of `ops` to lower into.
    pub(super) fn new(cx: &'c Ctx<'g>, ops: &[OpId]) -> B<'c, 'g> {
        B {
            cx,
            seg: Segment {
                vals: Vec::new(),
                steps: Vec::new(),
                input: None,
                output: 0,
                loss: None,
                ops: ops.to_vec(),
                tp: cx.tp,
                expert_params: Vec::new(),
                padded_vocab: None,
                placed: vec![None; ops.len()],
            },
            map: std::collections::HashMap::new(),
        }
    }

    pub(super) fn val(&mut self, v: Val) -> SVal {
        self.seg.vals.push(v);
        self.seg.vals.len() - 1
    }

    pub(super) fn err(&self, o: OpId, msg: impl Into<String>) -> CodegenError {
        let op = self.cx.graph.op(o);
        CodegenError::Unsupported {
            layer: op.layer,
            op: o.0,
            mnemonic: op.kind.mnemonic().into(),
            message: msg.into(),
        }
    }

    /// A new value shaped like `shape` (global) under `lay`.
    pub(super) fn derived(&mut self, like: SVal, lay: Lay, suffix: &str) -> SVal {
        let v = self.seg.vals[like].clone();
        let full = match v.lay {
            Lay::Split { axis, .. } => {
                let mut s = v.shape.clone();
                if let Some(d) = s.get_mut(usize::from(axis)) {
                    *d *= u64::from(self.cx.tp);
                }
                s
            }
            _ => v.shape.clone(),
        };
        self.val(Val {
            shape: local(&full, lay, self.cx.tp),
            lay,
            source: Source::Step,
            name: format!("{}.{suffix}", v.name),
            ..v
        })
    }

    /// This rank's piece of a whole value along the sequence.
    fn scatter_seq(&mut self, x: SVal) -> SVal {
        self.scatter_along(x, 1, "sp")
    }

    /// This rank's piece of a whole value along `axis` (its gradient is the pieces'
    /// gradients all-gathered).
    fn scatter_along(&mut self, x: SVal, axis: u8, suffix: &str) -> SVal {
        let y = self.derived(x, Lay::Split { axis, blocks: 1 }, suffix);
        self.seg.steps.push(Step::Chunk {
            axis,
            x,
            y,
            group: Slot::Tp,
        });
        y
    }

    /// `x` (whole tokens) gathered over the expert-parallel group along the batch: the
    /// group's micro-batches, member `i`'s rows at `i·b`.
    fn gather_ep(&mut self, x: SVal) -> SVal {
        self.gather_along(x, 0, Slot::Ep, self.cx.ep, "ep")
    }

    /// `x` all-gathered over `group` (`size` members) along `axis`, whatever its
    /// tensor-parallel layout: member `i`'s part at `i` times the local extent.
    fn gather_along(&mut self, x: SVal, axis: u8, group: Slot, size: u32, suffix: &str) -> SVal {
        let mut v = self.seg.vals[x].clone();
        if let Some(d) = v.shape.get_mut(usize::from(axis)) {
            *d *= u64::from(size);
        }
        v.source = Source::Step;
        v.name = format!("{}.{suffix}", v.name);
        let y = self.val(v);
        self.seg.steps.push(Step::Coll {
            op: CollectiveOp::AllGather,
            axis,
            x,
            y,
            group,
        });
        y
    }

    /// This rank's block of `x` along `axis` over the expert-parallel group.
    fn chunk_ep(&mut self, x: SVal, axis: u8) -> SVal {
        let mut v = self.seg.vals[x].clone();
        if let Some(d) = v.shape.get_mut(usize::from(axis)) {
            *d /= u64::from(self.cx.ep);
        }
        v.source = Source::Step;
        v.name = format!("{}.mine", v.name);
        let y = self.val(v);
        self.seg.steps.push(Step::Chunk {
            axis,
            x,
            y,
            group: Slot::Ep,
        });
        y
    }

    /// An expert layer under expert parallelism (Megatron-Core's all-gather token
    /// dispatcher): the group's tokens and routing weights gathered along the batch, this
    /// rank's experts (a block of the expert axis of each weight and of the weights' columns)
    /// run on all of them, and their partial sum reduce-scattered back along the batch. The
    /// input's gradient is then a partial sum over the group; the routing weights' gradient
    /// of this rank's experts is whole. Returns the local op.
    pub(super) fn expert_parallel(
        &mut self,
        o: OpId,
        ins: &mut [SVal],
    ) -> Result<OpKind, CodegenError> {
        let ep = u64::from(self.cx.ep);
        let OpKind::MoeExperts { experts, form } = self.cx.graph.op(o).kind else {
            return Err(self.err(o, "not an expert layer"));
        };
        if !experts.is_multiple_of(ep) {
            return Err(self.err(o, format!("{experts} experts do not split over ep {ep}")));
        }
        if ins
            .iter()
            .take(2)
            .any(|&v| self.seg.vals[v].lay != Lay::Rep)
        {
            return Err(self.err(o, "expert parallelism needs the layer's whole tokens"));
        }
        ins[0] = self.gather_ep(ins[0]);
        let gates = self.gather_ep(ins[1]);
        let last = (self.seg.vals[gates].shape.len() - 1) as u8;
        ins[1] = self.chunk_ep(gates, last);
        for &k in ins.iter().skip(2) {
            let w = &mut self.seg.vals[k];
            let expert_axis_whole = !matches!(w.lay, Lay::Split { axis: 0, .. } | Lay::Partial);
            if !matches!(w.source, Source::Param { .. }) || !expert_axis_whole {
                return Err(self.err(o, "expert weights must be parameters"));
            }
            if let Some(d) = w.shape.first_mut() {
                *d /= ep;
            }
            self.seg.expert_params.push(k);
        }
        Ok(OpKind::MoeExperts {
            experts: experts / ep,
            form,
        })
    }

    /// The reduce-scatter that completes an expert-parallel layer's partial output (each
    /// member's rows back to it, summed over the group's experts); still a partial sum over
    /// the tensor-parallel group when the experts' FFN is split there too.
    pub(super) fn combine_ep(&mut self, y: SVal, tp_partial: bool) -> SVal {
        let mut v = self.seg.vals[y].clone();
        if let Some(d) = v.shape.first_mut() {
            *d /= u64::from(self.cx.ep);
        }
        v.lay = if tp_partial { Lay::Partial } else { Lay::Rep };
        v.name = format!("{}.rs", v.name);
        let z = self.val(v);
        self.seg.steps.push(Step::Coll {
            op: CollectiveOp::ReduceScatter,
            axis: 0,
            x: y,
            y: z,
            group: Slot::Ep,
        });
        z
    }

    /// Context parallelism (Megatron-Core's, with its load-balanced chunks): whether op `o`
    /// runs on this rank's chunks as a context op (attention, rotary, iota). Attention gathers
    /// the group's keys and values along the sequence (Transformer Engine's
    /// `cp_comm_type all_gather`; the backward gathers them again from the kept shards), and
    /// their gradients are partial sums over the group (each rank's queries contribute
    /// theirs), reduce-scattered back.
    pub(super) fn context_parallel(
        &mut self,
        o: OpId,
        ins: &mut [SVal],
        partial_inputs: &mut Vec<(usize, Slot)>,
    ) -> Result<bool, CodegenError> {
        match self.cx.graph.op(o).kind {
            OpKind::Attention { .. } => {
                if !self.cx.fused_attention {
                    return Err(self.err(o, "context parallelism needs fused attention"));
                }
                for k in [1, 2] {
                    ins[k] = self.gather_cp(ins[k]);
                    partial_inputs.push((k, Slot::Cp));
                }
                Ok(true)
            }
            OpKind::Rotary { .. }
                if matches!(self.seg.vals[ins[0]].lay, Lay::Split { axis: 1, .. }) =>
            {
                // Positions are those of the rank's whole local sequence.
                Err(self.err(
                    o,
                    "a rotary on a piece of the rank's sequence under context parallelism",
                ))
            }
            OpKind::Rotary { .. } | OpKind::Iota { .. } => Ok(true),
            OpKind::Softmax { causal: true } => Err(self.err(
                o,
                "a causal softmax outside an attention op: context parallelism splits the \
                 sequence only around attention ops; compile with --cp 1",
            )),
            _ => Ok(false),
        }
    }

    /// `x` (`[b, s/cp, ..]`) gathered over the context-parallel group along the sequence:
    /// member `i`'s tokens at `i·s/cp`.
    fn gather_cp(&mut self, x: SVal) -> SVal {
        self.gather_along(x, 1, Slot::Cp, self.cx.cp, "cp")
    }

    fn gather_seq(&mut self, x: SVal) -> SVal {
        let y = self.derived(x, Lay::Rep, "ag");
        self.seg.steps.push(Step::Coll {
            op: CollectiveOp::AllGather,
            axis: 1,
            x,
            y,
            group: Slot::Tp,
        });
        y
    }
}

/// Lowers `ops` (in order) into a segment.
pub fn lower(cx: &Ctx<'_>, ops: &[OpId], kind: Kind) -> Result<Segment, CodegenError> {
    let g = cx.graph;
    // The head runs tensor-parallel too when the vocabulary is split (column-parallel logits,
    // vocabulary-parallel cross-entropy).
    let tp_on = cx.tp > 1 && (kind == Kind::Layer || (kind == Kind::Post && cx.vocab_parallel));
    let mut b = B::new(cx, ops);
    if kind != Kind::Layer {
        b.seg.padded_vocab = cx.padded_vocab;
    }
    let inside: std::collections::HashSet<OpId> = ops.iter().copied().collect();
    // Which linear feeds an equal split (fused QKV): block count per op.
    let mut blocks_of = std::collections::HashMap::new();
    for &o in ops {
        if let OpKind::Split { sizes, .. } = &g.op(o).kind
            && let Some(&x) = g.op(o).inputs.first()
            && sizes.iter().all(|&s| Some(&s) == sizes.first())
        {
            blocks_of.insert(g.def_op(x), sizes.len() as u32);
        }
    }
    let replicated_kv = if tp_on {
        let mut whole = planner::model::whole::replicated_kv_projections(g, ops, cx.tp);
        whole.extend(planner::model::whole::duplicated_linears(g, ops));
        whole
    } else {
        std::collections::HashSet::new()
    };
    let float = |cx: &Ctx<'_>, v: ValueId| {
        if g.ty(v).dtype == ir::DType::I64 {
            Elem::I64
        } else {
            cx.act
        }
    };
    for (pos, &o) in ops.iter().enumerate() {
        let op = g.op(o);
        match &op.kind {
            OpKind::Param { name } => {
                b.param(pos, op.results[0], name);
                continue;
            }
            OpKind::Input { name } => {
                let r = op.results[0];
                let targets = name == "targets";
                if !targets && name != "input_ids" {
                    return Err(b.err(o, format!("unknown input `{name}`")));
                }
                let v = b.val(Val {
                    shape: cx.global_shape(r),
                    elem: Elem::I64,
                    grad_elem: Elem::I64,
                    lay: Lay::Rep,
                    source: Source::Tokens { targets },
                    needs_grad: false,
                    name: name.clone(),
                });
                b.map.insert(r, v);
                continue;
            }
            OpKind::Buffer { .. } | OpKind::State { .. } => {
                return Err(b.err(o, "constant buffers are not supported by codegen yet"));
            }
            _ => {}
        }
        // Operands: map, or the segment input.
        let mut ins = Vec::new();
        for &x in &op.inputs {
            let sv = match b.map.get(&x) {
                Some(&s) => s,
                None => {
                    let d = g.def_op(x);
                    if let OpKind::Param { name } = &g.op(d).kind {
                        // A parameter of another segment (tied embedding read by the head).
                        let pos = b.seg.ops.len();
                        b.seg.ops.push(d);
                        let v = b.val(Val {
                            shape: cx.global_shape(x),
                            elem: cx.weight,
                            grad_elem: cx.weight,
                            lay: Lay::Rep,
                            source: Source::Param { pos },
                            needs_grad: true,
                            name: name.clone(),
                        });
                        b.map.insert(x, v);
                        v
                    } else if let OpKind::Input { name } = &g.op(d).kind {
                        let v = b.val(Val {
                            shape: cx.global_shape(x),
                            elem: Elem::I64,
                            grad_elem: Elem::I64,
                            lay: Lay::Rep,
                            source: Source::Tokens {
                                targets: name == "targets",
                            },
                            needs_grad: false,
                            name: name.clone(),
                        });
                        b.map.insert(x, v);
                        v
                    } else if b.seg.input.is_none() && !inside.contains(&d) {
                        let lay = if tp_on && cx.sp {
                            Lay::Split { axis: 1, blocks: 1 }
                        } else {
                            Lay::Rep
                        };
                        let shape = local(&cx.global_shape(x), lay, cx.tp);
                        let v = b.val(Val {
                            shape,
                            elem: cx.act,
                            grad_elem: cx.act,
                            lay,
                            source: Source::Input,
                            needs_grad: true,
                            name: "x".into(),
                        });
                        b.seg.input = Some(v);
                        b.map.insert(x, v);
                        v
                    } else {
                        return Err(b.err(o, format!("operand {x} comes from outside the segment")));
                    }
                }
            };
            ins.push(sv);
        }
        let needs = ins.iter().any(|&v| b.seg.vals[v].needs_grad);
        let mut kind_local = bind(&op.kind, cx.batch, cx.seq);
        let mut out_lay = Lay::Rep;
        let mut partial_params = Vec::new();
        let mut partial_inputs: Vec<(usize, Slot)> = Vec::new();
        let mut post_bias: Option<SVal> = None;
        // The operands before the op's own local selection (a rank's kv head of whole keys
        // and values), where it makes one: what `differs_from` compares.
        let mut read: Option<Vec<SVal>> = None;
        let mut reduce_after = false;
        let mut vocab_parallel = kind == Kind::Pre
            && cx.vocab_parallel
            && matches!(op.kind, OpKind::Embedding)
            && ins
                .get(1)
                .is_some_and(|&i| b.seg.vals[i].source == Source::Tokens { targets: false })
            && ins.first().is_some_and(|&w| {
                let rows = b.seg.vals[w].shape.first().copied().unwrap_or(0);
                rows.is_multiple_of(u64::from(cx.tp)) || Some(rows) == b.seg.padded_vocab
            });
        if vocab_parallel {
            // The table's rows over the group; each rank looks up the tokens it holds and the
            // all-reduce after the step sums the shards' rows.
            set_split(&mut b, ins[0], 0, 1, u64::from(cx.tp)).map_err(|m| b.err(o, m))?;
            out_lay = Lay::Partial;
        }
        if tp_on {
            let lay_of = |b: &B, v: SVal| b.seg.vals[v].lay;
            let is_param = |b: &B, v: SVal| matches!(b.seg.vals[v].source, Source::Param { .. });
            let t = u64::from(cx.tp);
            match &op.kind {
                OpKind::Linear { .. }
                    if replicated_kv.contains(&o)
                        && !matches!(lay_of(&b, ins[0]), Lay::Split { axis, .. }
                            if usize::from(axis) + 1 == b.seg.vals[ins[0]].shape.len()) =>
                {
                    // The K or V projection of an attention with fewer KV heads than ranks, or
                    // a down-projection into a latent (`duplicated_linears`): every rank
                    // computes it whole (on the whole sequence).
                    if let Lay::Split { axis: 1, .. } = lay_of(&b, ins[0]) {
                        ins[0] = b.gather_seq(ins[0]);
                    }
                }
                OpKind::Linear { bias } => {
                    let x = ins[0];
                    let last = (b.seg.vals[x].shape.len() - 1) as u8;
                    match lay_of(&b, x) {
                        Lay::Split { axis, .. } if axis == last => {
                            // Row-parallel: split weight rows; the bias is added after the sum.
                            set_split(&mut b, ins[1], 0, 1, t).map_err(|m| b.err(o, m))?;
                            if *bias {
                                post_bias = Some(ins[2]);
                                ins.truncate(2);
                                kind_local = OpKind::Linear { bias: false };
                            }
                            out_lay = Lay::Partial;
                            reduce_after = true;
                        }
                        lay if too_narrow_to_split(&b, ins[1], blocks_of.get(&o), t)
                            || planner::model::reads_routing_weights(cx.graph, o) =>
                        {
                            // A projection too narrow to split (Qwen2-MoE's one-column gate of
                            // its shared expert), or one of the routing weights (gpt-oss's
                            // experts' down-projection bias, Σₑ gateₑ·b2ₑ, beside the experts'
                            // output): every rank computes it whole on the tokens it holds; on
                            // a piece of the sequence (SP) its weight gradient is a partial sum.
                            out_lay = lay;
                            if let Lay::Split { axis: 1, .. } = lay {
                                partial_params = (1..ins.len()).collect();
                            }
                        }
                        lay => {
                            let x = if let Lay::Split { axis: 1, .. } = lay {
                                let y = b.gather_seq(x);
                                ins[0] = y;
                                y
                            } else {
                                x
                            };
                            let _ = x;
                            let blocks = blocks_of.get(&o).copied().unwrap_or(1);
                            // A tied head's weight arrives split already (the transposed table).
                            if lay_of(&b, ins[1]) == Lay::Rep {
                                set_split(&mut b, ins[1], 1, blocks, t).map_err(|m| b.err(o, m))?;
                            }
                            if *bias {
                                set_split(&mut b, ins[2], 0, blocks, t).map_err(|m| b.err(o, m))?;
                            }
                            out_lay = Lay::Split { axis: last, blocks };
                            partial_inputs = vec![(0, Slot::Tp)];
                        }
                    }
                }
                OpKind::Split { axis, sizes } => match lay_of(&b, ins[0]) {
                    Lay::Split { axis: a, .. } if usize::from(a) == *axis => {
                        kind_local = OpKind::Split {
                            axis: *axis,
                            sizes: sizes.iter().map(|s| s / t).collect(),
                        };
                        out_lay = Lay::Split { axis: a, blocks: 1 };
                    }
                    l => out_lay = l,
                },
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
                    // Fewer key/value heads than ranks: K and V are computed whole and each
                    // rank takes the one head its query heads share.
                    let replicated_kv = *kv_heads < t
                        && t.is_multiple_of(*kv_heads)
                        && lay_of(&b, ins[1]) == Lay::Rep
                        && lay_of(&b, ins[2]) == Lay::Rep;
                    if !heads.is_multiple_of(t) || !(kv_heads.is_multiple_of(t) || replicated_kv) {
                        return Err(b.err(
                            o,
                            format!("heads {heads}/{kv_heads} not divisible by tp {t}"),
                        ));
                    }
                    if replicated_kv {
                        read = Some(ins.clone());
                        for k in [1, 2] {
                            ins[k] = select_kv_head(&mut b, o, ins[k], *kv_heads, t)?;
                        }
                    }
                    if *sinks {
                        // One sink per query head, split as the heads are.
                        set_split(&mut b, ins[3], 0, 1, t).map_err(|m| b.err(o, m))?;
                    }
                    kind_local = OpKind::Attention {
                        heads: heads / t,
                        kv_heads: if replicated_kv { 1 } else { kv_heads / t },
                        scale: *scale,
                        causal: *causal,
                        softcap: *softcap,
                        sinks: *sinks,
                        window: *window,
                        chunk: *chunk,
                    };
                    out_lay = lay_of(&b, ins[0]);
                }
                OpKind::Rotary {
                    heads,
                    theta,
                    scaling,
                } => {
                    out_lay = lay_of(&b, ins[0]);
                    if out_lay != Lay::Rep {
                        kind_local = OpKind::Rotary {
                            heads: heads / t,
                            theta: *theta,
                            scaling: *scaling,
                        };
                    }
                }
                OpKind::TopKRouter { .. } => {
                    // Every rank routes the tokens it holds (all of them, or its piece of the
                    // sequence with SP) with the whole router (and its bias: gpt-oss's), whose
                    // gradients are then partial sums over the pieces.
                    if ins[1..].iter().any(|&w| lay_of(&b, w) != Lay::Rep) {
                        return Err(b.err(o, "the router weight must be replicated"));
                    }
                    out_lay = lay_of(&b, ins[0]);
                    match out_lay {
                        Lay::Rep => {}
                        Lay::Split { axis: 1, .. } => partial_params = (1..ins.len()).collect(),
                        l => return Err(b.err(o, format!("no router rule for tokens laid {l:?}"))),
                    }
                }
                OpKind::MoeExperts { .. } => {
                    // Expert tensor parallelism (Megatron-Core's `expert_tensor_parallel_size`):
                    // each expert's FFN is split as the dense MLP is, gate and up projections
                    // by columns and the down projection by rows, so every rank runs every
                    // expert on its slice of the FFN for all tokens; the partial sums are
                    // all-reduced (reduce-scattered with SP), and the gradients of the tokens
                    // and of their gates are partial sums in turn.
                    for k in [0, 1] {
                        if let Lay::Split { axis: 1, .. } = lay_of(&b, ins[k]) {
                            ins[k] = b.gather_seq(ins[k]);
                        }
                        if lay_of(&b, ins[k]) != Lay::Rep {
                            return Err(b.err(o, "expert layer operands must be whole tokens"));
                        }
                    }
                    // gpt-oss's biases of the gate and up projections, `[E, F]`, with them.
                    let biases = [(5, 1), (6, 1)]
                        .into_iter()
                        .take(ins.len().saturating_sub(5));
                    for (k, axis) in [(2, 2), (3, 2), (4, 1)].into_iter().chain(biases) {
                        set_split(&mut b, ins[k], axis, 1, t).map_err(|m| b.err(o, m))?;
                    }
                    out_lay = Lay::Partial;
                    reduce_after = true;
                    partial_inputs = vec![(0, Slot::Tp), (1, Slot::Tp)];
                }
                OpKind::Transpose { perm }
                    if kind == Kind::Post && perm.as_slice() == [1, 0] && is_param(&b, ins[0]) =>
                {
                    // A tied head reads the embedding table [V, h] transposed: the table's rows
                    // (the vocabulary) are split as the embedding splits them, so the
                    // transposed weight is split along its columns.
                    if lay_of(&b, ins[0]) == Lay::Rep {
                        set_split(&mut b, ins[0], 0, 1, t).map_err(|m| b.err(o, m))?;
                    }
                    out_lay = Lay::Split { axis: 1, blocks: 1 };
                }
                OpKind::CrossEntropy
                    if kind == Kind::Post
                        && matches!(lay_of(&b, ins[0]), Lay::Split { axis, .. }
                            if usize::from(axis) + 1 == b.seg.vals[ins[0]].shape.len()) =>
                {
                    // Logits split by vocabulary column blocks: Megatron's vocabulary-parallel
                    // cross-entropy, whose loss every rank of the group ends with.
                    vocab_parallel = true;
                }
                OpKind::Reshape { .. }
                    if let Some((axis, local_kind)) =
                        head_view(&b.seg.vals[ins[0]], &kind_local, t) =>
                {
                    // A view between [.., heads·d] and [.., heads, d] of a tensor split by
                    // heads (Qwen3's per-head q/k norms): each rank views its own heads.
                    kind_local = local_kind;
                    out_lay = Lay::Split { axis, blocks: 1 };
                }
                OpKind::Concat { axis }
                    if let Some(Lay::Split { axis: a, blocks: 1 }) =
                        split_elsewhere_but_whole(&b, &ins, *axis) =>
                {
                    // Pieces split along another axis beside whole operands (MLA's key: each
                    // rank's heads of `k_nope` beside the one rotary key expanded to every
                    // head): each rank takes its piece of the whole ones.
                    for v in ins.iter_mut() {
                        if lay_of(&b, *v) == Lay::Rep {
                            *v = b.scatter_along(*v, a, "heads");
                        }
                    }
                    out_lay = Lay::Split { axis: a, blocks: 1 };
                }
                OpKind::Slice { axis, .. } | OpKind::Concat { axis }
                    if let Some(lay) = split_elsewhere(&b, &ins, *axis) =>
                {
                    // A slice or concatenation along an axis the group does not split (within
                    // the heads of a head-split tensor: Nemotron's partial rotary) runs on
                    // each rank's shard as it is.
                    out_lay = lay;
                }
                OpKind::Reshape { .. }
                | OpKind::Transpose { .. }
                | OpKind::Expand { .. }
                | OpKind::Concat { .. }
                | OpKind::Slice { .. }
                | OpKind::MatMul
                | OpKind::Embedding
                | OpKind::CrossEntropy
                | OpKind::Softmax { .. } => {
                    if ins.iter().any(|&v| lay_of(&b, v) != Lay::Rep) {
                        return Err(
                            b.err(o, "no tensor-parallel rule for this op on split operands")
                        );
                    }
                }
                _ => {
                    // Elementwise, norms, dropout: the activation operands' layout (a scalar,
                    // Llama 4's eps, broadcasts to every rank's piece as it is).
                    let acts: Vec<Lay> = ins
                        .iter()
                        .filter(|&&v| !is_param(&b, v) && !b.seg.vals[v].shape.is_empty())
                        .map(|&v| lay_of(&b, v))
                        .collect();
                    out_lay = acts.first().copied().unwrap_or(Lay::Rep);
                    if acts.iter().any(|&l| l != out_lay) {
                        return Err(b.err(o, format!("operands in different layouts {acts:?}")));
                    }
                    // Split along an axis the parameters broadcast over (the sequence with
                    // SP, the heads of a per-head norm): each rank's weight gradient is a
                    // partial sum.
                    let rank = ins.first().map_or(0, |&v| b.seg.vals[v].shape.len());
                    if let Lay::Split { axis, .. } = out_lay
                        && usize::from(axis) + 1 < rank
                    {
                        partial_params = (0..ins.len()).filter(|&i| is_param(&b, ins[i])).collect();
                    }
                }
            }
        }
        let expert_parallel = cx.ep > 1 && matches!(op.kind, OpKind::MoeExperts { .. });
        if expert_parallel {
            // After the tensor-parallel rule (if any) gathered whole tokens and split every
            // expert's FFN: the experts over the expert-parallel group too.
            kind_local = b.expert_parallel(o, &mut ins)?;
            out_lay = Lay::Partial;
            partial_inputs.push((0, Slot::Ep));
        }
        let context = cx.cp > 1 && b.context_parallel(o, &mut ins, &mut partial_inputs)?;
        if kind == Kind::Pre
            && !tp_on
            && op.kind.is_unary_pointwise()
            && matches!(b.seg.vals[ins[0]].lay, Lay::Split { .. })
        {
            // After the embedding's reduce-scatter onto sequence pieces, a one-operand
            // point-wise op (Gemma's scaling, the closing dropout) runs on the piece it reads.
            out_lay = b.seg.vals[ins[0]].lay;
        }
        if kind == Kind::Pre
            && cx.sp
            && matches!(op.kind, OpKind::Dropout { .. })
            && Some(&o) == ops.iter().rev().find(|&&q| !g.op(q).kind.is_source())
            && b.seg.vals[ins[0]].lay == Lay::Rep
            && b.seg.vals[ins[0]]
                .shape
                .get(1)
                .is_some_and(|s| s.is_multiple_of(u64::from(cx.tp)))
        {
            // The embedding's closing dropout runs on this rank's sequence piece, as
            // Megatron-LM scatters the embeddings to the sequence-parallel region before its
            // dropout: its mask is 1/tp of the whole one (the runtime draws it on global
            // indices, so the masks are one device's).
            ins[0] = b.scatter_seq(ins[0]);
            out_lay = Lay::Split { axis: 1, blocks: 1 };
        }
        if kind == Kind::Post && cx.seq_shard {
            partial_params = (0..ins.len())
                .filter(|&i| matches!(b.seg.vals[ins[i]].source, Source::Param { .. }))
                .collect();
        }
        // Result values.
        let mut outs = Vec::new();
        for &r in &op.results {
            let full = cx.global_shape(r);
            let (mut elem, mut grad_elem) = (float(cx, r), float(cx, r));
            let vocab_wide = kind == Kind::Post && op.kind.is_pointwise() && {
                let w = cx.graph.ty(r).shape.last().and_then(|d| d.fixed());
                w.is_some() && w == logits_width(cx.graph)
            };
            if kind == Kind::Post
                && (matches!(op.kind, OpKind::Linear { .. } | OpKind::CrossEntropy) || vocab_wide)
            {
                // The planner counts the logits in fp32, and so what element-wise ops make
                // of them (Gemma 2's soft-cap); their gradients as the engine holds them.
                elem = Elem::F32;
                if !matches!(op.kind, OpKind::CrossEntropy) {
                    // (The loss's own gradient is the f32 seed.)
                    grad_elem = cx.logits_grad;
                }
            }
            let name = format!("{}{}", op.kind.mnemonic(), b.seg.vals.len());
            let mut shape = local(&full, out_lay, cx.tp);
            if expert_parallel && let Some(d) = shape.first_mut() {
                *d *= u64::from(cx.ep);
            }
            let v = b.val(Val {
                shape,
                elem,
                grad_elem,
                lay: out_lay,
                source: Source::Step,
                needs_grad: needs,
                name,
            });
            outs.push(v);
        }
        // Local type check.
        check_local(&b, o, &kind_local, &ins, &outs)?;
        let mut saves = saves_of(cx, &b.seg, &kind_local, &ins, &outs);
        if vocab_parallel && matches!(op.kind, OpKind::CrossEntropy) {
            // The log-sum-exp of every position, for the backward.
            let positions = ins
                .get(1)
                .map_or(0, |&t| b.seg.vals[t].shape.iter().product());
            saves.push(SaveDecl {
                name: "lse".into(),
                shape: vec![positions],
                elem: Elem::F32,
                scores: false,
            });
        }
        if let (Some(slot), Some(&output)) = (b.seg.placed.get_mut(pos), outs.first()) {
            *slot = Some(Placed {
                inputs: read.take().unwrap_or_else(|| ins.clone()),
                output,
            });
        }
        b.seg.steps.push(Step::Compute {
            kind: kind_local,
            ins,
            outs: outs.clone(),
            saves,
            partial_param_grads: partial_params,
            partial_input_grads: partial_inputs,
            vocab_parallel,
            context,
        });
        let mut result = outs.first().copied().unwrap_or(0);
        if expert_parallel {
            result = b.combine_ep(result, reduce_after);
        }
        if vocab_parallel && kind == Kind::Pre {
            // With sequence parallelism an embedding whose sum is the segment's output (or
            // reaches it through one-operand point-wise ops: Gemma's scaling, which then runs
            // on the pieces) is reduce-scattered onto the ranks' sequence pieces
            // (Megatron-Core's `reduce_scatter_embeddings`); one that more ops read (a
            // position table's add) is all-reduced, and the first layer's input is cut from the whole output at
            // the segment boundary.
            let scatter = cx.sp
                && only_pointwise_after(g, ops, o)
                && b.seg.vals[result]
                    .shape
                    .get(1)
                    .is_some_and(|s| s.is_multiple_of(u64::from(cx.tp)));
            let (op_c, lay, name) = if scatter {
                (
                    CollectiveOp::ReduceScatter,
                    Lay::Split { axis: 1, blocks: 1 },
                    "rs",
                )
            } else {
                (CollectiveOp::AllReduce, Lay::Rep, "ar")
            };
            let y = b.derived(result, lay, name);
            b.seg.steps.push(Step::Coll {
                op: op_c,
                axis: 1,
                x: result,
                y,
                group: Slot::Tp,
            });
            result = y;
        }
        if reduce_after {
            let (op_c, lay) = if cx.sp {
                (
                    CollectiveOp::ReduceScatter,
                    Lay::Split { axis: 1, blocks: 1 },
                )
            } else {
                (CollectiveOp::AllReduce, Lay::Rep)
            };
            let y = b.derived(result, lay, if cx.sp { "rs" } else { "ar" });
            b.seg.steps.push(Step::Coll {
                op: op_c,
                axis: 1,
                x: result,
                y,
                group: Slot::Tp,
            });
            result = y;
            if let Some(bias) = post_bias {
                let z = b.derived(y, lay, "bias");
                let split_rows = if cx.sp { vec![1] } else { vec![] };
                b.seg
                    .steps
                    .push(Step::plain(OpKind::Add, vec![y, bias], vec![z], split_rows));
                result = z;
                // The extraction's linear with a bias ends after the bias: compare that.
                if let Some(Some(placed)) = b.seg.placed.get_mut(pos) {
                    placed.output = z;
                }
            }
        }
        if let Some(&r0) = op.results.first() {
            b.map.insert(r0, result);
        }
        for (&r, &v) in op.results.iter().zip(&outs).skip(1) {
            b.map.insert(r, v);
        }
    }
    // The output: the last op's result (layers, embeddings) or `loss` (head).
    let last = ops
        .iter()
        .rev()
        .find(|&&o| !g.op(o).kind.is_source())
        .copied()
        .ok_or_else(|| CodegenError::plan("model", "an empty segment"))?;
    let out = g.op(last).results[0];
    b.seg.output = *b.map.get(&out).ok_or_else(|| b.err(last, "no output"))?;
    if kind == Kind::Post {
        if g.output("loss").is_none_or(|l| l != out) {
            return Err(b.err(last, "the head segment must end in the `loss` output"));
        }
        b.seg.loss = Some(b.seg.output);
    }
    // With SP, the layer output is split along the sequence like its input.
    Ok(b.seg)
}

/// This rank's key/value head of a whole `[b, s, kv·d]` K or V for `t` ranks (`t` a multiple
/// of `kv`): the heads repeated `t / kv` times (`[b, s, t·d]`, rank `r`'s query heads share
/// head `r / (t / kv)`), then the rank's piece along the last axis.
pub(super) fn select_kv_head(
    b: &mut B,
    o: OpId,
    x: SVal,
    kv: u64,
    t: u64,
) -> Result<SVal, CodegenError> {
    let shape = b.seg.vals[x].shape.clone();
    let (Some(&width), true) = (shape.last(), shape.len() == 3) else {
        return Err(b.err(
            o,
            format!("keys/values of shape {shape:?}, not [b, s, kv·d]"),
        ));
    };
    let (bs, d) = (&shape[..2], width / kv);
    let fixed = |dims: &[u64]| dims.iter().map(|&n| ir::Dim::Fixed(n)).collect::<Vec<_>>();
    let heads5 = [bs, &[kv, 1, d]].concat();
    let repeated5 = [bs, &[kv, t / kv, d]].concat();
    let repeated = [bs, &[t * d]].concat();
    let chain = [
        (
            OpKind::Reshape {
                shape: fixed(&heads5),
            },
            heads5,
            "kvheads",
        ),
        (
            OpKind::Expand {
                shape: fixed(&repeated5),
            },
            repeated5,
            "kvrepeat",
        ),
        (
            OpKind::Reshape {
                shape: fixed(&repeated),
            },
            repeated,
            "kvrepeated",
        ),
    ];
    let mut v = x;
    for (kind, out_shape, suffix) in chain {
        let y = b.val(Val {
            shape: out_shape,
            source: Source::Step,
            name: format!("{}.{suffix}", b.seg.vals[v].name),
            ..b.seg.vals[v].clone()
        });
        check_local(b, o, &kind, &[v], &[y])?;
        b.seg
            .steps
            .push(Step::plain(kind, vec![v], vec![y], vec![]));
        v = y;
    }
    let local = [bs, &[d]].concat();
    let y = b.val(Val {
        shape: local,
        lay: Lay::Split { axis: 2, blocks: 1 },
        source: Source::Step,
        name: format!("{}.kvhead", b.seg.vals[v].name),
        ..b.seg.vals[v].clone()
    });
    b.seg.steps.push(Step::Chunk {
        axis: 2,
        x: v,
        y,
        group: Slot::Tp,
    });
    Ok(y)
}

/// What a grouped-GEMM expert layer keeps for its backward (Megatron-Core's MoE): for each of
/// the `k` routed copies of a token, the gate and up projections and their SwiGLU product
/// (`3 · ffn` elements), as the planner counts them. plait's CPU kernel rebuilds them from its
/// operands instead; the declaration sizes the program for the GPU engines it stands for.
fn expert_saves(cx: &Ctx<'_>, seg: &Segment, ins: &[SVal]) -> Vec<SaveDecl> {
    let (Some(&x), Some(&gates), Some(&w_gate)) = (ins.first(), ins.get(1), ins.get(2)) else {
        return vec![];
    };
    let x_shape = &seg.vals[x].shape;
    let hidden = x_shape.last().copied().unwrap_or(1).max(1);
    let tokens = x_shape.iter().product::<u64>() / hidden;
    let ffn = seg.vals[w_gate].shape.last().copied().unwrap_or(0);
    let (k, experts) = routed_experts(seg, gates).unwrap_or((1, 1));
    // Under expert parallelism the gates are this rank's experts' block: on average its share
    // of the gathered tokens' routed copies.
    let mine = seg.vals[gates].shape.last().copied().unwrap_or(experts);
    let copies = tokens * k * mine / experts.max(1);
    vec![SaveDecl {
        name: "expert_inner".into(),
        shape: vec![copies, 3 * ffn],
        elem: cx.act,
        scores: false,
    }]
}

/// The `k` and expert count of the `topk_router` step that defines `gates` (through the
/// all-gathers of the gates a sequence- or expert-parallel layer needs, and an expert-parallel
/// rank's block of them).
fn routed_experts(seg: &Segment, gates: SVal) -> Option<(u64, u64)> {
    seg.steps.iter().find_map(|s| match s {
        Step::Compute {
            kind: OpKind::TopKRouter { k, experts, .. },
            outs,
            ..
        } if outs.contains(&gates) => Some((*k, *experts)),
        Step::Coll { x, y, .. } | Step::Chunk { x, y, .. } if *y == gates => {
            routed_experts(seg, *x)
        }
        _ => None,
    })
}

/// Whether the ops after `o` in `ops` are a chain of one-operand point-wise ops on its result
/// (Gemma's embedding scale, a closing dropout), so that its sum reaches the segment's output
/// in whatever layout it is left in.
fn only_pointwise_after(g: &Graph, ops: &[OpId], o: OpId) -> bool {
    let Some(i) = ops.iter().position(|&q| q == o) else {
        return false;
    };
    let mut last = g.op(o).results[0];
    for &q in &ops[i + 1..] {
        let op = g.op(q);
        if op.kind.is_source() {
            continue;
        }
        if !(op.kind.is_unary_pointwise() && op.inputs == [last]) {
            return false;
        }
        last = op.results[0];
    }
    true
}

/// For a reshape of `x` (split along its last axis in whole heads) that only splits that axis
/// into [heads, d], or of `x` split along its heads axis that merges [heads, d] back, the split
/// axis of the result and the rank-local reshape; `None` for any other reshape or layout.
fn head_view(x: &Val, bound: &OpKind, t: u64) -> Option<(u8, OpKind)> {
    let OpKind::Reshape { shape } = bound else {
        return None;
    };
    let Lay::Split { axis, blocks: 1 } = x.lay else {
        return None;
    };
    let to: Vec<u64> = shape.iter().map(|d| d.fixed()).collect::<Option<_>>()?;
    let from = &x.shape;
    let axis = usize::from(axis);
    let (r, n) = (from.len(), to.len());
    if n == r + 1 && axis + 1 == r && from[..r - 1] == to[..r - 1] {
        // [.., w/t] → [.., heads/t, d]
        let (heads, d) = (to[r - 1], to[r]);
        let local = heads
            .checked_div(t)
            .filter(|h| h * t == heads && h * d == from[r - 1])?;
        let mut out = to.clone();
        out[r - 1] = local;
        let kind = OpKind::Reshape {
            shape: out.into_iter().map(ir::Dim::Fixed).collect(),
        };
        return Some((u8::try_from(r - 1).ok()?, kind));
    }
    if n + 1 == r && axis + 2 == r && from[..r - 2] == to[..n - 1] {
        // [.., heads/t, d] → [.., w/t]
        let local = from[r - 2] * from[r - 1];
        if local * t != to[n - 1] {
            return None;
        }
        let mut out = to.clone();
        out[n - 1] = local;
        let kind = OpKind::Reshape {
            shape: out.into_iter().map(ir::Dim::Fixed).collect(),
        };
        return Some((u8::try_from(n - 1).ok()?, kind));
    }
    None
}

/// The width of the logits the cross-entropy reads (the vocabulary), if the graph has a loss.
fn logits_width(g: &Graph) -> Option<u64> {
    g.order().iter().find_map(|&o| {
        let op = g.op(o);
        match op.kind {
            OpKind::CrossEntropy => g.ty(*op.inputs.first()?).shape.last()?.fixed(),
            _ => None,
        }
    })
}

/// Fixes the symbolic sizes in an op's attributes (`iota`, `reshape`, `expand`).
pub(super) fn bind(kind: &OpKind, batch: u64, seq: u64) -> OpKind {
    let bd = ir::Binding { batch, seq };
    let fix = |d: &ir::Dim| ir::Dim::Fixed(d.eval(bd));
    match kind {
        OpKind::Iota { len } => OpKind::Iota { len: fix(len) },
        OpKind::Reshape { shape } => OpKind::Reshape {
            shape: shape.iter().map(fix).collect(),
        },
        OpKind::Expand { shape } => OpKind::Expand {
            shape: shape.iter().map(fix).collect(),
        },
        k => k.clone(),
    }
}

/// The layout all of `ins` share when it splits an axis other than `axis`.
fn split_elsewhere(b: &B, ins: &[SVal], axis: usize) -> Option<Lay> {
    let first = b.seg.vals[*ins.first()?].lay;
    let Lay::Split { axis: split, .. } = first else {
        return None;
    };
    (usize::from(split) != axis && ins.iter().all(|&v| b.seg.vals[v].lay == first)).then_some(first)
}

/// The one split (along an axis other than `axis`, one block) of operands that are each either
/// split so or whole, with at least one of each.
fn split_elsewhere_but_whole(b: &B, ins: &[SVal], axis: usize) -> Option<Lay> {
    let lays: Vec<Lay> = ins.iter().map(|&v| b.seg.vals[v].lay).collect();
    let split = *lays.iter().find(|l| matches!(l, Lay::Split { .. }))?;
    let Lay::Split { axis: a, blocks: 1 } = split else {
        return None;
    };
    let fits = lays.iter().all(|&l| l == split || l == Lay::Rep);
    (usize::from(a) != axis && fits && lays.contains(&Lay::Rep)).then_some(split)
}

/// Whether a replicated weight `[in, out]` has too few columns to split `blocks × t` ways.
fn too_narrow_to_split(b: &B, w: SVal, blocks: Option<&u32>, t: u64) -> bool {
    let val = &b.seg.vals[w];
    let cols = val.shape.get(1).copied().unwrap_or(0);
    val.lay == Lay::Rep
        && !cols.is_multiple_of(u64::from(blocks.copied().unwrap_or(1)) * t)
        && Some(cols) != b.seg.padded_vocab
}

pub(super) fn set_split(b: &mut B, v: SVal, axis: u8, blocks: u32, t: u64) -> Result<(), String> {
    let padded = b.seg.padded_vocab;
    let val = &mut b.seg.vals[v];
    let dim = val.shape.get(usize::from(axis)).copied().unwrap_or(0);
    // A padded vocabulary splits into ⌈vocab / tp⌉ rows (columns) per rank.
    let pads = blocks == 1 && Some(dim) == padded;
    if !pads && !dim.is_multiple_of(u64::from(blocks) * t) {
        return Err(format!(
            "parameter {} axis {axis} ({dim}) is not divisible into {blocks} block(s) x tp {t}",
            val.name
        ));
    }
    if let Some(d) = val.shape.get_mut(usize::from(axis)) {
        *d = d.div_ceil(t);
    }
    val.lay = Lay::Split { axis, blocks };
    Ok(())
}

pub(super) fn check_local(
    b: &B,
    o: OpId,
    kind: &OpKind,
    ins: &[SVal],
    outs: &[SVal],
) -> Result<(), CodegenError> {
    let ty = |v: SVal| {
        let val = &b.seg.vals[v];
        let dt = if val.elem == Elem::I64 {
            ir::DType::I64
        } else {
            ir::DType::F32
        };
        ir::TensorType::new(dt, ir::Shape::fixed(&val.shape))
    };
    let tys: Vec<ir::TensorType> = ins.iter().map(|&v| ty(v)).collect();
    let refs: Vec<&ir::TensorType> = tys.iter().collect();
    let got = ir::infer_types(kind, &refs).map_err(|m| CodegenError::LocalType {
        op: o.0,
        mnemonic: kind.mnemonic().into(),
        message: m,
    })?;
    for (g, &v) in got.iter().zip(outs) {
        let want = ty(v);
        if g.shape != want.shape {
            return Err(CodegenError::LocalType {
                op: o.0,
                mnemonic: kind.mnemonic().into(),
                message: format!("infers {} but the layout gives {}", g.shape, want.shape),
            });
        }
    }
    Ok(())
}

/// Memory-only state kept for the backward, sized as the planner counts it (Korthikanti):
/// a dropout mask (1 byte per element); the attention scores of a materialized kernel (softmax
/// output, and with dropout its mask and output: 2e + 1 bytes per score, else e). A fused
/// kernel keeps one fp32 log-sum-exp per query row and head instead and rebuilds the scores
/// tile by tile in its backward (Dao et al. 2022, §3.1), regenerating dropout from its seed.
pub(super) fn saves_of(
    cx: &Ctx<'_>,
    seg: &Segment,
    kind: &OpKind,
    ins: &[SVal],
    outs: &[SVal],
) -> Vec<SaveDecl> {
    let Some(&out) = outs.first() else {
        return vec![];
    };
    let shape = seg.vals[out].shape.clone();
    match kind {
        OpKind::Dropout { p, .. } if *p > 0.0 => vec![SaveDecl {
            name: "mask".into(),
            shape,
            elem: Elem::U8,
            scores: false,
        }],
        OpKind::MoeExperts { .. } => expert_saves(cx, seg, ins),
        OpKind::Attention { heads, .. } if cx.fused_attention => vec![SaveDecl {
            name: "lse".into(),
            shape: vec![cx.batch, *heads, cx.seq],
            elem: Elem::F32,
            scores: false,
        }],
        OpKind::Attention { heads, .. } => {
            let (b, s) = (cx.batch, cx.seq);
            // Models that train with dropout drop attention probabilities too (the planner's
            // rule: a dropout op in the graph).
            let dropout = cx
                .graph
                .order()
                .iter()
                .any(|&o| matches!(cx.graph.op(o).kind, OpKind::Dropout { p, .. } if p > 0.0));
            let mut v = vec![SaveDecl {
                name: "softmax".into(),
                shape: vec![b, *heads, s, s],
                elem: cx.act,
                scores: true,
            }];
            if dropout {
                v.push(SaveDecl {
                    name: "score_mask".into(),
                    shape: vec![b, *heads, s, s],
                    elem: Elem::U8,
                    scores: true,
                });
                v.push(SaveDecl {
                    name: "score_dropout".into(),
                    shape: vec![b, *heads, s, s],
                    elem: cx.act,
                    scores: true,
                });
            }
            v
        }
        _ => vec![],
    }
}

/// The first op of `seg` (a layer) that does not run as the extraction `bp` chose: its result
/// or an activation operand in another layout, or a parameter held otherwise. Parameters are
/// compared at their own positions, so operands that are parameters are skipped; an operand
/// the step dropped (a row-parallel bias added after the reduction) is not compared.
pub fn differs_from(seg: &Segment, bp: &planner::sharding::BlockPlan) -> Option<String> {
    differs_in(seg, bp, 0..usize::MAX)
}

/// [`differs_from`] for the ops of `bp` at positions `within`, `seg` being the segment of
/// those ops alone (the embedding or the head of an extraction of both,
/// `plan.embedding_head_plan`).
pub fn differs_in(
    seg: &Segment,
    bp: &planner::sharding::BlockPlan,
    within: std::ops::Range<usize>,
) -> Option<String> {
    for op in bp.ops.iter().filter(|o| within.contains(&o.position)) {
        let at = op.position - within.start;
        let Some(placed) = seg.placed.get(at).and_then(Option::as_ref) else {
            continue;
        };
        let lay = |v: SVal| seg.vals[v].lay;
        let describe = |what: &str, chosen: &planner::sharding::Layout, lowered: Lay| {
            format!(
                "{} at position {}: {what} is {chosen:?} in the extraction, {lowered:?} in the program",
                op.mnemonic, op.position
            )
        };
        let Some(out) = &op.output else {
            return Some(format!(
                "{} at position {}: the extraction does not compute it",
                op.mnemonic, op.position
            ));
        };
        if !same_layout(out, lay(placed.output)) {
            return Some(describe("the result", out, lay(placed.output)));
        }
        for (k, (chosen, &v)) in op.inputs.iter().zip(&placed.inputs).enumerate() {
            let param = matches!(seg.vals[v].source, Source::Param { .. });
            if !param && !same_layout(chosen, lay(v)) {
                return Some(describe(&format!("operand {k}"), chosen, lay(v)));
            }
        }
    }
    None
}

fn same_layout(chosen: &planner::sharding::Layout, lowered: Lay) -> bool {
    use planner::sharding::Layout;
    match (chosen, lowered) {
        (Layout::Replicated, Lay::Rep) | (Layout::Partial, Lay::Partial) => true,
        (Layout::Split { axis, blocks }, Lay::Split { axis: a, blocks: b }) => {
            *axis == a && u32::from(*blocks) == b
        }
        _ => false,
    }
}
