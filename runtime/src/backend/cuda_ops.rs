//! Row-major GEMMs ([`Gemm`]) on cuBLAS, which is column-major: a row-major
//! `c = op(a) · op(b)` is the column-major `cᵀ = op(b)ᵀ · op(a)ᵀ`, the same memory. f32
//! results; [`GemmPrecision::Bf16`] rounds the operands to bf16 copies first (`to_bf16`) and
//! multiplies those on the tensor cores, accumulating in f32.

use std::ffi::{c_int, c_longlong, c_void};

use cudarc::cublas::result::{CublasError, gemm_strided_batched_ex};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use super::cuda::{CudaDevice, CudaMem};
use super::device::bf16_gemm::{self, Layout};
use super::device::{Device, Gemm, GemmPrecision, KernelArg};
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

/// The operands as cuBLAS reads them: f32 for an f32 plan; for a bf16 plan, copies rounded to
/// bf16 (`to_bf16`) with rows padded to a multiple of 8 elements (16 bytes), multiplied on the
/// tensor cores. On an H200 the unpadded copies ran GPT-2's GEMMs about as fast as cuBLAS's
/// own down-conversion of f32 operands (`CUBLAS_COMPUTE_32F_FAST_16BF`); the padding is for
/// rows like a 50257-word vocabulary's, whose LM-head GEMMs took 16.5 ms of the step's ~40 ms
/// of GEMMs there (the padded form has not yet run on a GPU).
enum Operands<'m> {
    F32(&'m CudaMem, &'m CudaMem),
    Bf16([(Bf16Copy<'m>, Layout); 2]),
}

/// A bf16 operand: converted for this GEMM, or given already converted (`Gemm::given_bf16`:
/// one copy serves the several GEMMs that read the same matrix).
enum Bf16Copy<'m> {
    Made(CudaMem),
    Given(&'m CudaMem),
}

impl Bf16Copy<'_> {
    fn mem(&self) -> &CudaMem {
        match self {
            Bf16Copy::Made(m) => m,
            Bf16Copy::Given(m) => m,
        }
    }
}

/// One `[rows, cols]` matrix as bf16 at the padded pitch (`Device::bf16_operand`).
pub(super) fn bf16_operand(
    dev: &CudaDevice,
    x: &CudaMem,
    rows: usize,
    cols: usize,
) -> Result<CudaMem, RuntimeError> {
    Ok(to_bf16(dev, x, 1, (rows, cols), rows * cols)?.0)
}

/// Operand `x` of `batch` `[rows, cols]` matrices at `stride` as the GEMM reads it: `given`
/// already as [`bf16_operand`]'s copy (one matrix: `to_bf16`'s layout of it), else converted now.
fn bf16_of<'m>(
    dev: &CudaDevice,
    x: &'m CudaMem,
    given: bool,
    batch: usize,
    dims: (usize, usize),
    stride: usize,
) -> Result<(Bf16Copy<'m>, Layout), RuntimeError> {
    if !given {
        let (mem, layout) = to_bf16(dev, x, batch, dims, stride)?;
        return Ok((Bf16Copy::Made(mem), layout));
    }
    if batch != 1 {
        return Err(RuntimeError::Cuda {
            op: "gemm",
            message: format!("a bf16 operand given for a batch of {batch} products (one only)"),
        });
    }
    Ok((Bf16Copy::Given(x), bf16_gemm::given_layout(dims)))
}

/// A GEMM operand of `batch` `[rows, cols]` matrices at `stride` as bf16, laid out as
/// `bf16_gemm::copy_layout` says.
fn to_bf16(
    dev: &CudaDevice,
    x: &CudaMem,
    batch: usize,
    dims: (usize, usize),
    stride: usize,
) -> Result<(CudaMem, Layout), RuntimeError> {
    let (op, layout) = bf16_gemm::copy_layout(batch, dims, stride);
    Ok((dev.to_bf16(x, &op)?, layout))
}

