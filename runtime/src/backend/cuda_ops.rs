//! Row-major GEMMs ([`Gemm`]) on cuBLAS, which is column-major: a row-major
//! `c = op(a) · op(b)` is the column-major `cᵀ = op(b)ᵀ · op(a)ᵀ`, the same memory. f32
//! operands and results; [`GemmPrecision::Bf16`] lets cuBLAS down-convert the operands to bf16
//! for the tensor cores (`CUBLAS_COMPUTE_32F_FAST_16BF`), accumulating in f32.

use std::ffi::{c_int, c_longlong, c_void};

use cudarc::cublas::result::{CublasError, gemm_strided_batched_ex};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::cuda::{CudaDevice, CudaMem};
use super::device::{Gemm, GemmPrecision};
use crate::RuntimeError;

fn int(x: usize) -> Result<c_int, RuntimeError> {
    c_int::try_from(x).map_err(|_| RuntimeError::Cuda {
        op: "gemm",
        message: format!("dimension {x} exceeds cuBLAS's 32-bit sizes"),
    })
}

fn long(x: usize) -> Result<c_longlong, RuntimeError> {
    c_longlong::try_from(x).map_err(|_| RuntimeError::Cuda {
        op: "gemm",
        message: format!("stride {x} exceeds cuBLAS's 64-bit sizes"),
    })
}

fn op(transposed: bool) -> cublasOperation_t {
    if transposed {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

fn compute_type(p: GemmPrecision) -> cublasComputeType_t {
    match p {
        GemmPrecision::F32 => cublasComputeType_t::CUBLAS_COMPUTE_32F,
        GemmPrecision::Bf16 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF,
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
    let (alpha, beta) = (1.0f32, 0.0f32);
    let f32_type = cudaDataType::CUDA_R_32F;
    let stream = &dev.stream;
    // cuBLAS runs on the calling thread's current context: ranks that are threads sharing
    // one process each bind their own device's before calling it raw.
    stream
        .context()
        .bind_to_thread()
        .map_err(super::cuda::cuda_err("bind context"))?;
    let (a_ptr, _a_sync) = a.data.device_ptr(stream);
    let (b_ptr, _b_sync) = b.data.device_ptr(stream);
    let (c_ptr, _c_sync) = c.data.device_ptr_mut(stream);
    // Column-major view: cᵀ[n, m] = op(b)ᵀ[n, k] · op(a)ᵀ[k, m]; a row-major [r, c] matrix
    // is a column-major [c, r] one with leading dimension c.
    // SAFETY: the pointers come from live allocations of at least the elements the lowering in
    // `device::ops::matmul` sized for these dims and strides; alpha and beta are f32 as the
    // f32 compute types require; the handle is bound to `stream`.
    #[allow(unsafe_code)]
    unsafe {
        gemm_strided_batched_ex(
            *dev.blas.handle(),
            op(g.trans_b),
            op(g.trans_a),
            int(g.n)?,
            int(g.m)?,
            int(g.k)?,
            std::ptr::from_ref(&alpha).cast::<c_void>(),
            b_ptr as *const c_void,
            f32_type,
            int(if g.trans_b { g.k } else { g.n })?,
            long(g.stride_b)?,
            a_ptr as *const c_void,
            f32_type,
            int(if g.trans_a { g.m } else { g.k })?,
            long(g.stride_a)?,
            std::ptr::from_ref(&beta).cast::<c_void>(),
            c_ptr as *mut c_void,
            f32_type,
            int(g.n)?,
            long(g.stride_c)?,
            int(g.batch)?,
            compute_type(g.precision),
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e: CublasError| RuntimeError::Cuda {
        op: "gemm",
        message: e.to_string(),
    })
}
