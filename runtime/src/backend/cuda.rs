//! The CUDA backend (feature `cuda`): buffers in GPU memory through cudarc, the CUDA driver and
//! cuBLAS loaded at run time (so it builds on machines without CUDA and fails with
//! [`RuntimeError::NoCudaDevice`] at run time there).
//!
//! What runs on the GPU: buffers, host transfers, [`Backend::sgemm`], and the `MatMul` /
//! bias-free `Linear` forward ops whose right operand is one matrix or whose batch dims agree
//! (cuBLAS sgemm, plain and strided-batched, in f32 without TF32). Buffers come from a
//! caching pool ([`super::pool`]) whose high-water mark `plait run` prints.
//!
//! TODO(runtime, issue 6): every other op (elementwise, norms, softmax, attention, the
//! backward ops and AdamW) takes a correct but slow host round trip: download the operands,
//! run the `kernels` CPU kernel, upload the results. Native kernels (NVRTC-compiled
//! elementwise and reductions, cuBLAS for the matmul gradients) replace it op by op.

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use ir::{AdamWConfig, Binding, OpKind};
use kernels::Tensor32;

use super::pool::{Lease, MemoryStats, Pool, Slab};
use super::{Backend, TransferStats, sgemm_dims};
use crate::RuntimeError;
use std::sync::atomic::{AtomicU64, Ordering};

/// One CUDA device, its default stream, a cuBLAS handle on it and the caching allocator its
/// buffers come from.
pub struct CudaBackend {
    pub(super) ordinal: usize,
    pub(super) device_name: String,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    pub(super) pool: Pool<CudaSlice<f32>>,
    /// Host transfers so far ([`Backend::transfer_stats`]).
    transfers: Transfers,
}

/// Counters of [`TransferStats`], shared by the threads that use the backend.
#[derive(Default)]
struct Transfers {
    uploads: AtomicU64,
    upload_bytes: AtomicU64,
    downloads: AtomicU64,
    download_bytes: AtomicU64,
    host_ops: AtomicU64,
}

impl Transfers {
    fn count(calls: &AtomicU64, bytes: &AtomicU64, n: usize) {
        calls.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add((n * std::mem::size_of::<f32>()) as u64, Ordering::Relaxed);
    }

    fn stats(&self) -> TransferStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransferStats {
            uploads: get(&self.uploads),
            upload_bytes: get(&self.upload_bytes),
            downloads: get(&self.downloads),
            download_bytes: get(&self.download_bytes),
            host_ops: get(&self.host_ops),
        }
    }
}

impl Slab for CudaSlice<f32> {
    fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<f32>()
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ordinal)
            .field("device_name", &self.device_name)
            .finish_non_exhaustive()
    }
}

/// A dense row-major f32 tensor in GPU memory.
pub struct CudaBuffer {
    pub(super) shape: Vec<usize>,
    /// Element count of `shape`: the first `len` elements of `data`, a block of the pool at
    /// least that long (and at least one element: CUDA refuses zero-byte allocations).
    pub(super) len: usize,
    pub(super) data: CudaSlice<f32>,
    /// The block's place in the pool's accounting.
    pub(super) lease: Lease<CudaSlice<f32>>,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

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

impl CudaBackend {
    /// Number of visible CUDA devices; [`RuntimeError::NoCudaDevice`] without a driver.
    pub fn device_count() -> Result<usize, RuntimeError> {
        if !driver_present() {
            return Err(RuntimeError::NoCudaDevice {
                reason: "the CUDA driver library (libcuda.so) was not found".into(),
            });
        }
        let n = CudaContext::device_count().map_err(|e| RuntimeError::NoCudaDevice {
            reason: format!("the CUDA driver reports: {e}"),
        })?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Opens device `ordinal`: [`RuntimeError::NoCudaDevice`] when there is no driver, no such
    /// device, or no cuBLAS library.
    pub fn new(ordinal: usize) -> Result<CudaBackend, RuntimeError> {
        let count = CudaBackend::device_count()?;
        if ordinal >= count {
            return Err(RuntimeError::NoCudaDevice {
                reason: format!("device {ordinal} asked for, {count} visible"),
            });
        }
        if !cublas_present() {
            return Err(RuntimeError::NoCudaDevice {
                reason: "the cuBLAS library (libcublas.so) was not found; add its folder to LD_LIBRARY_PATH".into(),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| RuntimeError::NoCudaDevice {
            reason: format!("cannot open device {ordinal}: {e}"),
        })?;
        let device_name = ctx.name().map_err(cuda_err("device name"))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| RuntimeError::Cuda {
            op: "cublas init",
            message: e.to_string(),
        })?;
        Ok(CudaBackend {
            ordinal,
            device_name,
            stream,
            blas,
            pool: Pool::new(),
            transfers: Transfers::default(),
        })
    }

    /// A zero-filled buffer of `shape` from the pool.
    fn alloc(&self, shape: &[usize]) -> Result<CudaBuffer, RuntimeError> {
        let len = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|n| n.checked_mul(std::mem::size_of::<f32>()).is_some())
            .ok_or_else(|| RuntimeError::Cuda {
                op: "alloc",
                message: format!("a buffer of shape {shape:?} exceeds the address space"),
            })?;
        let (mut data, lease) = self
            .pool
            .take(len.max(1) * std::mem::size_of::<f32>(), |bytes| {
                self.stream
                    .alloc_zeros::<f32>(bytes / std::mem::size_of::<f32>())
            })
            .map_err(cuda_err("alloc"))?;
        // A block from the cache holds an earlier buffer's values (a new one is zeros).
        if lease.reused() {
            self.stream
                .memset_zeros(&mut data.slice_mut(..len.max(1)))
                .map_err(cuda_err("zero"))?;
        }
        Ok(CudaBuffer {
            shape: shape.to_vec(),
            len,
            data,
            lease,
        })
    }

    /// Runs a CPU kernel on downloaded operands and uploads its results (the fallback for ops
    /// without a GPU kernel yet).
    fn on_host<T>(
        &self,
        buffers: &[&CudaBuffer],
        run: impl FnOnce(&[&Tensor32]) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        self.transfers.host_ops.fetch_add(1, Ordering::Relaxed);
        let host: Vec<Tensor32> = buffers
            .iter()
            .map(|b| self.download(b))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&Tensor32> = host.iter().collect();
        run(&refs)
    }

    fn upload_all(&self, ts: Vec<Tensor32>) -> Result<Vec<CudaBuffer>, RuntimeError> {
        ts.iter().map(|t| self.upload(t)).collect()
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.device_name)
    }

