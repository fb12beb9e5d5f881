//! `CrossEntropy(logits[.., V], targets[..])`: mean negative log-likelihood over positions,
//! with the log-sum-exp and the mean accumulated in f64.

use crate::shape::{index_value, rows};
use crate::{KernelError, Tensor32};

const OP: &str = "cross_entropy";

fn check(logits: &Tensor32, targets: &Tensor32) -> Result<(usize, usize), KernelError> {
    let (n, v) = rows(OP, "logits", logits)?;
    if logits.shape[..logits.shape.len() - 1] != targets.shape[..] || n == 0 {
        return Err(KernelError::Shape {
            op: OP,
            what: "targets",
            got: targets.shape.clone(),
            want: format!("the non-empty leading dims of logits {:?}", logits.shape),
        });
    }
    Ok((n, v))
}

/// log Σ exp(row), shifted by the max for stability.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = f64::from(row.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    max + row
        .iter()
        .map(|&l| (f64::from(l) - max).exp())
        .sum::<f64>()
        .ln()
}

pub(crate) fn cross_entropy(
    logits: &Tensor32,
    targets: &Tensor32,
) -> Result<Tensor32, KernelError> {
    let (n, v) = check(logits, targets)?;
    let mut total = 0f64;
    for (row, &t) in logits.data.chunks_exact(v).zip(&targets.data) {
        let t = index_value(OP, "target", t, v)?;
        total += log_sum_exp(row) - f64::from(row[t]);
    }
    Ok(Tensor32::scalar((total / n as f64) as f32))
}

/// d loss / d logits = g/N · (softmax(logits) − onehot(target)).
pub(crate) fn cross_entropy_vjp(
    logits: &Tensor32,
    targets: &Tensor32,
    g: &Tensor32,
) -> Result<Tensor32, KernelError> {
    let (n, v) = check(logits, targets)?;
    let g = match (g.shape.as_slice(), g.data.as_slice()) {
        ([], &[g]) => f64::from(g),
        _ => {
            return Err(KernelError::Shape {
                op: OP,
                what: "output gradient",
                got: g.shape.clone(),
                want: "[]".into(),
            });
        }
    };
    let scale = g / n as f64;
    let mut dl = Tensor32::zeros(&logits.shape)?;
    for ((row, &t), dr) in logits
        .data
        .chunks_exact(v)
        .zip(&targets.data)
        .zip(dl.data.chunks_exact_mut(v))
    {
        let t = index_value(OP, "target", t, v)?;
        let lse = log_sum_exp(row);
        for (j, (d, &l)) in dr.iter_mut().zip(row).enumerate() {
            let p = (f64::from(l) - lse).exp() - if j == t { 1.0 } else { 0.0 };
            *d = (p * scale) as f32;
        }
    }
    Ok(dl)
}
