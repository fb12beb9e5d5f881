//! Vector-Jacobian products of every differentiable op, mirroring `ir::interp::vjp`, and the
//! `Grad{of, wrt}` op built on them.

use ir::OpKind;

use crate::attention::{self, Attention};
use crate::elementwise::{Binary, Unary};
use crate::shape::{attr_usize, expect_shape, operands};
use crate::{
    KernelError, Tensor32, dropout, embedding, layout, loss, matmul, moe, norm, reduce, rotary,
    softmax,
};

/// Evaluates `Grad{of, wrt}`: `inputs` are the forward operands followed by one output gradient
/// per forward result; returns the gradients of the operands listed in `wrt`.
pub(crate) fn grad(
    of: &OpKind,
    wrt: &[usize],
    inputs: &[&Tensor32],
) -> Result<Vec<Tensor32>, KernelError> {
    let r = of.result_count();
    let n = inputs.len().checked_sub(r).ok_or(KernelError::Arity {
        op: "grad",
        want: r,
        got: inputs.len(),
    })?;
    let mut all = backward(of, &inputs[..n], &inputs[n..])?;
    wrt.iter()
        .map(|&i| {
            all.get_mut(i)
                .and_then(Option::take)
                .ok_or_else(|| KernelError::Unsupported {
                    op: of.mnemonic(),
                    reason: format!("operand {i} has no gradient"),
                })
        })
        .collect()
}

/// The vector-Jacobian product of `kind` at operands `xs` for output gradients `dys` (one per
/// result): the gradient of every operand, `None` for operands no gradient flows through
/// (token ids, targets). Forward intermediates are recomputed from the operands.
pub fn backward(
    kind: &OpKind,
    xs: &[&Tensor32],
    dys: &[&Tensor32],
) -> Result<Vec<Option<Tensor32>>, KernelError> {
    for t in xs.iter().chain(dys) {
        t.check()?;
    }
    let op = kind.mnemonic();
    let all = |ts: Vec<Tensor32>| Ok(ts.into_iter().map(Some).collect());
    if let Some(u) = Unary::of(kind) {
        let ([x], [g]) = (operands(op, xs)?, operands(op, dys)?);
        return all(vec![u.vjp(op, x, g)?]);
    }
    if let Some(b) = Binary::of(kind) {
        let ([x, y], [g]) = (operands(op, xs)?, operands(op, dys)?);
        let (dx, dy) = b.vjp(op, x, y, g)?;
        return all(vec![dx, dy]);
    }
    if let OpKind::Split { axis, .. } = kind {
        let [x] = operands(op, xs)?;
        let dx = layout::concat(dys, *axis)?;
        expect_shape(op, "output gradients", &dx, &x.shape)?;
        return all(vec![dx]);
    }
    let [g] = operands(op, dys)?;
    match kind {
        OpKind::Embedding => {
            let [table, ids] = operands(op, xs)?;
            Ok(vec![Some(embedding::embedding_vjp(table, ids, g)?), None])
        }
        OpKind::MatMul => {
            let [a, b] = operands(op, xs)?;
            let (da, db) = matmul::matmul_vjp(a, b, g)?;
            all(vec![da, db])
        }
        OpKind::Linear { bias: false } => {
            let [x, w] = operands(op, xs)?;
            let (dx, dw, _) = matmul::linear_vjp(x, w, None, g)?;
            all(vec![dx, dw])
        }
        OpKind::Linear { bias: true } => {
            let [x, w, b] = operands(op, xs)?;
            let (dx, dw, db) = matmul::linear_vjp(x, w, Some(b), g)?;
            Ok(vec![Some(dx), Some(dw), db])
        }
        OpKind::ReduceMean | OpKind::ReduceSum => {
            let [x] = operands(op, xs)?;
            all(vec![reduce::reduce_vjp(
                x,
                g,
                matches!(kind, OpKind::ReduceMean),
            )?])
        }
        OpKind::LayerNorm { eps, bias: true } => {
            let [x, gamma, beta] = operands(op, xs)?;
            all(norm::layer_norm_vjp(x, gamma, Some(beta), *eps, g)?.into())
        }
        OpKind::LayerNorm { eps, bias: false } => {
            let [x, gamma] = operands(op, xs)?;
            let [dx, dgamma, _] = norm::layer_norm_vjp(x, gamma, None, *eps, g)?;
            all(vec![dx, dgamma])
        }
        OpKind::RmsNorm { eps } => {
            let [x, gamma] = operands(op, xs)?;
            all(norm::rms_norm_vjp(x, gamma, *eps, g)?.into())
        }
        OpKind::Softmax { causal } => {
            let [x] = operands(op, xs)?;
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
            let (q, k, v, sinks) = attention::operands_of(xs, sinks)?;
            all(Attention {
                heads,
                kv_heads,
                scale,
                causal,
                softcap,
                sinks,
                mask: ir::KeyMask { window, chunk },
            }
            .vjp(q, k, v, g)?)
        }
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => {
            let [x] = operands(op, xs)?;
            all(vec![rotary::rotary_vjp(x, *heads, *theta, scaling, g)?])
        }
        OpKind::Reshape { .. } => {
            let [x] = operands(op, xs)?;
            all(vec![layout::reshape(g, x.shape.clone())?])
        }
        OpKind::Expand { .. } => {
            let [x] = operands(op, xs)?;
            all(vec![layout::expand_vjp(x, g)?])
        }
        OpKind::Transpose { perm } => {
            let [x] = operands(op, xs)?;
            let dx = layout::transpose_vjp(perm, g)?;
            expect_shape(op, "output gradient", &dx, &x.shape)?;
            all(vec![dx])
        }
        OpKind::Concat { axis } => all(layout::concat_vjp(xs, *axis, g)?),
        OpKind::Slice { axis, start, end } => {
            let [x] = operands(op, xs)?;
            let (start, end) = (attr_usize(op, *start)?, attr_usize(op, *end)?);
            all(vec![layout::slice_vjp(x, *axis, start, end, g)?])
        }
        OpKind::Dropout { p, seed } => {
            let [x] = operands(op, xs)?;
            all(vec![dropout::dropout_vjp(x, *p, *seed, g)?])
        }
        OpKind::CrossEntropy => {
            let [logits, targets] = operands(op, xs)?;
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
            let (x, w) = moe::router_operands(xs, *bias)?;
            all(moe::top_k_router_vjp(x, w, *experts, *k, routing, g)?)
        }
        OpKind::MoeExperts { experts, form } => {
            all(moe::Experts::new(*experts, *form, xs)?.vjp(g)?)
        }
        _ => Err(KernelError::Unsupported {
            op,
            reason: "no vector-Jacobian product".into(),
        }),
    }
}
