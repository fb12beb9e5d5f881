//! `Dropout{p, seed}`: inverted dropout whose mask is a pure function of (seed, flat index), so
//! the forward, its VJP and any sharded re-execution agree without carrying a mask tensor.

use super::KernelError;
use super::index::same_shape;
use crate::tensor::Tensor;

/// The golden-ratio increment of splitmix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function (Steele, Lea & Flood 2014).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether element `index` (flat, row-major) survives dropout with probability `p` under
/// `seed`: u = top 53 bits of splitmix64 at state seed + (index + 1)·φ, as a uniform in
/// [0, 1) (the `index`-th output of a splitmix64 stream seeded with `seed`); kept iff u ≥ p.
pub fn dropout_keep(seed: u64, index: u64, p: f64) -> bool {
    let z = mix(seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)));
    let u = (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    u >= p
}

/// Per element, 1/(1 − p) where kept and 0 where dropped.
fn factors(n: usize, p: f64, seed: u64) -> Result<Vec<f64>, KernelError> {
    if !(0.0..1.0).contains(&p) {
        return Err(KernelError::new(format!(
            "dropout probability {p} is not in [0, 1)"
        )));
    }
    let scale = 1.0 / (1.0 - p);
    Ok((0..n as u64)
        .map(|i| if dropout_keep(seed, i, p) { scale } else { 0.0 })
        .collect())
}

pub(crate) fn dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor, KernelError> {
    let f = factors(x.data.len(), p, seed)?;
    Ok(Tensor {
        shape: x.shape.clone(),
        data: x.data.iter().zip(&f).map(|(a, b)| a * b).collect(),
    })
}

/// The same mask applied to the output gradient.
pub(crate) fn dropout_vjp(
    x: &Tensor,
    p: f64,
    seed: u64,
    g: &Tensor,
) -> Result<Tensor, KernelError> {
    same_shape(x, g, "output gradient")?;
    dropout(g, p, seed)
}
