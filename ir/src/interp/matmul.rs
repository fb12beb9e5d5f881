//! Matrix products: batched `MatMul` with broadcast batch dims, and `Linear`.

use super::KernelError;
use super::index::{broadcast_map, broadcast_shape, check_numel, rows, zeros};
use crate::tensor::Tensor;

/// `out[m,n] += Σₖ a[m,k] · b[k,n]`, where `a` is stored `[k,m]` when `ta` and `b` is stored
/// `[n,k]` when `tb` (so the VJPs can multiply by transposes without materializing them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_acc(
    out: &mut [f64],
    a: &[f64],
    ta: bool,
    b: &[f64],
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            out[i * n + j] += s;
        }
    }
}

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
    fn new(a: &Tensor, b: &Tensor) -> Result<Batched, KernelError> {
        let (ra, rb) = (a.shape.len(), b.shape.len());
        if ra < 2 || rb < 2 {
            return Err(KernelError::new("matmul operands must be rank >= 2"));
        }
        let (m, k) = (a.shape[ra - 2], a.shape[ra - 1]);
        let (k2, n) = (b.shape[rb - 2], b.shape[rb - 1]);
        if k != k2 {
            return Err(KernelError::new(format!(
                "matmul contraction mismatch: {:?} vs {:?}",
                a.shape, b.shape
            )));
        }
        let (ba, bb) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
        let batch = broadcast_shape(ba, bb)?;
        let mut out_shape = batch.clone();
        out_shape.extend([m, n]);
        check_numel(&out_shape)?;
        Ok(Batched {
            m,
            k,
            n,
            map_a: broadcast_map(ba, &batch)?,
            map_b: broadcast_map(bb, &batch)?,
            out_shape,
        })
    }
}

pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    let bt = Batched::new(a, b)?;
    let (m, k, n) = (bt.m, bt.k, bt.n);
    let mut out = zeros(&bt.out_shape)?;
    for (i, (&ia, &ib)) in bt.map_a.iter().zip(&bt.map_b).enumerate() {
        matmul_acc(
            &mut out.data[i * m * n..(i + 1) * m * n],
            &a.data[ia * m * k..(ia + 1) * m * k],
            false,
            &b.data[ib * k * n..(ib + 1) * k * n],
            false,
            m,
            k,
            n,
        );
    }
    Ok(out)
}

/// (dA, dB) = (G Bᵀ, Aᵀ G) per batch entry, summed over entries that share a broadcast matrix.
pub(crate) fn matmul_vjp(
    a: &Tensor,
    b: &Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor), KernelError> {
    let bt = Batched::new(a, b)?;
    let (m, k, n) = (bt.m, bt.k, bt.n);
    if g.shape != bt.out_shape {
        return Err(KernelError::new(format!(
            "output gradient {:?} must be {:?}",
            g.shape, bt.out_shape
        )));
    }
    let mut da = zeros(&a.shape)?;
    let mut db = zeros(&b.shape)?;
    for (i, (&ia, &ib)) in bt.map_a.iter().zip(&bt.map_b).enumerate() {
        let gi = &g.data[i * m * n..(i + 1) * m * n];
        let ai = &a.data[ia * m * k..(ia + 1) * m * k];
        let bi = &b.data[ib * k * n..(ib + 1) * k * n];
        matmul_acc(
            &mut da.data[ia * m * k..(ia + 1) * m * k],
            gi,
            false,
            bi,
            true,
            m,
            n,
            k,
        );
        matmul_acc(
            &mut db.data[ib * k * n..(ib + 1) * k * n],
            ai,
            true,
            gi,
            false,
            k,
            m,
            n,
        );
    }
    Ok((da, db))
}

/// Checks `x[.., K] · w[K, N] (+ bias[N])` and returns (rows, K, N).
fn linear_dims(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
) -> Result<(usize, usize, usize), KernelError> {
    let (r, k) = rows(x, "linear input")?;
    if w.shape.len() != 2 || w.shape[0] != k {
        return Err(KernelError::new(format!(
            "linear weight {:?} must be [{k}, N]",
            w.shape
        )));
    }
    let n = w.shape[1];
    if let Some(b) = bias
        && b.shape != [n]
    {
        return Err(KernelError::new(format!(
            "linear bias {:?} must be [{n}]",
            b.shape
        )));
    }
    Ok((r, k, n))
}

pub(crate) fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, KernelError> {
    let (r, k, n) = linear_dims(x, w, bias)?;
    let mut shape = x.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    let mut out = zeros(&shape)?;
    if let Some(b) = bias {
        for row in out.data.chunks_exact_mut(n.max(1)) {
            row.iter_mut().zip(&b.data).for_each(|(o, &bv)| *o = bv);
        }
    }
    matmul_acc(&mut out.data, &x.data, false, &w.data, false, r, k, n);
    Ok(out)
}

/// (dx, dw, dbias): dx = G wᵀ, dw = Σ_rows xᵀ G, dbias = Σ_rows G.
pub(crate) fn linear_vjp(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &Tensor,
) -> Result<(Tensor, Tensor, Option<Tensor>), KernelError> {
    let (r, k, n) = linear_dims(x, w, bias)?;
    if g.data.len() != r * n || g.shape.last() != Some(&n) {
        return Err(KernelError::new(format!(
            "output gradient {:?} does not match the linear result",
            g.shape
        )));
    }
    let mut dx = zeros(&x.shape)?;
    let mut dw = zeros(&w.shape)?;
    matmul_acc(&mut dx.data, &g.data, false, &w.data, true, r, n, k);
    matmul_acc(&mut dw.data, &x.data, true, &g.data, false, k, r, n);
    let db = match bias {
        Some(b) => {
            let mut db = zeros(&b.shape)?;
            for row in g.data.chunks_exact(n.max(1)) {
                db.data.iter_mut().zip(row).for_each(|(d, &gv)| *d += gv);
            }
            Some(db)
        }
        None => None,
    };
    Ok((dx, dw, db))
}
