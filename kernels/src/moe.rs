//! Mixture of experts: `TopKRouter` (the routing of `plait_ir::Routing`) and `MoeExperts` (gated
//! experts of an `ExpertForm`),
//! every projection a gemm over all tokens of one expert.

use crate::gemm::{Mat, MatMut, gemm};
use crate::matmul::{linear, linear_vjp};
use crate::shape::{attr_usize, expect_shape, operands, rows};
use crate::{KernelError, Tensor32};
use ir::ExpertForm;
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
    (w, bias): (&Tensor32, Option<&Tensor32>),
    experts: u64,
    k: u64,
    routing: &Routing,
) -> Result<Tensor32, KernelError> {
    let k = router_k(w, experts, k, routing)?;
    let mut gates = linear(x, w, bias)?;
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
/// ([`Routing::logits_grad`]), then through the router's linear map (and its bias).
pub(crate) fn top_k_router_vjp(
    x: &Tensor32,
    (w, bias): (&Tensor32, Option<&Tensor32>),
    experts: u64,
    k: u64,
    routing: &Routing,
    g: &Tensor32,
) -> Result<Vec<Tensor32>, KernelError> {
    let k = router_k(w, experts, k, routing)?;
    let mut dlogits = linear(x, w, bias)?;
    expect_shape(ROUTER, "output gradient", g, &dlogits.shape)?;
    let (_, e) = rows(ROUTER, "logits", &dlogits)?;
    let mut d = vec![0f64; e];
    for (row, gr) in dlogits.data.chunks_exact_mut(e).zip(g.data.chunks_exact(e)) {
        let dgates: Vec<f64> = gr.iter().map(|&v| f64::from(v)).collect();
        routing.logits_grad(&route_row(routing, row, k), &dgates, &mut d);
        row.iter_mut().zip(&d).for_each(|(o, &v)| *o = v as f32);
    }
    let (dx, dw, dbias) = linear_vjp(x, w, bias, &dlogits)?;
    Ok([dx, dw].into_iter().chain(dbias).collect())
}

/// One `MoeExperts` call: its operands (with the biases where its form has them), its form
/// and sizes: tokens, experts, hidden width, expert width.
pub(crate) struct Experts<'t> {
    x: &'t Tensor32,
    gates: &'t Tensor32,
    w1: &'t Tensor32,
    w3: &'t Tensor32,
    w2: &'t Tensor32,
    b1: Option<&'t Tensor32>,
    b3: Option<&'t Tensor32>,
    form: ExpertForm,
    t: usize,
    e: usize,
    h: usize,
    f: usize,
}

/// One expert's activations over a set of token rows: a = x·w1ₑ + b1ₑ, b = x·w3ₑ + b3ₑ,
/// hidden = unit(a, b).
struct Pass {
    a: Vec<f32>,
    b: Vec<f32>,
    hidden: Vec<f32>,
}

impl<'t> Experts<'t> {
    pub(crate) fn new(
        experts: u64,
        form: ExpertForm,
        ops: &[&'t Tensor32],
    ) -> Result<Experts<'t>, KernelError> {
        if ops.len() != form.operands() {
            return Err(KernelError::Arity {
                op: EXPERTS,
                want: form.operands(),
                got: ops.len(),
            });
        }
        let (x, gates, w1, w3, w2) = (ops[0], ops[1], ops[2], ops[3], ops[4]);
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
        let (b1, b3) = (ops.get(5).copied(), ops.get(6).copied());
        for (what, b) in [("b1", b1), ("b3", b3)] {
            if let Some(b) = b {
                expect_shape(EXPERTS, what, b, &[e, f])?;
            }
        }
        Ok(Experts {
            x,
            gates,
            w1,
            w3,
            w2,
            b1,
            b3,
            form,
            t,
            e,
            h,
            f,
        })
    }

    /// Expert `e` on `rows` token rows `x` (`[rows, h]`).
    fn pass(&self, x: &[f32], rows: usize, e: usize) -> Result<Pass, KernelError> {
        let (h, f) = (self.h, self.f);
        let project = |w: &Tensor32, bias: Option<&Tensor32>| -> Result<Vec<f32>, KernelError> {
            let mut out = vec![0f32; rows * f];
            gemm(
                1.0,
                Mat::rm(x, 0, rows, h),
                Mat::rm(&w.data, e * h * f, h, f),
                0.0,
                MatMut::rm(&mut out, 0, rows, f),
            )?;
            if let Some(b) = bias {
                let be = &b.data[e * f..(e + 1) * f];
                for row in out.chunks_exact_mut(f) {
                    row.iter_mut().zip(be).for_each(|(o, &bv)| *o += bv);
                }
            }
            Ok(out)
        };
        let (a, b) = (project(self.w1, self.b1)?, project(self.w3, self.b3)?);
        let hidden = a
            .iter()
            .zip(&b)
            .map(|(&av, &bv)| self.form.hidden(f64::from(av), f64::from(bv)) as f32)
            .collect();
        Ok(Pass { a, b, hidden })
    }

