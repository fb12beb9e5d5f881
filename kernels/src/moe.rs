//! Mixture of experts: `TopKRouter` (the routing of `plait_ir::Routing`) and `MoeExperts` (SwiGLU experts),
//! every projection a gemm over all tokens of one expert.

use crate::elementwise::{Unary, sigmoid};
use crate::gemm::{Mat, MatMut, gemm};
use crate::matmul::{linear, linear_vjp};
use crate::shape::{attr_usize, expect_shape, rows};
use crate::{KernelError, Tensor32};
use ir::routing::{Route, Routing};

const ROUTER: &str = "topk_router";
const EXPERTS: &str = "moe_experts";

fn router_k(w: &Tensor32, experts: u64, k: u64, routing: &Routing) -> Result<usize, KernelError> {
    routing
        .check(experts, k)
        .map_err(|reason| KernelError::Attribute { op: ROUTER, reason })?;
    let (e, k) = (attr_usize(ROUTER, experts)?, attr_usize(ROUTER, k)?);
    if w.shape.len() != 2 || w.shape[1] != e {
        return Err(KernelError::Shape {
            op: ROUTER,
            what: "weight",
            got: w.shape.clone(),
            want: format!("[H, {e}]"),
        });
    }
    Ok(k)
}

/// One token's route, from its f32 logits (the routing rule itself computes in f64: it reads
/// `experts` values per token, nothing beside the gemm that made them).
fn route_row(routing: &Routing, row: &[f32], k: usize) -> Route {
    let logits: Vec<f64> = row.iter().map(|&l| f64::from(l)).collect();
    routing.route(&logits, k)
}

/// Each token's expert weights, as [`Routing`] chooses them.
pub(crate) fn top_k_router(
    x: &Tensor32,
    w: &Tensor32,
    experts: u64,
    k: u64,
    routing: &Routing,
) -> Result<Tensor32, KernelError> {
    let k = router_k(w, experts, k, routing)?;
    let mut gates = linear(x, w, None)?;
    let (_, e) = rows(ROUTER, "logits", &gates)?;
    let mut weights = vec![0f64; e];
    for row in gates.data.chunks_exact_mut(e) {
        routing.gates(&route_row(routing, row, k), &mut weights);
        row.iter_mut()
            .zip(&weights)
            .for_each(|(g, &w)| *g = w as f32);
    }
    Ok(gates)
}

/// The selection is locally constant, so the gradient flows through the chosen scores only
/// ([`Routing::logits_grad`]), then through the router's linear map.
pub(crate) fn top_k_router_vjp(
    x: &Tensor32,
    w: &Tensor32,
    experts: u64,
    k: u64,
    routing: &Routing,
    g: &Tensor32,
) -> Result<[Tensor32; 2], KernelError> {
    let k = router_k(w, experts, k, routing)?;
    let mut dlogits = linear(x, w, None)?;
    expect_shape(ROUTER, "output gradient", g, &dlogits.shape)?;
    let (_, e) = rows(ROUTER, "logits", &dlogits)?;
    let mut d = vec![0f64; e];
    for (row, gr) in dlogits.data.chunks_exact_mut(e).zip(g.data.chunks_exact(e)) {
        let dgates: Vec<f64> = gr.iter().map(|&v| f64::from(v)).collect();
        routing.logits_grad(&route_row(routing, row, k), &dgates, &mut d);
        row.iter_mut().zip(&d).for_each(|(o, &v)| *o = v as f32);
    }
    let (dx, dw, _) = linear_vjp(x, w, None, &dlogits)?;
    Ok([dx, dw])
}

/// Sizes of one `MoeExperts` call: tokens, experts, hidden width, expert width.
struct Dims {
    t: usize,
    e: usize,
    h: usize,
    f: usize,
}

