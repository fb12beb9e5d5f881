//! Pointwise ops: unary functions and broadcasting binary arithmetic, with their derivatives.
//!
//! Each element is computed in f64 and rounded once to f32: these ops are memory-bound, so the
//! wider arithmetic is free, and it keeps transcendental functions (erf, tanh) as accurate as
//! the reference interpreter's up to the final rounding.

use std::f64::consts::PI;

use ir::OpKind;

use crate::shape::{Reader, broadcast_shape, expect_shape, unbroadcast};
use crate::{KernelError, Tensor32};

/// A pointwise function of one operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Unary {
    Neg,
    Exp,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Pow(f64),
    Scale(f64),
    Gelu { tanh: bool },
    Silu,
    Relu,
    Clamp(f64),
}

/// √(2/π), the constant of GPT-2's tanh approximation of GELU.
const GELU_TANH_C: f64 = 0.797_884_560_802_865_4;
const GELU_TANH_CUBIC: f64 = 0.044_715;

/// The logistic function, written to stay finite for large |x|.
pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

impl Unary {
    pub(crate) fn of(kind: &OpKind) -> Option<Unary> {
        Some(match kind {
            OpKind::Neg => Unary::Neg,
            OpKind::Exp => Unary::Exp,
            OpKind::Sqrt => Unary::Sqrt,
            OpKind::Rsqrt => Unary::Rsqrt,
            OpKind::Tanh => Unary::Tanh,
            OpKind::Sigmoid => Unary::Sigmoid,
            OpKind::Pow { exponent } => Unary::Pow(*exponent),
            OpKind::Scale { factor } => Unary::Scale(*factor),
            OpKind::Gelu { tanh } => Unary::Gelu { tanh: *tanh },
            OpKind::Silu => Unary::Silu,
            OpKind::Relu => Unary::Relu,
            OpKind::Clamp { limit } => Unary::Clamp(*limit),
            _ => return None,
        })
    }

    pub(crate) fn apply(self, x: f64) -> f64 {
        match self {
            Unary::Neg => -x,
            Unary::Exp => x.exp(),
            Unary::Sqrt => x.sqrt(),
            Unary::Rsqrt => 1.0 / x.sqrt(),
            Unary::Tanh => x.tanh(),
            Unary::Sigmoid => sigmoid(x),
            Unary::Pow(e) => x.powf(e),
            Unary::Scale(f) => x * f,
            Unary::Gelu { tanh: false } => 0.5 * x * (1.0 + ir::interp::erf(x / 2f64.sqrt())),
            Unary::Gelu { tanh: true } => {
                let u = GELU_TANH_C * (x + GELU_TANH_CUBIC * x * x * x);
                0.5 * x * (1.0 + u.tanh())
            }
            Unary::Silu => x * sigmoid(x),
            Unary::Relu => x.max(0.0),
            Unary::Clamp(l) => x.clamp(-l, l),
        }
    }

