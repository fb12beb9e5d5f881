//! [`DeviceBackend`]: the [`Backend`] of a [`Device`], with the host fallback and its counters.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use ir::{AdamWConfig, Binding, OpKind};
use kernels::Tensor32;

use super::{Device, Gemm, GemmPrecision, KernelArg, ops};
use crate::Communicator;
use crate::RuntimeError;
use crate::backend::collectives::{Collectives, DeviceCollective};
use crate::backend::vocab::VocabShard;
use crate::backend::{Backend, DropoutMask, MemoryStats, Stashed, TransferStats, sgemm_dims};

/// plait's ops on a [`Device`]: kernels where `ops` has a lowering, the host otherwise.
#[derive(Debug)]
pub struct DeviceBackend<D: Device> {
    pub(crate) device: D,
    transfers: Arc<Transfers>,
    /// Small constant tables the kernels read (rotary frequencies), uploaded once by key.
    tables: Mutex<HashMap<String, D::Mem>>,
    /// What the ops' GEMMs multiply in ([`Backend::sgemm`] is always f32).
    pub(crate) gemm_precision: GemmPrecision,
    /// Collectives on this device's buffers (NCCL); `None`: the executor stages them
    /// through the host.
    collectives: Option<Arc<dyn Collectives<D::Mem>>>,
}

/// A handle on a [`DeviceBackend`]'s host-op counts that outlives the backend (a training run
/// takes the backend by value).
#[derive(Clone, Debug)]
pub struct HostOps(Arc<Transfers>);

