//! `CrossEntropy(logits[.., V], targets[..])`: the mean negative log-likelihood over positions.

use super::KernelError;
use super::embedding::index_value;
use super::index::{rows, zeros};
use super::softmax::softmax_row;
use crate::tensor::Tensor;

fn check(logits: &Tensor, targets: &Tensor) -> Result<(usize, usize), KernelError> {
    let (n, v) = rows(logits, "cross-entropy logits")?;
    if logits.shape[..logits.shape.len() - 1] != targets.shape[..] {
        return Err(KernelError::new(format!(
            "logits {:?} do not match targets {:?}",
            logits.shape, targets.shape
        )));
    }
    if n == 0 {
        return Err(KernelError::new("cross-entropy over zero positions"));
    }
    Ok((n, v))
}

/// log Σ exp(row), shifted by the max for stability.
fn log_sum_exp(row: &[f64]) -> f64 {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    max + row.iter().map(|l| (l - max).exp()).sum::<f64>().ln()
}

pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor, KernelError> {
    let (n, v) = check(logits, targets)?;
    let mut total = 0.0;
    for (row, &t) in logits.data.chunks_exact(v).zip(&targets.data) {
        let t = index_value(t, v, "target")?;
        total += log_sum_exp(row) - row[t];
    }
    Ok(Tensor::scalar(total / n as f64))
}

/// d loss / d logits = g/N · (softmax(logits) − onehot(target)).
pub(crate) fn cross_entropy_vjp(
    logits: &Tensor,
    targets: &Tensor,
    g: &Tensor,
) -> Result<Tensor, KernelError> {
    let (n, v) = check(logits, targets)?;
    let g = match (g.shape.as_slice(), g.data.as_slice()) {
        ([], &[g]) => g,
        _ => {
            return Err(KernelError::new(format!(
                "output gradient {:?} must be a scalar",
                g.shape
            )));
        }
    };
    let scale = g / n as f64;
    let mut dl = zeros(&logits.shape)?;
    for ((row, &t), dr) in logits
        .data
        .chunks_exact(v)
        .zip(&targets.data)
        .zip(dl.data.chunks_exact_mut(v))
    {
        let t = index_value(t, v, "target")?;
        softmax_row(row, v, dr);
        dr[t] -= 1.0;
        dr.iter_mut().for_each(|d| *d *= scale);
    }
    Ok(dl)
}
