//! Training loops: every rank runs its program for a number of steps on the same token
//! stream. [`train_rank`] is one rank on any communicator (threads or MPI);
//! [`train_threads`] runs all ranks as threads of this process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use program::ProgramSet;

use crate::checkpoint;
use crate::data::Tokens;
use crate::exec::{Executor, Init, OpTimes, ShardState};
use crate::{Backend, Communicator, CpuBackend, CudaBackend, RuntimeError, ThreadComm};

/// Where and how often to checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointOptions {
    pub dir: PathBuf,
    /// Steps between checkpoints (0: only after the last step).
    pub every: u64,
    /// Start from the latest checkpoint in `dir` (any layout) instead of `init`.
    pub resume: bool,
}

/// What a training run does.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The step to train up to (a resumed run continues from its checkpoint's step).
    pub steps: u64,
    /// Seed of the data order (and of parameters when `init` is a seed).
    pub seed: u64,
    pub init: Init,
    /// Deadline of every communicator operation.
    pub timeout: Duration,
    pub checkpoint: Option<CheckpointOptions>,
    /// Record each rank's wall time per instruction kind (after the first step, a warm-up;
    /// [`RankOutcome::op_times`]).
    pub op_times: bool,
    /// Reproducible mode ([`CpuBackend::reproducible`]): a tensor-parallel run trains to one
    /// device's parameters. Applies to the backend [`TrainOptions::cpu_backend`] builds (as
    /// [`train_threads`] and `plait run` do); a caller of [`train_rank`] chooses its own.
    pub reproducible: bool,
    /// How data-parallel gradients are exchanged: compressed, or local SGD
    /// ([`crate::exec::dp_comm`]).
    pub dp_comm: crate::exec::dp_comm::DpComm,
    /// Where each rank's tensors live and its ops run.
    pub device: Device,
}

/// Where a rank's tensors live and its ops run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// This machine's CPU threads ([`CpuBackend`]).
    #[default]
    Cpu,
    /// A CUDA GPU ([`CudaBackend`]); rank `r` of a node uses GPU `r mod count`.
    Cuda,
    /// No device: the CUDA lowering on [`crate::backend::dry::DryDevice`], which runs no
    /// kernel and counts the memory a GPU's caching allocator would hold (losses are 0).
    Dry,
}

impl Device {
    /// How many of this device the machine has: 1 for the CPU; the visible GPUs for CUDA, or
    /// why there are none ([`RuntimeError::NotCompiledWithCudaSupport`] in a build without
    /// the `cuda` feature, [`RuntimeError::NoCudaDevice`] without a driver or GPU). Checks
    /// nothing else, so a caller can refuse at once, before building programs.
    pub fn available(self) -> Result<usize, RuntimeError> {
        match self {
            Device::Cpu | Device::Dry => Ok(1),
            Device::Cuda => match CudaBackend::device_count()? {
                0 => Err(RuntimeError::NoCudaDevice {
                    reason: "the CUDA driver sees no GPU".into(),
                }),
                n => Ok(n),
            },
        }
    }
}

impl TrainOptions {
    /// The CPU backend these options ask for.
    pub fn cpu_backend(&self) -> CpuBackend {
        if self.reproducible {
            CpuBackend::reproducible()
        } else {
            CpuBackend::new()
        }
    }
}

/// One finished step, as rank 0 reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLog {
    /// 1-based step number.
    pub step: u64,
    pub loss: f64,
    pub seconds: f64,
    /// Tokens of the global batch per second.
    pub tokens_per_s: f64,
    /// Seconds spent writing the checkpoint taken after this step, if one was.
    pub checkpoint_s: Option<f64>,
    /// On a resumed run's first step: the step its checkpoint was taken at and the seconds
    /// loading it took.
    pub resumed: Option<(u64, f64)>,
    /// Bytes this rank sent during the step, over all its communicators, as the ring
    /// algorithms send them ([`crate::comm::Counted`]).
    pub comm_bytes: u64,
}