impl HostOps {
    /// The ops run on the host so far, by name (`linear`, `attention backward`), most frequent
    /// first: the ops that still lack a device lowering.
    pub fn by_kind(&self) -> Vec<(String, u64)> {
        let kinds = self
            .0
            .host_kinds
            .lock()
            .map(|k| k.clone())
            .unwrap_or_default();
        let mut v: Vec<_> = kinds.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// A dense row-major f32 tensor in a device's memory.
#[derive(Debug)]
pub struct DeviceBuffer<M> {
    pub(crate) shape: Vec<usize>,
    /// Element count of `shape`; `mem` holds at least `len.max(1)` elements (devices refuse
    /// empty allocations).
    pub(crate) len: usize,
    pub(crate) mem: M,
    /// `mem` rounded to bf16, two to a word in order (`⌈len / 2⌉` words: the stash's layout),
    /// where a bf16 GEMM made that copy of it or the buffer came back from the stash: a later
    /// GEMM reads it as it is, and stashing the buffer keeps it, instead of converting `mem`
    /// again (`ops::matmul::bf16_twin`). Ops take their inputs by shared reference and write
    /// only buffers they allocate; every [`crate::Backend`] method that writes a buffer in
    /// place (`fill_in_place`, `adamw`) drops its twin first ([`DeviceBackend::written`]).
    pub(crate) bf16: OnceLock<M>,
    /// The twin holds exactly `mem`'s values (the buffer came back from the stash, so its
    /// f32 values are the words expanded, or are not written yet): any kernel may read the
    /// words instead ([`DeviceBuffer::exact_bf16`]). A twin a GEMM made is `mem` rounded,
    /// which only a bf16 GEMM may read in its place.
    pub(crate) bf16_exact: bool,
    /// `mem` is a one-element placeholder, not `len` elements: a buffer made as words alone
    /// (a result every reader of which reads only its words, or one back from the stash so)
    /// holds no f32 memory until something writes its f32 values
    /// ([`DeviceBackend::ensure_f32`]), so that it costs the plan's bf16 bytes, not 1.5 times
    /// them.
    pub(crate) f32_lazy: bool,
    /// `mem` holds the rows (of the last dim) this many elements apart, not densely: a bf16
    /// GEMM's product written at its padded pitch (an LM head's logits over a vocabulary of odd
    /// width), which only kernels that take a pitch read as it lies (the cross-entropy's,
    /// `Backend::reads_pitched`); [`DeviceBackend::make_dense`] copies it out before anything
    /// else reads it. With [`DeviceBuffer::f32_lazy`] the rows lie so in the twin instead, as
    /// the bf16 words of a GEMM's operand alone ([`DeviceBackend::alloc_operand`]: the
    /// cross-entropy's gradient, which only the LM head's backward GEMM reads).
    pub(crate) pitch: Option<usize>,
}

impl<M> DeviceBuffer<M> {
    /// The bf16 words that hold exactly this buffer's values, where it has them.
    pub(crate) fn exact_bf16(&self) -> Option<&M> {
        self.bf16.get().filter(|_| self.bf16_exact)
    }
}

/// Counters of [`TransferStats`], shared by the threads that use the backend.
#[derive(Debug, Default)]
struct Transfers {
    uploads: AtomicU64,
    upload_bytes: AtomicU64,
    downloads: AtomicU64,
    download_bytes: AtomicU64,
    host_ops: AtomicU64,
    /// Host ops by op mnemonic (which ops still lack a device lowering).
    host_kinds: Mutex<BTreeMap<String, u64>>,
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

/// A host op's name: the mnemonic, and for a gradient the op it differentiates.
fn host_op_name(kind: &OpKind) -> String {
    match kind {
        OpKind::Grad { of, .. } => format!("{} backward", of.mnemonic()),
        k => k.mnemonic().to_owned(),
    }
}

/// An error where `x`'s f32 values are not held as `len` dense elements (held as bf16 words
/// alone, or at a padded pitch): the executor expands such a buffer before `op`, which reads
/// them so.
fn dense_f32<M>(op: &'static str, x: &DeviceBuffer<M>) -> Result<(), RuntimeError> {
    if !x.f32_lazy && x.pitch.is_none() {
        return Ok(());
    }
    Err(RuntimeError::DeviceLaunch {
        kernel: op,
        message: "an operand's f32 values are not held densely (bf16 words alone, or a padded \
                  row pitch): expand it first"
            .into(),
    })
}

/// An error where a buffer held at a pitch reaches an op that reads rows densely (all but the
/// cross-entropy, and a product's gradient reading its output gradient as the GEMM operand it
/// is held as: the executor makes such a buffer dense before any other reader).
fn refuse_pitched<M>(kind: &OpKind, inputs: &[&DeviceBuffer<M>]) -> Result<(), RuntimeError> {
    let of = match kind {
        OpKind::Grad { of, .. } => of,
        k => k,
    };
    if matches!(of, OpKind::CrossEntropy) {
        return Ok(());
    }
    // A `Grad` op's output gradient is its last operand.
    let (dy, xs) = match (kind, inputs.split_last()) {
        (OpKind::Grad { .. }, Some((dy, xs))) => (Some(*dy), xs),
        _ => (None, inputs),
    };
    refuse_pitched_inputs(kind, xs)?;
    dy.map_or(Ok(()), |dy| refuse_pitched_grads(of, &[dy]))
}

/// [`refuse_pitched`] for the output gradients `dys` of `of`'s backward: a product's may be
/// held as its GEMM's operand ([`DeviceBackend::alloc_operand`]).
fn refuse_pitched_grads<M>(of: &OpKind, dys: &[&DeviceBuffer<M>]) -> Result<(), RuntimeError> {
    let product = matches!(of, OpKind::Linear { .. } | OpKind::MatMul);
    let operands: Vec<&DeviceBuffer<M>> = dys
        .iter()
        .copied()
        .filter(|x| !(product && x.f32_lazy && x.pitch.is_some()))
        .collect();
    refuse_pitched_inputs(of, &operands)
}

fn refuse_pitched_inputs<M>(
    kind: &OpKind,
    inputs: &[&DeviceBuffer<M>],
) -> Result<(), RuntimeError> {
    if inputs.iter().all(|x| x.pitch.is_none()) {
        return Ok(());
    }
    Err(RuntimeError::DeviceLaunch {
        kernel: "unpad_rows",
        message: format!(
            "{}: an operand is held at a padded row pitch; only the cross-entropy reads it so",
            kind.mnemonic()
        ),
    })
}

fn element_count(shape: &[usize]) -> Result<usize, RuntimeError> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|n| n.checked_mul(std::mem::size_of::<f32>()).is_some())
        .ok_or_else(|| RuntimeError::Cuda {
            op: "alloc",
            message: format!("a buffer of shape {shape:?} exceeds the address space"),
        })
}

impl<D: Device> DeviceBackend<D> {
    /// The backend of `device`.
    pub fn on(device: D) -> DeviceBackend<D> {
        DeviceBackend {
            device,
            transfers: Arc::default(),
            tables: Mutex::default(),
            gemm_precision: GemmPrecision::F32,
            collectives: None,
        }
    }

    /// The backend with collectives on its own buffers (see [`Collectives`]).
    pub fn with_collectives(
        mut self,
        collectives: Arc<dyn Collectives<D::Mem>>,
    ) -> DeviceBackend<D> {
        self.collectives = Some(collectives);
        self
    }