    /// Token `t`'s gate for expert `e`.
    fn gate(&self, t: usize, e: usize) -> f32 {
        self.gates.data[t * self.e + e]
    }

    /// Σₑ gatesₑ · unit(x w1ₑ + b1ₑ, x w3ₑ + b3ₑ) w2ₑ, or Σₑ unit(gatesₑx w1ₑ, gatesₑx w3ₑ) w2ₑ
    /// where the form `scales_input`. Each expert runs only on the tokens routed to it
    /// (nonzero gate), gathered into one contiguous block: a zero gate contributes exactly 0.
    pub(crate) fn forward(&self) -> Result<Tensor32, KernelError> {
        let (h, f) = (self.h, self.f);
        let mut y = Tensor32::zeros(&self.x.shape)?;
        let mut xs = Vec::new();
        for e in 0..self.e {
            let routed: Vec<usize> = (0..self.t).filter(|&t| self.gate(t, e) != 0.0).collect();
            if routed.is_empty() {
                continue;
            }
            xs.clear();
            for &t in &routed {
                let row = &self.x.data[t * h..(t + 1) * h];
                let scale = if self.form.scales_input {
                    self.gate(t, e)
                } else {
                    1.0
                };
                xs.extend(row.iter().map(|&v| scale * v));
            }
            let n = routed.len();
            let pass = self.pass(&xs, n, e)?;
            let mut out = vec![0f32; n * h];
            gemm(
                1.0,
                Mat::rm(&pass.hidden, 0, n, f),
                Mat::rm(&self.w2.data, e * f * h, f, h),
                0.0,
                MatMut::rm(&mut out, 0, n, h),
            )?;
            for (&t, o) in routed.iter().zip(out.chunks_exact(h)) {
                let gate = if self.form.scales_input {
                    1.0
                } else {
                    self.gate(t, e)
                };
                for (yv, &ov) in y.data[t * h..(t + 1) * h].iter_mut().zip(o) {
                    *yv += gate * ov;
                }
            }
        }
        Ok(y)
    }

    /// Gradients of (x, gates, w1, w3, w2, and b1, b3 with biases). Every expert runs on every
    /// token here, since the gate gradient dgateₜₑ = dyₜ·outₜₑ is defined (and returned) even
    /// where the gate is 0. Then dout = gate·dy, dhidden = dout w2ₑᵀ, da = dhidden · ∂unit/∂a,
    /// db = dhidden · ∂unit/∂b; the biases' gradients sum da and db over the tokens. Where the
    /// gate scales the input, the expert runs on xs = gate·x with dout = dy, and the scaled
    /// input's gradient dxs gives dx = gate·dxs and dgate = x·dxs ([`Experts::input_grads`]).
    pub(crate) fn vjp(&self, g: &Tensor32) -> Result<Vec<Tensor32>, KernelError> {
        let x = self.x;
        expect_shape(EXPERTS, "output gradient", g, &x.shape)?;
        let (t, h, f) = (self.t, self.h, self.f);
        let mut dx = Tensor32::zeros(&x.shape)?;
        let mut dgates = Tensor32::zeros(&self.gates.shape)?;
        let mut dw1 = Tensor32::zeros(&self.w1.shape)?;
        let mut dw3 = Tensor32::zeros(&self.w3.shape)?;
        let mut dw2 = Tensor32::zeros(&self.w2.shape)?;
        let mut db1 = Tensor32::zeros(&[self.e, f])?;
        let mut db3 = Tensor32::zeros(&[self.e, f])?;
        let mut out = vec![0f32; t * h];
        let mut dout = vec![0f32; t * h];
        let mut dhidden = vec![0f32; t * f];
        for e in 0..self.e {
            let xs = self.expert_input(e);
            let pass = self.pass(&xs, t, e)?;
            let hid = Mat::rm(&pass.hidden, 0, t, f);
            let w2e = Mat::rm(&self.w2.data, e * f * h, f, h);
            gemm(1.0, hid, w2e, 0.0, MatMut::rm(&mut out, 0, t, h))?;
            for ti in 0..t {
                let gate = self.gate(ti, e);
                let (gr, or) = (&g.data[ti * h..(ti + 1) * h], &out[ti * h..(ti + 1) * h]);
                let out_scale = if self.form.scales_input { 1.0 } else { gate };
                if !self.form.scales_input {
                    dgates.data[ti * self.e + e] = dot(gr, or);
                }
                for (dv, &gv) in dout[ti * h..(ti + 1) * h].iter_mut().zip(gr) {
                    *dv = out_scale * gv;
                }
            }
            let dom = Mat::rm(&dout, 0, t, h);
            let dw2e = MatMut::rm(&mut dw2.data, e * f * h, f, h);
            gemm(1.0, hid.t(), dom, 0.0, dw2e)?;
            gemm(1.0, dom, w2e.t(), 0.0, MatMut::rm(&mut dhidden, 0, t, f))?;
            // dhidden becomes da, and db is built beside it.
            let mut db = vec![0f32; t * f];
            for (((dh, dbv), &av), &bv) in dhidden
                .iter_mut()
                .zip(db.iter_mut())
                .zip(&pass.a)
                .zip(&pass.b)
            {
                let (pa, pb) = self.form.partials(f64::from(av), f64::from(bv));
                let g64 = f64::from(*dh);
                *dbv = (g64 * pb) as f32;
                *dh = (g64 * pa) as f32;
            }
            column_sums(&dhidden, &mut db1.data[e * f..(e + 1) * f]);
            column_sums(&db, &mut db3.data[e * f..(e + 1) * f]);
            let grads = [&mut dw1, &mut dw3, &mut dx, &mut dgates];
            self.input_grads(e, &xs, (&dhidden, &db), grads)?;
        }
        let mut grads = vec![dx, dgates, dw1, dw3, dw2];
        if self.form.bias {
            grads.extend([db1, db3]);
        }
        Ok(grads)
    }

