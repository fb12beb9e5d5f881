//! A backend made of device launches: [`DeviceBackend`] runs plait's ops as the kernels of
//! `kernels/cuda` plus GEMMs on any [`Device`], and sends the ops it has no kernel for to the
//! host (counted in [`super::TransferStats::host_ops`]).
//!
//! A [`Device`] is the small set of primitives a GPU offers: allocate, copy to and from the
//! host, launch a named kernel on a 1-D grid, and multiply matrices. The CUDA backend is
//! `DeviceBackend<CudaDevice>` (NVRTC-compiled kernels, cuBLAS); the tests run the same
//! backend on the `simt` emulator, so the lowering of every op to launches, and the kernels
//! themselves, are checked against the CPU kernels on machines without a GPU.

mod backend;
pub mod bf16_gemm;
mod ops;

pub use backend::{DeviceBackend, DeviceBuffer, HostOps};
pub use kernels::device::{Broadcast, KernelArg};

use super::MemoryStats;
use crate::RuntimeError;

/// What a GEMM's tensor cores multiply: f32 operands as they are, or rounded to bf16 (mixed
/// precision, as PyTorch's autocast runs a bf16 plan's matmuls); accumulation and results are
/// f32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmPrecision {
    #[default]
    F32,
    Bf16,
}

impl GemmPrecision {
    /// The GEMMs of a plan of `precision` (`MeshInfo::precision`): f32 for `fp32`, bf16 for
    /// the mixed-precision ones. fp16 and fp8 plans run bf16 GEMMs here too: this runtime has
    /// no fp16 loss scaling or fp8 kernels yet.
    pub fn of_plan(precision: &str) -> GemmPrecision {
        if precision == "fp32" {
            GemmPrecision::F32
        } else {
            GemmPrecision::Bf16
        }
    }
}

/// One matrix product per batch entry, row-major: `c[b] = op(a[b]) · op(b[b])`, where `op(a)`
/// is `[m, k]` (stored `[k, m]` when `trans_a`) and `op(b)` is `[k, n]` (stored `[n, k]` when
/// `trans_b`); matrices `stride_*` elements apart (0 reuses one). `c` is overwritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub batch: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub precision: GemmPrecision,
    /// Operands `[a, b]` given already as [`Device::bf16_operand`]'s copy (one matrix, bf16
    /// words at its padded pitch) rather than f32: a bf16 GEMM then converts only the other.
    pub given_bf16: [bool; 2],
    /// `c`'s rows lie this many elements apart (≥ the product's padded columns), as cuBLAS
    /// writes a bf16 product's padded rows directly ([`bf16_gemm::padded_output`]); 0: dense.
    pub c_pitch: usize,
    /// `c` is written as bf16 words (two to a 32-bit element, in order, rows dense): the f32
    /// accumulators rounded once, to nearest even, as `to_bf16` would round an f32 product.
    /// Only where [`bf16_gemm::writes_words`] allows it.
    pub c_words: bool,
    /// `c`'s values as they are (words where `c_words`) are added to the product before it is
    /// rounded and written over them: cuBLAS's beta = 1, the sum in f32. A dense output only
    /// (no padded pitch).
    pub accumulate: bool,
}

impl Gemm {
    /// One product `[m, k] · [k, n]`, neither operand transposed.
    pub fn plain(m: usize, k: usize, n: usize) -> Gemm {
        Gemm {
            m,
            k,
            n,
            batch: 1,
            trans_a: false,
            trans_b: false,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            precision: GemmPrecision::F32,
            given_bf16: [false; 2],
            c_pitch: 0,
            c_words: false,
            accumulate: false,
        }
    }
}

/// What a [`DeviceBackend`] needs of a device.
pub trait Device: std::fmt::Debug {
    /// An allocation of f32 elements in the device's memory.
    type Mem: std::fmt::Debug;