    /// The backend with the ops' GEMMs in `precision`.
    pub fn with_gemm_precision(mut self, precision: GemmPrecision) -> DeviceBackend<D> {
        self.gemm_precision = precision;
        self
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// What the device reports of itself.
    pub fn properties(&self) -> super::DeviceProperties {
        self.device.properties()
    }

    /// Runs `f` on the constant table `key`, made by `make` (on the host) and uploaded the
    /// first time it is asked for: such tables are not per-step transfers.
    pub(crate) fn with_table<T>(
        &self,
        key: String,
        make: impl FnOnce() -> Vec<f32>,
        f: impl FnOnce(&D::Mem) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let mut tables = self.tables.lock().map_err(|_| RuntimeError::Poisoned {
            op: "device tables",
            reason: "a thread panicked while holding them".into(),
        })?;
        if !tables.contains_key(&key) {
            let host = make();
            let mut mem = self.device.alloc_zeros(host.len().max(1))?;
            if !host.is_empty() {
                self.device.upload(&host, &mut mem)?;
            }
            tables.insert(key.clone(), mem);
        }
        match tables.get(&key) {
            Some(mem) => f(mem),
            None => Err(RuntimeError::Poisoned {
                op: "device tables",
                reason: format!("table {key} vanished"),
            }),
        }
    }

    /// A handle on the counts of ops run on the host.
    pub fn host_ops(&self) -> HostOps {
        HostOps(Arc::clone(&self.transfers))
    }

    fn count_host_op(&self, name: String) {
        self.transfers.host_ops.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut kinds) = self.transfers.host_kinds.lock() {
            *kinds.entry(name).or_default() += 1;
        }
    }

    /// A buffer of `shape` for a kernel to write in full: its values are unspecified
    /// ([`Device::alloc`]).
    pub(crate) fn alloc(&self, shape: &[usize]) -> Result<DeviceBuffer<D::Mem>, RuntimeError> {
        let len = element_count(shape)?;
        Ok(DeviceBuffer {
            shape: shape.to_vec(),
            len,
            mem: self.device.alloc(len.max(1))?,
            bf16: OnceLock::new(),
            bf16_exact: false,
            f32_lazy: false,
            pitch: None,
        })
    }

    /// A buffer of `shape` held as its exact bf16 `words` alone (`⌈len / 2⌉` words): no f32
    /// memory until [`DeviceBackend::ensure_f32`].
    pub(crate) fn words_only(
        &self,
        shape: &[usize],
        words: D::Mem,
    ) -> Result<DeviceBuffer<D::Mem>, RuntimeError> {
        let placeholder = match self.device.alloc(1) {
            Ok(m) => m,
            Err(e) => {
                self.device.release(words);
                return Err(e);
            }
        };
        Ok(DeviceBuffer {
            shape: shape.to_vec(),
            len: element_count(shape)?,
            mem: placeholder,
            bf16: OnceLock::from(words),
            bf16_exact: true,
            f32_lazy: true,
            pitch: None,
        })
    }

    /// Gives `x` its `len` elements of f32 memory (values unwritten) where it holds only a
    /// placeholder ([`DeviceBuffer::f32_lazy`]): before anything writes its f32 values.
    pub(crate) fn ensure_f32(&self, x: &mut DeviceBuffer<D::Mem>) -> Result<(), RuntimeError> {
        if x.f32_lazy {
            let full = self.device.alloc(x.len.max(1))?;
            self.device.release(std::mem::replace(&mut x.mem, full));
            x.f32_lazy = false;
        }
        Ok(())
    }

    /// A buffer of `shape` whose rows (of the last dim) lie `pitch` elements apart in its
    /// memory ([`DeviceBuffer::pitch`]), values unwritten.
    pub(crate) fn alloc_pitched(
        &self,
        shape: &[usize],
        pitch: usize,
    ) -> Result<DeviceBuffer<D::Mem>, RuntimeError> {
        let len = element_count(shape)?;
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let held = element_count(&[len / cols, pitch])?;
        Ok(DeviceBuffer {
            shape: shape.to_vec(),
            len,
            mem: self.device.alloc(held.max(1))?,
            bf16: OnceLock::new(),
            bf16_exact: false,
            f32_lazy: false,
            pitch: Some(pitch),
        })
    }

    /// A buffer of `shape` held as a bf16 GEMM's operand alone ([`DeviceBuffer::pitch`] with
    /// [`DeviceBuffer::f32_lazy`]): its twin holds the rows (of the last dim) as bf16 words
    /// `pitch` elements apart, as `to_bf16` copies an operand ([`bf16_gemm::copy_layout`]),
    /// values unwritten; no f32 memory. Only a product's gradient reads it so
    /// (`ops::reads_pitched`); [`DeviceBackend::make_dense`] expands it for anything else.
    pub(crate) fn alloc_operand(
        &self,
        shape: &[usize],
        pitch: usize,
    ) -> Result<DeviceBuffer<D::Mem>, RuntimeError> {
        let len = element_count(shape)?;
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let words = element_count(&[len / cols, pitch])?.div_ceil(2);
        let words = self.device.alloc(words.max(1))?;
        let mut x = self.words_only(shape, words)?;
        x.bf16_exact = false;
        x.pitch = Some(pitch);
        Ok(x)
    }

