//! `Rotary` position embedding in Hugging Face Llama's "rotate half" convention: within each
//! head of size d (half = d/2), channel c < half pairs with c + half and the pair turns by angle
//! pos·θ^(−2c/d), pos being the index along S. The VJP turns back by the opposite angle.

use crate::shape::{attr_usize, expect_shape};
use crate::{KernelError, Tensor32};
use ir::RopeScaling;

const OP: &str = "rotary";

/// Turns `x`; token `i` along S sits at position `at[i]` (`None`: at `i`).
fn rotate(
    x: &Tensor32,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
    sign: f64,
    at: Option<&[usize]>,
) -> Result<Tensor32, KernelError> {
    let heads = attr_usize(OP, heads)?;
    let [b, s, w] = <[usize; 3]>::try_from(x.shape.as_slice()).map_err(|_| KernelError::Shape {
        op: OP,
        what: "operand",
        got: x.shape.clone(),
        want: "[B, S, heads*d]".into(),
    })?;
    if heads == 0 || w % heads != 0 || (w / heads) % 2 != 0 {
        return Err(KernelError::Attribute {
            op: OP,
            reason: format!("width {w} must split into {heads} heads of even size"),
        });
    }
    let d = w / heads;
    let half = d / 2;
    // The (cos, sin) table per (position, channel pair), computed once in f64 from HF's
    // inv_freq = 1/θ^(2c/d) rescaled as `rope_scaling` says (YaRN, and Llama 4's temperature
    // per position, also scale cos and sin),
    // then shared by every batch entry and head.
    if at.is_some_and(|p| p.len() != s) {
        return Err(KernelError::Attribute {
            op: OP,
            reason: format!(
                "{} positions for a sequence of {s}",
                at.map_or(0, <[_]>::len)
            ),
        });
    }
    let inv_freq = scaling.inv_freq(theta, d);
    let mut table = Vec::with_capacity(s * half);
    for i in 0..s {
        let pos = at.map_or(i, |p| p[i]);
        let m = scaling.magnitude(pos as f64);
        for &f in &inv_freq {
            let angle = pos as f64 * f;
            table.push((m * angle.cos(), m * sign * angle.sin()));
        }
    }
    let mut out = Tensor32::zeros(&x.shape)?;
    for bi in 0..b {
        for pos in 0..s {
            let trig = &table[pos * half..(pos + 1) * half];
            for h in 0..heads {
                let base = (bi * s + pos) * w + h * d;
                for (c, &(cos, sin)) in trig.iter().enumerate() {
                    let (x1, x2) = (
                        f64::from(x.data[base + c]),
                        f64::from(x.data[base + c + half]),
                    );
                    out.data[base + c] = (x1 * cos - x2 * sin) as f32;
                    out.data[base + c + half] = (x2 * cos + x1 * sin) as f32;
                }
            }
        }
    }
    Ok(out)
}

pub(crate) fn rotary(
    x: &Tensor32,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
) -> Result<Tensor32, KernelError> {
    rotate(x, heads, theta, scaling, 1.0, None)
}

/// [`rotary`] with token `i` at position `at[i]`.
pub(crate) fn rotary_at(
    x: &Tensor32,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
    at: &[usize],
) -> Result<Tensor32, KernelError> {
    rotate(x, heads, theta, scaling, 1.0, Some(at))
}

/// [`rotary_vjp`] with token `i` at position `at[i]`.
pub(crate) fn rotary_vjp_at(
    x: &Tensor32,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
    g: &Tensor32,
    at: &[usize],
) -> Result<Tensor32, KernelError> {
    expect_shape(OP, "output gradient", g, &x.shape)?;
    rotate(g, heads, theta, scaling, -1.0, Some(at))
}

pub(crate) fn rotary_vjp(
    x: &Tensor32,
    heads: u64,
    theta: f64,
    scaling: &RopeScaling,
    g: &Tensor32,
) -> Result<Tensor32, KernelError> {
    expect_shape(OP, "output gradient", g, &x.shape)?;
    rotate(g, heads, theta, scaling, -1.0, None)
}
