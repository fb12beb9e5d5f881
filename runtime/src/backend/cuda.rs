//! The CUDA device (feature `cuda`): memory, NVRTC-compiled kernels and cuBLAS through cudarc,
//! the driver and libraries loaded at run time (so it builds on machines without CUDA and fails
//! with [`RuntimeError::NoCudaDevice`] at run time there). [`CudaBackend`] is the
//! [`DeviceBackend`] of this device: the ops `device::ops` lowers run as the kernels of
//! `kernels/cuda` (compiled by NVRTC when the backend opens, for the device's architecture)
//! and cuBLAS GEMMs (f32 without TF32; a bf16 plan's on bf16 copies of the operands); the
//! rest take the counted host path. A bf16 plan's attention runs on the tensor cores
//! (`attention_mma.cu`).
//!
//! Buffers come from a caching pool ([`super::pool`]) whose high-water mark `plait run` prints.
//! Compiled kernels are cached on disk ([`super::kernel_cache`]).
//!
//! TODO(runtime, issue 15): bf16 buffers (activations are stored in f32, which doubles the
//! activation memory a bf16 plan prices); the attention's tile loads overlapped with its
//! products; a communication stream that overlaps the data-parallel reduce with the backward.
//! Run on an H200 (2026-12-04): `bench/device/check.sh` passes its correctness rows.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use kernels::device::{AttentionShape, Broadcast, KernelArg, Strided};

use super::device::bf16_gemm::Bf16Operand;
use super::device::{Device, DeviceBackend, DeviceBuffer, DeviceProperties, Gemm};
use super::nvrtc;
use super::pool::{MemoryStats, Pool, Pooled, Slab};
use crate::RuntimeError;

/// plait's ops on one CUDA GPU.
pub type CudaBackend = DeviceBackend<CudaDevice>;
/// A dense row-major f32 tensor in GPU memory.
pub type CudaBuffer = DeviceBuffer<CudaMem>;

/// One CUDA device: its default stream, a cuBLAS handle on it, the kernels of `kernels/cuda`
/// compiled for it, and the caching allocator its buffers come from.
pub struct CudaDevice {
    pub(super) ordinal: usize,
    pub(super) device_name: String,
    /// Compute capability 8.0 or newer: bf16 `mma.sync` (attention_mma.cu).
    tensor_cores: bool,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    functions: HashMap<&'static str, CudaFunction>,
    pub(super) pool: Pool<CudaSlice<f32>>,
    /// How long a wait for the queued work may take (`backend::watchdog`).
    wait_timeout: std::time::Duration,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("device_name", &self.device_name)
            .finish_non_exhaustive()
    }
}

/// A block of GPU memory from the pool: at least as many elements as its buffer needs.
pub struct CudaMem {
    /// The pool's block: it returns to the pool's cache when the buffer drops.
    pub(super) data: Pooled<CudaSlice<f32>>,
}

impl std::fmt::Debug for CudaMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMem")
            .field("len", &self.data.len())
            .finish_non_exhaustive()
    }
}

impl Slab for CudaSlice<f32> {
    fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }
}

/// `struct Broadcast` as a kernel argument passed by value.
#[repr(transparent)]
struct DeviceBroadcast(Broadcast);

// SAFETY: `Broadcast` is `#[repr(C)]` plain data (integers only), laid out as `common.cuh`'s
// `struct Broadcast`.
#[allow(unsafe_code)]
unsafe impl DeviceRepr for DeviceBroadcast {}

/// `struct Attention` as a kernel argument passed by value.
#[repr(transparent)]
struct DeviceAttention(AttentionShape);

// SAFETY: `AttentionShape` is `#[repr(C)]` plain data (integers and doubles), laid out as
// `common.cuh`'s `struct Attention`.
#[allow(unsafe_code)]
unsafe impl DeviceRepr for DeviceAttention {}

/// `struct Strided` as a kernel argument passed by value.
#[repr(transparent)]
struct DeviceStrided(Strided);

