//! Training loops: every rank runs its program for a number of steps on the same token
//! stream. [`train_rank`] is one rank on any communicator (threads or MPI);
//! [`train_threads`] runs all ranks as threads of this process.

use std::time::{Duration, Instant};

use codegen::ProgramSet;

use crate::data::Tokens;
use crate::exec::{Executor, Init, ShardState};
use crate::{Backend, Communicator, CpuBackend, RuntimeError, ThreadComm};

/// What a training run does.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Steps to run (after any resumed ones).
    pub steps: u64,
    /// Seed of the data order (and of parameters when `init` is a seed).
    pub seed: u64,
    pub init: Init,
    /// Deadline of every communicator operation.
    pub timeout: Duration,
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
}

/// One rank's result.
#[derive(Debug, Clone, PartialEq)]
pub struct RankOutcome {
    /// The loss of every step (identical on every rank).
    pub losses: Vec<f64>,
    /// Final parameter and optimizer state of this rank.
    pub states: Vec<ShardState>,
}

/// Global batch size (sequences) of the programs.
pub fn global_rows(set: &ProgramSet) -> usize {
    (set.mesh.micro_batch * u64::from(set.mesh.micro_batches) * u64::from(set.mesh.dp)) as usize
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
    let mut ex = Executor::new(set, backend, comm)?;
    ex.init(&opts.init)?;
    let rows = global_rows(set);
    let seq = set.mesh.seq as usize;
    let mut losses = Vec::new();
    for _ in 0..opts.steps {
        let step = ex.steps() + 1;
        let batch = data.batch(opts.seed, step, rows, seq)?;
        let t0 = Instant::now();
        let loss = ex.step(&batch)?;
        let seconds = t0.elapsed().as_secs_f64();
        losses.push(loss);
        on_step(
            ex.rank(),
            StepLog {
                step,
                loss,
                seconds,
                tokens_per_s: (rows * seq) as f64 / seconds.max(1e-9),
            },
        );
    }
    Ok(RankOutcome {
        losses,
        states: ex.shard_states()?,
    })
}

/// Runs every rank as a thread on the CPU backend; returns the ranks' outcomes in rank order.
pub fn train_threads(
    set: &ProgramSet,
    data: &Tokens,
    opts: &TrainOptions,
    on_step: &(dyn Fn(u32, StepLog) + Sync),
) -> Result<Vec<RankOutcome>, RuntimeError> {
    let n = set.ranks.len();
    let results = ThreadComm::run(n, opts.timeout, |c| {
        train_rank(set, CpuBackend::new(), c, data, opts, on_step)
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