/// One rank's result.
#[derive(Debug, Clone, PartialEq)]
pub struct RankOutcome {
    /// The loss of every step (identical on every rank).
    pub losses: Vec<f64>,
    /// Final parameter and optimizer state of this rank.
    pub states: Vec<ShardState>,
    /// Wall time per instruction kind, when [`TrainOptions::op_times`] asked for it.
    pub op_times: Option<OpTimes>,
    /// The device allocator's high-water marks, where the backend keeps them (CUDA).
    pub memory: Option<crate::backend::MemoryStats>,
    /// The step instruction that raised that high-water mark last.
    pub memory_peak_at: Option<crate::exec::peak::PeakAt>,
    /// Host transfers per step (the mean over this run's steps), where the backend counts
    /// them (CUDA).
    pub transfers_per_step: Option<crate::backend::TransferStats>,
    /// The last step's kernel launches, where the backend counts them (the dry device).
    pub launches_last_step: Option<crate::backend::launches::LaunchTally>,
}

/// Global batch size (sequences) of the programs.
pub fn global_rows(set: &ProgramSet) -> usize {
    (set.mesh.micro_batch
        * u64::from(set.mesh.micro_batches)
        * u64::from(set.mesh.batch_replicas())) as usize
}

/// Runs one rank: initialization, then `opts.steps` steps; `on_step` sees every step.
pub fn train_rank<B: Backend, C: Communicator>(
    set: &ProgramSet,
    backend: B,
    comm: C,
    data: &Tokens,
    opts: &TrainOptions,
    on_step: &(dyn Fn(u32, StepLog) + Sync),
) -> Result<RankOutcome, RuntimeError> {
    let comm = crate::comm::Counted::new(comm);
    let sent = comm.sent_bytes_handle();
    let mut ex = Executor::new(set, backend, comm)?;
    ex.set_dp_comm(opts.dp_comm)?;
    if let Some(c) = &opts.checkpoint {
        checkpoint::check_writable(&c.dir, ex.rank())?;
    }
    let mut resumed = None;
    match &opts.checkpoint {
        Some(c) if c.resume => {
            let t0 = Instant::now();
            let l = load_for_resume(set, ex.rank(), &c.dir, opts)?;
            ex.init(&Init::Weights(l.weights))?;
            ex.load_moments(&l.m, &l.v)?;
            ex.set_steps(l.step);
            if !opts.dp_comm.is_plain() {
                let named = checkpoint::load_local(&c.dir, ex.rank())?;
                ex.set_dp_residuals(named)
                    .map_err(|message| RuntimeError::Checkpoint {
                        path: c.dir.display().to_string(),
                        message,
                    })?;
            }
            resumed = Some((l.step, t0.elapsed().as_secs_f64()));
        }
        _ => ex.init(&opts.init)?,
    }
    let rows = global_rows(set);
    let seq = set.mesh.seq as usize;
    let mut losses = Vec::new();
    let first = ex.steps() + 1;
    let mut launches_last_step = None;
    let mut transfers = ex
        .transfer_stats()
        .map(|_| crate::backend::TransferStats::default());
    while ex.steps() < opts.steps {
        let step = ex.steps() + 1;
        // The first step is a warm-up (first touches of memory), unless it is the only one.
        if opts.op_times && (step > first || opts.steps == step) {
            ex.record_op_times();
        }
        let batch = data.batch(opts.seed, step, rows, seq)?;
        let t0 = Instant::now();
        let sent_before = sent.load(std::sync::atomic::Ordering::Relaxed);
        let transfers_before = ex.transfer_stats();
        let launches_before = ex.launch_tally();
        // A GPU rank that gives up waiting on its device asks the others who is missing.
        let loss = ex
            .step(&batch)
            .map_err(|e| crate::backend::watchdog::name_missing_rank(e, ex.world()))?;
        if let (Some(after), Some(before)) = (ex.launch_tally(), launches_before) {
            launches_last_step = Some(after.since(&before));
        }
        if let (Some(sum), Some(after), Some(before)) =
            (transfers.as_mut(), ex.transfer_stats(), transfers_before)
        {
            *sum = sum.plus(after.since(before));
        }
        let comm_bytes = sent.load(std::sync::atomic::Ordering::Relaxed) - sent_before;
        let seconds = t0.elapsed().as_secs_f64();
        losses.push(loss);
        let mut checkpoint_s = None;
        if let Some(c) = &opts.checkpoint
            && ((c.every > 0 && step.is_multiple_of(c.every)) || step == opts.steps)
        {
            let t0 = Instant::now();
            save(&ex, set, &c.dir, step)?;
            checkpoint_s = Some(t0.elapsed().as_secs_f64());
        }
        on_step(
            ex.rank(),
            StepLog {
                step,
                loss,
                seconds,
                tokens_per_s: (rows * seq) as f64 / seconds.max(1e-9),
                checkpoint_s,
                resumed: resumed.take(),
                comm_bytes,
            },
        );
    }
    let steps_run = losses.len() as u64;
    Ok(RankOutcome {
        losses,
        states: ex.shard_states()?,
        op_times: ex.op_times().cloned(),
        memory: ex.memory_stats(),
        memory_peak_at: ex.peak_at().cloned(),
        transfers_per_step: transfers.map(|t| t.per_step(steps_run)),
        launches_last_step,
    })
}

