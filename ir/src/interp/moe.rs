//! Mixture of experts: `TopKRouter` (the routing of [`Routing`]) and `MoeExperts` (SwiGLU experts).

use super::KernelError;
use super::elementwise::{Unary, sigmoid};
use super::index::{rows, to_usize, zeros};
use super::matmul::{linear, linear_vjp};
use crate::routing::Routing;
use crate::tensor::Tensor;

fn router_logits(
    x: &Tensor,
    w: &Tensor,
    experts: u64,
    k: u64,
    routing: &Routing,
) -> Result<(Tensor, usize), KernelError> {
    routing.check(experts, k).map_err(KernelError::new)?;
    let (e, k) = (to_usize(experts)?, to_usize(k)?);
    if w.shape.get(1) != Some(&e) {
        return Err(KernelError::new(format!(
            "router weight {:?} must be [H, {e}]",
            w.shape
        )));
    }
    Ok((linear(x, w, None)?, k))
}

/// Each token's expert weights, as [`Routing`] chooses them.
pub(crate) fn top_k_router(
    x: &Tensor,
    w: &Tensor,
    experts: u64,
    k: u64,
    routing: &Routing,
) -> Result<Tensor, KernelError> {
    let (logits, k) = router_logits(x, w, experts, k, routing)?;
    let (_, e) = rows(&logits, "router logits")?;
    let mut gates = logits.clone();
    for (lr, gr) in logits
        .data
        .chunks_exact(e)
        .zip(gates.data.chunks_exact_mut(e))
    {
        routing.gates(&routing.route(lr, k), gr);
    }
    Ok(gates)
}

/// The selection is locally constant, so the gradient flows through the chosen scores only
/// ([`Routing::logits_grad`]), then through the router's linear map into x and the weight.
pub(crate) fn top_k_router_vjp(
    x: &Tensor,
    w: &Tensor,
    experts: u64,
    k: u64,
    routing: &Routing,
    g: &Tensor,
) -> Result<[Tensor; 2], KernelError> {
    let (logits, k) = router_logits(x, w, experts, k, routing)?;
    super::index::same_shape(&logits, g, "output gradient")?;
    let (_, e) = rows(&logits, "router logits")?;
    let mut dlogits = logits.clone();
    for ((lr, gr), dr) in logits
        .data
        .chunks_exact(e)
        .zip(g.data.chunks_exact(e))
        .zip(dlogits.data.chunks_exact_mut(e))
    {
        routing.logits_grad(&routing.route(lr, k), gr, dr);
    }
    let (dx, dw, _) = linear_vjp(x, w, None, &dlogits)?;
    Ok([dx, dw])
}

/// Sizes of one `MoeExperts` call: tokens, experts, hidden width, expert width.
struct Dims {
    tokens: usize,
    e: usize,
    h: usize,
    f: usize,
}

fn experts_dims(experts: u64, ops: [&Tensor; 5]) -> Result<Dims, KernelError> {
    let [x, gates, w1, w3, w2] = ops;
    let e = to_usize(experts)?;
    let (tokens, h) = rows(x, "experts input")?;
    let mut gate_shape = x.shape.clone();
    if let Some(last) = gate_shape.last_mut() {
        *last = e;
    }
    if gates.shape != gate_shape {
        return Err(KernelError::new(format!(
            "gates {:?} must be {gate_shape:?}",
            gates.shape
        )));
    }
    let f = match w1.shape.as_slice() {
        &[we, wh, f] if we == e && wh == h => f,
        s => {
            return Err(KernelError::new(format!(
                "expert w1 {s:?} must be [{e}, {h}, F]"
            )));
        }
    };
    if w3.shape != w1.shape || w2.shape != [e, f, h] {
        return Err(KernelError::new(format!(
            "expert w3 {:?} must be [{e}, {h}, {f}] and w2 {:?} must be [{e}, {f}, {h}]",
            w3.shape, w2.shape
        )));
    }
    Ok(Dims { tokens, e, h, f })
}

/// One expert's intermediate values for one token.
struct ExpertPass {
    /// x·w1ₑ and x·w3ₑ, each `[F]`.
    a: Vec<f64>,
    b: Vec<f64>,
    /// silu(a) ⊙ b.
    hidden: Vec<f64>,
    /// hidden·w2ₑ, `[H]`.
    out: Vec<f64>,
}

