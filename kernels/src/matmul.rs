//! Matrix products: batched `MatMul` with broadcast batch dims, and `Linear`, on [`gemm`].

use crate::gemm::{Mat, MatMut, gemm, gemm64};
use crate::shape::{broadcast_map, broadcast_shape, expect_shape, rows};
use crate::tensor::numel;
use crate::{KernelError, Tensor32};

const MATMUL: &str = "matmul";
const LINEAR: &str = "linear";

/// The batch layout of `a[.., M, K] @ b[.., K, N]`.
struct Batched {
    m: usize,
    k: usize,
    n: usize,
    out_shape: Vec<usize>,
    /// Per output batch entry, which matrix of `a` and of `b` it multiplies.
    map_a: Vec<usize>,
    map_b: Vec<usize>,
}

impl Batched {
    fn new(a: &Tensor32, b: &Tensor32) -> Result<Batched, KernelError> {
        let (ra, rb) = (a.shape.len(), b.shape.len());
        if ra < 2 || rb < 2 || a.shape[ra - 1] != b.shape[rb - 2] {
            return Err(KernelError::Shape {
                op: MATMUL,
                what: "right operand",
                got: b.shape.clone(),
                want: format!("[.., K, N] contracting with {:?}", a.shape),
            });
        }
        let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
        let (ba, bb) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
        let batch = broadcast_shape(MATMUL, ba, bb)?;
        let mut out_shape = batch.clone();
        out_shape.extend([m, n]);
        numel(&out_shape)?;
        Ok(Batched {
            m,
            k,
            n,
            map_a: broadcast_map(MATMUL, ba, &batch)?,
            map_b: broadcast_map(MATMUL, bb, &batch)?,
            out_shape,
        })
    }

    /// Whether `b` is one matrix shared by every batch entry while `a` has one per entry: then
    /// the batch folds into M and the whole product is a single large gemm.
    fn folds(&self) -> bool {
        self.map_b.iter().all(|&i| i == 0) && self.map_a.iter().enumerate().all(|(i, &j)| i == j)
    }
}

pub(crate) fn matmul(a: &Tensor32, b: &Tensor32) -> Result<Tensor32, KernelError> {
    let bt = Batched::new(a, b)?;
    let (m, k, n) = (bt.m, bt.k, bt.n);
    let mut out = Tensor32::zeros(&bt.out_shape)?;
    if bt.folds() {
        let r = bt.map_a.len() * m;
        gemm(
            1.0,
            Mat::rm(&a.data, 0, r, k),
            Mat::rm(&b.data, 0, k, n),
            0.0,
            MatMut::rm(&mut out.data, 0, r, n),
        )?;
        return Ok(out);
    }
    for (i, (&ia, &ib)) in bt.map_a.iter().zip(&bt.map_b).enumerate() {
        gemm(
            1.0,
            Mat::rm(&a.data, ia * m * k, m, k),
            Mat::rm(&b.data, ib * k * n, k, n),
            0.0,
            MatMut::rm(&mut out.data, i * m * n, m, n),
        )?;
    }
    Ok(out)
}

/// (dA, dB) = (G Bᵀ, Aᵀ G) per batch entry, accumulated over entries that share a broadcast
/// matrix.
pub(crate) fn matmul_vjp(
    a: &Tensor32,
    b: &Tensor32,
    g: &Tensor32,
) -> Result<(Tensor32, Tensor32), KernelError> {
    let bt = Batched::new(a, b)?;
    let (m, k, n) = (bt.m, bt.k, bt.n);
    expect_shape(MATMUL, "output gradient", g, &bt.out_shape)?;
    let mut da = Tensor32::zeros(&a.shape)?;
    let mut db = Tensor32::zeros(&b.shape)?;
    if bt.folds() {
        let r = bt.map_a.len() * m;
        let (gm, am) = (Mat::rm(&g.data, 0, r, n), Mat::rm(&a.data, 0, r, k));
        gemm(
            1.0,
            gm,
            Mat::rm(&b.data, 0, k, n).t(),
            0.0,
            MatMut::rm(&mut da.data, 0, r, k),
        )?;
        gemm(1.0, am.t(), gm, 0.0, MatMut::rm(&mut db.data, 0, k, n))?;
        return Ok((da, db));
    }
    for (i, (&ia, &ib)) in bt.map_a.iter().zip(&bt.map_b).enumerate() {
        let gi = Mat::rm(&g.data, i * m * n, m, n);
        let ai = Mat::rm(&a.data, ia * m * k, m, k);
        let bi = Mat::rm(&b.data, ib * k * n, k, n);
        gemm(
            1.0,
            gi,
            bi.t(),
            1.0,
            MatMut::rm(&mut da.data, ia * m * k, m, k),
        )?;
        gemm(
            1.0,
            ai.t(),
            gi,
            1.0,
            MatMut::rm(&mut db.data, ib * k * n, k, n),
        )?;
    }
    Ok((da, db))
}