fn experts_dims(experts: u64, ops: [&Tensor32; 5]) -> Result<Dims, KernelError> {
    let [x, gates, w1, w3, w2] = ops;
    let e = attr_usize(EXPERTS, experts)?;
    let (t, h) = rows(EXPERTS, "input", x)?;
    let mut gate_shape = x.shape.clone();
    if let Some(last) = gate_shape.last_mut() {
        *last = e;
    }
    expect_shape(EXPERTS, "gates", gates, &gate_shape)?;
    let f = match w1.shape.as_slice() {
        &[we, wh, f] if we == e && wh == h => f,
        s => {
            return Err(KernelError::Shape {
                op: EXPERTS,
                what: "w1",
                got: s.to_vec(),
                want: format!("[{e}, {h}, F]"),
            });
        }
    };
    expect_shape(EXPERTS, "w3", w3, &[e, h, f])?;
    expect_shape(EXPERTS, "w2", w2, &[e, f, h])?;
    Ok(Dims { t, e, h, f })
}

/// One expert's activations over a set of token rows: a = x·w1ₑ, b = x·w3ₑ, hidden = silu(a)⊙b.
struct Pass {
    a: Vec<f32>,
    b: Vec<f32>,
    hidden: Vec<f32>,
}

fn expert_pass(
    d: &Dims,
    x: &[f32],
    rows: usize,
    w1: &Tensor32,
    w3: &Tensor32,
    e: usize,
) -> Result<Pass, KernelError> {
    let (h, f) = (d.h, d.f);
    let mut a = vec![0f32; rows * f];
    let mut b = vec![0f32; rows * f];
    gemm(
        1.0,
        Mat::rm(x, 0, rows, h),
        Mat::rm(&w1.data, e * h * f, h, f),
        0.0,
        MatMut::rm(&mut a, 0, rows, f),
    )?;
    gemm(
        1.0,
        Mat::rm(x, 0, rows, h),
        Mat::rm(&w3.data, e * h * f, h, f),
        0.0,
        MatMut::rm(&mut b, 0, rows, f),
    )?;
    let hidden = a
        .iter()
        .zip(&b)
        .map(|(&av, &bv)| (Unary::Silu.apply(f64::from(av)) * f64::from(bv)) as f32)
        .collect();
    Ok(Pass { a, b, hidden })
}

/// Σₑ gatesₑ · (silu(x w1ₑ) ⊙ (x w3ₑ)) w2ₑ. Each expert runs only on the tokens routed to it
/// (nonzero gate), gathered into one contiguous block: a zero gate contributes exactly 0.
pub(crate) fn moe_experts(experts: u64, ops: [&Tensor32; 5]) -> Result<Tensor32, KernelError> {
    let d = experts_dims(experts, ops)?;
    let [x, gates, w1, w3, w2] = ops;
    let (h, f) = (d.h, d.f);
    let mut y = Tensor32::zeros(&x.shape)?;
    let mut xs = Vec::new();
    for e in 0..d.e {
        let routed: Vec<usize> = (0..d.t)
            .filter(|&t| gates.data[t * d.e + e] != 0.0)
            .collect();
        if routed.is_empty() {
            continue;
        }
        xs.clear();
        for &t in &routed {
            xs.extend_from_slice(&x.data[t * h..(t + 1) * h]);
        }
        let n = routed.len();
        let pass = expert_pass(&d, &xs, n, w1, w3, e)?;
        let mut out = vec![0f32; n * h];
        gemm(
            1.0,
            Mat::rm(&pass.hidden, 0, n, f),
            Mat::rm(&w2.data, e * f * h, f, h),
            0.0,
            MatMut::rm(&mut out, 0, n, h),
        )?;
        for (&t, o) in routed.iter().zip(out.chunks_exact(h)) {
            let gate = gates.data[t * d.e + e];
            for (yv, &ov) in y.data[t * h..(t + 1) * h].iter_mut().zip(o) {
                *yv += gate * ov;
            }
        }
    }
    Ok(y)
}

