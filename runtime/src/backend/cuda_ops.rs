//! The CUDA backend's native ops: row-major matrix products on cuBLAS sgemm.

use std::ffi::c_int;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig, StridedBatchedConfig};
use ir::OpKind;

use super::cuda::{CudaBackend, CudaBuffer};
use crate::RuntimeError;

fn int(op: &'static str, x: usize) -> Result<c_int, RuntimeError> {
    c_int::try_from(x).map_err(|_| RuntimeError::Cuda {
        op,
        message: format!("dimension {x} exceeds cuBLAS's 32-bit sizes"),
    })
}

impl CudaBackend {
    /// `c = a · b` for `batch` row-major products `[m,k]·[k,n]`, matrices `strides` elements
    /// apart in `(a, b, c)` (a stride of 0 reuses one matrix). cuBLAS is column-major, so this
    /// computes `cᵀ = bᵀ · aᵀ`, which has the same memory layout.
    pub(super) fn gemm_rm(
        &self,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        (m, k, n): (usize, usize, usize),
        batch: usize,
        (sa, sb, sc): (usize, usize, usize),
    ) -> Result<(), RuntimeError> {
        if m == 0 || n == 0 || k == 0 || batch == 0 {
            return Ok(()); // `c` was allocated zero-filled
        }
        let op = "sgemm";
        let gemm = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: int(op, n)?,
            n: int(op, m)?,
            k: int(op, k)?,
            alpha: 1.0f32,
            lda: int(op, n)?,
            ldb: int(op, k)?,
            beta: 0.0f32,
            ldc: int(op, n)?,
        };
        let err = |e: cudarc::cublas::result::CublasError| RuntimeError::Cuda {
            op,
            message: e.to_string(),
        };
        if batch == 1 {
            // SAFETY: the buffers hold at least k·n (b), m·k (a) and m·n (c) elements, as
            // checked by the callers from the shapes the buffers were allocated with.
            #[allow(unsafe_code)]
            unsafe { self.blas.gemm(gemm, &b.data, &a.data, &mut c.data) }.map_err(err)
        } else {
            let cfg = StridedBatchedConfig {
                gemm,
                batch_size: int(op, batch)?,
                stride_a: i64::from(int(op, sb)?),
                stride_b: i64::from(int(op, sa)?),
                stride_c: i64::from(int(op, sc)?),
            };
            // SAFETY: as above, for `batch` matrices at the given strides.
            #[allow(unsafe_code)]
            unsafe {
                self.blas
                    .gemm_strided_batched(cfg, &b.data, &a.data, &mut c.data)
            }
            .map_err(err)
        }
    }

    /// The forward ops that run on cuBLAS; `None` sends the op to the host fallback (which
    /// also reports malformed operands).
    pub(super) fn forward_native(
        &self,
        kind: &OpKind,
        inputs: &[&CudaBuffer],
    ) -> Result<Option<CudaBuffer>, RuntimeError> {
        let (x, w) = match (kind, inputs) {
            (OpKind::MatMul, &[x, w]) | (OpKind::Linear { bias: false }, &[x, w]) => (x, w),
            _ => return Ok(None),
        };
        let (xs, ws) = (x.shape.as_slice(), w.shape.as_slice());
        let linear = matches!(kind, OpKind::Linear { .. });
        let (rx, rw) = (xs.len(), ws.len());
        if rw < 2 || rx < if linear { 1 } else { 2 } || (linear && rw != 2) {
            return Ok(None);
        }
        let (k, n) = (ws[rw - 2], ws[rw - 1]);
        if xs[rx - 1] != k {
            return Ok(None);
        }
        let mut out_shape = xs[..rx - 1].to_vec();
        out_shape.push(n);
        if rw == 2 {
            // One weight matrix: fold every leading dim of x into M.
            let m = xs[..rx - 1].iter().product();
            let mut c = self.zeros_shape(&out_shape)?;
            self.gemm_rm(x, w, &mut c, (m, k, n), 1, (0, 0, 0))?;
            return Ok(Some(c));
        }
        if rx != rw || xs[..rx - 2] != ws[..rw - 2] {
            return Ok(None); // broadcast batch dims: host fallback
        }
        let m = xs[rx - 2];
        let batch = xs[..rx - 2].iter().product();
        let mut c = self.zeros_shape(&out_shape)?;
        self.gemm_rm(x, w, &mut c, (m, k, n), batch, (m * k, k * n, m * n))?;
        Ok(Some(c))
    }

    fn zeros_shape(&self, shape: &[usize]) -> Result<CudaBuffer, RuntimeError> {
        use super::Backend;
        self.zeros(shape)
    }
}