    /// Whether `x` is held as a bf16 GEMM's operand alone ([`DeviceBackend::alloc_operand`]).
    pub(crate) fn is_operand(x: &DeviceBuffer<D::Mem>) -> bool {
        x.f32_lazy && x.pitch.is_some()
    }

    /// `x`'s rows copied out densely (`unpad_rows`) into new memory, where `x` holds them at a
    /// pitch; `None` where it is dense already.
    pub(crate) fn dense_copy(
        &self,
        x: &DeviceBuffer<D::Mem>,
    ) -> Result<Option<D::Mem>, RuntimeError> {
        let Some(pitch) = x.pitch else {
            return Ok(None);
        };
        let cols = x.shape.last().copied().unwrap_or(1).max(1);
        let rows = x.len / cols;
        // An operand held as its words alone: expanded at its pitch first (`from_bf16`).
        let wide = if Self::is_operand(x) {
            Some(self.expanded_at_pitch(x, rows * pitch)?)
        } else {
            None
        };
        let dense = self.device.alloc(x.len.max(1));
        let launched = dense.and_then(|mut dense| {
            let i = |n: usize| KernelArg::I64(i64::try_from(n).unwrap_or(i64::MAX));
            let launched = self.device.launch(
                "unpad_rows",
                ops::row_grid(rows),
                self.device.block_size(),
                &mut [
                    KernelArg::Out(&mut dense),
                    KernelArg::In(wide.as_ref().unwrap_or(&x.mem)),
                    i(rows),
                    i(cols),
                    i(pitch),
                    i(0),
                ],
            );
            match launched {
                Ok(()) => Ok(dense),
                Err(e) => {
                    self.device.release(dense);
                    Err(e)
                }
            }
        });
        if let Some(w) = wide {
            self.device.release(w);
        }
        launched.map(Some)
    }

    /// The f32 values (`len` of them, at the buffer's pitch) of operand-form `x`'s words.
    fn expanded_at_pitch(
        &self,
        x: &DeviceBuffer<D::Mem>,
        len: usize,
    ) -> Result<D::Mem, RuntimeError> {
        let words = x.bf16.get().ok_or_else(|| RuntimeError::DeviceLaunch {
            kernel: "from_bf16",
            message: "an operand held as words alone has no words".into(),
        })?;
        let mut wide = self.device.alloc(len.max(1))?;
        let block = self.device.block_size();
        let launched = self.device.launch(
            "from_bf16",
            ops::stream_grid(block, len.div_ceil(2)),
            block,
            &mut [
                KernelArg::Out(&mut wide),
                KernelArg::In(words),
                KernelArg::I64(i64::try_from(len).unwrap_or(i64::MAX)),
            ],
        );
        match launched {
            Ok(()) => Ok(wide),
            Err(e) => {
                self.device.release(wide);
                Err(e)
            }
        }
    }

    /// Makes `x` dense where it is held at a pitch (as f32, or as an operand's words alone:
    /// its padded words then go).
    pub(crate) fn make_dense(&self, x: &mut DeviceBuffer<D::Mem>) -> Result<(), RuntimeError> {
        if let Some(dense) = self.dense_copy(x)? {
            self.device.release(std::mem::replace(&mut x.mem, dense));
            x.pitch = None;
            if x.f32_lazy {
                x.f32_lazy = false;
                if let Some(words) = x.bf16.take() {
                    self.device.release(words);
                }
            }
        }
        Ok(())
    }

    /// Drops `x`'s f32 memory for a placeholder: its values are its exact twin's, and nothing
    /// reads them as f32 before [`DeviceBackend::ensure_f32`] (a result made as words, whose
    /// kernel needed the f32 memory as scratch).
    pub(crate) fn drop_f32(&self, x: &mut DeviceBuffer<D::Mem>) -> Result<(), RuntimeError> {
        if x.exact_bf16().is_some() && !x.f32_lazy {
            let placeholder = self.device.alloc(1)?;
            self.device
                .release(std::mem::replace(&mut x.mem, placeholder));
            x.f32_lazy = true;
        }
        Ok(())
    }

