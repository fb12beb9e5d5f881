//! `Rotary` position embedding in Hugging Face Llama's "rotate half" convention.
//!
//! Within each head of size d (half = d/2), channel c < half pairs with c + half and the pair
//! turns by angle pos · θ^(−2c/d), with pos the index along S:
//!   y[c]        = x[c]·cos − x[c+half]·sin
//!   y[c+half]   = x[c+half]·cos + x[c]·sin
//! i.e. y = x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁].

use super::KernelError;
use super::index::{to_usize, zeros};
use crate::rope::RopeScaling;
use crate::tensor::Tensor;

/// Which way to turn: the VJP of a rotation is the rotation by the opposite angle.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Inverse,
}

fn rotate(
    x: &Tensor,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
    dir: Direction,
) -> Result<Tensor, KernelError> {
    let heads = to_usize(heads)?;
    let [b, s, w] = <[usize; 3]>::try_from(x.shape.as_slice()).map_err(|_| {
        KernelError::new(format!(
            "rotary operand must be [B, S, heads*d], got {:?}",
            x.shape
        ))
    })?;
    if heads == 0 || w % heads != 0 || (w / heads) % 2 != 0 {
        return Err(KernelError::new(format!(
            "rotary width {w} must split into {heads} heads of even size"
        )));
    }
    let d = w / heads;
    let half = d / 2;
    // HF computes inv_freq = 1 / θ^(arange(0, d, 2)/d), i.e. θ^(−2c/d) for c < half, then
    // rescales it as `rope_scaling` says; YaRN also scales cos and sin.
    let inv_freq = scaling.inv_freq(theta, d);
    let sign = match dir {
        Direction::Forward => 1.0,
        Direction::Inverse => -1.0,
    };
    let mut out = zeros(&x.shape)?;
    for bi in 0..b {
        for pos in 0..s {
            let m = scaling.magnitude(pos as f64);
            for h in 0..heads {
                let base = (bi * s + pos) * w + h * d;
                for (c, &f) in inv_freq.iter().enumerate() {
                    let angle = pos as f64 * f;
                    let (sin, cos) = (m * sign * angle.sin(), m * angle.cos());
                    let (x1, x2) = (x.data[base + c], x.data[base + c + half]);
                    out.data[base + c] = x1 * cos - x2 * sin;
                    out.data[base + c + half] = x2 * cos + x1 * sin;
                }
            }
        }
    }
    Ok(out)
}

pub(crate) fn rotary(
    x: &Tensor,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
) -> Result<Tensor, KernelError> {
    rotate(x, heads, theta, scaling, Direction::Forward)
}

/// The map is a rotation times the attention factor, so its VJP turns the output gradient back
/// by the same angle, times the same factor.
pub(crate) fn rotary_vjp(
    x: &Tensor,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
    g: &Tensor,
) -> Result<Tensor, KernelError> {
    super::index::same_shape(x, g, "output gradient")?;
    rotate(g, heads, theta, scaling, Direction::Inverse)
}
