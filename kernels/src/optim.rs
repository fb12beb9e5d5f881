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
    adamw_frozen_variance(cfg, param, grad, m, v, step, None)
}

/// [`adamw`] with the second moment frozen after update `frozen_after` (1-bit Adam's
/// compression stage, Tang et al. 2021): from then on `v` is left as it was and its bias
/// correction stays that of step `frozen_after`, so the update is linear in the gradient. An
/// element that has had no gradient yet (`v` = 0: an embedding row of a token not seen so
/// far) keeps updating its second moment as plain AdamW does, instead of dividing its first
/// gradient by `eps`. `None`: plain AdamW.
pub fn adamw_frozen_variance(
    cfg: &AdamWConfig,
    param: &mut Tensor32,
    grad: &Tensor32,
    m: &mut Tensor32,
    v: &mut Tensor32,
    step: u64,
    frozen_after: Option<u64>,
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
    let frozen = frozen_after.is_some_and(|f| step > f);
    let t_frozen = frozen_after.map_or(t, |f| t.min(i32::try_from(f).unwrap_or(i32::MAX)));
    let bias1 = 1.0 - cfg.beta1.powi(t);
    let bias2_sqrt = (1.0 - cfg.beta2.powi(t)).sqrt();
    let frozen_bias2_sqrt = (1.0 - cfg.beta2.powi(t_frozen)).sqrt();
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
        let keep = frozen && *v > 0.0;
        let (v64, bias2) = if keep {
            (f64::from(*v), frozen_bias2_sqrt)
        } else {
            (
                cfg.beta2 * f64::from(*v) + (1.0 - cfg.beta2) * g * g,
                bias2_sqrt,
            )
        };
        let denom = v64.sqrt() / bias2 + cfg.eps;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn t(data: &[f32]) -> Tensor32 {
        Tensor32::new(vec![data.len()], data.to_vec()).unwrap()
    }

    /// After the freeze the second moment stays as the warm-up left it (except where no
    /// gradient has come yet), and the update is linear in the gradient: twice the gradient
    /// from zero momentum moves a weight twice as far.
    #[test]
    fn a_frozen_second_moment_makes_the_update_linear() {
        let cfg = AdamWConfig {
            weight_decay: 0.0,
            ..AdamWConfig::default()
        };
        let mut v = t(&[0.0, 0.0]);
        let (mut p, mut m) = (t(&[0.0, 0.0]), t(&[0.0, 0.0]));
        let warm = t(&[0.5, 0.0]);
        adamw_frozen_variance(&cfg, &mut p, &warm, &mut m, &mut v, 1, Some(1)).unwrap();
        let v_frozen = v.data[0];
        assert!(v_frozen > 0.0 && v.data[1] == 0.0);
        let step = |g: f32| {
            let (mut p, mut m, mut v) = (t(&[0.0, 0.0]), t(&[0.0, 0.0]), v.clone());
            adamw_frozen_variance(&cfg, &mut p, &t(&[g, g]), &mut m, &mut v, 2, Some(1)).unwrap();
            (p.data, v.data)
        };
        let ((p1, v1), (p2, _)) = (step(1.0), step(2.0));
        assert_eq!(v1[0], v_frozen, "the frozen element's second moment moved");
        assert!(
            v1[1] > 0.0,
            "an element without a gradient so far keeps updating"
        );
        assert!((p2[0] / p1[0] - 2.0).abs() < 1e-6, "{} vs {}", p2[0], p1[0]);
        // Unfrozen, the same gradients move it almost equally far (Adam's normalization).
        let plain = |g: f32| {
            let (mut p, mut m, mut v) = (t(&[0.0]), t(&[0.0]), t(&[v_frozen]));
            adamw(&cfg, &mut p, &t(&[g]), &mut m, &mut v, 2).unwrap();
            p.data[0]
        };
        assert!(plain(2.0) / plain(1.0) < 1.5);
    }
}
