//! Dispatch of one compute, layout or training op to its kernel, mirroring
//! `ir::interp::apply`.

use ir::{Binding, OpKind};

use crate::attention::{self, Attention};
use crate::elementwise::{Binary, Unary};
use crate::shape::{attr_usize, operands};
use crate::{
    KernelError, Tensor32, dropout, embedding, layout, loss, matmul, moe, norm, optim, reduce,
    rotary, softmax,
};

/// Runs one non-source op on operand values and returns one tensor per result. `binding` sizes
/// symbolic attribute shapes (the targets of `Reshape` and `Expand`); ops whose attributes are
/// all fixed ignore it.
pub fn forward(
    kind: &OpKind,
    inputs: &[&Tensor32],
    binding: Binding,
) -> Result<Vec<Tensor32>, KernelError> {
    for t in inputs {
        t.check()?;
    }
    let op = kind.mnemonic();
    if let Some(u) = Unary::of(kind) {
        let [x] = operands(op, inputs)?;
        return Ok(vec![u.forward(x)]);
    }
    if let Some(b) = Binary::of(kind) {
        let [x, y] = operands(op, inputs)?;
        return Ok(vec![b.forward(op, x, y)?]);
    }
    let one = |t: Tensor32| Ok(vec![t]);
    match kind {
        OpKind::Embedding => {
            let [table, ids] = operands(op, inputs)?;
            one(embedding::embedding(table, ids)?)
        }
        OpKind::MatMul => {
            let [a, b] = operands(op, inputs)?;
            one(matmul::matmul(a, b)?)
        }
        OpKind::Linear { bias: false } => {
            let [x, w] = operands(op, inputs)?;
            one(matmul::linear(x, w, None)?)
        }
        OpKind::Linear { bias: true } => {
            let [x, w, b] = operands(op, inputs)?;
            one(matmul::linear(x, w, Some(b))?)
        }
        OpKind::ReduceMean | OpKind::ReduceSum => {
            let [x] = operands(op, inputs)?;
            one(reduce::reduce(x, matches!(kind, OpKind::ReduceMean))?)
        }
        OpKind::LayerNorm { eps, bias: true } => {
            let [x, gamma, beta] = operands(op, inputs)?;
            one(norm::layer_norm(x, gamma, Some(beta), *eps)?)
        }
        OpKind::LayerNorm { eps, bias: false } => {
            let [x, gamma] = operands(op, inputs)?;
            one(norm::layer_norm(x, gamma, None, *eps)?)
        }
        OpKind::RmsNorm { eps } => {
            let [x, gamma] = operands(op, inputs)?;
            one(norm::rms_norm(x, gamma, *eps)?)
        }
        OpKind::Softmax { causal } => {
            let [x] = operands(op, inputs)?;
            one(softmax::softmax(x, *causal)?)
        }
        &OpKind::Attention {
            heads,
            kv_heads,
            scale,
            causal,
            softcap,
            sinks,
            window,
            chunk,
        } => {
            let (q, k, v, sinks) = attention::operands_of(inputs, sinks)?;
            one(Attention {
                heads,
                kv_heads,
                scale,
                causal,
                softcap,
                sinks,
                mask: ir::KeyMask { window, chunk },
            }
            .forward(q, k, v)?)
        }
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => {
            let [x] = operands(op, inputs)?;
            one(rotary::rotary(x, *heads, *theta, scaling)?)
        }
        OpKind::Reshape { shape } => {
            let [x] = operands(op, inputs)?;
            one(layout::reshape(x, layout::eval_dims(op, shape, binding)?)?)
        }
        OpKind::Expand { shape } => {
            let [x] = operands(op, inputs)?;
            one(layout::expand(x, &layout::eval_dims(op, shape, binding)?)?)
        }
        OpKind::Transpose { perm } => {
            let [x] = operands(op, inputs)?;
            one(layout::transpose(x, perm)?)
        }
        OpKind::Split { axis, sizes } => {
            let [x] = operands(op, inputs)?;
            layout::split(x, *axis, sizes)
        }
        OpKind::Concat { axis } => one(layout::concat(inputs, *axis)?),
        OpKind::Slice { axis, start, end } => {
            let [x] = operands(op, inputs)?;
            one(layout::slice(
                x,
                *axis,
                attr_usize(op, *start)?,
                attr_usize(op, *end)?,
            )?)
        }
        OpKind::Dropout { p, seed } => {
            let [x] = operands(op, inputs)?;
            one(dropout::dropout(x, *p, *seed)?)
        }
        OpKind::CrossEntropy => {
            let [logits, targets] = operands(op, inputs)?;
            one(loss::cross_entropy(logits, targets)?)
        }
        OpKind::TopKRouter {
            experts,
            k,
            routing,
            bias,
        } => {
            let (x, w) = moe::router_operands(inputs, *bias)?;
            one(moe::top_k_router(x, w, *experts, *k, routing)?)
        }
        OpKind::MoeExperts { experts, form } => {
            one(moe::Experts::new(*experts, *form, inputs)?.forward()?)
        }
        OpKind::Grad { of, wrt } => crate::backward::grad(of, wrt, inputs),
        OpKind::AdamW(cfg) => optim::adamw_op(cfg, operands::<5>(op, inputs)?),
        _ => Err(KernelError::Unsupported {
            op,
            reason: "a source op; its value comes from the environment".into(),
        }),
    }
}
