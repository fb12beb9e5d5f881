//! Row-major GEMMs ([`Gemm`]) on cuBLAS sgemm, which is column-major: a row-major
//! `c = op(a) · op(b)` is the column-major `cᵀ = op(b)ᵀ · op(a)ᵀ`, the same memory.

use std::ffi::c_int;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm as _, GemmConfig, StridedBatchedConfig};

use super::cuda::{CudaDevice, CudaMem};
use super::device::Gemm;
use crate::RuntimeError;

fn int(x: usize) -> Result<c_int, RuntimeError> {
    c_int::try_from(x).map_err(|_| RuntimeError::Cuda {
        op: "sgemm",
        message: format!("dimension {x} exceeds cuBLAS's 32-bit sizes"),
    })
}

fn op(transposed: bool) -> cublasOperation_t {
    if transposed {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// The products of `g` on cuBLAS (nothing for an empty product: `c` is zero-filled).
pub(super) fn gemm(
    dev: &CudaDevice,
    g: &Gemm,
    a: &CudaMem,
    b: &CudaMem,
    c: &mut CudaMem,
) -> Result<(), RuntimeError> {
    if g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
        return Ok(());
    }
    // Column-major view: cᵀ[n, m] = op(b)ᵀ[n, k] · op(a)ᵀ[k, m]; a row-major [r, c] matrix
    // is a column-major [c, r] one with leading dimension c.
    let cfg = GemmConfig {
        transa: op(g.trans_b),
        transb: op(g.trans_a),
        m: int(g.n)?,
        n: int(g.m)?,
        k: int(g.k)?,
        alpha: 1.0f32,
        lda: int(if g.trans_b { g.k } else { g.n })?,
        ldb: int(if g.trans_a { g.m } else { g.k })?,
        beta: 0.0f32,
        ldc: int(g.n)?,
    };
    let err = |e: cudarc::cublas::result::CublasError| RuntimeError::Cuda {
        op: "sgemm",
        message: e.to_string(),
    };
    if g.batch == 1 {
        // SAFETY: the buffers hold at least the k·n (b), m·k (a) and m·n (c) elements the
        // lowering in `device::ops::matmul` sized them for.
        #[allow(unsafe_code)]
        unsafe { dev.blas.gemm(cfg, &b.data, &a.data, &mut c.data) }.map_err(err)
    } else {
        let batched = StridedBatchedConfig {
            gemm: cfg,
            batch_size: int(g.batch)?,
            stride_a: i64::from(int(g.stride_b)?),
            stride_b: i64::from(int(g.stride_a)?),
            stride_c: i64::from(int(g.stride_c)?),
        };
        // SAFETY: as above, for `batch` matrices at the given strides.
        #[allow(unsafe_code)]
        unsafe {
            dev.blas
                .gemm_strided_batched(batched, &b.data, &a.data, &mut c.data)
        }
        .map_err(err)
    }
}
