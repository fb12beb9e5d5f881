//! `Softmax{causal}` over the last axis; the row kernels and causal mask are shared with
//! attention and the router. Sums are accumulated in f64 so the result does not depend on how
//! a row was produced (single device or sharded).

use crate::shape::{expect_shape, rows};
use crate::{KernelError, Tensor32};

const OP: &str = "softmax";

/// How many leading keys query `i` of `sq` may read among `sk` keys: the causal mask hides key
/// `j > i + sk − sq` (queries aligned with the last keys, as in the interpreter).
pub(crate) fn visible_keys(i: usize, sq: usize, sk: usize, causal: bool) -> usize {
    if causal {
        (i + sk + 1).saturating_sub(sq).min(sk)
    } else {
        sk
    }
}

/// In place: softmax of `row[..visible]`, zeros beyond; all zeros if none is visible. A sink
/// of −∞ takes no share (e⁻ᶦⁿᶠ adds an exact 0 to the sum).
pub(crate) fn softmax_row(row: &mut [f32], visible: usize) {
    softmax_row_with_sink(row, visible, f32::NEG_INFINITY);
}

/// [`softmax_row`] with one more logit, `sink`, that no output reads (an attention sink);
/// returns the sink's share, so that the row's weights sum to one less it.
pub(crate) fn softmax_row_with_sink(row: &mut [f32], visible: usize, sink: f32) -> f32 {
    let visible = visible.min(row.len());
    let (shown, hidden) = row.split_at_mut(visible);
    hidden.iter_mut().for_each(|x| *x = 0.0);
    let max = shown.iter().copied().fold(sink, f32::max);
    let sunk = (sink - max).exp();
    let mut sum = f64::from(sunk);
    for x in shown.iter_mut() {
        *x = (*x - max).exp();
        sum += f64::from(*x);
    }
    let inv = 1.0 / sum;
    shown
        .iter_mut()
        .for_each(|x| *x = (f64::from(*x) * inv) as f32);
    (f64::from(sunk) * inv) as f32
}

/// dx = y ⊙ (g − Σ g·y) for one row, overwriting the output gradient `g` with dx; the dot
/// product in f64. Masked entries have y = 0 and so get no gradient. Returns Σ g·y (an
/// attention sink's gradient is its share times minus that).
pub(crate) fn softmax_row_vjp_in_place(y: &[f32], g: &mut [f32]) -> f64 {
    let dot: f64 = y
        .iter()
        .zip(g.iter())
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    for (gi, &yi) in g.iter_mut().zip(y) {
        *gi = (f64::from(yi) * (f64::from(*gi) - dot)) as f32;
    }
    dot
}

/// The (query count, key count) of a `[.., Sq, Sk]` operand.
fn dims(x: &Tensor32, causal: bool) -> Result<(usize, usize), KernelError> {
    let (_, sk) = rows(OP, "operand", x)?;
    let r = x.shape.len();
    if causal && r < 2 {
        return Err(KernelError::Shape {
            op: OP,
            what: "causal operand",
            got: x.shape.clone(),
            want: "[.., Sq, Sk]".into(),
        });
    }
    let sq = if r >= 2 { x.shape[r - 2] } else { 1 };
    Ok((sq.max(1), sk))
}

pub(crate) fn softmax(x: &Tensor32, causal: bool) -> Result<Tensor32, KernelError> {
    let (sq, sk) = dims(x, causal)?;
    let mut out = x.clone();
    for (r, row) in out.data.chunks_exact_mut(sk).enumerate() {
        softmax_row(row, visible_keys(r % sq, sq, sk, causal));
    }
    Ok(out)
}

pub(crate) fn softmax_vjp(
    x: &Tensor32,
    causal: bool,
    g: &Tensor32,
) -> Result<Tensor32, KernelError> {
    expect_shape(OP, "output gradient", g, &x.shape)?;
    let (_, sk) = dims(x, causal)?;
    let y = softmax(x, causal)?;
    let mut dx = g.clone();
    for (yr, dr) in y.data.chunks_exact(sk).zip(dx.data.chunks_exact_mut(sk)) {
        softmax_row_vjp_in_place(yr, dr);
    }
    Ok(dx)
}
