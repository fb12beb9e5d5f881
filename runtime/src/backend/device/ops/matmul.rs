//! `MatMul` and `Linear` as GEMMs ([`Device::gemm`]: cuBLAS on a GPU), the bias as a broadcast
//! add and its gradient as a column sum.

use ir::OpKind;

use super::{Buf, Weighted};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, Gemm, GemmPrecision, KernelArg};

/// The shapes of a product `x · w` the device runs: `w` one matrix (every leading dim of `x`
/// folded into M), or both batched with equal batch dims. `None` otherwise (broadcast batch
/// dims, mismatched k): the host path.
#[derive(Clone, Copy, Debug)]
struct Product {
    m: usize,
    k: usize,
    n: usize,
    /// Matrices in the batch; 1 when `w` is one matrix.
    batch: usize,
    /// Whether `w` has the batch dims too (else one matrix serves every row of `x`).
    batched_w: bool,
    precision: GemmPrecision,
}

fn product(kind: &OpKind, xs: &[usize], ws: &[usize]) -> Option<Product> {
    let linear = matches!(kind, OpKind::Linear { .. });
    let (rx, rw) = (xs.len(), ws.len());
    if rw < 2 || rx < if linear { 1 } else { 2 } || (linear && rw != 2) {
        return None;
    }
    let (k, n) = (ws[rw - 2], ws[rw - 1]);
    if xs[rx - 1] != k {
        return None;
    }
    if rw == 2 {
        let m = xs[..rx - 1].iter().product();
        return Some(Product {
            m,
            k,
            n,
            batch: 1,
            batched_w: false,
            precision: GemmPrecision::F32,
        });
    }
    (rx == rw && xs[..rx - 2] == ws[..rw - 2]).then(|| Product {
        m: xs[rx - 2],
        k,
        n,
        batch: xs[..rx - 2].iter().product(),
        batched_w: true,
        precision: GemmPrecision::F32,
    })
}

impl Product {
    /// `y = x · w`.
    fn forward(&self) -> Gemm {
        let (m, k, n) = (self.m, self.k, self.n);
        Gemm {
            batch: self.batch,
            stride_a: m * k,
            stride_b: if self.batched_w { k * n } else { 0 },
            stride_c: m * n,
            precision: self.precision,
            ..Gemm::plain(m, k, n)
        }
    }

    /// `dx = g · wᵀ`.
    fn input_grad(&self) -> Gemm {
        let (m, k, n) = (self.m, self.k, self.n);
        Gemm {
            batch: self.batch,
            trans_b: true,
            stride_a: m * n,
            stride_b: if self.batched_w { k * n } else { 0 },
            stride_c: m * k,
            precision: self.precision,
            ..Gemm::plain(m, n, k)
        }
    }

    /// `dw = xᵀ · g`: per batch entry when `w` is batched, else one product over all rows.
    fn weight_grad(&self) -> Gemm {
        let (m, k, n) = (self.m, self.k, self.n);
        let batch = if self.batched_w { self.batch } else { 1 };
        Gemm {
            batch,
            trans_a: true,
            stride_a: m * k,
            stride_b: m * n,
            stride_c: k * n,
            precision: self.precision,
            ..Gemm::plain(k, m, n)
        }
    }
}

/// Whether `kind`'s operands are a product's `x`, `w` and (for a biased linear) a `[n]` bias;
/// its GEMMs in `precision`.
fn operands<'a, D: Device>(
    precision: GemmPrecision,
    kind: &OpKind,
    xs: &[&'a Buf<D>],
) -> Option<(Weighted<'a, D>, Product)> {
    let (x, w, bias) = match (kind, xs) {
        (OpKind::MatMul | OpKind::Linear { bias: false }, &[x, w]) => (x, w, None),
        (OpKind::Linear { bias: true }, &[x, w, bias]) => (x, w, Some(bias)),
        _ => return None,
    };
    let p = product(kind, &x.shape, &w.shape)?;
    let p = Product { precision, ..p };
    if bias.is_some_and(|b| b.shape != [p.n]) {
        return None;
    }
    Some(((x, w, bias), p))
}

