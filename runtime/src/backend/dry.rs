//! A device that runs nothing and counts memory: every buffer the device backend asks for is
//! taken from the same caching pool the CUDA device uses ([`super::pool`]), at the same sizes,
//! and so are a bf16 GEMM's operand copies and padded output
//! ([`super::device::bf16_gemm::temporaries`]); kernels, GEMMs and copies do nothing, and
//! what comes back to the host is zeros. A step on it takes the allocations a step on a GPU
//! takes, in the same order, so its high-water mark is the one `plait run` would print on
//! the GPU (the values computed are not: a loss of 0), in a fraction of the time and with no
//! GPU. What the CUDA device holds outside its pool (the CUDA context, cuBLAS's workspace)
//! it does not count, as `plait run` does not.
//!
//! It also counts the launches a step makes, by kernel, with the bytes of the buffers each is
//! handed ([`super::launches`]): a GEMM's as `bf16_gemm::launches` lists them.

use std::sync::Mutex;

use super::collectives::{Collectives, DeviceCollective};
use super::device::{Device, Gemm, KernelArg, bf16_gemm};
use super::launches::LaunchTally;
use super::pool::{MemoryStats, Pool, Pooled, Slab};
use crate::{Communicator, RuntimeError};

/// The name [`DryDevice`] counts a zeroed allocation's memset under.
pub const MEMSET: &str = "memset (zeroed allocation)";

/// A block of memory that is not there: its size only.
#[derive(Debug)]
pub struct DrySlab(usize);

impl Slab for DrySlab {
    fn bytes(&self) -> usize {
        self.0
    }
}

/// An allocation on the dry device: the pool's block and the elements asked for.
#[derive(Debug)]
pub struct DryMem {
    // Held for its lease: dropping it gives the block back to the pool.
    _block: Pooled<DrySlab>,
    len: usize,
}

impl DryMem {
    fn bytes(&self) -> u64 {
        (self.len * std::mem::size_of::<f32>()) as u64
    }
}

/// A device with no memory and no compute: its allocations counted by a caching pool, its
/// launches by kernel.
#[derive(Debug)]
pub struct DryDevice {
    pool: Pool<DrySlab>,
    tensor_cores: bool,
    launches: Mutex<LaunchTally>,
}

impl DryDevice {
    /// A device whose kernels would be (`tensor_cores`) the tensor-core ones of compute
    /// capability 8.0 and up: attention then reads its operands as bf16 words.
    pub fn new(tensor_cores: bool) -> DryDevice {
        DryDevice {
            pool: Pool::new(),
            tensor_cores,
            launches: Mutex::default(),
        }
    }

    fn take(&self, len: usize) -> Result<DryMem, RuntimeError> {
        let block = self
            .pool
            .take(len.max(1) * std::mem::size_of::<f32>(), |bytes| {
                Ok::<_, RuntimeError>(DrySlab(bytes))
            })?;
        Ok(DryMem { _block: block, len })
    }

    fn count(&self, kernel: &'static str, bytes: u64) {
        if let Ok(mut t) = self.launches.lock() {
            t.add(kernel, bytes);
        }
    }
}

impl Device for DryDevice {
    type Mem = DryMem;

    fn name(&self) -> String {
        "dry (counts memory, runs nothing)".into()
    }

    /// Zeroed on a GPU by a memset, counted as one.
    fn alloc_zeros(&self, len: usize) -> Result<Self::Mem, RuntimeError> {
        let mem = self.take(len)?;
        self.count(MEMSET, mem.bytes());
        Ok(mem)
    }

    fn alloc(&self, len: usize) -> Result<Self::Mem, RuntimeError> {
        self.take(len)
    }

    fn upload(&self, _: &[f32], _: &mut Self::Mem) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn download(&self, _: &Self::Mem, host: &mut [f32]) -> Result<(), RuntimeError> {
        host.fill(0.0);
        Ok(())
    }

    fn copy(&self, _: &Self::Mem, _: &mut Self::Mem, len: usize) -> Result<(), RuntimeError> {
        self.count("copy", (2 * len * std::mem::size_of::<f32>()) as u64);
        Ok(())
    }