    /// A zeroed buffer of `shape` (accumulators, and outputs a kernel writes only in part).
    pub(crate) fn alloc_zeroed(
        &self,
        shape: &[usize],
    ) -> Result<DeviceBuffer<D::Mem>, RuntimeError> {
        let len = element_count(shape)?;
        Ok(DeviceBuffer {
            shape: shape.to_vec(),
            len,
            mem: self.device.alloc_zeros(len.max(1))?,
            bf16: OnceLock::new(),
            bf16_exact: false,
            f32_lazy: false,
            pitch: None,
        })
    }

    /// `r`, having aborted the device communicators where it is a device timeout: their
    /// kernels may be waiting for a rank that is gone (`backend::watchdog`).
    fn aborting_on_timeout<T>(&self, r: Result<T, RuntimeError>) -> Result<T, RuntimeError> {
        if let Err(RuntimeError::DeviceTimeout { .. }) = &r
            && let Some(c) = &self.collectives
        {
            c.abort();
        }
        r
    }

    /// Drops `x`'s bf16 twin before `mem` is written in place (its words would be stale), and
    /// gives it its f32 memory where it held none.
    pub(crate) fn written(&self, x: &mut DeviceBuffer<D::Mem>) -> Result<(), RuntimeError> {
        // Dense first: a GEMM operand's words alone are its only values.
        self.make_dense(x)?;
        if let Some(twin) = x.bf16.take() {
            self.device.release(twin);
        }
        x.bf16_exact = false;
        self.ensure_f32(x)
    }

    /// Runs a CPU kernel on downloaded operands (the path of ops without a device lowering).
    fn on_host<T>(
        &self,
        name: String,
        buffers: &[&DeviceBuffer<D::Mem>],
        run: impl FnOnce(&[&Tensor32]) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        self.count_host_op(name);
        let host: Vec<Tensor32> = buffers
            .iter()
            .map(|b| self.download(b))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&Tensor32> = host.iter().collect();
        run(&refs)
    }

    /// `x`'s values on the host from its exact bf16 words (a buffer made as words, or back
    /// from the stash, may have no f32 values written yet).
    fn download_words(
        &self,
        x: &DeviceBuffer<D::Mem>,
        words: &D::Mem,
    ) -> Result<Tensor32, RuntimeError> {
        let t = &self.transfers;
        let n = x.len.div_ceil(2);
        Transfers::count(&t.downloads, &t.download_bytes, n);
        let mut w = vec![0.0f32; n];
        if n > 0 {
            self.aborting_on_timeout(self.device.download(words, &mut w))?;
        }
        let data = (0..x.len)
            .map(|i| {
                let word = w[i / 2].to_bits();
                f32::from_bits(if i % 2 == 0 {
                    word << 16
                } else {
                    word & 0xffff_0000
                })
            })
            .collect();
        Tensor32::new(x.shape.clone(), data).map_err(RuntimeError::kernel("download"))
    }
}

impl<D: Device> Backend for DeviceBackend<D> {
    type Buffer = DeviceBuffer<D::Mem>;

    fn name(&self) -> String {
        match self.gemm_precision {
            GemmPrecision::F32 => self.device.name(),
            GemmPrecision::Bf16 => format!("{}, bf16 GEMMs", self.device.name()),
        }
    }

    fn zeros(&self, shape: &[usize]) -> Result<Self::Buffer, RuntimeError> {
        self.alloc_zeroed(shape)
    }

    fn free(&self, buffer: Self::Buffer) {
        if let Some(twin) = buffer.bf16.into_inner() {
            self.device.release(twin);
        }
        self.device.release(buffer.mem);
    }

