//! Pointwise ops: unary functions and broadcasting binary arithmetic, with their derivatives.

use std::f64::consts::PI;

use super::KernelError;
use super::index::{broadcast_map, broadcast_shape, unbroadcast};
use super::special::erf;
use crate::op::OpKind;
use crate::tensor::Tensor;

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
            Unary::Gelu { tanh: false } => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
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
            // x^e has derivative e·x^(e−1); e = 0 is constant (avoids 0·0^(−1) = NaN at x = 0).
            Unary::Pow(0.0) => 0.0,
            Unary::Pow(e) => e * x.powf(e - 1.0),
            Unary::Scale(f) => f,
            Unary::Gelu { tanh: false } => {
                let cdf = 0.5 * (1.0 + erf(x / 2f64.sqrt()));
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

    pub(crate) fn forward(self, x: &Tensor) -> Tensor {
        Tensor {
            shape: x.shape.clone(),
            data: x.data.iter().map(|&v| self.apply(v)).collect(),
        }
    }

    pub(crate) fn vjp(self, x: &Tensor, g: &Tensor) -> Result<Tensor, KernelError> {
        super::index::same_shape(x, g, "output gradient")?;
        Ok(Tensor {
            shape: x.shape.clone(),
            data: x
                .data
                .iter()
                .zip(&g.data)
                .map(|(&v, &gi)| gi * self.derivative(v))
                .collect(),
        })
    }
}

/// The logistic function, written to stay finite for large |x|.
pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
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

    pub(crate) fn forward(self, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
        let shape = broadcast_shape(&a.shape, &b.shape)?;
        let (ma, mb) = (
            broadcast_map(&a.shape, &shape)?,
            broadcast_map(&b.shape, &shape)?,
        );
        let data = ma
            .iter()
            .zip(&mb)
            .map(|(&i, &j)| self.apply(a.data[i], b.data[j]))
            .collect();
        Ok(Tensor { shape, data })
    }

    /// Gradients of both operands; broadcast axes are summed back by scatter-adding.
    pub(crate) fn vjp(
        self,
        a: &Tensor,
        b: &Tensor,
        g: &Tensor,
    ) -> Result<(Tensor, Tensor), KernelError> {
        let shape = broadcast_shape(&a.shape, &b.shape)?;
        if g.shape != shape {
            return Err(KernelError::new(format!(
                "output gradient {:?} must have the result shape {shape:?}",
                g.shape
            )));
        }
        let (ma, mb) = (
            broadcast_map(&a.shape, &shape)?,
            broadcast_map(&b.shape, &shape)?,
        );
        let mut ga = Vec::with_capacity(g.data.len());
        let mut gb = Vec::with_capacity(g.data.len());
        for ((&i, &j), &gi) in ma.iter().zip(&mb).zip(&g.data) {
            let (da, db) = self.partials(a.data[i], b.data[j]);
            ga.push(gi * da);
            gb.push(gi * db);
        }
        Ok((
            unbroadcast(&ga, &ma, &a.shape)?,
            unbroadcast(&gb, &mb, &b.shape)?,
        ))
    }
}