impl Operands<'_> {
    /// The two device pointers, each with the guard that records the read when it drops
    /// (keep both until the GEMM is queued).
    fn pointers<'s>(&'s self, stream: &'s CudaStream) -> [(u64, SyncOnDrop<'s>); 2] {
        let (a, b) = match self {
            Operands::F32(a, b) => (*a, *b),
            Operands::Bf16([(a, _), (b, _)]) => (a.mem(), b.mem()),
        };
        [a.data.device_ptr(stream), b.data.device_ptr(stream)]
    }

    fn data_type(&self) -> cudaDataType {
        match self {
            Operands::F32(..) => cudaDataType::CUDA_R_32F,
            Operands::Bf16(..) => cudaDataType::CUDA_R_16BF,
        }
    }

    /// The operands' layouts: `g`'s own for f32, the copies' for bf16.
    fn layouts(&self, g: &Gemm) -> [Layout; 2] {
        match self {
            Operands::F32(..) => [
                Layout {
                    ld: if g.trans_a { g.m } else { g.k },
                    stride: g.stride_a,
                },
                Layout {
                    ld: if g.trans_b { g.k } else { g.n },
                    stride: g.stride_b,
                },
            ],
            Operands::Bf16([(_, a), (_, b)]) => [*a, *b],
        }
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
    let operands = match g.precision {
        GemmPrecision::F32 => Operands::F32(a, b),
        GemmPrecision::Bf16 => {
            let [a_dims, b_dims] = bf16_gemm::operand_dims(g);
            Operands::Bf16([
                bf16_of(dev, a, g.given_bf16[0], g.batch, a_dims, g.stride_a)?,
                bf16_of(dev, b, g.given_bf16[1], g.batch, b_dims, g.stride_b)?,
            ])
        }
    };
    let in_type = operands.data_type();
    let [a_layout, b_layout] = operands.layouts(g);
    let stream = &dev.stream;
    // cuBLAS runs on the calling thread's current context: ranks that are threads sharing
    // one process each bind their own device's before calling it raw.
    stream
        .context()
        .bind_to_thread()
        .map_err(super::cuda::cuda_err("bind context"))?;
    let [(a_ptr, _a_sync), (b_ptr, _b_sync)] = operands.pointers(stream);
    let dims = Dims::of(g, &operands, [a_layout, b_layout]);
    let call = Call {
        g,
        dims,
        rows: g.m,
        in_type,
        a: (a_ptr, a_layout),
        b: (b_ptr, b_layout),
    };
    if g.c_words && !bf16_gemm::writes_words(g) {
        return Err(RuntimeError::DeviceLaunch {
            kernel: "cublasGemmStridedBatchedEx",
            message: format!(
                "bf16 words asked of a product cuBLAS cannot write so ({}x{}, batch {})",
                g.m, g.n, g.batch
            ),
        });
    }
    let Some(pitch) = bf16_gemm::padded_pitch(g, dims.n) else {
        let (c_ptr, _c_sync) = c.data.device_ptr_mut(stream);
        // At `c`'s own pitch (≥ the padded columns), cuBLAS writes the padded product's rows
        // where they stay; else the product's `n` columns densely.
        if g.c_pitch != 0 && g.c_pitch < dims.n {
            return Err(RuntimeError::DeviceLaunch {
                kernel: "cublasGemmStridedBatchedEx",
                message: format!(
                    "an output pitch of {} columns under the product's {}",
                    g.c_pitch, dims.n
                ),
            });
        }
        let (ld, n) = if g.c_pitch != 0 {
            (g.c_pitch, dims.n)
        } else {
            (g.n, g.n)
        };
        let c_layout = Layout {
            ld,
            stride: if g.c_pitch != 0 { g.m * ld } else { g.stride_c },
        };
        let call = Call {
            dims: Dims { n, ..dims },
            ..call
        };
        return call.run(dev, (c_ptr, c_layout));
    };
    if g.accumulate {
        return Err(RuntimeError::DeviceLaunch {
            kernel: "cublasGemmStridedBatchedEx",
            message: format!(
                "an accumulating product written at a padded pitch ({}x{})",
                g.m, g.n
            ),
        });
    }
    let chunk = bf16_gemm::padded_chunk(g, pitch);
    let mut scratch = dev.uninit(g.batch * chunk * pitch)?;
    for row0 in (0..g.m).step_by(chunk) {
        let rows = chunk.min(g.m - row0);
        // op(a)'s rows `row0 ..`: rows of a, or its columns when a is stored transposed.
        let a_skip = if g.trans_a { row0 } else { row0 * a_layout.ld };
        let part = Call {
            rows,
            a: (a_ptr + (2 * a_skip) as u64, a_layout),
            ..call
        };
        {
            let (s_ptr, _s_sync) = scratch.data.device_ptr_mut(stream);
            let s_layout = Layout {
                ld: pitch,
                stride: chunk * pitch,
            };
            part.run(dev, (s_ptr, s_layout))?;
        }
        unpad(dev, &scratch, c, (g.batch * rows, g.n, pitch), row0)?;
    }
    drop(scratch);
    Ok(())
}

