//! `Grad{of, wrt}`: vector-Jacobian products of every differentiable op.

use super::KernelError;
use super::attention::Attention;
use super::elementwise::{Binary, Unary};
use super::forward::operands;
use super::index::{to_usize, well_formed};
use super::{dropout, embedding, layout, loss, matmul, moe, norm, reduce, rotary, softmax};
use crate::op::OpKind;
use crate::tensor::Tensor;

/// Evaluates a `Grad{of, wrt}` op: `inputs` are the forward operands followed by one output
/// gradient per forward result; returns the gradients of the operands listed in `wrt`.
pub(crate) fn grad(
    of: &OpKind,
    wrt: &[usize],
    inputs: &[&Tensor],
) -> Result<Vec<Tensor>, KernelError> {
    let r = of.result_count();
    let n = inputs.len().checked_sub(r).ok_or_else(|| {
        KernelError::new(format!(
            "grad of {} needs {r} output gradient(s) after the operands",
            of.mnemonic()
        ))
    })?;
    let mut all = vjp(of, &inputs[..n], &inputs[n..])?;
    wrt.iter()
        .map(|&i| {
            all.get_mut(i).and_then(Option::take).ok_or_else(|| {
                KernelError::new(format!("operand {i} of {} has no gradient", of.mnemonic()))
            })
        })
        .collect()
}

/// The vector-Jacobian product of `kind` at operands `xs` for output gradients `dys` (one per
/// result): the gradient of every operand, `None` for operands no gradient flows through
/// (token ids, targets). Forward intermediates are recomputed from the operands.
pub fn vjp(
    kind: &OpKind,
    xs: &[&Tensor],
    dys: &[&Tensor],
) -> Result<Vec<Option<Tensor>>, KernelError> {
    for t in xs.iter().chain(dys) {
        well_formed(t)?;
    }
    let all = |ts: Vec<Tensor>| Ok(ts.into_iter().map(Some).collect());
    if let Some(u) = Unary::of(kind) {
        let ([x], [g]) = (operands(kind, xs)?, operands(kind, dys)?);
        return all(vec![u.vjp(x, g)?]);
    }
    if let Some(b) = Binary::of(kind) {
        let ([x, y], [g]) = (operands(kind, xs)?, operands(kind, dys)?);
        let (dx, dy) = b.vjp(x, y, g)?;
        return all(vec![dx, dy]);
    }
    if let OpKind::Split { axis, .. } = kind {
        let [x] = operands(kind, xs)?;
        let dx = layout::concat(dys, *axis)?;
        super::index::same_shape(x, &dx, "split gradient")?;
        return all(vec![dx]);
    }
    let [g] = operands(kind, dys)?;
    match kind {
        OpKind::Embedding => {
            let [table, ids] = operands(kind, xs)?;
            Ok(vec![Some(embedding::embedding_vjp(table, ids, g)?), None])
        }
        OpKind::MatMul => {
            let [a, b] = operands(kind, xs)?;
            let (da, db) = matmul::matmul_vjp(a, b, g)?;
            all(vec![da, db])
        }
        OpKind::Linear { bias: false } => {
            let [x, w] = operands(kind, xs)?;
            let (dx, dw, _) = matmul::linear_vjp(x, w, None, g)?;
            all(vec![dx, dw])
        }
        OpKind::Linear { bias: true } => {
            let [x, w, b] = operands(kind, xs)?;
            let (dx, dw, db) = matmul::linear_vjp(x, w, Some(b), g)?;
            Ok(vec![Some(dx), Some(dw), db])
        }
        OpKind::ReduceMean | OpKind::ReduceSum => {
            let [x] = operands(kind, xs)?;
            all(vec![reduce::reduce_vjp(
                x,
                g,
                matches!(kind, OpKind::ReduceMean),
            )?])
        }
        OpKind::LayerNorm { eps, bias: true } => {
            let [x, gamma, beta] = operands(kind, xs)?;
            all(norm::layer_norm_vjp(x, gamma, Some(beta), *eps, g)?.into())
        }
        OpKind::LayerNorm { eps, bias: false } => {
            let [x, gamma] = operands(kind, xs)?;
            let [dx, dgamma, _] = norm::layer_norm_vjp(x, gamma, None, *eps, g)?;
            all(vec![dx, dgamma])
        }
        OpKind::RmsNorm { eps } => {
            let [x, gamma] = operands(kind, xs)?;
            all(norm::rms_norm_vjp(x, gamma, *eps, g)?.into())
        }
        OpKind::Softmax { causal } => {
            let [x] = operands(kind, xs)?;
            all(vec![softmax::softmax_vjp(x, *causal, g)?])
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
                let [q, k, v, s] = operands(kind, xs)?;
                all(a.vjp(q, k, v, Some(s), g)?)
            } else {
                let [q, k, v] = operands(kind, xs)?;
                all(a.vjp(q, k, v, None, g)?)
            }
        }
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => {
            let [x] = operands(kind, xs)?;
            all(vec![rotary::rotary_vjp(x, *heads, *theta, scaling, g)?])
        }
        OpKind::Reshape { .. } => {
            let [x] = operands(kind, xs)?;
            all(vec![layout::reshape(g, x.shape.clone())?])
        }
        OpKind::Expand { .. } => {
            let [x] = operands(kind, xs)?;
            all(vec![layout::expand_vjp(x, g)?])
        }
        OpKind::Transpose { perm } => {
            let [x] = operands(kind, xs)?;
            let dx = layout::transpose_vjp(perm, g)?;
            super::index::same_shape(x, &dx, "transpose gradient")?;
            all(vec![dx])
        }
        OpKind::Concat { axis } => all(layout::concat_vjp(xs, *axis, g)?),
        OpKind::Slice { axis, start, end } => {
            let [x] = operands(kind, xs)?;
            let (start, end) = (to_usize(*start)?, to_usize(*end)?);
            all(vec![layout::slice_vjp(x, *axis, start, end, g)?])
        }
        OpKind::Dropout { p, seed } => {
            let [x] = operands(kind, xs)?;
            all(vec![dropout::dropout_vjp(x, *p, *seed, g)?])
        }
        OpKind::CrossEntropy => {
            let [logits, targets] = operands(kind, xs)?;
            Ok(vec![
                Some(loss::cross_entropy_vjp(logits, targets, g)?),
                None,
            ])
        }
        OpKind::TopKRouter {
            experts,
            k,
            routing,
            bias,
        } => {
            let (x, w) = super::forward::router_operands(kind, xs, *bias)?;
            all(moe::top_k_router_vjp(x, w, *experts, *k, routing, g)?)
        }
        OpKind::MoeExperts { experts, form } => {
            all(moe::Experts::new(*experts, *form, xs)?.vjp(g)?)
        }
        other => Err(KernelError::new(format!(
            "{} has no vector-Jacobian product",
            other.mnemonic()
        ))),
    }
}
