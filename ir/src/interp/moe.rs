//! Mixture of experts: `TopKRouter` (the routing of [`Routing`]) and `MoeExperts` (gated
//! experts of an [`ExpertForm`]).

use super::KernelError;
use super::index::{rows, to_usize, zeros};
use super::matmul::{linear, linear_vjp};
use crate::expert::ExpertForm;
use crate::routing::Routing;
use crate::tensor::Tensor;

fn router_logits(
    x: &Tensor,
    (w, bias): (&Tensor, Option<&Tensor>),
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
    Ok((linear(x, w, bias)?, k))
}

/// Each token's expert weights, as [`Routing`] chooses them from the logits x·w (+ bias).
pub(crate) fn top_k_router(
    x: &Tensor,
    w: (&Tensor, Option<&Tensor>),
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
/// ([`Routing::logits_grad`]), then through the router's linear map into x, the weight and
/// the bias where there is one.
pub(crate) fn top_k_router_vjp(
    x: &Tensor,
    w: (&Tensor, Option<&Tensor>),
    experts: u64,
    k: u64,
    routing: &Routing,
    g: &Tensor,
) -> Result<Vec<Tensor>, KernelError> {
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
    let (dx, dw, dbias) = linear_vjp(x, w.0, w.1, &dlogits)?;
    Ok([dx, dw].into_iter().chain(dbias).collect())
}

/// One `MoeExperts` call: its operands (the biases where the form has them), its form and
/// sizes (tokens, experts, hidden width, expert width).
pub(crate) struct Experts<'t> {
    x: &'t Tensor,
    gates: &'t Tensor,
    w1: &'t Tensor,
    w3: &'t Tensor,
    w2: &'t Tensor,
    b1: Option<&'t Tensor>,
    b3: Option<&'t Tensor>,
    form: ExpertForm,
    tokens: usize,
    e: usize,
    h: usize,
    f: usize,
}