/// One cuBLAS call: `rows` rows of `g`'s product over `dims`, from operands given as device
/// pointers with their layouts (bf16 copies, or f32 buffers).
#[derive(Clone, Copy)]
struct Call<'g> {
    g: &'g Gemm,
    dims: Dims,
    rows: usize,
    in_type: cudaDataType,
    a: (u64, Layout),
    b: (u64, Layout),
}

impl Call<'_> {
    fn run(self, dev: &CudaDevice, (c_ptr, c_layout): (u64, Layout)) -> Result<(), RuntimeError> {
        let Call {
            g,
            dims,
            rows,
            in_type,
            a: (a_ptr, a_layout),
            b: (b_ptr, b_layout),
        } = self;
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        // Column-major view: cᵀ[n, m] = op(b)ᵀ[n, k] · op(a)ᵀ[k, m]; a row-major [r, c]
        // matrix is a column-major [c, r] one with leading dimension c.
        // SAFETY: the pointers come from live allocations of at least the elements the
        // lowering in `device::ops::matmul` sized for these dims and strides (a chunk's rows
        // lie inside them); alpha and beta are f32 as the f32 compute type requires (beta 1:
        // c, read in its own type, is added in f32 before the rounding); the handle is bound
        // to the device's stream.
        #[allow(unsafe_code)]
        unsafe {
            gemm_strided_batched_ex(
                *dev.blas.handle(),
                op(g.trans_b),
                op(g.trans_a),
                int(dims.n)?,
                int(rows)?,
                int(dims.k)?,
                std::ptr::from_ref(&alpha).cast::<c_void>(),
                b_ptr as *const c_void,
                in_type,
                int(b_layout.ld)?,
                long(b_layout.stride)?,
                a_ptr as *const c_void,
                in_type,
                int(a_layout.ld)?,
                long(a_layout.stride)?,
                std::ptr::from_ref(&beta).cast::<c_void>(),
                c_ptr as *mut c_void,
                // bf16 words where asked (`Gemm::c_words`: its leading dimension and stride
                // count bf16 elements, as the f32 ones count f32).
                if g.c_words {
                    cudaDataType::CUDA_R_16BF
                } else {
                    cudaDataType::CUDA_R_32F
                },
                int(c_layout.ld)?,
                long(c_layout.stride)?,
                int(g.batch)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e: CublasError| RuntimeError::Cuda {
            op: "gemm",
            message: e.to_string(),
        })
    }
}

/// The `n` and `k` cuBLAS multiplies over: `g`'s own for f32 operands, the bf16 copies'
/// padded extents otherwise (`bf16_gemm::product_dims`).
#[derive(Debug, Clone, Copy)]
struct Dims {
    n: usize,
    k: usize,
}

impl Dims {
    fn of(g: &Gemm, operands: &Operands<'_>, layouts: [Layout; 2]) -> Dims {
        if matches!(operands, Operands::F32(..)) {
            return Dims { n: g.n, k: g.k };
        }
        let (n, k) = bf16_gemm::product_dims(g, layouts);
        Dims { n, k }
    }
}

/// `rows` rows of `cols` columns of `padded` (at `pitch`) into `c` from row `row0` on.
fn unpad(
    dev: &CudaDevice,
    padded: &CudaMem,
    c: &mut CudaMem,
    (rows, cols, pitch): (usize, usize, usize),
    row0: usize,
) -> Result<(), RuntimeError> {
    let i = |n: usize| KernelArg::I64(i64::try_from(n).unwrap_or(i64::MAX));
    dev.launch(
        "unpad_rows",
        u32::try_from(rows.clamp(1, 1 << 16)).unwrap_or(1 << 16),
        dev.block_size(),
        &mut [
            KernelArg::Out(c),
            KernelArg::In(padded),
            i(rows),
            i(cols),
            i(pitch),
            i(row0),
        ],
    )
}
