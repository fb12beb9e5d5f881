//! Dispatch of one compute, layout or training op to its kernel.

use super::KernelError;
use super::attention::Attention;
use super::elementwise::{Binary, Unary};
use super::index::{to_usize, well_formed};
use super::{
    dropout, embedding, grad, layout, loss, matmul, moe, norm, optim, reduce, rotary, softmax,
};
use crate::op::OpKind;
use crate::tensor::Tensor;
use crate::types::Binding;

/// Exactly `N` operands, or an error naming the op.
pub(crate) fn operands<'t, const N: usize>(
    kind: &OpKind,
    inputs: &[&'t Tensor],
) -> Result<[&'t Tensor; N], KernelError> {
    <[&Tensor; N]>::try_from(inputs).map_err(|_| {
        KernelError::new(format!(
            "{} takes {N} operand(s), got {}",
            kind.mnemonic(),
            inputs.len()
        ))
    })
}

/// Runs one non-source op on operand values; `binding` sizes symbolic attribute shapes
/// (reshape and expand targets). Returns one tensor per result.
pub fn apply(
    kind: &OpKind,
    inputs: &[&Tensor],
    binding: Binding,
) -> Result<Vec<Tensor>, KernelError> {
    for t in inputs {
        well_formed(t)?;
    }
    if let Some(u) = Unary::of(kind) {
        let [x] = operands(kind, inputs)?;
        return Ok(vec![u.forward(x)]);
    }
    if let Some(b) = Binary::of(kind) {
        let [x, y] = operands(kind, inputs)?;
        return Ok(vec![b.forward(x, y)?]);
    }
    let one = |t: Tensor| Ok(vec![t]);
    match kind {
        OpKind::Embedding => {
            let [table, ids] = operands(kind, inputs)?;
            one(embedding::embedding(table, ids)?)
        }
        OpKind::MatMul => {
            let [a, b] = operands(kind, inputs)?;
            one(matmul::matmul(a, b)?)
        }
        OpKind::Linear { bias: false } => {
            let [x, w] = operands(kind, inputs)?;
            one(matmul::linear(x, w, None)?)
        }
        OpKind::Linear { bias: true } => {
            let [x, w, b] = operands(kind, inputs)?;
            one(matmul::linear(x, w, Some(b))?)
        }
        OpKind::ReduceMean | OpKind::ReduceSum => {
            let [x] = operands(kind, inputs)?;
            one(reduce::reduce(x, matches!(kind, OpKind::ReduceMean))?)
        }
        OpKind::LayerNorm { eps, bias: true } => {
            let [x, gamma, beta] = operands(kind, inputs)?;
            one(norm::layer_norm(x, gamma, Some(beta), *eps)?)
        }
        OpKind::LayerNorm { eps, bias: false } => {
            let [x, gamma] = operands(kind, inputs)?;
            one(norm::layer_norm(x, gamma, None, *eps)?)
        }
        OpKind::RmsNorm { eps } => {
            let [x, gamma] = operands(kind, inputs)?;
            one(norm::rms_norm(x, gamma, *eps)?)
        }
        OpKind::Softmax { causal } => {
            let [x] = operands(kind, inputs)?;
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
            let a = Attention {
                heads,
                kv_heads,
                scale,
                causal,
                softcap,
                mask: crate::KeyMask { window, chunk },
            };
            if sinks {
                let [q, k, v, s] = operands(kind, inputs)?;
                one(a.forward(q, k, v, Some(s))?)
            } else {
                let [q, k, v] = operands(kind, inputs)?;
                one(a.forward(q, k, v, None)?)
            }
        }
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => {
            let [x] = operands(kind, inputs)?;
            one(rotary::rotary(x, *heads, *theta, scaling)?)
        }
        OpKind::Reshape { shape } => {
            let [x] = operands(kind, inputs)?;
            one(layout::reshape(x, layout::eval_dims(shape, binding)?)?)
        }
        OpKind::Expand { shape } => {
            let [x] = operands(kind, inputs)?;
            one(layout::expand(x, &layout::eval_dims(shape, binding)?)?)
        }
        OpKind::Transpose { perm } => {
            let [x] = operands(kind, inputs)?;
            one(layout::transpose(x, perm)?)
        }
        OpKind::Split { axis, sizes } => {
            let [x] = operands(kind, inputs)?;
            layout::split(x, *axis, sizes)
        }
        OpKind::Concat { axis } => one(layout::concat(inputs, *axis)?),
        OpKind::Slice { axis, start, end } => {
            let [x] = operands(kind, inputs)?;
            one(layout::slice(x, *axis, to_usize(*start)?, to_usize(*end)?)?)
        }
        OpKind::Dropout { p, seed } => {
            let [x] = operands(kind, inputs)?;
            one(dropout::dropout(x, *p, *seed)?)
        }
        OpKind::CrossEntropy => {
            let [logits, targets] = operands(kind, inputs)?;
            one(loss::cross_entropy(logits, targets)?)
        }
        OpKind::TopKRouter {
            experts,
            k,
            routing,
            bias,
        } => {
            let (x, w) = router_operands(kind, inputs, *bias)?;
            one(moe::top_k_router(x, w, *experts, *k, routing)?)
        }
        OpKind::MoeExperts { experts, form } => {
            one(moe::Experts::new(*experts, *form, inputs)?.forward()?)
        }
        OpKind::Grad { of, wrt } => grad::grad(of, wrt, inputs),
        OpKind::AdamW(cfg) => {
            let ops = operands::<5>(kind, inputs)?;
            Ok(optim::adamw(cfg, ops)?.into())
        }
        other => Err(KernelError::new(format!(
            "{} is a source op; evaluate reads it from the environment",
            other.mnemonic()
        ))),
    }
}

/// The router's input, and its weight with its bias where it has one.
pub(crate) type RouterOperands<'t> = (&'t Tensor, (&'t Tensor, Option<&'t Tensor>));

/// [`RouterOperands`] of a `TopKRouter` with or without a bias.
pub(crate) fn router_operands<'t>(
    kind: &OpKind,
    inputs: &[&'t Tensor],
    bias: bool,
) -> Result<RouterOperands<'t>, KernelError> {
    Ok(if bias {
        let [x, w, b] = operands(kind, inputs)?;
        (x, (w, Some(b)))
    } else {
        let [x, w] = operands(kind, inputs)?;
        (x, (w, None))
    })
}