// SAFETY: `Strided` is `#[repr(C)]` plain data (integers only), laid out as `common.cuh`'s
// `struct Strided`.
#[allow(unsafe_code)]
unsafe impl DeviceRepr for DeviceStrided {}

pub(super) fn cuda_err(
    op: &'static str,
) -> impl FnOnce(cudarc::driver::DriverError) -> RuntimeError {
    move |e| RuntimeError::Cuda {
        op,
        message: e.to_string(),
    }
}

/// Whether the CUDA driver library can be loaded (cudarc panics on first use otherwise).
fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its candidate names.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::driver::sys::is_culib_present()
    }
}

fn cublas_present() -> bool {
    // SAFETY: only tries to dlopen the cuBLAS library by its candidate names.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::cublas::sys::is_culib_present()
    }
}

fn no_device(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::NoCudaDevice {
        reason: reason.into(),
    }
}

impl DeviceBackend<CudaDevice> {
    /// Number of visible CUDA devices; [`RuntimeError::NoCudaDevice`] without a driver.
    pub fn device_count() -> Result<usize, RuntimeError> {
        if !driver_present() {
            return Err(no_device(
                "the CUDA driver library (libcuda.so) was not found",
            ));
        }
        let n = CudaContext::device_count()
            .map_err(|e| no_device(format!("the CUDA driver reports: {e}")))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Opens device `ordinal` and compiles the kernels for it: [`RuntimeError::NoCudaDevice`]
    /// when there is no driver, no such device, or no cuBLAS or NVRTC library.
    pub fn new(ordinal: usize) -> Result<CudaBackend, RuntimeError> {
        Ok(DeviceBackend::on(CudaDevice::open(ordinal)?))
    }

    /// The backend whose waits for the GPU give up after `limit` (`backend::watchdog`).
    pub fn with_device_timeout(mut self, limit: std::time::Duration) -> CudaBackend {
        self.device.wait_timeout = limit;
        self
    }
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<CudaDevice, RuntimeError> {
        let count = CudaBackend::device_count()?;
        if ordinal >= count {
            return Err(no_device(format!(
                "device {ordinal} asked for, {count} visible"
            )));
        }
        if !cublas_present() {
            return Err(no_device(
                "the cuBLAS library (libcublas.so) was not found; add its folder to LD_LIBRARY_PATH",
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| no_device(format!("cannot open device {ordinal}: {e}")))?;
        let device_name = ctx.name().map_err(cuda_err("device name"))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| RuntimeError::Cuda {
            op: "cublas init",
            message: e.to_string(),
        })?;
        let functions = compile_kernels(&ctx)?;
        let (major, _) = ctx
            .compute_capability()
            .map_err(cuda_err("compute capability"))?;
        Ok(CudaDevice {
            ordinal,
            device_name,
            tensor_cores: major >= 8,
            stream,
            blas,
            functions,
            pool: Pool::new(),
            wait_timeout: super::watchdog::DEFAULT_DEVICE_TIMEOUT,
        })
    }

    /// Waits for the work queued so far, polling an event, until the device timeout
    /// (`backend::watchdog`): a blocking synchronize would hang for good behind a collective
    /// whose peer is gone.
    fn wait_idle(&self, op: &'static str) -> Result<(), RuntimeError> {
        let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let event = self
            .stream
            .record_event(Some(flags))
            .map_err(cuda_err(op))?;
        super::watchdog::wait_until(op, self.wait_timeout, || {
            event.try_is_complete().map_err(cuda_err(op))
        })
    }
}

/// The kernels compiled for the device's compute capability, every one loaded.
fn compile_kernels(
    ctx: &Arc<CudaContext>,
) -> Result<HashMap<&'static str, CudaFunction>, RuntimeError> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(cuda_err("compute capability"))?;
    let module = load_kernels(ctx, major, minor)?;
    kernels::device::kernel_names()
        .into_iter()
        .map(|name| {
            let f = module
                .load_function(name)
                .map_err(cuda_err("load function"))?;
            Ok((name, f))
        })
        .collect()
}

/// The kernels' module: NVRTC's cubin for `sm_XY` (see [`super::nvrtc`]), else its PTX for
/// `compute_XY` when NVRTC cannot target the device itself; both errors when neither loads.
fn load_kernels(
    ctx: &Arc<CudaContext>,
    major: i32,
    minor: i32,
) -> Result<Arc<CudaModule>, RuntimeError> {
    let cubin = nvrtc::compile_kernels(major, minor, nvrtc::Output::Cubin).and_then(|bytes| {
        ctx.load_module(Ptx::from_binary(bytes))
            .map_err(cuda_err("load cubin"))
    });
    let cubin_error = match cubin {
        Ok(module) => return Ok(module),
        Err(e @ RuntimeError::NoCudaDevice { .. }) => return Err(e),
        Err(e) => e,
    };
    let text = nvrtc::compile_kernels(major, minor, nvrtc::Output::Ptx)?;
    let text = String::from_utf8_lossy(&text).into_owned();
    ctx.load_module(Ptx::from_src(text))
        .map_err(|e| RuntimeError::Cuda {
            op: "load kernels",
            message: format!("as a cubin: {cubin_error}; as PTX: {e}"),
        })
}

/// A kernel argument's value, kept alive while the launch reads it.
enum Value {
    I64(i64),
    I32(i32),
    F64(f64),
    Broadcast(DeviceBroadcast),
    Strided(DeviceStrided),
    Attention(DeviceAttention),
    /// A null `float*`.
    Null(u64),
}

impl CudaDevice {
    /// `len` elements whose values do not matter (they are written before they are read): a
    /// block from the pool, not zeroed.
    pub(super) fn uninit(&self, len: usize) -> Result<CudaMem, RuntimeError> {
        let data = self
            .pool
            .take(len.max(1) * std::mem::size_of::<f32>(), |bytes| {
                // SAFETY: callers write the memory (a kernel or a GEMM) before reading it.
                #[allow(unsafe_code)]
                unsafe {
                    self.stream.alloc::<f32>(bytes / std::mem::size_of::<f32>())
                }
            })
            .map_err(cuda_err("alloc"))?;
        Ok(CudaMem { data })
    }