/// Checks `x[.., K] · w[K, N] (+ bias[N])` and returns (rows, K, N).
fn linear_dims(
    x: &Tensor32,
    w: &Tensor32,
    bias: Option<&Tensor32>,
) -> Result<(usize, usize, usize), KernelError> {
    let (r, k) = rows(LINEAR, "input", x)?;
    if w.shape.len() != 2 || w.shape[0] != k {
        return Err(KernelError::Shape {
            op: LINEAR,
            what: "weight",
            got: w.shape.clone(),
            want: format!("[{k}, N]"),
        });
    }
    let n = w.shape[1];
    if let Some(b) = bias {
        expect_shape(LINEAR, "bias", b, &[n])?;
    }
    Ok((r, k, n))
}

pub(crate) fn linear(
    x: &Tensor32,
    w: &Tensor32,
    bias: Option<&Tensor32>,
) -> Result<Tensor32, KernelError> {
    let (r, k, n) = linear_dims(x, w, bias)?;
    let mut shape = x.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    let mut out = Tensor32::zeros(&shape)?;
    let beta = match bias {
        Some(b) => {
            for row in out.data.chunks_exact_mut(n.max(1)) {
                row.copy_from_slice(&b.data);
            }
            1.0
        }
        None => 0.0,
    };
    gemm(
        1.0,
        Mat::rm(&x.data, 0, r, k),
        Mat::rm(&w.data, 0, k, n),
        beta,
        MatMut::rm(&mut out.data, 0, r, n),
    )?;
    Ok(out)
}

/// `x[.., K] · w[K, N]` in f64, unrounded: products over slices of K added in f64 round, once,
/// to what the whole product rounds to (tensor parallelism's row-parallel partial sums).
pub fn linear_partial(x: &Tensor32, w: &Tensor32) -> Result<Vec<f64>, KernelError> {
    let (r, k, n) = linear_dims(x, w, None)?;
    let p = gemm64(Mat::rm(&x.data, 0, r, k), Mat::rm(&w.data, 0, k, n))?;
    Ok(p.iter().copied().collect())
}

/// The input gradient `G wᵀ` of `x · w` in f64, unrounded (over slices of N it adds up as
/// [`linear_partial`]'s products over slices of K do: column-parallel partial sums).
pub fn linear_input_grad_partial(w: &Tensor32, g: &Tensor32) -> Result<Vec<f64>, KernelError> {
    let (k, n) = match w.shape[..] {
        [k, n] => (k, n),
        _ => {
            return Err(KernelError::Shape {
                op: LINEAR,
                what: "weight",
                got: w.shape.clone(),
                want: "[K, N]".into(),
            });
        }
    };
    let r = g.data.len() / n.max(1);
    check_output_grad(g, r, n)?;
    let p = gemm64(Mat::rm(&g.data, 0, r, n), Mat::rm(&w.data, 0, k, n).t())?;
    Ok(p.iter().copied().collect())
}

fn check_output_grad(g: &Tensor32, r: usize, n: usize) -> Result<(), KernelError> {
    if g.data.len() != r * n || g.shape.last() != Some(&n) {
        return Err(KernelError::Shape {
            op: LINEAR,
            what: "output gradient",
            got: g.shape.clone(),
            want: format!("{r} rows of {n}"),
        });
    }
    Ok(())
}

/// (dx, dw, dbias): dx = G wᵀ, dw = xᵀ G, dbias = Σ_rows G (in f64).
pub(crate) fn linear_vjp(
    x: &Tensor32,
    w: &Tensor32,
    bias: Option<&Tensor32>,
    g: &Tensor32,
) -> Result<(Tensor32, Tensor32, Option<Tensor32>), KernelError> {
    let (r, k, n) = linear_dims(x, w, bias)?;
    check_output_grad(g, r, n)?;
    let mut dx = Tensor32::zeros(&x.shape)?;
    let mut dw = Tensor32::zeros(&w.shape)?;
    let gm = Mat::rm(&g.data, 0, r, n);
    gemm(
        1.0,
        gm,
        Mat::rm(&w.data, 0, k, n).t(),
        0.0,
        MatMut::rm(&mut dx.data, 0, r, k),
    )?;
    gemm(
        1.0,
        Mat::rm(&x.data, 0, r, k).t(),
        gm,
        0.0,
        MatMut::rm(&mut dw.data, 0, k, n),
    )?;
    let db = bias.map(|_| column_sums(&g.data, n));
    Ok((dx, dw, db))
}

/// Σ over rows of a `[.., n]` buffer, accumulated in f64.
pub(crate) fn column_sums(data: &[f32], n: usize) -> Tensor32 {
    let mut acc = vec![0f64; n];
    for row in data.chunks_exact(n.max(1)) {
        acc.iter_mut()
            .zip(row)
            .for_each(|(a, &v)| *a += f64::from(v));
    }
    Tensor32 {
        shape: vec![n],
        data: acc.into_iter().map(|v| v as f32).collect(),
    }
}
