//! Compute backends: where a rank's tensors live and its ops run.
//!
//! A [`Backend`] owns device memory through its [`Backend::Buffer`] type (candle's
//! storage/device split, without dynamic dispatch: the executor is generic over the backend).
//! Every op goes through [`Backend::forward`] / [`Backend::backward`] with the semantics of
//! `kernels::forward` / `kernels::backward` (the interpreter's), and the optimizer through
//! [`Backend::adamw`]. Buffers move to and from the host as [`Tensor32`]s; collectives run on
//! host slices (see [`crate::comm`]).
//!
//! - [`CpuBackend`]: always available, the `kernels` crate on host memory.
//! - [`CudaBackend`]: behind the `cuda` cargo feature (cudarc, libraries loaded at run time).
//!   Without the feature the type still exists and its constructor returns
//!   [`RuntimeError::NotCompiledWithCudaSupport`], so callers compile everywhere. With it,
//!   `NcclCollectives` runs the executor's collectives on its buffers ([`collectives`]).

pub mod collectives;
pub mod conformance;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_ops;
pub mod device;
mod dropout;
pub mod dry;
pub mod kernel_cache;
pub mod launches;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod pool;
pub mod vocab;
pub mod watchdog;

use ir::{AdamWConfig, Binding, OpKind};
use kernels::Tensor32;

use crate::{Communicator, RuntimeError};

pub use cpu::CpuBackend;
pub use cuda::{CudaBackend, CudaBuffer};
#[cfg(feature = "cuda")]
pub use cuda::{CudaDevice, CudaMem};
pub use device::{Device, DeviceBackend, DeviceBuffer, DeviceProperties, Gemm, GemmPrecision};
pub use dropout::DropoutMask;
#[cfg(feature = "cuda")]
pub use nccl::{NcclCollectives, nccl_present};
pub use pool::MemoryStats;

/// What [`Backend::stash_bf16`] made of a buffer.
#[derive(Debug)]
pub enum Stashed<B> {
    /// Its bf16 words.
    Words(B),
    /// The buffer as it was: the backend keeps f32 only.
    Kept(B),
}

/// A device that holds f32 buffers and runs plait's ops on them.
pub trait Backend: std::fmt::Debug {
    /// A tensor in this backend's memory (shape and data).
    type Buffer: std::fmt::Debug;

    /// A short description, e.g. `cpu (2 threads)` or `cuda:0 (NVIDIA H200)`.
    fn name(&self) -> String;

    /// A zero-filled buffer of `shape`.
    fn zeros(&self, shape: &[usize]) -> Result<Self::Buffer, RuntimeError>;

    /// Frees a buffer now (dropping it does the same).
    fn free(&self, buffer: Self::Buffer) {
        drop(buffer);
    }