    fn zeros(&self, shape: &[usize]) -> Result<CudaBuffer, RuntimeError> {
        self.alloc(shape)
    }

    /// Returns the buffer's block to the pool for the next buffer of about its size.
    fn free(&self, buffer: CudaBuffer) {
        let CudaBuffer { data, lease, .. } = buffer;
        self.pool.give(data, lease);
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        Some(self.pool.stats())
    }

    fn transfer_stats(&self) -> Option<TransferStats> {
        Some(self.transfers.stats())
    }

    fn shape<'b>(&self, buffer: &'b CudaBuffer) -> &'b [usize] {
        &buffer.shape
    }

    fn upload(&self, host: &Tensor32) -> Result<CudaBuffer, RuntimeError> {
        let mut buf = self.alloc(&host.shape)?;
        if host.data.len() != buf.len {
            return Err(RuntimeError::BadLength {
                op: "upload",
                what: "host tensor",
                got: host.data.len(),
                want: buf.len,
            });
        }
        let t = &self.transfers;
        Transfers::count(&t.uploads, &t.upload_bytes, buf.len);
        if buf.len > 0 {
            self.stream
                .memcpy_htod(&host.data, &mut buf.data.slice_mut(..buf.len))
                .map_err(cuda_err("upload"))?;
        }
        Ok(buf)
    }

    fn download(&self, buffer: &CudaBuffer) -> Result<Tensor32, RuntimeError> {
        let t = &self.transfers;
        Transfers::count(&t.downloads, &t.download_bytes, buffer.len);
        let mut data = vec![0.0f32; buffer.len.max(1)];
        self.stream
            .memcpy_dtoh(&buffer.data.slice(..buffer.len.max(1)), &mut data)
            .map_err(cuda_err("download"))?;
        self.stream.synchronize().map_err(cuda_err("download"))?;
        data.truncate(buffer.len);
        Tensor32::new(buffer.shape.clone(), data).map_err(RuntimeError::kernel("download"))
    }

    fn forward(
        &self,
        kind: &OpKind,
        inputs: &[&CudaBuffer],
        binding: Binding,
    ) -> Result<Vec<CudaBuffer>, RuntimeError> {
        if let Some(out) = self.forward_native(kind, inputs)? {
            return Ok(vec![out]);
        }
        let results = self.on_host(inputs, |xs| {
            kernels::forward(kind, xs, binding).map_err(RuntimeError::kernel(kind.mnemonic()))
        })?;
        self.upload_all(results)
    }

    fn backward(
        &self,
        kind: &OpKind,
        xs: &[&CudaBuffer],
        dys: &[&CudaBuffer],
    ) -> Result<Vec<Option<CudaBuffer>>, RuntimeError> {
        let all: Vec<&CudaBuffer> = xs.iter().chain(dys).copied().collect();
        let grads = self.on_host(&all, |ts| {
            let (x, dy) = ts.split_at(xs.len());
            kernels::backward(kind, x, dy).map_err(RuntimeError::kernel(kind.mnemonic()))
        })?;
        grads
            .into_iter()
            .map(|g| g.map(|t| self.upload(&t)).transpose())
            .collect()
    }

    fn adamw(
        &self,
        cfg: &AdamWConfig,
        param: &mut CudaBuffer,
        grad: &CudaBuffer,
        m: &mut CudaBuffer,
        v: &mut CudaBuffer,
        step: u64,
    ) -> Result<(), RuntimeError> {
        super::adamw_on_host(self, cfg, [param, m, v], grad, step, None)
    }

    fn sgemm(&self, a: &CudaBuffer, b: &CudaBuffer) -> Result<CudaBuffer, RuntimeError> {
        let (m, k, n) = sgemm_dims(&a.shape, &b.shape)?;
        let mut c = self.alloc(&[m, n])?;
        self.gemm_rm(a, b, &mut c, (m, k, n), 1, (0, 0, 0))?;
        Ok(c)
    }

    fn synchronize(&self) -> Result<(), RuntimeError> {
        self.stream.synchronize().map_err(cuda_err("synchronize"))
    }
}