/// The checkpoint to resume from. A plain run reads every rank's pieces (any layout resumes).
/// A compressed or local-SGD run keeps per-rank state (top-k's and int8's residuals; under local SGD
/// each replica's own weights and moments between averages), so it resumes on the mesh that
/// wrote it, each rank from its own replica's pieces.
fn load_for_resume(
    set: &ProgramSet,
    rank: u32,
    dir: &std::path::Path,
    opts: &TrainOptions,
) -> Result<checkpoint::Loaded, RuntimeError> {
    if opts.dp_comm.is_plain() {
        return checkpoint::load_latest(dir, &set.params);
    }
    let my_dp = set.rank(rank).map(|r| r.coords.dp);
    let replica: Vec<u32> = set
        .ranks
        .iter()
        .filter(|r| Some(r.coords.dp) == my_dp)
        .map(|r| r.rank)
        .collect();
    let l = checkpoint::load_latest_of(dir, &set.params, Some(&replica))?;
    let m = &set.mesh;
    if l.mesh != [m.tp, m.pp, m.dp] || l.cp != m.cp.max(1) || l.ranks != set.ranks.len() {
        return Err(RuntimeError::Checkpoint {
            path: dir.display().to_string(),
            message: format!(
                "written by tp {} pp {} dp {} cp {} ({} ranks); {} keeps per-rank state \
                 (error-feedback residuals, local SGD's replicas), so it resumes on the same mesh \
                 (tp {} pp {} dp {} cp {})",
                l.mesh[0],
                l.mesh[1],
                l.mesh[2] / l.cp.max(1),
                l.cp,
                l.ranks,
                opts.dp_comm.describe(),
                m.tp,
                m.pp,
                m.batch_replicas(),
                m.cp.max(1)
            ),
        });
    }
    Ok(l)
}

/// Every rank writes its pieces (and, compressed, its residuals); once all have, rank 0
/// commits the checkpoint.
fn save<B: Backend, C: Communicator>(
    ex: &Executor<'_, B, C>,
    set: &ProgramSet,
    dir: &std::path::Path,
    step: u64,
) -> Result<(), RuntimeError> {
    checkpoint::save_rank(dir, step, ex.rank(), &set.params, &ex.shard_states()?)?;
    let residuals = ex.dp_residuals();
    if !residuals.is_empty() {
        checkpoint::save_local(dir, step, ex.rank(), &residuals)?;
    }
    ex.world().barrier()?;
    if ex.rank() == 0 {
        let m = &set.mesh;
        checkpoint::commit(
            dir,
            step,
            &set.model,
            ([m.tp, m.pp, m.dp], m.cp.max(1)),
            &set.params,
            set.ranks.len() as u32,
        )?;
    }
    ex.world().barrier()
}

/// [`train_rank`] on the backend `opts.device` names: the CPU, or GPU `local_rank mod count`
/// of this node (`local_rank`: the rank's index among this node's ranks).
pub fn train_rank_on_device<C: Communicator>(
    set: &ProgramSet,
    local_rank: usize,
    comm: C,
    data: &Tokens,
    opts: &TrainOptions,
    on_step: &(dyn Fn(u32, StepLog) + Sync),
) -> Result<RankOutcome, RuntimeError> {
    match opts.device {
        Device::Cpu => train_rank(set, opts.cpu_backend(), comm, data, opts, on_step),
        Device::Cuda => {
            let gpus = Device::Cuda.available()?;
            // A mixed-precision plan's GEMMs in bf16 on the tensor cores (autocast's choice).
            let precision = crate::GemmPrecision::of_plan(&set.mesh.precision);
            let backend = CudaBackend::new(local_rank % gpus)?
                .with_gemm_precision(precision)
                .with_device_timeout(device_timeout()?);
            let backend = with_nccl(backend, &comm, gpus)?;
            train_rank(set, backend, comm, data, opts, on_step)
        }
        Device::Dry => {
            let precision = crate::GemmPrecision::of_plan(&set.mesh.precision);
            let device = crate::backend::dry::DryDevice::new(true);
            let backend = crate::DeviceBackend::on(device).with_gemm_precision(precision);
            // As a GPU run takes NCCL where each rank has a GPU (`with_nccl`): the dry run
            // stands for that run, not for ranks sharing one GPU.
            let backend = if nccl_refused() {
                backend
            } else {
                backend.with_collectives(std::sync::Arc::new(crate::backend::dry::DryCollectives))
            };
            train_rank(set, backend, comm, data, opts, on_step)
        }
    }
}

