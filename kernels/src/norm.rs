//! `LayerNorm` and `RmsNorm` over the last axis (biased variance, as in PyTorch). Row
//! statistics and the parameter gradients (sums over rows) are accumulated in f64.

use crate::shape::{expect_shape, rows};
use crate::{KernelError, Tensor32};

const LN: &str = "layernorm";
const RMS: &str = "rmsnorm";

fn f(x: f32) -> f64 {
    f64::from(x)
}

/// Per row: the mean and 1/√(var + eps), two-pass for accuracy.
fn moments(row: &[f32], eps: f64) -> (f64, f64) {
    let n = row.len() as f64;
    let mu = row.iter().map(|&v| f(v)).sum::<f64>() / n;
    let var = row.iter().map(|&v| (f(v) - mu) * (f(v) - mu)).sum::<f64>() / n;
    (mu, 1.0 / (var + eps).sqrt())
}

fn to_f32(v: Vec<f64>, shape: Vec<usize>) -> Tensor32 {
    Tensor32 {
        shape,
        data: v.into_iter().map(|x| x as f32).collect(),
    }
}

/// y = (x − μ)/√(var + eps) · γ + β (β zero where there is none).
pub(crate) fn layer_norm(
    x: &Tensor32,
    gamma: &Tensor32,
    beta: Option<&Tensor32>,
    eps: f64,
) -> Result<Tensor32, KernelError> {
    let (_, h) = rows(LN, "input", x)?;
    expect_shape(LN, "gamma", gamma, &[h])?;
    if let Some(beta) = beta {
        expect_shape(LN, "beta", beta, &[h])?;
    }
    let mut out = Tensor32::zeros(&x.shape)?;
    for (xr, yr) in x.data.chunks_exact(h).zip(out.data.chunks_exact_mut(h)) {
        let (mu, rstd) = moments(xr, eps);
        for i in 0..h {
            yr[i] = ((f(xr[i]) - mu) * rstd * f(gamma.data[i]) + beta.map_or(0.0, |b| f(b.data[i])))
                as f32;
        }
    }
    Ok(out)
}

/// With x̂ = (x − μ)·r and d = g·γ: dx = r·(d − mean(d) − x̂·mean(d·x̂)), dγ = Σ g·x̂, dβ = Σ g.
pub(crate) fn layer_norm_vjp(
    x: &Tensor32,
    gamma: &Tensor32,
    beta: Option<&Tensor32>,
    eps: f64,
    g: &Tensor32,
) -> Result<[Tensor32; 3], KernelError> {
    let (_, h) = rows(LN, "input", x)?;
    expect_shape(LN, "gamma", gamma, &[h])?;
    if let Some(beta) = beta {
        expect_shape(LN, "beta", beta, &[h])?;
    }
    expect_shape(LN, "output gradient", g, &x.shape)?;
    let mut dx = Tensor32::zeros(&x.shape)?;
    let mut dgamma = vec![0f64; h];
    let mut dbeta = vec![0f64; h];
    let hf = h as f64;
    let mut xhat = vec![0f64; h];
    let mut d = vec![0f64; h];
    for ((xr, gr), dxr) in x
        .data
        .chunks_exact(h)
        .zip(g.data.chunks_exact(h))
        .zip(dx.data.chunks_exact_mut(h))
    {
        let (mu, rstd) = moments(xr, eps);
        for i in 0..h {
            xhat[i] = (f(xr[i]) - mu) * rstd;
            d[i] = f(gr[i]) * f(gamma.data[i]);
        }
        let mean_d = d.iter().sum::<f64>() / hf;
        let mean_dx = d.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / hf;
        for i in 0..h {
            dxr[i] = (rstd * (d[i] - mean_d - xhat[i] * mean_dx)) as f32;
            dgamma[i] += f(gr[i]) * xhat[i];
            dbeta[i] += f(gr[i]);
        }
    }
    Ok([dx, to_f32(dgamma, vec![h]), to_f32(dbeta, vec![h])])
}

/// 1/√(mean(x²) + eps) of one row.
fn rms_scale(row: &[f32], eps: f64) -> f64 {
    let ms = row.iter().map(|&v| f(v) * f(v)).sum::<f64>() / row.len() as f64;
    1.0 / (ms + eps).sqrt()
}

/// y = x/√(mean(x²) + eps) · γ.
pub(crate) fn rms_norm(x: &Tensor32, gamma: &Tensor32, eps: f64) -> Result<Tensor32, KernelError> {
    let (_, h) = rows(RMS, "input", x)?;
    expect_shape(RMS, "gamma", gamma, &[h])?;
    let mut out = Tensor32::zeros(&x.shape)?;
    for (xr, yr) in x.data.chunks_exact(h).zip(out.data.chunks_exact_mut(h)) {
        let r = rms_scale(xr, eps);
        for i in 0..h {
            yr[i] = (f(xr[i]) * r * f(gamma.data[i])) as f32;
        }
    }
    Ok(out)
}

/// With d = g·γ: dx = r·d − x·r³·mean(d·x), dγ = Σ g·x·r.
pub(crate) fn rms_norm_vjp(
    x: &Tensor32,
    gamma: &Tensor32,
    eps: f64,
    g: &Tensor32,
) -> Result<[Tensor32; 2], KernelError> {
    let (_, h) = rows(RMS, "input", x)?;
    expect_shape(RMS, "gamma", gamma, &[h])?;
    expect_shape(RMS, "output gradient", g, &x.shape)?;
    let mut dx = Tensor32::zeros(&x.shape)?;
    let mut dgamma = vec![0f64; h];
    for ((xr, gr), dxr) in x
        .data
        .chunks_exact(h)
        .zip(g.data.chunks_exact(h))
        .zip(dx.data.chunks_exact_mut(h))
    {
        let r = rms_scale(xr, eps);
        let mean_dx = (0..h)
            .map(|i| f(gr[i]) * f(gamma.data[i]) * f(xr[i]))
            .sum::<f64>()
            / h as f64;
        for i in 0..h {
            let di = f(gr[i]) * f(gamma.data[i]);
            dxr[i] = (r * di - f(xr[i]) * r * r * r * mean_dx) as f32;
            dgamma[i] += f(gr[i]) * f(xr[i]) * r;
        }
    }
    Ok([dx, to_f32(dgamma, vec![h])])
}
