//! Per-op work: FLOPs and bytes moved, for the forward pass, the backward pass and a recompute.
//!
//! Conventions (the cost model in `planner` reads these):
//! - A multiply-add counts as 2 FLOPs. Matrix products dominate; elementwise ops count a small
//!   documented number of FLOPs per element (below), so totals stay honest without pretending
//!   to know each kernel's instruction mix.
//! - Attention counts the full `S × S` score matrix for both `q kᵀ` and `p v`
//!   (4·B·heads·Sq·Sk·d), the convention of Narayanan et al. (SC'21) whose formula
//!   72·l·h²·(1 + s/6h + V/12lh) plait's `flops_per_token` is checked against; in a sliding
//!   window of w keys, `S × min(S, w)` (as NeMo's FLOP counts for gpt-oss's windowed layers),
//!   and in chunks of c, `S × min(S, c)`.
//!   Bytes assume a fused (flash-style) kernel: q, k, v read once and the output written once.
//! - Backward of a product op is twice its forward (one product per operand gradient); backward
//!   of an elementwise op is costed at twice its forward (it reads the forward operands and the
//!   output gradient). A recompute costs exactly one forward.
//! - Bytes read = bytes of the operands, bytes written = bytes of the results, at each value's
//!   dtype; the backward reads operands and output gradients and writes operand gradients.
//! - `TopKRouter`/`MoeExperts` count only the `k` experts a token is routed to.

use crate::graph::{Graph, OpId};
use crate::op::OpKind;
use crate::types::Binding;

/// Work of one op.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpCost {
    pub fwd_flops: f64,
    pub bwd_flops: f64,
    pub fwd_bytes_read: f64,
    pub fwd_bytes_written: f64,
    pub bwd_bytes_read: f64,
    pub bwd_bytes_written: f64,
}

impl OpCost {
    /// A recompute repeats the forward.
    pub fn recompute_flops(&self) -> f64 {
        self.fwd_flops
    }

    pub fn fwd_bytes(&self) -> f64 {
        self.fwd_bytes_read + self.fwd_bytes_written
    }

    pub fn bwd_bytes(&self) -> f64 {
        self.bwd_bytes_read + self.bwd_bytes_written
    }

    fn add(&mut self, o: &OpCost) {
        self.fwd_flops += o.fwd_flops;
        self.bwd_flops += o.bwd_flops;
        self.fwd_bytes_read += o.fwd_bytes_read;
        self.fwd_bytes_written += o.fwd_bytes_written;
        self.bwd_bytes_read += o.bwd_bytes_read;
        self.bwd_bytes_written += o.bwd_bytes_written;
    }
}

/// FLOPs per element of elementwise and normalization ops (forward).
///
/// Rough operation counts of the textbook formula, e.g. LayerNorm: mean (1), centre (1),
/// square (1), variance (1), rsqrt-scale (1), affine (2) ≈ 7 → 8 with the reduction adds;
/// GELU-tanh: x³, two mul-adds, tanh (counted as ~4), final mul-add ≈ 10.
pub fn elementwise_flops(kind: &OpKind) -> f64 {
    match kind {
        OpKind::Add
        | OpKind::Sub
        | OpKind::Mul
        | OpKind::Div
        | OpKind::Neg
        | OpKind::Scale { .. } => 1.0,
        OpKind::Exp | OpKind::Sqrt | OpKind::Rsqrt | OpKind::Tanh | OpKind::Pow { .. } => 2.0,
        OpKind::Sigmoid => 4.0,
        OpKind::Silu => 5.0,
        OpKind::Relu => 1.0,
        OpKind::Clamp { .. } => 2.0,
        OpKind::Gelu { .. } => 10.0,
        OpKind::ReduceMean | OpKind::ReduceSum => 1.0,
        OpKind::LayerNorm { .. } => 8.0,
        OpKind::RmsNorm { .. } => 5.0,
        OpKind::Softmax { .. } => 5.0,
        OpKind::Rotary { .. } => 3.0,
        OpKind::Dropout { .. } => 2.0,
        OpKind::CrossEntropy => 5.0,
        _ => 0.0,
    }
}