/// How long a GPU rank waits on its device before it gives up (`backend::watchdog`):
/// `PLAIT_DEVICE_TIMEOUT` seconds, by default 600 (PyTorch's NCCL watchdog's).
fn device_timeout() -> Result<std::time::Duration, RuntimeError> {
    const VAR: &str = "PLAIT_DEVICE_TIMEOUT";
    match std::env::var(VAR) {
        Err(_) => Ok(crate::backend::watchdog::DEFAULT_DEVICE_TIMEOUT),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) if s > 0 => Ok(std::time::Duration::from_secs(s)),
            _ => Err(RuntimeError::Launch {
                var: VAR,
                value: v,
                reason: "is not a whole number of seconds above 0".into(),
            }),
        },
    }
}

/// `backend` with NCCL running its collectives where each rank of this node has a GPU of its
/// own (NCCL refuses two ranks on one GPU) and the library is there; otherwise the
/// collectives stage through the host communicator. `PLAIT_NCCL=0` asks for the latter.
#[cfg(feature = "cuda")]
fn with_nccl(
    backend: CudaBackend,
    world: &dyn Communicator,
    gpus: usize,
) -> Result<CudaBackend, RuntimeError> {
    let local: usize = [
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(world.size());
    if nccl_refused() || local > gpus || !crate::backend::nccl_present() {
        return Ok(backend);
    }
    let nccl = crate::backend::NcclCollectives::on(&backend)?;
    // The world's communicator now, while every rank is here: pipeline stages' point-to-point
    // messages use it, and only two ranks take part in each.
    crate::backend::collectives::Collectives::open(&nccl, world)?;
    Ok(backend.with_collectives(std::sync::Arc::new(nccl)))
}

/// Whether the user asked for collectives staged through the host (`PLAIT_NCCL=0`).
fn nccl_refused() -> bool {
    matches!(std::env::var("PLAIT_NCCL").as_deref(), Ok("0"))
}

/// Without the `cuda` feature there is no CUDA backend to attach NCCL to.
#[cfg(not(feature = "cuda"))]
fn with_nccl(
    backend: CudaBackend,
    _world: &dyn Communicator,
    _gpus: usize,
) -> Result<CudaBackend, RuntimeError> {
    Ok(backend)
}

/// Runs every rank as a thread of this process on `opts.device` (several ranks share a GPU
/// when there are fewer GPUs than ranks); returns the ranks' outcomes in rank order.
pub fn train_threads(
    set: &ProgramSet,
    data: &Tokens,
    opts: &TrainOptions,
    on_step: &(dyn Fn(u32, StepLog) + Sync),
) -> Result<Vec<RankOutcome>, RuntimeError> {
    let n = set.ranks.len();
    opts.device.available()?;
    let results = ThreadComm::run(n, opts.timeout, |c| {
        let rank = Communicator::rank(&c);
        train_rank_on_device(set, rank, c, data, opts, on_step)
    })?;
    // The first failure that is not a consequence of another rank's.
    let mut first: Option<RuntimeError> = None;
    let mut outs = Vec::with_capacity(n);
    for r in results {
        match r {
            Ok(o) => outs.push(o),
            Err(e) => {
                let secondary = matches!(root(&e), RuntimeError::Poisoned { .. });
                if first.is_none()
                    || (!secondary
                        && first
                            .as_ref()
                            .is_some_and(|f| matches!(root(f), RuntimeError::Poisoned { .. })))
                {
                    first = Some(e);
                }
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(outs),
    }
}

fn root(e: &RuntimeError) -> &RuntimeError {
    match e {
        RuntimeError::Instr { source, .. } => root(source),
        other => other,
    }
}
