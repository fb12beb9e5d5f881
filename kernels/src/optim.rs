//! AdamW, exactly torch.optim.AdamW's update (non-amsgrad) in the interpreter's order of
//! operations, each element computed in f64 and stored as f32:
//!
//! ```text
//! param ← param · (1 − lr·wd)
//! m     ← β₁·m + (1 − β₁)·g
//! v     ← β₂·v + (1 − β₂)·g²
//! param ← param − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + eps)
//! ```

use ir::AdamWConfig;

use crate::shape::{expect_shape, index_value};
use crate::{KernelError, Tensor32};

const OP: &str = "adamw";

/// One AdamW update in place; `step` is the 1-based number of this update.
pub fn adamw(
    cfg: &AdamWConfig,
    param: &mut Tensor32,
    grad: &Tensor32,
    m: &mut Tensor32,
    v: &mut Tensor32,
    step: u64,
) -> Result<(), KernelError> {
    for t in [&*param, grad, &*m, &*v] {
        t.check()?;
    }
    expect_shape(OP, "gradient", grad, &param.shape)?;
    expect_shape(OP, "first moment", m, &param.shape)?;
    expect_shape(OP, "second moment", v, &param.shape)?;
    if step == 0 {
        return Err(KernelError::Attribute {
            op: OP,
            reason: "the step number is 1-based; got 0".into(),
        });
    }
    let t = i32::try_from(step).unwrap_or(i32::MAX);
    let bias1 = 1.0 - cfg.beta1.powi(t);
    let bias2_sqrt = (1.0 - cfg.beta2.powi(t)).sqrt();
    let step_size = cfg.lr / bias1;
    let decay = 1.0 - cfg.lr * cfg.weight_decay;
    for (((p, &g), m), v) in param
        .data
        .iter_mut()
        .zip(&grad.data)
        .zip(m.data.iter_mut())
        .zip(v.data.iter_mut())
    {
        let g = f64::from(g);
        let p64 = f64::from(*p) * decay;
        let m64 = cfg.beta1 * f64::from(*m) + (1.0 - cfg.beta1) * g;
        let v64 = cfg.beta2 * f64::from(*v) + (1.0 - cfg.beta2) * g * g;
        let denom = v64.sqrt() / bias2_sqrt + cfg.eps;
        *p = (p64 - step_size * m64 / denom) as f32;
        *m = m64 as f32;
        *v = v64 as f32;
    }
    Ok(())
}

/// The `AdamW` op's functional form: (param', m', v') from (param, grad, m, v, step), the
/// step stored as an exact f32 scalar.
pub(crate) fn adamw_op(
    cfg: &AdamWConfig,
    ops: [&Tensor32; 5],
) -> Result<Vec<Tensor32>, KernelError> {
    let [param, grad, m, v, step] = ops;
    let step = match (step.shape.as_slice(), step.data.as_slice()) {
        ([], &[s]) => index_value(OP, "step", s, 1 << 24)?,
        _ => {
            return Err(KernelError::Shape {
                op: OP,
                what: "step",
                got: step.shape.clone(),
                want: "[]".into(),
            });
        }
    };
    let (mut p2, mut m2, mut v2) = (param.clone(), m.clone(), v.clone());
    adamw(cfg, &mut p2, grad, &mut m2, &mut v2, step as u64)?;
    Ok(vec![p2, m2, v2])
}
