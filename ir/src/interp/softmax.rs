//! `Softmax{causal}` over the last axis; the causal mask is shared with attention.

use super::KernelError;
use super::index::{rows, same_shape};
use crate::tensor::Tensor;

/// How many leading keys query `i` of `sq` may read among `sk` keys: the causal mask hides
/// key `j > i + sk − sq` (queries are aligned with the last keys, as in a KV cache).
pub(crate) fn visible_keys(i: usize, sq: usize, sk: usize, causal: bool) -> usize {
    if causal {
        (i + sk + 1).saturating_sub(sq).min(sk)
    } else {
        sk
    }
}

/// Softmax of `logits[..visible]` into `out[..visible]`, zeros beyond; all zeros if none visible.
/// A sink of −∞ takes no share (e⁻ᶦⁿᶠ adds an exact 0 to the sum).
pub(crate) fn softmax_row(logits: &[f64], visible: usize, out: &mut [f64]) {
    softmax_row_with_sink(logits, visible, f64::NEG_INFINITY, out);
}

/// [`softmax_row`] with one more logit, `sink`, that no output reads (an attention sink):
/// returns the sink's share, so the row's weights sum to one less it.
pub(crate) fn softmax_row_with_sink(
    logits: &[f64],
    visible: usize,
    sink: f64,
    out: &mut [f64],
) -> f64 {
    out.iter_mut().for_each(|o| *o = 0.0);
    let shown = &logits[..visible];
    let max = shown.iter().copied().fold(sink, f64::max);
    let mut sum = (sink - max).exp();
    for (o, &l) in out.iter_mut().zip(shown) {
        *o = (l - max).exp();
        sum += *o;
    }
    out[..visible].iter_mut().for_each(|o| *o /= sum);
    (sink - max).exp() / sum
}

/// dx = y ⊙ (g − Σ g·y) for one row (masked entries have y = 0 and so get no gradient).
pub(crate) fn softmax_row_vjp(y: &[f64], g: &[f64], dx: &mut [f64]) {
    let dot: f64 = y.iter().zip(g).map(|(a, b)| a * b).sum();
    for ((d, &yi), &gi) in dx.iter_mut().zip(y).zip(g) {
        *d = yi * (gi - dot);
    }
}

/// The (query count, key count) of a `[.., Sq, Sk]` operand.
fn dims(x: &Tensor, causal: bool) -> Result<(usize, usize), KernelError> {
    let (_, sk) = rows(x, "softmax operand")?;
    let r = x.shape.len();
    let sq = if r >= 2 { x.shape[r - 2] } else { 1 };
    if causal && r < 2 {
        return Err(KernelError::new(
            "a causal softmax needs a [.., Sq, Sk] operand",
        ));
    }
    Ok((sq, sk))
}

pub(crate) fn softmax(x: &Tensor, causal: bool) -> Result<Tensor, KernelError> {
    let (sq, sk) = dims(x, causal)?;
    let mut out = x.clone();
    for (r, (xr, yr)) in x
        .data
        .chunks_exact(sk)
        .zip(out.data.chunks_exact_mut(sk))
        .enumerate()
    {
        softmax_row(xr, visible_keys(r % sq.max(1), sq, sk, causal), yr);
    }
    Ok(out)
}

pub(crate) fn softmax_vjp(x: &Tensor, causal: bool, g: &Tensor) -> Result<Tensor, KernelError> {
    same_shape(x, g, "output gradient")?;
    let (_, sk) = dims(x, causal)?;
    let y = softmax(x, causal)?;
    let mut dx = x.clone();
    for ((yr, gr), dr) in y
        .data
        .chunks_exact(sk)
        .zip(g.data.chunks_exact(sk))
        .zip(dx.data.chunks_exact_mut(sk))
    {
        softmax_row_vjp(yr, gr, dr);
    }
    Ok(dx)
}