impl<'t> Experts<'t> {
    /// Reads the operands `ops` (x, gates, w1, w3, w2, and b1, b3 with biases) and checks them.
    pub(crate) fn new(
        experts: u64,
        form: ExpertForm,
        ops: &[&'t Tensor],
    ) -> Result<Experts<'t>, KernelError> {
        if ops.len() != form.operands() {
            return Err(KernelError::new(format!(
                "moe_experts takes {} operands, got {}",
                form.operands(),
                ops.len()
            )));
        }
        let (x, gates, w1, w3, w2) = (ops[0], ops[1], ops[2], ops[3], ops[4]);
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
        let (b1, b3) = (ops.get(5).copied(), ops.get(6).copied());
        if [b1, b3].iter().flatten().any(|b| b.shape != [e, f]) {
            return Err(KernelError::new(format!(
                "expert biases must be [{e}, {f}]"
            )));
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
            tokens,
            e,
            h,
            f,
        })
    }

    /// The factors on expert `e`'s input and output for token `t`: its gate on one, 1 on the
    /// other, as the form says.
    fn gate_sides(&self, t: usize, e: usize) -> (f64, f64) {
        let gate = self.gates.data[t * self.e + e];
        if self.form.scales_input {
            (gate, 1.0)
        } else {
            (1.0, gate)
        }
    }

    /// Expert `e`'s intermediate values for token `t`, its input scaled by `scale`.
    fn pass(&self, t: usize, e: usize, scale: f64) -> ExpertPass {
        let (h, f, hf) = (self.h, self.f, self.h * self.f);
        let xt: Vec<f64> = self.x.data[t * h..(t + 1) * h]
            .iter()
            .map(|&v| scale * v)
            .collect();
        let proj = |w: &Tensor, b: Option<&Tensor>| -> Vec<f64> {
            let w = &w.data[e * hf..(e + 1) * hf];
            (0..f)
                .map(|j| {
                    let bias = b.map_or(0.0, |b| b.data[e * f + j]);
                    bias + (0..h).map(|i| xt[i] * w[i * f + j]).sum::<f64>()
                })
                .collect()
        };
        let (a, b) = (proj(self.w1, self.b1), proj(self.w3, self.b3));
        let hidden: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(&av, &bv)| self.form.hidden(av, bv))
            .collect();
        let w2 = &self.w2.data[e * hf..(e + 1) * hf];
        let out = (0..h)
            .map(|i| (0..f).map(|j| hidden[j] * w2[j * h + i]).sum())
            .collect();
        ExpertPass { a, b, hidden, out }
    }

    /// Σₑ gatesₑ · unit(x w1ₑ + b1ₑ, x w3ₑ + b3ₑ) w2ₑ, or with `scales_input`
    /// Σₑ unit(gatesₑx w1ₑ, gatesₑx w3ₑ) w2ₑ. Every expert runs for every token, even at gate
    /// 0: this is an oracle, and the gate's gradient needs each expert's output anyway.
    pub(crate) fn forward(&self) -> Result<Tensor, KernelError> {
        let h = self.h;
        let mut y = zeros(&self.x.shape)?;
        for t in 0..self.tokens {
            for e in 0..self.e {
                let (in_scale, out_scale) = self.gate_sides(t, e);
                let pass = self.pass(t, e, in_scale);
                for (yv, &o) in y.data[t * h..(t + 1) * h].iter_mut().zip(&pass.out) {
                    *yv += out_scale * o;
                }
            }
        }
        Ok(y)
    }

    /// Gradients of every operand, per token and expert: dgate = dy·out,
    /// dhidden = w2ₑ (gate·dy), da = dhidden · ∂unit/∂a, db = dhidden · ∂unit/∂b, and the
    /// biases' gradients da and db. With `scales_input`, dhidden = w2ₑ dy, the input's
    /// gradient dxs = w1ₑ da + w3ₑ db is the scaled input's, so dx = gate·dxs and
    /// dgate = x·dxs.
    pub(crate) fn vjp(&self, g: &Tensor) -> Result<Vec<Tensor>, KernelError> {
        super::index::same_shape(self.x, g, "output gradient")?;
        let (h, f, hf) = (self.h, self.f, self.h * self.f);
        let mut dx = zeros(&self.x.shape)?;
        let mut dgates = zeros(&self.gates.shape)?;
        let mut dw1 = zeros(&self.w1.shape)?;
        let mut dw3 = zeros(&self.w3.shape)?;
        let mut dw2 = zeros(&self.w2.shape)?;
        let mut db1 = zeros(&[self.e, f])?;
        let mut db3 = zeros(&[self.e, f])?;
        for t in 0..self.tokens {
            let xt = &self.x.data[t * h..(t + 1) * h];
            let gt = &g.data[t * h..(t + 1) * h];
            for e in 0..self.e {
                let (in_scale, out_scale) = self.gate_sides(t, e);
                let w = |m: &'t Tensor| &m.data[e * hf..(e + 1) * hf];
                let (w1e, w3e, w2e) = (w(self.w1), w(self.w3), w(self.w2));
                let pass = self.pass(t, e, in_scale);
                if !self.form.scales_input {
                    dgates.data[t * self.e + e] =
                        gt.iter().zip(&pass.out).map(|(a, b)| a * b).sum();
                }
                let dout: Vec<f64> = gt.iter().map(|&gv| out_scale * gv).collect();
                let dw2e = &mut dw2.data[e * hf..(e + 1) * hf];
                let mut da = vec![0.0; f];
                let mut db = vec![0.0; f];
                for j in 0..f {
                    let mut dhidden = 0.0;
                    for i in 0..h {
                        dhidden += w2e[j * h + i] * dout[i];
                        dw2e[j * h + i] += pass.hidden[j] * dout[i];
                    }
                    let (pa, pb) = self.form.partials(pass.a[j], pass.b[j]);
                    da[j] = dhidden * pa;
                    db[j] = dhidden * pb;
                }
                for j in 0..f {
                    db1.data[e * f + j] += da[j];
                    db3.data[e * f + j] += db[j];
                }
                let (dw1e, dw3e) = (
                    &mut dw1.data[e * hf..(e + 1) * hf],
                    &mut dw3.data[e * hf..(e + 1) * hf],
                );
                let dxt = &mut dx.data[t * h..(t + 1) * h];
                let mut dgate = 0.0;
                for i in 0..h {
                    let mut dxs = 0.0;
                    for j in 0..f {
                        dw1e[i * f + j] += in_scale * xt[i] * da[j];
                        dw3e[i * f + j] += in_scale * xt[i] * db[j];
                        dxs += w1e[i * f + j] * da[j] + w3e[i * f + j] * db[j];
                    }
                    dxt[i] += in_scale * dxs;
                    dgate += xt[i] * dxs;
                }
                if self.form.scales_input {
                    dgates.data[t * self.e + e] = dgate;
                }
            }
        }
        let mut grads = vec![dx, dgates, dw1, dw3, dw2];
        if self.form.bias {
            grads.extend([db1, db3]);
        }
        Ok(grads)
    }
}

/// One expert's intermediate values for one token.
struct ExpertPass {
    /// x·w1ₑ + b1ₑ and x·w3ₑ + b3ₑ, each `[F]`.
    a: Vec<f64>,
    b: Vec<f64>,
    /// unit(a, b).
    hidden: Vec<f64>,
    /// hidden·w2ₑ, `[H]`.
    out: Vec<f64>,
}