/// The work of op `o` with the symbolic dimensions bound to `b`.
pub fn op_cost(graph: &Graph, o: OpId, b: Binding) -> OpCost {
    let op = graph.op(o);
    let in_bytes: f64 = op.inputs.iter().map(|&v| graph.ty(v).bytes(b) as f64).sum();
    let out_bytes: f64 = op
        .results
        .iter()
        .map(|&v| graph.ty(v).bytes(b) as f64)
        .sum();
    let dims = |v| graph.ty(v).shape.eval(b);
    let numel = |v| graph.ty(v).shape.numel(b) as f64;
    let kind = &op.kind;
    let elementwise = |per: f64, n: f64| OpCost {
        fwd_flops: per * n,
        bwd_flops: 2.0 * per * n,
        fwd_bytes_read: in_bytes,
        fwd_bytes_written: out_bytes,
        bwd_bytes_read: in_bytes + out_bytes,
        bwd_bytes_written: in_bytes,
    };
    let product = |flops: f64, extra: f64| OpCost {
        fwd_flops: flops + extra,
        bwd_flops: 2.0 * flops + extra,
        fwd_bytes_read: in_bytes,
        fwd_bytes_written: out_bytes,
        bwd_bytes_read: in_bytes + out_bytes,
        bwd_bytes_written: in_bytes,
    };
    match kind {
        k if k.is_source() => OpCost::default(),
        OpKind::Embedding => OpCost {
            // A gather moves rows and adds nothing; its backward scatter-adds into the table.
            fwd_flops: 0.0,
            bwd_flops: numel(op.results[0]),
            fwd_bytes_read: 2.0 * out_bytes,
            fwd_bytes_written: out_bytes,
            bwd_bytes_read: out_bytes,
            bwd_bytes_written: 2.0 * out_bytes,
        },
        OpKind::MatMul => {
            let a = dims(op.inputs[0]);
            let k = a.last().copied().unwrap_or(1) as f64;
            product(2.0 * numel(op.results[0]) * k, 0.0)
        }
        OpKind::Linear { bias } => {
            let k = dims(op.inputs[0]).last().copied().unwrap_or(1) as f64;
            let out = numel(op.results[0]);
            product(2.0 * out * k, if *bias { out } else { 0.0 })
        }
        OpKind::Attention { heads, .. } => {
            let q = dims(op.inputs[0]);
            let kv = dims(op.inputs[1]);
            let (bsz, sq, width) = (q[0] as f64, q[1] as f64, q[2] as f64);
            let widest = op.kind.attention_mask().widest();
            let sk = widest.map_or(kv[1], |w| kv[1].min(w)) as f64;
            let h = *heads as f64;
            // q kᵀ: B·heads·Sq·Sk·d multiply-adds (d·heads = the query width); p v: the same
            // with the value head size (heads·dv = the output width, narrower in MLA).
            let out_width = dims(op.results[0])[2] as f64;
            let products = 2.0 * bsz * sq * sk * (width + out_width);
            let softmax = elementwise_flops(&OpKind::Softmax { causal: true }) * bsz * h * sq * sk;
            product(products, softmax)
        }
        OpKind::TopKRouter { experts, k, .. } => {
            let x = dims(op.inputs[0]);
            let hidden = x.last().copied().unwrap_or(1) as f64;
            let tokens = numel(op.inputs[0]) / hidden;
            let e = *experts as f64;
            product(2.0 * tokens * hidden * e, tokens * (e + 5.0 * *k as f64))
        }
        OpKind::MoeExperts { experts, .. } => {
            let x = dims(op.inputs[0]);
            let hidden = x.last().copied().unwrap_or(1) as f64;
            let tokens = numel(op.inputs[0]) / hidden;
            let f = dims(op.inputs[2]).get(2).copied().unwrap_or(1) as f64;
            // Each token runs k of the experts; the router's k is not an operand here, so read it
            // from the gates' producer when it is a router, else assume all experts are active.
            let active = active_experts(graph, o).unwrap_or(*experts) as f64;
            let per_expert = 3.0 * 2.0 * hidden * f + 6.0 * f;
            let mut c = product(tokens * active * per_expert, tokens * hidden * active);
            // Only the active experts' weights are read per token batch; all of them in the
            // worst case, which is what a dense kernel does.
            c.fwd_bytes_read = in_bytes;
            c
        }
        OpKind::CrossEntropy => elementwise(5.0, numel(op.inputs[0])),
        OpKind::Grad { of, .. } => {
            // The backward of `of`: reuse its forward costing on the same operands.
            let fwd_inputs = op.inputs.len().saturating_sub(of.result_count());
            let tmp = shadow_op(graph, o, of, fwd_inputs, b);
            OpCost {
                fwd_flops: tmp.bwd_flops,
                bwd_flops: 0.0,
                fwd_bytes_read: tmp.bwd_bytes_read,
                fwd_bytes_written: tmp.bwd_bytes_written,
                bwd_bytes_read: 0.0,
                bwd_bytes_written: 0.0,
            }
        }
        OpKind::AdamW(_) => {
            // m, v updates, bias corrections, sqrt, division, decay, step: ~12 per element.
            let n = numel(op.inputs[0]);
            OpCost {
                fwd_flops: 12.0 * n,
                fwd_bytes_read: in_bytes,
                fwd_bytes_written: out_bytes,
                ..OpCost::default()
            }
        }
        k if k.class() == crate::op::OpClass::Layout => OpCost {
            fwd_bytes_read: in_bytes,
            fwd_bytes_written: out_bytes,
            bwd_bytes_read: out_bytes,
            bwd_bytes_written: in_bytes,
            ..OpCost::default()
        },
        k => elementwise(elementwise_flops(k), numel(op.results[0])),
    }
}

