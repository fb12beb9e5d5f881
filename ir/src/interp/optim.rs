//! `AdamW(param, grad, m, v, step)` → (param', m', v'), exactly torch.optim.AdamW's update
//! (non-amsgrad, non-maximize), in the same order of operations:
//!
//! ```text
//! param ← param · (1 − lr·wd)                    decoupled weight decay, applied first
//! m     ← β₁·m + (1 − β₁)·g
//! v     ← β₂·v + (1 − β₂)·g²
//! param ← param − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + eps)
//! ```
//! where t = `step` is the 1-based number of this update.

use super::KernelError;
use super::embedding::index_value;
use super::index::same_shape;
use crate::op::AdamWConfig;
use crate::tensor::Tensor;

pub(crate) fn adamw(cfg: &AdamWConfig, ops: [&Tensor; 5]) -> Result<[Tensor; 3], KernelError> {
    let [param, grad, m, v, step] = ops;
    for (t, what) in [
        (grad, "gradient"),
        (m, "first moment"),
        (v, "second moment"),
    ] {
        same_shape(param, t, what)?;
    }
    let t = match (step.shape.as_slice(), step.data.as_slice()) {
        ([], &[s]) => index_value(s, usize::MAX, "step")?,
        _ => {
            return Err(KernelError::new(format!(
                "step {:?} must be a scalar",
                step.shape
            )));
        }
    };
    if t == 0 {
        return Err(KernelError::new("the step number is 1-based; got 0"));
    }
    let t = i32::try_from(t).unwrap_or(i32::MAX);
    let bias1 = 1.0 - cfg.beta1.powi(t);
    let bias2_sqrt = (1.0 - cfg.beta2.powi(t)).sqrt();
    let step_size = cfg.lr / bias1;
    let (mut p2, mut m2, mut v2) = (param.clone(), m.clone(), v.clone());
    for i in 0..param.data.len() {
        let gi = grad.data[i];
        let p = param.data[i] * (1.0 - cfg.lr * cfg.weight_decay);
        m2.data[i] = cfg.beta1 * m.data[i] + (1.0 - cfg.beta1) * gi;
        v2.data[i] = cfg.beta2 * v.data[i] + (1.0 - cfg.beta2) * gi * gi;
        let denom = v2.data[i].sqrt() / bias2_sqrt + cfg.eps;
        p2.data[i] = p - step_size * m2.data[i] / denom;
    }
    Ok([p2, m2, v2])
}