/// Gradients of (x, gates, w1, w3, w2). Every expert runs on every token here, since the gate
/// gradient dgateₜₑ = dyₜ·outₜₑ is defined (and returned) even where the gate is 0. Then
/// dout = gate·dy, dhidden = dout w2ₑᵀ, da = dhidden ⊙ b ⊙ silu'(a), db = dhidden ⊙ silu(a).
pub(crate) fn moe_experts_vjp(
    experts: u64,
    ops: [&Tensor32; 5],
    g: &Tensor32,
) -> Result<[Tensor32; 5], KernelError> {
    let d = experts_dims(experts, ops)?;
    let [x, gates, w1, w3, w2] = ops;
    expect_shape(EXPERTS, "output gradient", g, &x.shape)?;
    let (t, h, f) = (d.t, d.h, d.f);
    let mut dx = Tensor32::zeros(&x.shape)?;
    let mut dgates = Tensor32::zeros(&gates.shape)?;
    let mut dw1 = Tensor32::zeros(&w1.shape)?;
    let mut dw3 = Tensor32::zeros(&w3.shape)?;
    let mut dw2 = Tensor32::zeros(&w2.shape)?;
    let mut out = vec![0f32; t * h];
    let mut dout = vec![0f32; t * h];
    let mut dhidden = vec![0f32; t * f];
    for e in 0..d.e {
        let pass = expert_pass(&d, &x.data, t, w1, w3, e)?;
        let hid = Mat::rm(&pass.hidden, 0, t, f);
        gemm(
            1.0,
            hid,
            Mat::rm(&w2.data, e * f * h, f, h),
            0.0,
            MatMut::rm(&mut out, 0, t, h),
        )?;
        for ti in 0..t {
            let gate = gates.data[ti * d.e + e];
            let (gr, or) = (&g.data[ti * h..(ti + 1) * h], &out[ti * h..(ti + 1) * h]);
            dgates.data[ti * d.e + e] = gr
                .iter()
                .zip(or)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>() as f32;
            for (dv, &gv) in dout[ti * h..(ti + 1) * h].iter_mut().zip(gr) {
                *dv = gate * gv;
            }
        }
        let dom = Mat::rm(&dout, 0, t, h);
        gemm(
            1.0,
            hid.t(),
            dom,
            0.0,
            MatMut::rm(&mut dw2.data, e * f * h, f, h),
        )?;
        gemm(
            1.0,
            dom,
            Mat::rm(&w2.data, e * f * h, f, h).t(),
            0.0,
            MatMut::rm(&mut dhidden, 0, t, f),
        )?;
        // dhidden becomes da, and db is built beside it.
        let mut db = vec![0f32; t * f];
        for (((dh, dbv), &av), &bv) in dhidden
            .iter_mut()
            .zip(db.iter_mut())
            .zip(&pass.a)
            .zip(&pass.b)
        {
            let (a64, b64, g64) = (f64::from(av), f64::from(bv), f64::from(*dh));
            *dbv = (g64 * a64 * sigmoid(a64)) as f32;
            *dh = (g64 * b64 * Unary::Silu.derivative(a64)) as f32;
        }
        let (xm, dam, dbm) = (
            Mat::rm(&x.data, 0, t, h),
            Mat::rm(&dhidden, 0, t, f),
            Mat::rm(&db, 0, t, f),
        );
        gemm(
            1.0,
            xm.t(),
            dam,
            0.0,
            MatMut::rm(&mut dw1.data, e * h * f, h, f),
        )?;
        gemm(
            1.0,
            xm.t(),
            dbm,
            0.0,
            MatMut::rm(&mut dw3.data, e * h * f, h, f),
        )?;
        gemm(
            1.0,
            dam,
            Mat::rm(&w1.data, e * h * f, h, f).t(),
            1.0,
            MatMut::rm(&mut dx.data, 0, t, h),
        )?;
        gemm(
            1.0,
            dbm,
            Mat::rm(&w3.data, e * h * f, h, f).t(),
            1.0,
            MatMut::rm(&mut dx.data, 0, t, h),
        )?;
    }
    Ok([dx, dgates, dw1, dw3, dw2])
}