    /// A short description, e.g. `cuda:0 (NVIDIA H200)`.
    fn name(&self) -> String;

    /// `len` (≥ 1) zeroed elements.
    fn alloc_zeros(&self, len: usize) -> Result<Self::Mem, RuntimeError>;

    /// `len` (≥ 1) elements whose values are unspecified, for outputs a kernel writes in full
    /// (zeroing them first would write every output twice: 17.7 GB per GPT-2 step). By
    /// default zeroed; the `simt` emulator fills them with NaN, so that a kernel that leaves
    /// an element unwritten fails its tests.
    fn alloc(&self, len: usize) -> Result<Self::Mem, RuntimeError> {
        self.alloc_zeros(len)
    }

    /// Gives an allocation back (a caching device's memory returns to its cache when dropped,
    /// so dropping a buffer does the same).
    fn release(&self, mem: Self::Mem) {
        drop(mem);
    }

    /// Copies `host` into the first `host.len()` elements of `dst`.
    fn upload(&self, host: &[f32], dst: &mut Self::Mem) -> Result<(), RuntimeError>;

    /// Copies the first `host.len()` elements of `src` to `host`, waiting for queued work.
    fn download(&self, src: &Self::Mem, host: &mut [f32]) -> Result<(), RuntimeError>;

    /// Copies the first `len` elements of `src` into `dst` on the device.
    fn copy(&self, src: &Self::Mem, dst: &mut Self::Mem, len: usize) -> Result<(), RuntimeError>;

    /// Launches `kernel` (declared in `kernels/cuda`) on `grid` blocks of `block` threads.
    fn launch(
        &self,
        kernel: &'static str,
        grid: u32,
        block: u32,
        args: &mut [KernelArg<'_, Self::Mem>],
    ) -> Result<(), RuntimeError>;

    /// One `[rows, cols]` matrix as the bf16 operand a bf16 GEMM makes of it before multiplying
    /// (rounded to bf16, two to a word, rows padded with zeros to a multiple of 8 columns), to
    /// pass to several GEMMs (`Gemm::given_bf16`) that would each convert it; `None` where the
    /// device's GEMMs take f32 operands as they are.
    fn bf16_operand(
        &self,
        x: &Self::Mem,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Self::Mem>, RuntimeError> {
        let _ = (x, rows, cols);
        Ok(None)
    }

    /// The products of `g` (f32 in and out, f32 accumulation).
    fn gemm(
        &self,
        g: &Gemm,
        a: &Self::Mem,
        b: &Self::Mem,
        c: &mut Self::Mem,
    ) -> Result<(), RuntimeError>;

    /// The threads per block of row and pointwise kernels (a power of two up to 1024).
    fn block_size(&self) -> u32 {
        256
    }

    /// Whether the device runs `kernels/cuda`'s warp-level tensor-core kernels
    /// (`attention_mma.cu`: `mma.sync` on bf16, compute capability 8.0 and up). The `simt`
    /// emulator runs them lane by lane when its device says yes (`emulator_mma` in the tests).
    fn tensor_cores(&self) -> bool {
        false
    }

    /// The allocator's counters, where the device keeps them.
    fn memory_stats(&self) -> Option<MemoryStats> {
        None
    }

    /// The launches so far by kernel, where the device counts them (the dry device).
    fn launch_tally(&self) -> Option<super::launches::LaunchTally> {
        None
    }

    /// Waits for all queued work.
    fn synchronize(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// What the device reports of itself (`plait profile --device cuda` writes it into the
    /// cluster file); unknown fields are `None`.
    fn properties(&self) -> DeviceProperties {
        DeviceProperties::default()
    }
}

/// A device's own description of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceProperties {
    /// The product name, e.g. `NVIDIA H200`.
    pub product: Option<String>,
    /// Streaming multiprocessors.
    pub sm_count: Option<u32>,
    /// Total device memory, bytes.
    pub memory_bytes: Option<u64>,
}