    /// Expert `e`'s input: x, or each token's row times its gate where the form scales the
    /// input.
    fn expert_input(&self, e: usize) -> std::borrow::Cow<'t, [f32]> {
        if !self.form.scales_input {
            return std::borrow::Cow::Borrowed(&self.x.data);
        }
        let h = self.h;
        let mut xs = self.x.data.clone();
        for (ti, row) in xs.chunks_exact_mut(h.max(1)).enumerate() {
            let gate = self.gate(ti, e);
            row.iter_mut().for_each(|v| *v *= gate);
        }
        std::borrow::Cow::Owned(xs)
    }

    /// dw1ₑ = xsᵀ da, dw3ₑ = xsᵀ db for the expert's input `xs`, and its gradient
    /// dxs = da w1ₑᵀ + db w3ₑᵀ: added to dx as it is, or, where the gate scaled the input,
    /// as gate·dxs, with dgate = x·dxs.
    fn input_grads(
        &self,
        e: usize,
        xs: &[f32],
        (da, db): (&[f32], &[f32]),
        [dw1, dw3, dx, dgates]: [&mut Tensor32; 4],
    ) -> Result<(), KernelError> {
        let (t, h, f) = (self.t, self.h, self.f);
        let (xm, dam, dbm) = (
            Mat::rm(xs, 0, t, h),
            Mat::rm(da, 0, t, f),
            Mat::rm(db, 0, t, f),
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
        let w1e = Mat::rm(&self.w1.data, e * h * f, h, f);
        let w3e = Mat::rm(&self.w3.data, e * h * f, h, f);
        if !self.form.scales_input {
            gemm(1.0, dam, w1e.t(), 1.0, MatMut::rm(&mut dx.data, 0, t, h))?;
            gemm(1.0, dbm, w3e.t(), 1.0, MatMut::rm(&mut dx.data, 0, t, h))?;
            return Ok(());
        }
        let mut dxs = vec![0f32; t * h];
        gemm(1.0, dam, w1e.t(), 0.0, MatMut::rm(&mut dxs, 0, t, h))?;
        gemm(1.0, dbm, w3e.t(), 1.0, MatMut::rm(&mut dxs, 0, t, h))?;
        for (ti, d) in dxs.chunks_exact(h.max(1)).enumerate() {
            let gate = self.gate(ti, e);
            let row = &mut dx.data[ti * h..(ti + 1) * h];
            row.iter_mut().zip(d).for_each(|(o, &v)| *o += gate * v);
            dgates.data[ti * self.e + e] = dot(&self.x.data[ti * h..(ti + 1) * h], d);
        }
        Ok(())
    }
}

/// a·b, summed in f64.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum::<f64>() as f32
}

/// Sums of the columns of the row-major `[rows, out.len()]` matrix `m` into `out`.
fn column_sums(m: &[f32], out: &mut [f32]) {
    let mut acc = vec![0f64; out.len()];
    for row in m.chunks_exact(out.len().max(1)) {
        acc.iter_mut()
            .zip(row)
            .for_each(|(a, &v)| *a += f64::from(v));
    }
    out.iter_mut().zip(acc).for_each(|(o, a)| *o = a as f32);
}

/// The router's input, and its weight with its bias where it has one.
pub(crate) type RouterOperands<'t> = (&'t Tensor32, (&'t Tensor32, Option<&'t Tensor32>));

/// [`RouterOperands`] of a `TopKRouter` with or without a bias.
pub(crate) fn router_operands<'t>(
    inputs: &[&'t Tensor32],
    bias: bool,
) -> Result<RouterOperands<'t>, KernelError> {
    Ok(if bias {
        let [x, w, b] = operands(ROUTER, inputs)?;
        (x, (w, Some(b)))
    } else {
        let [x, w] = operands(ROUTER, inputs)?;
        (x, (w, None))
    })
}