    /// `x` as bf16 (`to_bf16`): `op`'s matrices, rows padded to its pitch.
    pub(super) fn to_bf16(&self, x: &CudaMem, op: &Bf16Operand) -> Result<CudaMem, RuntimeError> {
        let words = op.words();
        let mut y = self.uninit(words)?;
        let block = self.block_size();
        let grid = kernels::device::to_bf16_grid(op.mats, op.rows, op.pitch);
        let i = |n: usize| KernelArg::I64(i64::try_from(n).unwrap_or(i64::MAX));
        self.launch(
            "to_bf16",
            grid,
            block,
            &mut [
                KernelArg::Out(&mut y),
                KernelArg::In(x),
                i(op.mats),
                i(op.rows),
                i(op.cols),
                i(op.stride),
                i(op.pitch),
            ],
        )?;
        Ok(y)
    }
}

impl Device for CudaDevice {
    type Mem = CudaMem;

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.device_name)
    }

    fn alloc_zeros(&self, len: usize) -> Result<CudaMem, RuntimeError> {
        let mut data = self
            .pool
            .take(len * std::mem::size_of::<f32>(), |bytes| {
                self.stream
                    .alloc_zeros::<f32>(bytes / std::mem::size_of::<f32>())
            })
            .map_err(cuda_err("alloc"))?;
        // A block from the cache holds an earlier buffer's values (a new one is zeros).
        if data.reused() {
            self.stream
                .memset_zeros(&mut data.slice_mut(..len))
                .map_err(cuda_err("zero"))?;
        }
        Ok(CudaMem { data })
    }

    fn alloc(&self, len: usize) -> Result<CudaMem, RuntimeError> {
        self.uninit(len)
    }

    fn upload(&self, host: &[f32], dst: &mut CudaMem) -> Result<(), RuntimeError> {
        self.stream
            .memcpy_htod(host, &mut dst.data.slice_mut(..host.len()))
            .map_err(cuda_err("upload"))
    }

    fn download(&self, src: &CudaMem, host: &mut [f32]) -> Result<(), RuntimeError> {
        // The copy to pageable host memory blocks until the queued work is done: wait for
        // that first, under the deadline.
        self.wait_idle("download")?;
        self.stream
            .memcpy_dtoh(&src.data.slice(..host.len()), host)
            .map_err(cuda_err("download"))?;
        self.stream.synchronize().map_err(cuda_err("download"))
    }

    fn copy(&self, src: &CudaMem, dst: &mut CudaMem, len: usize) -> Result<(), RuntimeError> {
        self.stream
            .memcpy_dtod(&src.data.slice(..len), &mut dst.data.slice_mut(..len))
            .map_err(cuda_err("copy"))
    }

    fn launch(
        &self,
        kernel: &'static str,
        grid: u32,
        block: u32,
        args: &mut [KernelArg<'_, CudaMem>],
    ) -> Result<(), RuntimeError> {
        let func = self
            .functions
            .get(kernel)
            .ok_or_else(|| RuntimeError::DeviceLaunch {
                kernel,
                message: "no such kernel in kernels/cuda".into(),
            })?;
        let values: Vec<Option<Value>> = args
            .iter()
            .map(|a| match a {
                KernelArg::Out(_) | KernelArg::In(_) => None,
                KernelArg::Null => Some(Value::Null(0)),
                KernelArg::I64(v) => Some(Value::I64(*v)),
                KernelArg::I32(v) => Some(Value::I32(*v)),
                KernelArg::F64(v) => Some(Value::F64(*v)),
                KernelArg::Broadcast(b) => Some(Value::Broadcast(DeviceBroadcast(*b))),
                KernelArg::Strided(s) => Some(Value::Strided(DeviceStrided(*s))),
                KernelArg::Attention(a) => Some(Value::Attention(DeviceAttention(*a))),
            })
            .collect();
        let mut builder = self.stream.launch_builder(func);
        for (arg, value) in args.iter_mut().zip(&values) {
            match (arg, value) {
                (KernelArg::Out(m), _) => builder.arg(&mut *m.data),
                (KernelArg::In(m), _) => builder.arg(&*m.data),
                (_, Some(Value::I64(v))) => builder.arg(v),
                (_, Some(Value::I32(v))) => builder.arg(v),
                (_, Some(Value::F64(v))) => builder.arg(v),
                (_, Some(Value::Broadcast(b))) => builder.arg(b),
                (_, Some(Value::Strided(s))) => builder.arg(s),
                (_, Some(Value::Attention(a))) => builder.arg(a),
                (_, Some(Value::Null(p))) => builder.arg(p),
                (_, None) => &mut builder,
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments follow the kernel's declaration in kernels/cuda (the same
        // launches are checked against it by the `simt` emulator's tests), and every buffer
        // holds at least the elements the lowering in `device::ops` sized the launch for.
        #[allow(unsafe_code)]
        unsafe { builder.launch(cfg) }
            .map(drop)
            .map_err(|e| RuntimeError::DeviceLaunch {
                kernel,
                message: e.to_string(),
            })
    }

    fn bf16_operand(
        &self,
        x: &CudaMem,
        rows: usize,
        cols: usize,
    ) -> Result<Option<CudaMem>, RuntimeError> {
        super::cuda_ops::bf16_operand(self, x, rows, cols).map(Some)
    }

    fn gemm(
        &self,
        g: &Gemm,
        a: &CudaMem,
        b: &CudaMem,
        c: &mut CudaMem,
    ) -> Result<(), RuntimeError> {
        super::cuda_ops::gemm(self, g, a, b, c)
    }

    fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        Some(self.pool.stats())
    }

    fn synchronize(&self) -> Result<(), RuntimeError> {
        self.wait_idle("synchronize")
    }

    fn properties(&self) -> DeviceProperties {
        let ctx = self.stream.context();
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .ok();
        DeviceProperties {
            product: Some(self.device_name.clone()),
            sm_count: sms.and_then(|n| u32::try_from(n).ok()),
            memory_bytes: ctx.total_mem().ok().map(|b| b as u64),
        }
    }
}
