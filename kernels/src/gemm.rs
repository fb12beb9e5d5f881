//! The one matrix-multiply entry point: strided f32 views into flat buffers, multiplied by
//! matrixmultiply's sgemm (through ndarray's safe, bounds-checked views; see the workspace
//! `Cargo.toml` for why this crate). Strides let callers multiply by transposes and by one
//! head's columns of a `[B, S, heads·d]` activation without copying.

use ndarray::{Array2, ArrayView2, ArrayViewMut2, ShapeBuilder};

use crate::KernelError;
use crate::accumulate::{self, Accumulate};

/// A `rows × cols` matrix inside a flat slice: element (i, j) is at `offset + i·rs + j·cs`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A contiguous row-major matrix starting at `offset`.
    pub(crate) fn rm(data: &'a [f32], offset: usize, rows: usize, cols: usize) -> Mat<'a> {
        Mat {
            data,
            offset,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (a view: only the strides swap).
    pub(crate) fn t(self) -> Mat<'a> {
        Mat {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// The mutable counterpart of [`Mat`], for results.
#[derive(Debug)]
pub(crate) struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatMut<'a> {
    pub(crate) fn rm(data: &'a mut [f32], offset: usize, rows: usize, cols: usize) -> MatMut<'a> {
        MatMut {
            data,
            offset,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }
}

fn bad(what: &'static str, rows: usize, cols: usize) -> KernelError {
    KernelError::Shape {
        op: "gemm",
        what,
        got: vec![rows, cols],
        want: "a view inside its buffer".into(),
    }
}

fn view<'a>(m: Mat<'a>, what: &'static str) -> Result<ArrayView2<'a, f32>, KernelError> {
    let data = m
        .data
        .get(m.offset..)
        .ok_or_else(|| bad(what, m.rows, m.cols))?;
    ArrayView2::from_shape((m.rows, m.cols).strides((m.rs, m.cs)), data)
        .map_err(|_| bad(what, m.rows, m.cols))
}

fn check(a: &Mat<'_>, b: &Mat<'_>, rows: usize, cols: usize) -> Result<(), KernelError> {
    if a.cols != b.rows || a.rows != rows || b.cols != cols {
        return Err(KernelError::Shape {
            op: "gemm",
            what: "operands",
            got: vec![a.rows, a.cols, b.rows, b.cols, rows, cols],
            want: "[m, k] · [k, n] → [m, n]".into(),
        });
    }
    Ok(())
}

/// a · b in f64 (every product of two f32s is exact there), row-major `[m, n]`, unrounded.
pub(crate) fn gemm64(a: Mat<'_>, b: Mat<'_>) -> Result<Array2<f64>, KernelError> {
    check(&a, &b, a.rows, b.cols)?;
    let a64 = view(a, "left operand")?.mapv(f64::from);
    let b64 = view(b, "right operand")?.mapv(f64::from);
    let mut c = Array2::zeros((a.rows, b.cols));
    if a.cols > 0 {
        ndarray::linalg::general_mat_mul(1.0, &a64, &b64, 0.0, &mut c);
    }
    Ok(c)
}

/// c ← alpha · a · b + beta · c. With beta = 0, c's old contents are never read (NaN-safe).
/// The product accumulates as the calling thread's [`Accumulate`] mode says; in f64 it is
/// rounded to f32 before alpha and beta apply, so that adding c afterwards (a bias) rounds as a
/// separate addition does.
pub(crate) fn gemm(
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: MatMut<'_>,
) -> Result<(), KernelError> {
    check(&a, &b, c.rows, c.cols)?;
    if c.rows == 0 || c.cols == 0 {
        return Ok(());
    }
    if a.cols == 0 {
        // An empty contraction: c ← beta·c (and 0 when beta is 0, as sgemm would give).
        for i in 0..c.rows {
            for j in 0..c.cols {
                let at = c.offset + i * c.rs + j * c.cs;
                if let Some(x) = c.data.get_mut(at) {
                    *x = if beta == 0.0 { 0.0 } else { beta * *x };
                }
            }
        }
        return Ok(());
    }
    let wide = match accumulate::current() {
        Accumulate::F32 => None,
        Accumulate::F64 => Some(gemm64(a, b)?),
    };
    let (rows, cols) = (c.rows, c.cols);
    let cdata = c
        .data
        .get_mut(c.offset..)
        .ok_or_else(|| bad("result", rows, cols))?;
    let mut cv = ArrayViewMut2::from_shape((rows, cols).strides((c.rs, c.cs)), cdata)
        .map_err(|_| bad("result", rows, cols))?;
    match wide {
        None => {
            let av = view(a, "left operand")?;
            let bv = view(b, "right operand")?;
            ndarray::linalg::general_mat_mul(alpha, &av, &bv, beta, &mut cv);
        }
        Some(ab) => cv.zip_mut_with(&ab, |c, &p| {
            let p = alpha * p as f32;
            *c = if beta == 0.0 { p } else { p + beta * *c };
        }),
    }
    Ok(())
}