    fn launch(
        &self,
        kernel: &'static str,
        _: u32,
        _: u32,
        args: &mut [KernelArg<'_, Self::Mem>],
    ) -> Result<(), RuntimeError> {
        // A buffer handed twice (q, k and v as the column blocks of one) counts once.
        let mut seen: Vec<*const DryMem> = Vec::new();
        let bytes = args
            .iter()
            .filter_map(|a| match a {
                KernelArg::Out(m) => Some(&**m),
                KernelArg::In(m) => Some(*m),
                _ => None,
            })
            .filter(|m| {
                let at: *const DryMem = *m;
                let new = !seen.contains(&at);
                seen.push(at);
                new
            })
            .map(DryMem::bytes)
            .sum();
        self.count(kernel, bytes);
        Ok(())
    }

    /// `to_bf16`'s copy, as the CUDA device makes it: the matrix's rows padded to 8 columns.
    fn bf16_operand(
        &self,
        _: &Self::Mem,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Self::Mem>, RuntimeError> {
        let (op, _) = bf16_gemm::copy_layout(1, (rows, cols), rows * cols);
        let words = self.take(op.words())?;
        self.count("to_bf16", 4 * (rows * cols) as u64 + words.bytes());
        Ok(Some(words))
    }

    /// The temporaries the CUDA device's GEMM takes, held together, then given back; its
    /// launches counted.
    fn gemm(
        &self,
        g: &Gemm,
        _: &Self::Mem,
        _: &Self::Mem,
        _: &mut Self::Mem,
    ) -> Result<(), RuntimeError> {
        let held = bf16_gemm::temporaries(g)
            .into_iter()
            .map(|len| self.take(len))
            .collect::<Result<Vec<_>, _>>()?;
        drop(held);
        for (kernel, bytes) in bf16_gemm::launches(g) {
            self.count(kernel, bytes);
        }
        Ok(())
    }

    fn launch_tally(&self) -> Option<LaunchTally> {
        self.launches.lock().ok().map(|t| t.clone())
    }

    fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        Some(self.pool.stats())
    }
}

/// NCCL's place on the dry device: a collective or a group of messages moves nothing (there
/// are no values), so that a run of several ranks takes the path a GPU run with NCCL takes
/// (device buffers in and out, no staging through the host) and counts its memory.
#[derive(Debug, Default)]
pub struct DryCollectives;

impl Collectives<DryMem> for DryCollectives {
    fn run(
        &self,
        _: &dyn Communicator,
        _: DeviceCollective,
        _: &DryMem,
        _: usize,
        _: &mut DryMem,
    ) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn open(&self, _: &dyn Communicator) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn exchange(
        &self,
        _: &dyn Communicator,
        _: &[(&DryMem, usize, usize)],
        _: &mut [(&mut DryMem, usize, usize)],
    ) -> Result<(), RuntimeError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::device::GemmPrecision;

    #[test]
    fn a_gemm_holds_its_temporaries_at_once_and_gives_them_back() -> Result<(), RuntimeError> {
        let dev = DryDevice::new(true);
        let (a, b, mut c) = (dev.take(64 * 96)?, dev.take(96 * 128)?, dev.take(64 * 128)?);
        let before = dev.memory_stats().map(|m| m.in_use);
        let g = Gemm {
            precision: GemmPrecision::Bf16,
            ..Gemm::plain(64, 96, 128)
        };
        dev.gemm(&g, &a, &b, &mut c)?;
        let m = dev.memory_stats().expect("counted");
        assert_eq!(Some(m.in_use), before, "given back");
        let copies: u64 = bf16_gemm::temporaries(&g)
            .iter()
            .map(|&len| super::super::pool::rounded(4 * len) as u64)
            .sum();
        assert_eq!(m.peak_in_use, before.unwrap_or(0) + copies);
        // Counted as the CUDA device launches it: two operand copies, one product.
        let t = dev.launch_tally().expect("counted");
        assert_eq!(t.get("to_bf16").launches, 2);
        assert_eq!(t.get(bf16_gemm::CUBLAS).launches, 1);
        // The product reads both copies (bf16) and writes the f32 result.
        let product = 2 * (64 * 96 + 96 * 128) + 4 * 64 * 128;
        assert_eq!(t.get(bf16_gemm::CUBLAS).bytes, product);
        Ok(())
    }

    /// A buffer back from the stash as its words alone holds the words and no f32 memory (the
    /// plan's bf16 bytes), until its values are expanded or it is written in place.
    #[test]
    fn a_buffer_held_as_words_holds_no_f32_memory_until_expanded() -> Result<(), RuntimeError> {
        use crate::backend::{Backend, Stashed};
        let b = crate::backend::device::DeviceBackend::on(DryDevice::new(true));
        let in_use = || b.device().memory_stats().map_or(0, |m| m.in_use);
        let (rows, cols) = (1024usize, 1024usize);
        let f32_bytes = super::super::pool::rounded(4 * rows * cols) as u64;
        let words_bytes = super::super::pool::rounded(2 * rows * cols) as u64;
        let one = super::super::pool::rounded(4) as u64;
        let x = b.zeros(&[rows, cols])?;
        let Stashed::Words(words) = b.stash_bf16(x)? else {
            panic!("a device backend stashes");
        };
        assert_eq!(in_use(), words_bytes, "the stash holds the words");
        let mut x = b.unstash_bf16_words(words, &[rows, cols])?;
        assert_eq!(in_use(), words_bytes + one, "the words and a placeholder");
        assert!(b.duplicate(&x).is_err(), "no f32 values to copy: refused");
        b.expand_stashed(&mut x)?;
        assert_eq!(
            in_use(),
            words_bytes + f32_bytes,
            "expanded: the f32 values too"
        );
        b.free(x);
        let Stashed::Words(words) = b.stash_bf16(b.zeros(&[rows, cols])?)? else {
            panic!("a device backend stashes");
        };
        let mut x = b.unstash_bf16_words(words, &[rows, cols])?;
        b.fill_in_place(&mut x, 1.0)?;
        assert_eq!(
            in_use(),
            f32_bytes,
            "written in place: f32 alone, no stale words"
        );
        b.free(x);
        assert_eq!(in_use(), 0);
        Ok(())
    }
}