    /// d apply(x) / dx.
    pub(crate) fn derivative(self, x: f64) -> f64 {
        match self {
            Unary::Neg => -1.0,
            Unary::Exp => x.exp(),
            Unary::Sqrt => 0.5 / x.sqrt(),
            Unary::Rsqrt => -0.5 / (x * x.sqrt()),
            Unary::Tanh => 1.0 - x.tanh().powi(2),
            Unary::Sigmoid => {
                let s = sigmoid(x);
                s * (1.0 - s)
            }
            // As in the interpreter: x⁰ is constant (avoids 0·0^(−1) = NaN at x = 0).
            Unary::Pow(0.0) => 0.0,
            Unary::Pow(e) => e * x.powf(e - 1.0),
            Unary::Scale(f) => f,
            Unary::Gelu { tanh: false } => {
                let cdf = 0.5 * (1.0 + ir::interp::erf(x / 2f64.sqrt()));
                let pdf = (-0.5 * x * x).exp() / (2.0 * PI).sqrt();
                cdf + x * pdf
            }
            Unary::Gelu { tanh: true } => {
                let u = GELU_TANH_C * (x + GELU_TANH_CUBIC * x * x * x);
                let t = u.tanh();
                let du = GELU_TANH_C * (1.0 + 3.0 * GELU_TANH_CUBIC * x * x);
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
            }
            Unary::Silu => {
                let s = sigmoid(x);
                s * (1.0 + x * (1.0 - s))
            }
            // The subgradient 0 at x = 0, as PyTorch's relu backward.
            Unary::Relu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            // PyTorch's clamp backward passes the gradient where min ≤ x ≤ max.
            Unary::Clamp(l) => {
                if x.abs() <= l {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    pub(crate) fn forward(self, x: &Tensor32) -> Tensor32 {
        Tensor32 {
            shape: x.shape.clone(),
            data: x
                .data
                .iter()
                .map(|&v| self.apply(f64::from(v)) as f32)
                .collect(),
        }
    }

    pub(crate) fn vjp(
        self,
        op: &'static str,
        x: &Tensor32,
        g: &Tensor32,
    ) -> Result<Tensor32, KernelError> {
        expect_shape(op, "output gradient", g, &x.shape)?;
        Ok(Tensor32 {
            shape: x.shape.clone(),
            data: x
                .data
                .iter()
                .zip(&g.data)
                .map(|(&v, &gi)| (f64::from(gi) * self.derivative(f64::from(v))) as f32)
                .collect(),
        })
    }
}

/// Broadcasting arithmetic of two operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

impl Binary {
    pub(crate) fn of(kind: &OpKind) -> Option<Binary> {
        Some(match kind {
            OpKind::Add => Binary::Add,
            OpKind::Sub => Binary::Sub,
            OpKind::Mul => Binary::Mul,
            OpKind::Div => Binary::Div,
            _ => return None,
        })
    }

    fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
        }
    }

    /// (∂/∂a, ∂/∂b) of apply(a, b).
    fn partials(self, a: f64, b: f64) -> (f64, f64) {
        match self {
            Binary::Add => (1.0, 1.0),
            Binary::Sub => (1.0, -1.0),
            Binary::Mul => (b, a),
            Binary::Div => (1.0 / b, -a / (b * b)),
        }
    }

    pub(crate) fn forward(
        self,
        op: &'static str,
        a: &Tensor32,
        b: &Tensor32,
    ) -> Result<Tensor32, KernelError> {
        let shape = broadcast_shape(op, &a.shape, &b.shape)?;
        let n = crate::tensor::numel(&shape)?;
        let data = if a.shape == b.shape {
            a.data
                .iter()
                .zip(&b.data)
                .map(|(&x, &y)| self.apply(f64::from(x), f64::from(y)) as f32)
                .collect()
        } else {
            let (ra, rb) = (
                Reader::new(op, &a.shape, &shape)?,
                Reader::new(op, &b.shape, &shape)?,
            );
            (0..n)
                .map(|i| {
                    let (x, y) = (a.data[ra.at(i)], b.data[rb.at(i)]);
                    self.apply(f64::from(x), f64::from(y)) as f32
                })
                .collect()
        };
        Ok(Tensor32 { shape, data })
    }

    /// Gradients of both operands; broadcast axes are summed back (in f64).
    pub(crate) fn vjp(
        self,
        op: &'static str,
        a: &Tensor32,
        b: &Tensor32,
        g: &Tensor32,
    ) -> Result<(Tensor32, Tensor32), KernelError> {
        let shape = broadcast_shape(op, &a.shape, &b.shape)?;
        expect_shape(op, "output gradient", g, &shape)?;
        let (ra, rb) = (
            Reader::new(op, &a.shape, &shape)?,
            Reader::new(op, &b.shape, &shape)?,
        );
        let mut ga = Vec::with_capacity(g.data.len());
        let mut gb = Vec::with_capacity(g.data.len());
        for (i, &gi) in g.data.iter().enumerate() {
            let (x, y) = (f64::from(a.data[ra.at(i)]), f64::from(b.data[rb.at(i)]));
            let (da, db) = self.partials(x, y);
            ga.push(f64::from(gi) * da);
            gb.push(f64::from(gi) * db);
        }
        Ok((
            unbroadcast(&ga, &ra, &a.shape)?,
            unbroadcast(&gb, &rb, &b.shape)?,
        ))
    }
}