/// The `k` of the router feeding a `MoeExperts` op's gates, if that is what feeds it.
fn active_experts(graph: &Graph, o: OpId) -> Option<u64> {
    let gates = *graph.op(o).inputs.get(1)?;
    match &graph.op(graph.def_op(gates)).kind {
        OpKind::TopKRouter { k, .. } => Some(*k),
        _ => None,
    }
}

/// Costs the forward op `of` applied to the first `n` operands of grad op `o`.
fn shadow_op(graph: &Graph, o: OpId, of: &OpKind, n: usize, b: Binding) -> OpCost {
    let mut g = Graph::new("shadow");
    let op = graph.op(o);
    let inputs: Vec<_> = op.inputs[..n.min(op.inputs.len())]
        .iter()
        .map(|&v| {
            g.push_source(
                OpKind::Input {
                    name: format!("{v}"),
                },
                graph.ty(v).clone(),
                None,
            )
        })
        .collect();
    let tys: Vec<_> = op.inputs[n.min(op.inputs.len())..]
        .iter()
        .map(|&v| graph.ty(v).clone())
        .collect();
    let shadow = g.push_op_typed(of.clone(), inputs, tys, None);
    op_cost(&g, shadow, b)
}

/// Summed work of a whole graph (forward ops only unless the graph holds grad ops).
pub fn graph_cost(graph: &Graph, b: Binding) -> OpCost {
    let mut total = OpCost::default();
    for &o in graph.order() {
        total.add(&op_cost(graph, o, b));
    }
    total
}

/// Training FLOPs per token of a forward graph: forward + backward, no recompute.
pub fn training_flops_per_token(forward: &Graph, b: Binding) -> f64 {
    let c = graph_cost(forward, b);
    (c.fwd_flops + c.bwd_flops) / (b.batch * b.seq) as f64
}