    fn shape<'b>(&self, buffer: &'b Self::Buffer) -> &'b [usize] {
        &buffer.shape
    }

    fn holds_words_alone(&self, buffer: &Self::Buffer) -> bool {
        buffer.f32_lazy
    }

    fn upload(&self, host: &Tensor32) -> Result<Self::Buffer, RuntimeError> {
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
            self.device.upload(&host.data, &mut buf.mem)?;
        }
        Ok(buf)
    }

    /// From the buffer's exact bf16 words where it has them (its f32 values may not be
    /// written), else its f32 values.
    fn download(&self, buffer: &Self::Buffer) -> Result<Tensor32, RuntimeError> {
        if let Some(words) = buffer.exact_bf16() {
            return self.download_words(buffer, words);
        }
        let dense = self.dense_copy(buffer)?;
        let t = &self.transfers;
        Transfers::count(&t.downloads, &t.download_bytes, buffer.len);
        let mut data = vec![0.0f32; buffer.len];
        let mem = dense.as_ref().unwrap_or(&buffer.mem);
        let got = if buffer.len > 0 {
            self.aborting_on_timeout(self.device.download(mem, &mut data))
        } else {
            Ok(())
        };
        if let Some(d) = dense {
            self.device.release(d);
        }
        got?;
        Tensor32::new(buffer.shape.clone(), data).map_err(RuntimeError::kernel("download"))
    }

    fn fill(&self, shape: &[usize], value: f32) -> Result<Self::Buffer, RuntimeError> {
        if value == 0.0 {
            return self.alloc_zeroed(shape);
        }
        let mut y = self.alloc(shape)?;
        if y.len > 0 {
            ops::fill(self, &mut y, value)?;
        }
        Ok(y)
    }

    fn fill_in_place(&self, buffer: &mut Self::Buffer, value: f32) -> Result<(), RuntimeError> {
        self.written(buffer)?;
        if buffer.len > 0 {
            ops::fill(self, buffer, value)?;
        }
        Ok(())
    }

    fn iota(&self, n: usize) -> Result<Self::Buffer, RuntimeError> {
        let mut y = self.alloc(&[n])?;
        if n > 0 {
            ops::iota(self, &mut y)?;
        }
        Ok(y)
    }

    fn dropout(&self, x: &Self::Buffer, mask: &DropoutMask) -> Result<Self::Buffer, RuntimeError> {
        ops::dropout(self, x, mask)
    }

    fn duplicate(&self, buffer: &Self::Buffer) -> Result<Self::Buffer, RuntimeError> {
        dense_f32("duplicate", buffer)?;
        let mut y = self.alloc(&buffer.shape)?;
        if buffer.len > 0 {
            self.device.copy(&buffer.mem, &mut y.mem, buffer.len)?;
        }
        Ok(y)
    }

    fn reshape(
        &self,
        mut buffer: Self::Buffer,
        shape: &[usize],
    ) -> Result<Self::Buffer, RuntimeError> {
        let n = element_count(shape)?;
        if n != buffer.len {
            return Err(RuntimeError::BadLength {
                op: "reshape",
                what: "buffer",
                got: buffer.len,
                want: n,
            });
        }
        // A pitch is the last dim's: rows of another width are made dense first.
        if buffer.pitch.is_some() && shape.last() != buffer.shape.last() {
            self.make_dense(&mut buffer)?;
        }
        buffer.shape = shape.to_vec();
        Ok(buffer)
    }

    fn context_op(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        at: kernels::Chunks,
        acc: kernels::Accumulate,
    ) -> Result<Vec<Self::Buffer>, RuntimeError> {
        if let Some(ys) = ops::context_op(self, kind, inputs, at)? {
            return Ok(ys);
        }
        self.count_host_op(format!("context {}", host_op_name(kind)));
        self.through_host(inputs, crate::backend::context_on_host(kind, at, acc))
    }

    fn vocab_shard(
        &self,
        op: &VocabShard,
        inputs: &[&Self::Buffer],
    ) -> Result<Vec<Self::Buffer>, RuntimeError> {
        if let Some(ys) = ops::vocab_shard(self, op, inputs)? {
            return Ok(ys);
        }
        self.count_host_op(op.name().to_owned());
        self.through_host(inputs, |ts| op.on_host(ts))
    }

    fn vocab_shard_pitched(
        &self,
        op: &VocabShard,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        ops::vocab_loss_grad_operand(self, op, inputs)
    }

    fn vocab_reads_pitched(&self, op: &VocabShard, operand: usize) -> bool {
        ops::vocab_reads_pitched(op, operand)
    }

    fn has_device_collectives(&self) -> bool {
        self.collectives.is_some()
    }

    fn device_exchange(
        &self,
        world: &dyn Communicator,
        sends: &[(&Self::Buffer, usize)],
        recvs: &[(Vec<usize>, usize)],
    ) -> Option<Result<Vec<Self::Buffer>, RuntimeError>> {
        let collectives = self.collectives.as_ref()?;
        let run = || {
            for (b, _) in sends {
                dense_f32("exchange", b)?;
            }
            let mut got = recvs
                .iter()
                .map(|(shape, _)| self.alloc(shape))
                .collect::<Result<Vec<_>, _>>()?;
            let out: Vec<(&D::Mem, usize, usize)> = sends
                .iter()
                .map(|(b, peer)| (&b.mem, b.len, *peer))
                .collect();
            let mut into: Vec<(&mut D::Mem, usize, usize)> = got
                .iter_mut()
                .zip(recvs)
                .map(|(b, (_, peer))| (&mut b.mem, b.len, *peer))
                .collect();
            collectives.exchange(world, &out, &mut into)?;
            drop(into);
            Ok(got)
        };
        Some(run())
    }

    fn device_collective(
        &self,
        group: &dyn Communicator,
        op: DeviceCollective,
        input: &Self::Buffer,
    ) -> Option<Result<Self::Buffer, RuntimeError>> {
        let collectives = self.collectives.as_ref()?;
        if let Err(e) = dense_f32("collective", input) {
            return Some(Err(e));
        }
        let n = op.out_len(input.len, group.size());
        Some(self.alloc(&[n]).and_then(|mut out| {
            collectives.run(group, op, &input.mem, input.len, &mut out.mem)?;
            Ok(out)
        }))
    }

    fn forward(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        binding: Binding,
    ) -> Result<Vec<Self::Buffer>, RuntimeError> {
        refuse_pitched(kind, inputs)?;
        if let Some(out) = ops::forward(self, kind, inputs, binding)? {
            return Ok(out);
        }
        let results = self.on_host(host_op_name(kind), inputs, |xs| {
            kernels::forward(kind, xs, binding).map_err(RuntimeError::kernel(kind.mnemonic()))
        })?;
        results.into_iter().map(|t| self.upload_owned(t)).collect()
    }

    fn backward(
        &self,
        kind: &OpKind,
        xs: &[&Self::Buffer],
        dys: &[&Self::Buffer],
    ) -> Result<Vec<Option<Self::Buffer>>, RuntimeError> {
        refuse_pitched(kind, xs)?;
        refuse_pitched_grads(kind, dys)?;
        if let Some(grads) = ops::backward(self, kind, xs, dys)? {
            return Ok(grads);
        }
        let all: Vec<&Self::Buffer> = xs.iter().chain(dys).copied().collect();
        let grads = self.on_host(format!("{} backward", kind.mnemonic()), &all, |ts| {
            let (x, dy) = ts.split_at(xs.len());
            kernels::backward(kind, x, dy).map_err(RuntimeError::kernel(kind.mnemonic()))
        })?;
        grads
            .into_iter()
            .map(|g| g.map(|t| self.upload_owned(t)).transpose())
            .collect()
    }

    fn adamw(
        &self,
        cfg: &AdamWConfig,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        step: u64,
    ) -> Result<(), RuntimeError> {
        for x in [&mut *param, &mut *m, &mut *v] {
            self.written(x)?;
        }
        ops::adamw(self, cfg, [param, m, v], grad, step, None)
    }

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
        for x in [&mut *param, &mut *m, &mut *v] {
            self.written(x)?;
        }
        ops::adamw(self, cfg, [param, m, v], grad, step, Some(frozen_after))
    }

    fn adamw_reads_grad_words(&self) -> bool {
        true
    }

    fn adamw_copy(
        &self,
        cfg: &AdamWConfig,
        [param, m, v]: [&mut Self::Buffer; 3],
        grad: &Self::Buffer,
        step: (u64, Option<u64>),
        copy: &mut Option<Self::Buffer>,
    ) -> Result<bool, RuntimeError> {
        for x in [&mut *param, &mut *m, &mut *v] {
            self.written(x)?;
        }
        ops::adamw_copy(self, cfg, [param, m, v], grad, step, copy)
    }

    /// `x`'s twin where it has one (made by a GEMM that read it), else its words made now.
    fn stash_bf16(&self, mut x: Self::Buffer) -> Result<Stashed<Self::Buffer>, RuntimeError> {
        self.make_dense(&mut x)?;
        let words = match x.bf16.take() {
            Some(twin) => DeviceBuffer {
                shape: vec![x.len.div_ceil(2)],
                len: x.len.div_ceil(2),
                mem: twin,
                bf16: OnceLock::new(),
                bf16_exact: false,
                f32_lazy: false,
                pitch: None,
            },
            None => ops::stash_bf16(self, &x)?,
        };
        self.free(x);
        Ok(Stashed::Words(words))
    }

    fn forward_words(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Vec<Self::Buffer>>, RuntimeError> {
        refuse_pitched(kind, inputs)?;
        ops::forward_words(self, kind, inputs)
    }

    fn forward_with_twin(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        refuse_pitched(kind, inputs)?;
        ops::forward_with_twin(self, kind, inputs)
    }

    fn attention_forward_keeping(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        as_words: bool,
    ) -> Result<Option<crate::backend::KeptForward<Self::Buffer>>, RuntimeError> {
        refuse_pitched(kind, inputs)?;
        ops::attention_forward_keeping(self, kind, inputs, as_words)
    }

    fn attention_backward_kept(
        &self,
        kind: &OpKind,
        xs: &[&Self::Buffer],
        dy_out_kept: [&Self::Buffer; 3],
        as_words: bool,
    ) -> Result<Option<crate::backend::KeptBackward<Self::Buffer>>, RuntimeError> {
        refuse_pitched(kind, xs)?;
        refuse_pitched(kind, &dy_out_kept)?;
        ops::attention_backward_kept(self, kind, xs, dy_out_kept, as_words)
    }

    fn reads_packed_qkv(&self, kind: &OpKind, parts: [&[usize]; 3]) -> bool {
        ops::attention_reads_packed(self, kind, parts)
    }

    fn attention_forward_keeping_packed(
        &self,
        kind: &OpKind,
        qkv: &Self::Buffer,
        parts: [&[usize]; 3],
        as_words: bool,
    ) -> Result<Option<crate::backend::KeptForward<Self::Buffer>>, RuntimeError> {
        refuse_pitched(kind, &[qkv])?;
        ops::attention_forward_keeping_packed(self, kind, qkv, parts, as_words)
    }

    fn attention_backward_kept_packed(
        &self,
        kind: &OpKind,
        qkv: &Self::Buffer,
        parts: [&[usize]; 3],
        kept: [&Self::Buffer; 3],
        form: (bool, bool),
    ) -> Result<Option<crate::backend::KeptBackward<Self::Buffer>>, RuntimeError> {
        refuse_pitched(kind, &[qkv])?;
        refuse_pitched(kind, &kept)?;
        ops::attention_backward_kept_packed(self, kind, qkv, parts, kept, form)
    }

    fn reads_stashed_words(&self, kind: &OpKind, shapes: &[&[usize]], operand: usize) -> bool {
        ops::reads_stashed_words(self, kind, shapes, operand)
    }

    /// An allocation of `shape` whose twin is `words`; its f32 values are written when
    /// [`Backend::expand_stashed`] asks (no kernel runs until then).
    fn unstash_bf16_words(
        &self,
        words: Self::Buffer,
        shape: &[usize],
    ) -> Result<Self::Buffer, RuntimeError> {
        ops::check_words(element_count(shape)?, &words)?;
        self.words_only(shape, words.mem)
    }

    /// Also makes a buffer held at a pitch dense ([`DeviceBackend::make_dense`]).
    fn expand_stashed(&self, x: &mut Self::Buffer) -> Result<(), RuntimeError> {
        if x.pitch.is_some() {
            return self.make_dense(x);
        }
        ops::expand_twin(self, x)
    }

    fn sums_with_bias(&self) -> bool {
        true
    }

    fn forward_biased(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        side_bias: (usize, &Self::Buffer),
        twin: bool,
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        ops::forward_biased(self, kind, inputs, side_bias, twin)
    }

    fn forward_some_words(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
        as_words: &[bool],
    ) -> Result<Option<crate::backend::SomeWords<Self::Buffer>>, RuntimeError> {
        refuse_pitched(kind, inputs)?;
        ops::some_words(self, kind, inputs, as_words)
    }

    fn forward_pitched(
        &self,
        kind: &OpKind,
        inputs: &[&Self::Buffer],
    ) -> Result<Option<Self::Buffer>, RuntimeError> {
        refuse_pitched(kind, inputs)?;
        ops::forward_pitched(self, kind, inputs)
    }

    fn reads_pitched(&self, kind: &OpKind, shapes: &[&[usize]], operand: usize) -> bool {
        ops::reads_pitched(self, kind, shapes, operand)
    }

    /// The f32 expansion, with the words kept as its twin: a GEMM that reads it next (a
    /// linear's weight or input, in the backward) takes them as they are, and a later stash
    /// keeps them.
    fn unstash_bf16(
        &self,
        words: Self::Buffer,
        shape: &[usize],
    ) -> Result<Self::Buffer, RuntimeError> {
        let mut x = ops::unstash_bf16(self, &words, shape)?;
        if let Err(twin) = x.bf16.set(words.mem) {
            self.device.release(twin);
        }
        x.bf16_exact = true;
        Ok(x)
    }

    fn sgemm(&self, a: &Self::Buffer, b: &Self::Buffer) -> Result<Self::Buffer, RuntimeError> {
        let (m, k, n) = sgemm_dims(&a.shape, &b.shape)?;
        dense_f32("sgemm", a)?;
        dense_f32("sgemm", b)?;
        let mut c = self.alloc_zeroed(&[m, n])?;
        if m > 0 && k > 0 && n > 0 {
            self.device
                .gemm(&Gemm::plain(m, k, n), &a.mem, &b.mem, &mut c.mem)?;
        }
        Ok(c)
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        self.device.memory_stats()
    }

    fn launch_tally(&self) -> Option<crate::backend::launches::LaunchTally> {
        self.device.launch_tally()
    }

    fn transfer_stats(&self) -> Option<TransferStats> {
        Some(self.transfers.stats())
    }

    fn synchronize(&self) -> Result<(), RuntimeError> {
        self.aborting_on_timeout(self.device.synchronize())
    }
}