    /// The buffer's shape.
    fn shape<'b>(&self, buffer: &'b Self::Buffer) -> &'b [usize];

    /// Whether the buffer holds its values as bf16 words alone, in half the bytes of its f32
    /// values (made as words, or as a GEMM's bf16 operand: [`Backend::forward_pitched`]).
    fn holds_words_alone(&self, buffer: &Self::Buffer) -> bool {
        let _ = buffer;
        false
    }

    /// Copies a host tensor into a new buffer.
    fn upload(&self, host: &Tensor32) -> Result<Self::Buffer, RuntimeError>;

    /// [`Backend::upload`] of a tensor the caller gives up: a host backend keeps it without
    /// a copy.
    fn upload_owned(&self, host: Tensor32) -> Result<Self::Buffer, RuntimeError> {
        self.upload(&host)
    }

    /// Copies a buffer back to the host.
    fn download(&self, buffer: &Self::Buffer) -> Result<Tensor32, RuntimeError>;

    /// A buffer of `shape` with every element `value`; by default uploaded from the host.
    fn fill(&self, shape: &[usize], value: f32) -> Result<Self::Buffer, RuntimeError> {
        let n = shape.iter().product();
        self.upload_owned(
            Tensor32::new(shape.to_vec(), vec![value; n]).map_err(RuntimeError::kernel("fill"))?,
        )
    }

    /// Sets every element of `buffer` to `value` in place (a step's gradient accumulators are
    /// zeroed where they live, not reallocated beside the old ones); by default a new buffer
    /// replaces it.
    fn fill_in_place(&self, buffer: &mut Self::Buffer, value: f32) -> Result<(), RuntimeError> {
        let filled = self.fill(self.shape(buffer), value)?;
        self.free(std::mem::replace(buffer, filled));
        Ok(())
    }

    /// `[0, 1, .., n − 1]` as a `[n]` buffer (the IR's `Iota`); by default uploaded.
    fn iota(&self, n: usize) -> Result<Self::Buffer, RuntimeError> {
        self.upload_owned(
            Tensor32::new(vec![n], (0..n).map(|i| i as f32).collect())
                .map_err(RuntimeError::kernel("iota"))?,
        )
    }

    /// `x` with inverted dropout `mask` applied; by default on the host.
    fn dropout(&self, x: &Self::Buffer, mask: &DropoutMask) -> Result<Self::Buffer, RuntimeError> {
        let mut t = self.download(x)?;
        mask.apply(&mut t.data);
        self.upload_owned(t)
    }

    /// A copy of `buffer`; by default through the host.
    fn duplicate(&self, buffer: &Self::Buffer) -> Result<Self::Buffer, RuntimeError> {
        self.upload_owned(self.download(buffer)?)
    }

    /// `buffer` as `shape` (as many elements, row-major order kept); by default through the
    /// host, on a device by relabelling it.
    fn reshape(&self, buffer: Self::Buffer, shape: &[usize]) -> Result<Self::Buffer, RuntimeError> {
        let mut t = self.download(&buffer)?;
        self.free(buffer);
        let n: usize = shape.iter().product();
        if n != t.data.len() {
            return Err(RuntimeError::BadLength {
                op: "reshape",
                what: "buffer",
                got: t.data.len(),
                want: n,
            });
        }
        t.shape = shape.to_vec();
        self.upload_owned(t)
    }

    /// `run` on `inputs` downloaded, its results uploaded: the host path of an op a backend
    /// has no kernel for.
    fn through_host(
        &self,
        inputs: &[&Self::Buffer],
        run: impl FnOnce(&[&Tensor32]) -> Result<Vec<Tensor32>, RuntimeError>,
    ) -> Result<Vec<Self::Buffer>, RuntimeError>
    where
        Self: Sized,
    {
        let host = inputs
            .iter()
            .map(|b| self.download(b))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Tensor32> = host.iter().collect();
        run(&refs)?
            .into_iter()
            .map(|t| self.upload_owned(t))
            .collect()
    }

    /// An op on this rank's context-parallel chunks (`kernels::context_forward_with`: `iota`,
    /// `rotary`, `attention` and their `grad`s, at the rank's places in the sequence); by
    /// default the CPU kernels on downloaded operands.
    fn context_op(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        at: kernels::Chunks,
        acc: kernels::Accumulate,
    ) -> Result<Vec<Self::Buffer>, RuntimeError>
    where
        Self: Sized,
    {
        self.through_host(inputs, context_on_host(kind, at, acc))
    }

    /// A vocabulary-parallel shard op; by default the CPU kernel on downloaded operands.
    fn vocab_shard(
        &self,
        op: &vocab::VocabShard,
        inputs: &[&Self::Buffer],
    ) -> Result<Vec<Self::Buffer>, RuntimeError>
    where
        Self: Sized,
    {
        self.through_host(inputs, |ts| op.on_host(ts))
    }

    /// A vocabulary-parallel shard op's one result held at a pitch, as
    /// [`Backend::forward_pitched`] holds the cross-entropy's gradient: the loss's gradient on
    /// the shard made as the bf16 operand the LM head's backward GEMMs read. `None`: not made
    /// so here.
    fn vocab_shard_pitched(
        &self,
        op: &vocab::VocabShard,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        let _ = (op, inputs);
        Ok(None)
    }

    /// Whether this backend's shard op `op` reads input `operand` where it lies when it is
    /// held at a pitch ([`Backend::reads_pitched`] for the vocabulary-parallel loss).
    fn vocab_reads_pitched(&self, op: &vocab::VocabShard, operand: usize) -> bool {
        let _ = (op, operand);
        false
    }

    /// Whether point-to-point messages go device to device ([`Backend::device_exchange`]).
    fn has_device_collectives(&self) -> bool {
        false
    }

    /// One group of point-to-point messages over `world` on device buffers
    /// ([`collectives::Collectives::exchange`]): `sends` (buffer, destination) and receives
    /// into new buffers of the given shapes (shape, source), returned in order; `None` where
    /// the backend has no device collectives.
    fn device_exchange(
        &self,
        world: &dyn Communicator,
        sends: &[(&Self::Buffer, usize)],
        recvs: &[(Vec<usize>, usize)],
    ) -> Option<Result<Vec<Self::Buffer>, RuntimeError>> {
        let _ = (world, sends, recvs);
        None
    }

    /// `op` of `input` over `group`'s members on this backend's buffers (a flat 1-D result),
    /// or `None` where the backend has no device path for collectives: the executor then
    /// stages them through the host communicator.
    fn device_collective(
        &self,
        group: &dyn Communicator,
        op: collectives::DeviceCollective,
        input: &Self::Buffer,
    ) -> Option<Result<Self::Buffer, RuntimeError>> {
        let _ = (group, op, input);
        None
    }

    /// Runs one non-source op (`kernels::forward` semantics): one buffer per result.
    fn forward(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        binding: Binding,
    ) -> Result<Vec<Self::Buffer>, RuntimeError>;

    /// The vector-Jacobian product of `kind` (`kernels::backward` semantics): one gradient per
    /// operand, `None` where no gradient flows (token ids, targets).
    fn backward(
        &self,
        kind: &OpKind,
        xs: &[&Self::Buffer],
        dys: &[&Self::Buffer],
    ) -> Result<Vec<Option<Self::Buffer>>, RuntimeError>;

    /// One AdamW update in place; `step` is 1-based.
    fn adamw(
        &self,
        cfg: &AdamWConfig,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        step: u64,
    ) -> Result<(), RuntimeError>;

    /// [`Backend::adamw`] with the second moment frozen after update `frozen_after`
    /// (`kernels::adamw_frozen_variance`); by default on the host.
    #[allow(clippy::too_many_arguments)]
    fn adamw_frozen_variance(
        &self,
        cfg: &AdamWConfig,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        step: u64,
        frozen_after: u64,
    ) -> Result<(), RuntimeError> {
        adamw_on_host(self, cfg, [param, m, v], grad, step, Some(frozen_after))
    }

    /// [`Backend::adamw`] (with the second moment frozen after `frozen_after`, where given)
    /// that also leaves the updated parameter in `copy` (made here where it is `None`): a
    /// program's `AdamW` and the `Copy` of the master weight to its compute copy after it, in
    /// one pass. `false`: nothing done (the executor runs the two).
    fn adamw_copy(
        &self,
        cfg: &AdamWConfig,
        state: [&mut Self::Buffer; 3],
        grad: &Self::Buffer,
        step: (u64, Option<u64>),
        copy: &mut Option<Self::Buffer>,
    ) -> Result<bool, RuntimeError> {
        let _ = (cfg, state, grad, step, copy);
        Ok(false)
    }

    /// Whether [`Backend::adamw`] and its kin read a gradient's exact bf16 words where it has
    /// them (then the executor brings a stashed gradient back for its update as words alone).
    fn adamw_reads_grad_words(&self) -> bool {
        false
    }

    /// Whether this backend carries tensor-parallel partial sums in f64 (reproducible mode):
    /// then the executor reduces every buffer codegen marks `partial` in f64.
    fn wide_partial_sums(&self) -> bool {
        false
    }

    /// The unrounded (f64) value of result `output` of `kind` on `inputs`, where this backend
    /// carries partial sums wide and can compute it so: a product `Linear` without bias (a
    /// row-parallel share) or a linear's input gradient (`Grad{of: Linear}`, operand 0; a
    /// column-parallel share). `None`: the executor widens the rounded f32 result.
    fn partial_sum(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        output: usize,
    ) -> Result<Option<Vec<f64>>, RuntimeError> {
        let _ = (kind, inputs, output);
        Ok(None)
    }

    /// `x` rounded to bf16 and kept in half its bytes, as a `[⌈len / 2⌉]` buffer of words,
    /// two bf16 to a word: what a bf16 plan's activation takes while the executor holds it
    /// between distant uses (`exec::stash`); `x` itself is given back to the backend.
    /// [`Stashed::Kept`]: this backend keeps f32 only (the host, whose kernels read f32), and
    /// the executor keeps `x` as it is.
    fn stash_bf16(&self, x: Self::Buffer) -> Result<Stashed<Self::Buffer>, RuntimeError> {
        Ok(Stashed::Kept(x))
    }

    /// The results of `kind` on `inputs` made as bf16 words only, where every reader of each
    /// reads it only as words ([`Backend::reads_stashed_words`]) and the plan stores it in
    /// bf16: each comes back with exact words and its f32 values not yet written
    /// ([`Backend::expand_stashed`] writes them). `None`: not made so here (the executor then
    /// runs [`Backend::forward`]).
    fn forward_words(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Vec<Self::Buffer>>, RuntimeError> {
        let _ = (kind, inputs);
        Ok(None)
    }

    /// `kind`'s results, each that `as_words` marks (every later reader of it reads it only as
    /// bf16 words, and the plan stores it in bf16) made as words alone where this backend can,
    /// the others as [`Backend::forward`] makes them; each with whether it was made so. For
    /// results only some of which are read so (a linear's input gradient beside its weight's);
    /// where all are, [`Backend::forward_words`]. `None`: not made so here.
    fn forward_some_words(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        as_words: &[bool],
    ) -> Result<Option<SomeWords<Self::Buffer>>, RuntimeError> {
        let _ = (kind, inputs, as_words);
        Ok(None)
    }

    /// Whether this backend runs [`Backend::forward_biased`]: the executor then runs a biased
    /// linear whose only reader is an addition without its bias, and the addition adds it.
    fn sums_with_bias(&self) -> bool {
        false
    }

    /// Binary `kind` (an addition after a projection) on `inputs` laid out as its output,
    /// operand `side` of which is a biased linear's product without its `bias`, added here in
    /// the same pass; with `twin`, made with its bf16 twin ([`Backend::forward_with_twin`]).
    /// `None` where this backend cannot (where [`Backend::sums_with_bias`], an error follows).
    fn forward_biased(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        side_bias: (usize, &Self::Buffer),
        twin: bool,
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        let _ = (kind, inputs, side_bias, twin);
        Ok(None)
    }

    /// `kind`'s result (one) held with its rows at a padded pitch, as a bf16 GEMM writes them
    /// where a row is not a whole number of 16-byte words (an LM head's logits over a
    /// vocabulary of odd width), or held as the bf16 operand (rows padded the same way) that a
    /// product's backward GEMMs read (the cross-entropy's gradient, which the LM head's
    /// backward reads next), for a result every reader of which reads it so
    /// ([`Backend::reads_pitched`]): no copy makes it dense, and the operand's f32 values are
    /// never made. `None`: not made so here.
    fn forward_pitched(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        let _ = (kind, inputs);
        Ok(None)
    }

    /// Whether this backend's op `kind`, on inputs of `shapes`, reads input `operand` where it
    /// lies when it is held at a pitch ([`Backend::forward_pitched`]); every other reader needs
    /// [`Backend::expand_stashed`] first, which makes it dense.
    fn reads_pitched(&self, kind: &OpKind, shapes: &[&[usize]], operand: usize) -> bool {
        let _ = (kind, shapes, operand);
        false
    }

    /// `kind`'s result (one) with its bf16 twin made by the same launch, for a result the
    /// executor stashes right after or a bf16 GEMM reads as its output gradient
    /// ([`Executor::twin_results`](crate::exec)): the words are those the stash or the GEMM
    /// would make of it. `None`: not made so here (the executor then runs
    /// [`Backend::forward`]).
    fn forward_with_twin(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        let _ = (kind, inputs);
        Ok(None)
    }

    /// Attention's forward (`kind` an `Attention`) that also returns what its backward would
    /// otherwise recompute: each query row's log-sum-exp, FlashAttention-2's saved statistic
    /// (the program's `saves`). With `as_words` (every reader of the output reads it only as
    /// bf16 words: [`Backend::forward_words`]) the output may be made as words alone. `None`
    /// where this backend keeps nothing (the executor then runs [`Backend::forward`]).
    fn attention_forward_keeping(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        as_words: bool,
    ) -> Result<Option<KeptForward<Self::Buffer>>, RuntimeError> {
        let _ = (kind, inputs, as_words);
        Ok(None)
    }

    /// `[dq, dk, dv]` of attention `kind` on `xs` (q, k, v) and output gradient `dy`, from the
    /// forward's output `out` and what [`Backend::attention_forward_keeping`] kept. With
    /// `as_words` (every reader of the gradients reads them only as bf16 words:
    /// [`Backend::forward_words`]) they may be made as words alone. `None` where this backend
    /// cannot (the executor then runs the `Grad`, which recomputes).
    fn attention_backward_kept(
        &self,
        kind: &OpKind,
        xs: &[&Self::Buffer],
        [dy, out, kept]: [&Self::Buffer; 3],
        as_words: bool,
    ) -> Result<Option<KeptBackward<Self::Buffer>>, RuntimeError> {
        let _ = (kind, xs, dy, out, kept, as_words);
        Ok(None)
    }

    /// Whether attention `kind` reads q, k and v of shapes `parts` as the column blocks of one
    /// buffer, `[q | k | v]` along the last axis (a fused projection's output, which the
    /// executor then never splits: [`crate::exec`]'s `packed`), in
    /// [`Backend::attention_forward_keeping_packed`] and
    /// [`Backend::attention_backward_kept_packed`].
    fn reads_packed_qkv(&self, kind: &OpKind, parts: [&[usize]; 3]) -> bool {
        let _ = (kind, parts);
        false
    }

    /// [`Backend::attention_forward_keeping`] with q, k and v the column blocks of `qkv`, of
    /// shapes `parts` ([`Backend::reads_packed_qkv`]). `None` where this backend cannot.
    fn attention_forward_keeping_packed(
        &self,
        kind: &OpKind,
        qkv: &Self::Buffer,
        parts: [&[usize]; 3],
        as_words: bool,
    ) -> Result<Option<KeptForward<Self::Buffer>>, RuntimeError> {
        let _ = (kind, qkv, parts, as_words);
        Ok(None)
    }

    /// [`Backend::attention_backward_kept`] with q, k and v the column blocks of `qkv`, of
    /// shapes `parts`; the gradients come apart (`[dq, dk, dv]`), or with `grads_packed` as one
    /// buffer laid out as `qkv` (`[dqkv]`: what concatenating them would make). `None` where
    /// this backend cannot.
    fn attention_backward_kept_packed(
        &self,
        kind: &OpKind,
        qkv: &Self::Buffer,
        parts: [&[usize]; 3],
        kept: [&Self::Buffer; 3],
        (as_words, grads_packed): (bool, bool),
    ) -> Result<Option<KeptBackward<Self::Buffer>>, RuntimeError> {
        let _ = (kind, qkv, parts, kept, as_words, grads_packed);
        Ok(None)
    }

    /// Whether this backend's op `kind`, on inputs of `shapes`, reads input `operand` only as
    /// the bf16 words a stash holds (a bf16 GEMM's operand), never as f32: the executor then
    /// brings such a buffer back from the stash without expanding it
    /// ([`Backend::unstash_bf16_words`]).
    fn reads_stashed_words(&self, kind: &OpKind, shapes: &[&[usize]], operand: usize) -> bool {
        let _ = (kind, shapes, operand);
        false
    }

    /// A [`Backend::stash_bf16`] buffer back with `shape` and its words, its f32 values not
    /// written: only an op that [`Backend::reads_stashed_words`] may read it before
    /// [`Backend::expand_stashed`] writes them.
    fn unstash_bf16_words(
        &self,
        words: Self::Buffer,
        shape: &[usize],
    ) -> Result<Self::Buffer, RuntimeError> {
        self.unstash_bf16(words, shape)
    }

    /// Writes the f32 values of a buffer [`Backend::unstash_bf16_words`] gave back.
    fn expand_stashed(&self, x: &mut Self::Buffer) -> Result<(), RuntimeError> {
        let _ = x;
        Ok(())
    }

    /// A [`Backend::stash_bf16`] buffer back in f32, with `shape`.
    fn unstash_bf16(
        &self,
        words: Self::Buffer,
        shape: &[usize],
    ) -> Result<Self::Buffer, RuntimeError> {
        let _ = shape;
        Ok(words)
    }

    /// `c[m,n] = a[m,k] · b[k,n]` on 2-D row-major buffers, allocating `c`.
    fn sgemm(&self, a: &Self::Buffer, b: &Self::Buffer) -> Result<Self::Buffer, RuntimeError>;

    /// The device allocator's counters and high-water marks, where it keeps them (the CUDA
    /// backend's caching pool); `None` on the host.
    fn memory_stats(&self) -> Option<MemoryStats> {
        None
    }

    /// The host transfers this backend has made, where it counts them (the CUDA backend:
    /// every upload, download and op it runs on the host); `None` on the host.
    /// The kernel launches so far, by kernel, where the backend counts them (the dry device:
    /// [`launches`]).
    fn launch_tally(&self) -> Option<launches::LaunchTally> {
        None
    }

    fn transfer_stats(&self) -> Option<TransferStats> {
        None
    }

    /// Waits until all queued work has finished (a no-op on the CPU).
    fn synchronize(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// Host transfers of a device backend: the goal is one upload (the batch) and one download
/// (the loss) per step; every op without a device kernel adds a round trip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub uploads: u64,
    pub upload_bytes: u64,
    pub downloads: u64,
    pub download_bytes: u64,
    /// Ops run on the host (their operands downloaded, their results uploaded).
    pub host_ops: u64,
}

impl TransferStats {
    /// The transfers made after `earlier` was taken.
    pub fn since(self, earlier: TransferStats) -> TransferStats {
        TransferStats {
            uploads: self.uploads.saturating_sub(earlier.uploads),
            upload_bytes: self.upload_bytes.saturating_sub(earlier.upload_bytes),
            downloads: self.downloads.saturating_sub(earlier.downloads),
            download_bytes: self.download_bytes.saturating_sub(earlier.download_bytes),
            host_ops: self.host_ops.saturating_sub(earlier.host_ops),
        }
    }

    /// The mean of `self` over `steps` steps.
    pub fn per_step(self, steps: u64) -> TransferStats {
        let n = steps.max(1);
        TransferStats {
            uploads: self.uploads / n,
            upload_bytes: self.upload_bytes / n,
            downloads: self.downloads / n,
            download_bytes: self.download_bytes / n,
            host_ops: self.host_ops / n,
        }
    }

    /// Both counts together.
    pub fn plus(self, other: TransferStats) -> TransferStats {
        TransferStats {
            uploads: self.uploads + other.uploads,
            upload_bytes: self.upload_bytes + other.upload_bytes,
            downloads: self.downloads + other.downloads,
            download_bytes: self.download_bytes + other.download_bytes,
            host_ops: self.host_ops + other.host_ops,
        }
    }
}

/// An attention forward's output and the row statistic it keeps for its gradient
/// ([`Backend::attention_forward_keeping`]).
#[derive(Debug)]
pub struct KeptForward<T> {
    pub out: T,
    /// Each query row's log-sum-exp, `[batch · heads · sq]`.
    pub stats: T,
    /// Whether `out` was made as bf16 words alone (its f32 values not written).
    pub out_as_words: bool,
}

/// Results each with whether it was made as bf16 words alone
/// ([`Backend::forward_some_words`]).
pub type SomeWords<T> = Vec<(T, bool)>;

/// An attention's gradients from what its forward kept ([`Backend::attention_backward_kept`]).
#[derive(Debug)]
pub struct KeptBackward<T> {
    /// `[dq, dk, dv]`.
    pub grads: Vec<T>,
    /// Whether they were made as bf16 words alone (their f32 values not written).
    pub as_words: bool,
}

/// Checks the operands of [`Backend::sgemm`]: `(m, k, n)`.
/// AdamW (`kernels::adamw_frozen_variance`) on host copies of a backend's buffers, written
/// back: the path of backends without their own optimizer kernel.
pub(crate) fn adamw_on_host<B: Backend + ?Sized>(
    b: &B,
    cfg: &AdamWConfig,
    [param, m, v]: [&mut B::Buffer; 3],
    grad: &B::Buffer,
    step: u64,
    frozen_after: Option<u64>,
) -> Result<(), RuntimeError> {
    let (mut p, g) = (b.download(param)?, b.download(grad)?);
    let (mut mh, mut vh) = (b.download(m)?, b.download(v)?);
    kernels::adamw_frozen_variance(cfg, &mut p, &g, &mut mh, &mut vh, step, frozen_after)
        .map_err(RuntimeError::kernel("adamw"))?;
    // The old buffers go back through the backend (a device pool keeps their memory).
    b.free(std::mem::replace(param, b.upload_owned(p)?));
    b.free(std::mem::replace(m, b.upload_owned(mh)?));
    b.free(std::mem::replace(v, b.upload_owned(vh)?));
    Ok(())
}

pub(crate) fn sgemm_dims(a: &[usize], b: &[usize]) -> Result<(usize, usize, usize), RuntimeError> {
    match (a, b) {
        (&[m, k], &[k2, n]) if k == k2 => Ok((m, k, n)),
        _ => Err(RuntimeError::Kernel {
            op: "sgemm",
            source: kernels::KernelError::Shape {
                op: "sgemm",
                what: "operands",
                got: [a, b].concat(),
                want: format!("a[m, k] and b[k, n], got {a:?} and {b:?}"),
            },
        }),
    }
}

/// A context-parallel op's CPU kernel, as [`Backend::through_host`] runs it (the default
/// backend's path, and a device's for an op it does not lower).
pub(crate) fn context_on_host<'k>(
    kind: &'k OpKind,
    at: kernels::Chunks,
    acc: kernels::Accumulate,
) -> impl FnOnce(&[&Tensor32]) -> Result<Vec<Tensor32>, RuntimeError> + 'k {
    move |ts| {
        kernels::context_forward_with(kind, ts, at, acc)
            .map_err(RuntimeError::kernel(kind.mnemonic()))
    }
}

#[cfg(test)]
mod tests {
    use super::TransferStats;

    #[test]
    fn transfer_counts_difference_sum_and_mean() {
        let t = |n: u64| TransferStats {
            uploads: n,
            upload_bytes: 4 * n,
            downloads: 2 * n,
            download_bytes: 8 * n,
            host_ops: 3 * n,
        };
        assert_eq!(t(10).since(t(4)), t(6));
        assert_eq!(t(4).since(t(10)), t(0), "never negative");
        assert_eq!(t(2).plus(t(3)), t(5));
        assert_eq!(t(9).per_step(3), t(3));
        assert_eq!(t(9).per_step(0), t(9), "no steps: the total");
    }
}