fn expert_pass(d: &Dims, xt: &[f64], w1: &[f64], w3: &[f64], w2: &[f64]) -> ExpertPass {
    let (h, f) = (d.h, d.f);
    let proj = |w: &[f64]| -> Vec<f64> {
        (0..f)
            .map(|j| (0..h).map(|i| xt[i] * w[i * f + j]).sum())
            .collect()
    };
    let (a, b) = (proj(w1), proj(w3));
    let hidden: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&av, &bv)| Unary::Silu.apply(av) * bv)
        .collect();
    let out = (0..h)
        .map(|i| (0..f).map(|j| hidden[j] * w2[j * h + i]).sum())
        .collect();
    ExpertPass { a, b, hidden, out }
}

/// Σₑ gatesₑ · (silu(x w1ₑ) ⊙ (x w3ₑ)) w2ₑ. Every expert runs for every token, even at gate 0:
/// this is an oracle, and the gate's gradient needs each expert's output anyway.
pub(crate) fn moe_experts(experts: u64, ops: [&Tensor; 5]) -> Result<Tensor, KernelError> {
    let d = experts_dims(experts, ops)?;
    let [x, gates, w1, w3, w2] = ops;
    let (hf, fh) = (d.h * d.f, d.f * d.h);
    let mut y = zeros(&x.shape)?;
    for t in 0..d.tokens {
        let xt = &x.data[t * d.h..(t + 1) * d.h];
        for e in 0..d.e {
            let gate = gates.data[t * d.e + e];
            let pass = expert_pass(
                &d,
                xt,
                &w1.data[e * hf..(e + 1) * hf],
                &w3.data[e * hf..(e + 1) * hf],
                &w2.data[e * fh..(e + 1) * fh],
            );
            for (yv, &o) in y.data[t * d.h..(t + 1) * d.h].iter_mut().zip(&pass.out) {
                *yv += gate * o;
            }
        }
    }
    Ok(y)
}

/// Gradients of (x, gates, w1, w3, w2), per token and expert:
/// dgate = dy·out, dhidden = w2ₑ (gate·dy), da = dhidden ⊙ b ⊙ silu'(a), db = dhidden ⊙ silu(a).
pub(crate) fn moe_experts_vjp(
    experts: u64,
    ops: [&Tensor; 5],
    g: &Tensor,
) -> Result<[Tensor; 5], KernelError> {
    let d = experts_dims(experts, ops)?;
    let [x, gates, w1, w3, w2] = ops;
    super::index::same_shape(x, g, "output gradient")?;
    let (h, f, hf) = (d.h, d.f, d.h * d.f);
    let mut dx = zeros(&x.shape)?;
    let mut dgates = zeros(&gates.shape)?;
    let mut dw1 = zeros(&w1.shape)?;
    let mut dw3 = zeros(&w3.shape)?;
    let mut dw2 = zeros(&w2.shape)?;
    for t in 0..d.tokens {
        let xt = &x.data[t * h..(t + 1) * h];
        let gt = &g.data[t * h..(t + 1) * h];
        for e in 0..d.e {
            let gate = gates.data[t * d.e + e];
            let (w1e, w3e, w2e) = (
                &w1.data[e * hf..(e + 1) * hf],
                &w3.data[e * hf..(e + 1) * hf],
                &w2.data[e * hf..(e + 1) * hf],
            );
            let pass = expert_pass(&d, xt, w1e, w3e, w2e);
            dgates.data[t * d.e + e] = gt.iter().zip(&pass.out).map(|(a, b)| a * b).sum();
            let dout: Vec<f64> = gt.iter().map(|&gv| gate * gv).collect();
            let dw2e = &mut dw2.data[e * hf..(e + 1) * hf];
            let mut da = vec![0.0; f];
            let mut db = vec![0.0; f];
            for j in 0..f {
                let mut dhidden = 0.0;
                for i in 0..h {
                    dhidden += w2e[j * h + i] * dout[i];
                    dw2e[j * h + i] += pass.hidden[j] * dout[i];
                }
                let s = sigmoid(pass.a[j]);
                da[j] = dhidden * pass.b[j] * Unary::Silu.derivative(pass.a[j]);
                db[j] = dhidden * pass.a[j] * s;
            }
            let (dw1e, dw3e) = (
                &mut dw1.data[e * hf..(e + 1) * hf],
                &mut dw3.data[e * hf..(e + 1) * hf],
            );
            let dxt = &mut dx.data[t * h..(t + 1) * h];
            for i in 0..h {
                for j in 0..f {
                    dw1e[i * f + j] += xt[i] * da[j];
                    dw3e[i * f + j] += xt[i] * db[j];
                    dxt[i] += w1e[i * f + j] * da[j] + w3e[i * f + j] * db[j];
                }
            }
        }
    }
    Ok([dx, dgates, dw1, dw3, dw2])
}