fn out_shape(x: &[usize], n: usize) -> Vec<usize> {
    let mut shape = x[..x.len() - 1].to_vec();
    shape.push(n);
    shape
}

fn empty(p: &Product) -> bool {
    p.m == 0 || p.k == 0 || p.n == 0 || p.batch == 0
}

pub(super) fn forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(((x, w, bias), p)) = operands::<D>(b.gemm_precision, kind, xs) else {
        return Ok(None);
    };
    let shape = out_shape(&x.shape, p.n);
    // An empty product (k = 0) is zeros, which no GEMM writes.
    let mut y = if empty(&p) {
        b.alloc_zeroed(&shape)?
    } else {
        b.alloc(&shape)?
    };
    if !empty(&p) {
        b.device.gemm(&p.forward(), &x.mem, &w.mem, &mut y.mem)?;
    }
    if let Some(bias) = bias
        && y.len > 0
    {
        let block = b.device.block_size();
        b.device.launch(
            "add_bias",
            super::row_grid(y.len / p.n),
            block,
            &mut [
                KernelArg::Out(&mut y.mem),
                KernelArg::In(&bias.mem),
                super::size(y.len),
                super::size(p.n),
            ],
        )?;
    }
    Ok(Some(y))
}

/// `[dx, dw]`, and `db` after them for a biased linear; those `wanted` marks false are `None`
/// (not computed: a `Grad` op that asks only for `dx` runs one GEMM).
pub(super) fn backward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    g: &Buf<D>,
    wanted: &[bool],
) -> Result<Option<Vec<Option<Buf<D>>>>, RuntimeError> {
    let Some(((x, w, bias), p)) = operands::<D>(b.gemm_precision, kind, xs) else {
        return Ok(None);
    };
    if g.shape != out_shape(&x.shape, p.n) {
        return Ok(None);
    }
    let want = |i: usize| wanted.get(i).copied().unwrap_or(true);
    // Both products read g ([m, n]); a bf16 plan's converts it once for the two.
    let g16 =
        if p.precision == GemmPrecision::Bf16 && p.batch == 1 && want(0) && want(1) && !empty(&p) {
            b.device.bf16_operand(&g.mem, p.m, p.n)?
        } else {
            None
        };
    let (g_in, g_given) = match &g16 {
        Some(m) => (m, true),
        None => (&g.mem, false),
    };
    let mut dx = p.input_grad();
    dx.given_bf16[0] = g_given;
    let mut dw = p.weight_grad();
    dw.given_bf16[1] = g_given;
    let mut out = Vec::with_capacity(3);
    for (i, (gemm, a, bm, shape)) in [(dx, g_in, &w.mem, &x.shape), (dw, &x.mem, g_in, &w.shape)]
        .into_iter()
        .enumerate()
    {
        if !want(i) {
            out.push(None);
            continue;
        }
        let mut d = if empty(&p) {
            b.alloc_zeroed(shape)?
        } else {
            b.alloc(shape)?
        };
        if !empty(&p) {
            b.device.gemm(&gemm, a, bm, &mut d.mem)?;
        }
        out.push(Some(d));
    }
    if let Some(m) = g16 {
        b.device.release(m);
    }
    if bias.is_some() {
        out.push(if want(2) {
            Some(bias_grad(b, g, p.n)?)
        } else {
            None
        });
    }
    Ok(Some(out))
}

/// A bias's gradient: `g` summed over every row.
fn bias_grad<D: Device>(
    b: &DeviceBackend<D>,
    g: &Buf<D>,
    n: usize,
) -> Result<Buf<D>, RuntimeError> {
    super::column_total(b, g, g.len / n.max(1), n)
}
