//! `LayerNorm` and `RmsNorm` over the last axis (biased variance, as in PyTorch).

use super::KernelError;
use super::index::{rows, zeros};
use crate::tensor::Tensor;

fn check_param(p: &Tensor, h: usize, what: &str) -> Result<(), KernelError> {
    if p.shape != [h] {
        return Err(KernelError::new(format!(
            "{what} {:?} must be [{h}]",
            p.shape
        )));
    }
    Ok(())
}

fn check_grad(x: &Tensor, g: &Tensor) -> Result<(), KernelError> {
    super::index::same_shape(x, g, "output gradient")
}

/// Per row: the mean and 1/√(var + eps).
fn moments(row: &[f64], eps: f64) -> (f64, f64) {
    let n = row.len() as f64;
    let mu = row.iter().sum::<f64>() / n;
    let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n;
    (mu, 1.0 / (var + eps).sqrt())
}

/// y = (x − μ)/√(var + eps) · γ + β (β zero where there is none).
pub(crate) fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor, KernelError> {
    let (_, h) = rows(x, "layernorm input")?;
    check_param(gamma, h, "layernorm gamma")?;
    if let Some(beta) = beta {
        check_param(beta, h, "layernorm beta")?;
    }
    let mut out = zeros(&x.shape)?;
    for (xr, yr) in x.data.chunks_exact(h).zip(out.data.chunks_exact_mut(h)) {
        let (mu, rstd) = moments(xr, eps);
        for i in 0..h {
            yr[i] = (xr[i] - mu) * rstd * gamma.data[i] + beta.map_or(0.0, |b| b.data[i]);
        }
    }
    Ok(out)
}

/// With x̂ = (x − μ)·r and d = g·γ: dx = r·(d − mean(d) − x̂·mean(d·x̂)), dγ = Σ g·x̂, dβ = Σ g.
pub(crate) fn layer_norm_vjp(
    x: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    eps: f64,
    g: &Tensor,
) -> Result<[Tensor; 3], KernelError> {
    let (_, h) = rows(x, "layernorm input")?;
    check_param(gamma, h, "layernorm gamma")?;
    if let Some(beta) = beta {
        check_param(beta, h, "layernorm beta")?;
    }
    check_grad(x, g)?;
    let mut dx = zeros(&x.shape)?;
    let mut dgamma = zeros(&[h])?;
    let mut dbeta = zeros(&[h])?;
    let hf = h as f64;
    for ((xr, gr), dxr) in x
        .data
        .chunks_exact(h)
        .zip(g.data.chunks_exact(h))
        .zip(dx.data.chunks_exact_mut(h))
    {
        let (mu, rstd) = moments(xr, eps);
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mu) * rstd).collect();
        let d: Vec<f64> = gr.iter().zip(&gamma.data).map(|(a, b)| a * b).collect();
        let mean_d = d.iter().sum::<f64>() / hf;
        let mean_dx = d.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / hf;
        for i in 0..h {
            dxr[i] = rstd * (d[i] - mean_d - xhat[i] * mean_dx);
            dgamma.data[i] += gr[i] * xhat[i];
            dbeta.data[i] += gr[i];
        }
    }
    Ok([dx, dgamma, dbeta])
}

/// 1/√(mean(x²) + eps) of one row.
fn rms_scale(row: &[f64], eps: f64) -> f64 {
    let ms = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
    1.0 / (ms + eps).sqrt()
}

/// y = x/√(mean(x²) + eps) · γ.
pub(crate) fn rms_norm(x: &Tensor, gamma: &Tensor, eps: f64) -> Result<Tensor, KernelError> {
    let (_, h) = rows(x, "rmsnorm input")?;
    check_param(gamma, h, "rmsnorm gamma")?;
    let mut out = zeros(&x.shape)?;
    for (xr, yr) in x.data.chunks_exact(h).zip(out.data.chunks_exact_mut(h)) {
        let r = rms_scale(xr, eps);
        for i in 0..h {
            yr[i] = xr[i] * r * gamma.data[i];
        }
    }
    Ok(out)
}

/// With d = g·γ: dx = r·d − x·r³·mean(d·x), dγ = Σ g·x·r.
pub(crate) fn rms_norm_vjp(
    x: &Tensor,
    gamma: &Tensor,
    eps: f64,
    g: &Tensor,
) -> Result<[Tensor; 2], KernelError> {
    let (_, h) = rows(x, "rmsnorm input")?;
    check_param(gamma, h, "rmsnorm gamma")?;
    check_grad(x, g)?;
    let mut dx = zeros(&x.shape)?;
    let mut dgamma = zeros(&[h])?;
    for ((xr, gr), dxr) in x
        .data
        .chunks_exact(h)
        .zip(g.data.chunks_exact(h))
        .zip(dx.data.chunks_exact_mut(h))
    {
        let r = rms_scale(xr, eps);
        let d: Vec<f64> = gr.iter().zip(&gamma.data).map(|(a, b)| a * b).collect();
        let mean_dx = d.iter().zip(xr).map(|(a, b)| a * b).sum::<f64>() / h as f64;
        for i in 0..h {
            dxr[i] = r * d[i] - xr[i] * r * r * r * mean_dx;
            dgamma.data[i] += gr[i] * xr[i] * r;
        }
    }
    Ok([dx, dgamma])
}
