//! The executor: runs one rank's `plait-program/1` template exactly as codegen wrote it (see
//! `program::format` for the semantics) on a [`Backend`] and a [`Communicator`].
//!
//! [`Executor::new`] resolves the rank's groups (every rank creates the program set's groups
//! it belongs to, in the set's order); [`Executor::init`] runs the template's `init` list once
//! (parameters from an [`Init`]); [`Executor::step`] runs the iteration's instructions on one
//! global [`Batch`] and returns the iteration's loss, summed over all ranks. Nothing is planned
//! here. Runtime conventions where the format leaves room:
//! - Buffers are f32 whatever their storage type (integers exact, see `kernels::Tensor32`);
//!   the planner's reserve and the memory-only `saves` are not allocated.
//! - `Send`/`Recv` tags are folded into the communicator's tag range as
//!   `((chunk · m + micro-batch) · 2 + backward) mod (MAX_TAG + 1)`; messages with the same
//!   source, destination and tag arrive in order, so a fold collision cannot reorder them.
//! - Dropout masks are drawn on global element indices ([`dropout`]), so every layout draws
//!   the same masks as one device.
//! - Where the backend carries partial sums wide ([`Backend::wide_partial_sums`], the CPU
//!   backend's reproducible mode), buffers marked `partial` get an f64 copy next to their f32
//!   value: written by the `Compute` that makes the partial sum ([`Backend::partial_sum`];
//!   sums of partial sums are added in f64), dropped whenever the buffer is written otherwise,
//!   allocated or freed. Every tp `AllReduce` / `ReduceScatter` of a `partial` buffer then
//!   reduces in f64 ([`collective::run_wide`]; from the f32 value where there is no copy), a
//!   choice made from the program and the backend alone, so all members of a group make it.
//! - The reported loss is Σ weight × value over the rank's `Loss` instructions, summed over
//!   the world in rank order in f64 (each share sent as two f32s).

mod adamw_copy;
mod bias_sum;
pub mod collective;
pub mod dp_comm;
pub mod dropout;
pub mod init;
pub mod kept;
pub mod layout;
mod made;
mod moves;
pub mod on_device;
pub mod op_times;
pub mod p2p;
mod packed;
pub mod peak;
mod pitched;
pub mod stash;
mod state;
mod twins;
mod vocab;
mod words_only;

use ir::OpKind;
use kernels::Tensor32;
use program::{BufferId, ProgramSet};
use program::{CollectiveOp, Elem, Instr, Purpose, Role, Slot, Template};

use self::collective::Members;
use crate::{Backend, Communicator, MAX_TAG, RuntimeError};

pub use init::Init;
pub use op_times::OpTimes;
pub use state::{Field, Piece, ShardState, assemble};

/// One iteration's tokens: the global batch, `rows` sequences of `seq` token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub rows: usize,
    pub seq: usize,
    pub input_ids: Vec<u32>,
    pub targets: Vec<u32>,
}

/// Whether `ins` writes `b` whole without reading it (every instruction writes its outputs
/// whole: `program::verify::operands`): `b`'s earlier value is dead.
fn overwrites(ins: &Instr, b: BufferId) -> bool {
    let (reads, writes) = program::verify::operands(ins);
    writes.contains(&b) && !reads.contains(&b)
}

/// One rank's program, its buffers and its communicators.
#[derive(Debug)]
pub struct Executor<'s, B: Backend, C: Communicator> {
    set: &'s ProgramSet,
    rank: u32,
    tpl: &'s Template,
    backend: B,
    world: C,
    /// Communicator per slot (tp, dp, tied); `None`: a group of one.
    slots: [Option<C>; Slot::ALL.len()],
    bufs: Vec<Option<B::Buffer>>,
    /// The f64 value of buffers holding a tensor-parallel partial sum, where the backend
    /// carries those wide.
    wide: Vec<Option<Vec<f64>>>,
    /// Allocated but not yet written: zero-filled on first read. Most buffers are written
    /// whole by their first instruction, and zero-filling them first would cost a pass over
    /// memory each.
    zero_on_read: Vec<bool>,
    /// The buffers each step instruction reads (`program::verify::operands`), computed once:
    /// the step loop checks them for pending zero-fills.
    step_reads: Vec<Vec<BufferId>>,
    /// Step instructions that are copies whose source is freed before anything else uses it
    /// ([`moving_copies`]): they move the buffer instead.
    step_moves: Vec<bool>,
    /// Per step instruction, the copy it is that need not run ([`moves::deferred_copies`], less
    /// those the stash plan touches).
    step_deferred: Vec<Option<moves::Deferral>>,
    /// Frees that hand their buffer on instead (instruction → (freed, receiver)): set where a
    /// deferred copy was skipped this step.
    handing_on: std::collections::HashMap<usize, (BufferId, BufferId)>,
    /// Step instructions that are `AdamW`s whose parameter the next instruction copies: the
    /// copy's destination, written by the update ([`adamw_copy`]).
    step_adamw_copies: Vec<Option<BufferId>>,
    /// Step instructions that are additions whose operand freed next is moved to the output
    /// when the other holds pending zeros ([`moves::moving_adds`]).
    step_adds: Vec<Option<usize>>,
    /// Where a bf16 plan's declared-bf16 buffers are held as bf16 between distant uses
    /// ([`stash`]); emptied once the backend says it keeps f32 only.
    stash_plan: stash::StashPlan,
    /// The backend keeps f32 only ([`crate::Backend::stash_bf16`] kept the buffer).
    stash_off: bool,
    /// The buffers held as bf16 words now, by buffer ([`crate::Backend::stash_bf16`]).
    stashed: Vec<Option<B::Buffer>>,
    /// Step instructions whose results are made as bf16 words only ([`words_only`]).
    step_words: Vec<bool>,
    /// Per step instruction, which of its results alone are made as words
    /// ([`Executor::some_word_results`]).
    step_some_words: Vec<Vec<bool>>,
    /// Step instructions whose result is made with its bf16 twin ([`twins`]).
    step_twins: Vec<bool>,
    /// Step instructions whose result is held at its GEMM's padded pitch ([`pitched`]).
    step_pitched: Vec<bool>,
    /// Per step instruction, the linear-and-sum pair it begins ([`bias_sum`]).
    step_bias_sums: Vec<Option<bias_sum::BiasSum>>,
    /// Products run without their bias this step, until the sum that adds it: product →
    /// (bias, the sum's step instruction).
    unbiased: std::collections::HashMap<BufferId, (BufferId, usize)>,
    /// Buffers held at a padded row pitch now ([`pitched`]).
    pitched: Vec<bool>,
    /// Buffers back from the stash whose f32 values are not yet expanded ([`words_only`]).
    words_only: Vec<bool>,
    /// Attention forwards that keep their row statistics for their gradients ([`kept`]).
    kept_plan: kept::KeptPlan,
    /// The splits whose results attention reads in place ([`packed`]), and what is held for
    /// them now.
    packed_plan: packed::PackedPlan,
    packed: packed::Held<B::Buffer>,
    /// The statistics kept now, and the outputs held for their gradients.
    kept: kept::Kept<B::Buffer>,
    /// The step instruction that raised the device allocator's high-water mark last.
    peak_at: Option<peak::PeakAt>,
    /// Completed optimizer steps.
    steps: u64,
    /// The current pipeline task's micro-batch.
    micro_batch: u32,
    /// Wall time per instruction kind, when recording ([`Executor::record_op_times`]).
    op_times: Option<OpTimes>,
    /// How data-parallel gradients are exchanged ([`Executor::set_dp_comm`]).
    dp_comm: dp_comm::DpComm,
    /// Top-k's error feedback: what each gradient buffer did not send yet, in the exchange's
    /// reduce-scatter (0) and in its all-gather of the summed pieces (1).
    residuals: std::collections::HashMap<(BufferId, u8), Vec<f32>>,
    /// Gradient buffers the data-parallel top-k exchange reduces (their Adam second moment
    /// freezes after its warm-up).
    topk_grads: std::collections::HashSet<BufferId>,
    /// Point-to-point sends on device buffers not yet issued (copy, destination): they go
    /// with the next receive in one group (see [`Executor::exchange`]).
    pending_sends: Vec<(B::Buffer, usize)>,
    /// Whether sends and receives go device to device: the backend has device collectives
    /// and the programs complete under NCCL's point-to-point rules ([`p2p::deadlock_free`]).
    device_p2p: bool,
}

fn instr_name(i: &Instr) -> &'static str {
    match i {
        Instr::Alloc { .. } => "alloc",
        Instr::Free { .. } => "free",
        Instr::Task { .. } => "task",
        Instr::InitParams { .. } => "init_params",
        Instr::LoadTokens { .. } => "load_tokens",
        Instr::Fill { .. } => "fill",
        Instr::Copy { .. } => "copy",
        Instr::Compute { kind, .. } => kind.mnemonic(),
        Instr::Collective { op, .. } => op.name(),
        Instr::Chunk { .. } => "chunk",
        Instr::Vocab { op, .. } => op.name(),
        Instr::Context { kind, .. } => kind.mnemonic(),
        Instr::Send { .. } => "send",
        Instr::Recv { .. } => "recv",
        Instr::RecomputeBegin { .. } => "recompute_begin",
        Instr::RecomputeEnd { .. } => "recompute_end",
        Instr::AdamW { .. } => "adamw",
        Instr::Loss { .. } => "loss",
    }
}

impl<'s, B: Backend, C: Communicator> Executor<'s, B, C> {
    /// Rank `world.rank()`'s executor for `set`.
    pub fn new(set: &'s ProgramSet, backend: B, world: C) -> Result<Self, RuntimeError> {
        let rank = world.rank() as u32;
        let prog = |what: String| RuntimeError::Program { rank, what };
        if world.size() != set.ranks.len() {
            return Err(prog(format!(
                "the communicator has {} ranks, the programs {}",
                world.size(),
                set.ranks.len()
            )));
        }
        let info = set
            .rank(rank)
            .ok_or_else(|| prog("no program for this rank".into()))?;
        let tpl = set
            .template(info.template)
            .ok_or_else(|| prog(format!("template {} is missing", info.template)))?;
        let mut slots: [Option<C>; Slot::ALL.len()] = std::array::from_fn(|_| None);
        for g in &set.groups {
            if !g.ranks.contains(&rank) {
                continue;
            }
            let ranks: Vec<usize> = g.ranks.iter().map(|&r| r as usize).collect();
            let c = world.group(&ranks)?;
            if info.group(g.slot) == Some(g.id)
                && let Some(i) = Slot::ALL.iter().position(|&s| s == g.slot)
            {
                slots[i] = Some(c);
            }
        }
        let backend_p2p = backend.has_device_collectives();
        let mut exec = Executor {
            set,
            rank,
            tpl,
            backend,
            world,
            slots,
            bufs: (0..tpl.buffers.len()).map(|_| None).collect(),
            wide: vec![None; tpl.buffers.len()],
            zero_on_read: vec![false; tpl.buffers.len()],
            step_reads: tpl
                .instrs
                .iter()
                .map(|i| program::verify::operands(i).0)
                .collect(),
            step_moves: moves::moving_copies(&tpl.instrs),
            step_deferred: Vec::new(),
            handing_on: std::collections::HashMap::new(),
            step_adamw_copies: adamw_copy::adamw_copies(&tpl.instrs),
            step_adds: moves::moving_adds(tpl),
            stash_plan: stash::plan(tpl),
            kept_plan: kept::plan(tpl),
            packed_plan: packed::PackedPlan::default(),
            packed: packed::Held::new(tpl.buffers.len()),
            kept: kept::Kept::default(),
            stash_off: false,
            stashed: (0..tpl.buffers.len()).map(|_| None).collect(),
            words_only: vec![false; tpl.buffers.len()],
            step_words: Vec::new(),
            step_some_words: Vec::new(),
            step_twins: Vec::new(),
            step_pitched: Vec::new(),
            step_bias_sums: Vec::new(),
            unbiased: std::collections::HashMap::new(),
            pitched: vec![false; tpl.buffers.len()],
            peak_at: None,
            steps: 0,
            micro_batch: 0,
            op_times: None,
            dp_comm: dp_comm::DpComm::default(),
            residuals: std::collections::HashMap::new(),
            topk_grads: std::collections::HashSet::new(),
            pending_sends: Vec::new(),
            device_p2p: backend_p2p && p2p::deadlock_free(set),
        };
        exec.step_deferred = exec.deferred_copies();
        exec.step_words = exec.word_results();
        exec.step_some_words = exec.some_word_results();
        exec.step_twins = exec.twin_results();
        exec.step_pitched = exec.pitched_results();
        exec.step_bias_sums = exec.bias_sums();
        exec.packed_plan = packed::plan(tpl, &exec.kept_plan, |kind, parts| {
            exec.backend.reads_packed_qkv(kind, parts)
        });
        Ok(exec)
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Optimizer steps completed.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Sets the number of completed steps (resuming from a checkpoint).
    pub fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    pub fn world(&self) -> &C {
        &self.world
    }

    /// Runs the template's initialization (once).
    pub fn init(&mut self, init: &Init) -> Result<(), RuntimeError> {
        let tpl = self.tpl;
        for (k, ins) in tpl.init.iter().enumerate() {
            let reads = program::verify::operands(ins).0;
            self.exec(ins, &reads, Some(init), None)
                .map_err(|e| self.at("init", k, ins, e))?;
        }
        self.zero_all_pending()
    }

    /// Records the wall time of every instruction of the steps from now on.
    pub fn record_op_times(&mut self) {
        self.op_times.get_or_insert_with(OpTimes::default);
    }

    /// The backend's allocator counters ([`Backend::memory_stats`]).
    pub fn memory_stats(&self) -> Option<crate::backend::MemoryStats> {
        self.backend.memory_stats()
    }

    /// The backend's host transfers so far ([`Backend::transfer_stats`]).
    pub fn transfer_stats(&self) -> Option<crate::backend::TransferStats> {
        self.backend.transfer_stats()
    }

    /// The backend's kernel launches so far ([`Backend::launch_tally`]).
    pub fn launch_tally(&self) -> Option<crate::backend::launches::LaunchTally> {
        self.backend.launch_tally()
    }

    /// Where the device allocator's high-water mark was reached ([`peak`]), on a backend
    /// that keeps one.
    pub fn peak_at(&self) -> Option<&peak::PeakAt> {
        self.peak_at.as_ref()
    }

    /// What [`Executor::record_op_times`] recorded.
    pub fn op_times(&self) -> Option<&OpTimes> {
        self.op_times.as_ref()
    }

    /// Runs one iteration on the global batch; returns the iteration's loss (all ranks).
    pub fn step(&mut self, batch: &Batch) -> Result<f64, RuntimeError> {
        self.steps += 1;
        let tpl = self.tpl;
        let mut loss = 0.0;
        let reads = std::mem::take(&mut self.step_reads);
        let stash_plan = std::mem::take(&mut self.stash_plan);
        if self.op_times.is_some() {
            // The last step's queued device work (its backward, after the loss came down) is
            // not this step's first instruction's.
            self.backend.synchronize()?;
        }
        let step_start = std::time::Instant::now();
        let mut copy_written = false;
        self.handing_on.clear();
        self.unbiased.clear();
        for (k, ins) in tpl.instrs.iter().enumerate() {
            let r = reads.get(k).map_or(&[][..], Vec::as_slice);
            let t0 = self.op_times.is_some().then(std::time::Instant::now);
            let launched = self
                .op_times
                .as_ref()
                .and_then(|_| self.backend.launch_tally());
            let expand = stash_plan.before.get(k).map_or(&[][..], Vec::as_slice);
            let zero_add = self.zero_add_source(k, ins);
            // A move hands its source on as it is held (as words alone too): nothing expands it.
            let moved = zero_add.map(|(src, _)| src);
            let back = self
                .unpack_for(k, r)
                .and_then(|()| self.expand_words_for(ins, r, moved))
                .and_then(|()| self.make_dense_for(ins, r))
                .and_then(|()| self.unstash(expand, Some(ins)));
            // The copy the update before it already wrote ([`adamw_copy`]).
            let written_by_update = std::mem::take(&mut copy_written);
            let mut result = match (back, ins, zero_add) {
                (Err(e), _, _) => Err(e),
                (Ok(()), Instr::Copy { .. }, None) if written_by_update => Ok(None),
                (Ok(()), Instr::AdamW { .. }, None)
                    if let Some(dst) = self.step_adamw_copies.get(k).copied().flatten() =>
                {
                    match self.run_adamw_copy(ins, dst) {
                        Ok(true) => {
                            copy_written = true;
                            Ok(None)
                        }
                        Ok(false) => self.exec(ins, r, None, Some(batch)),
                        Err(e) => Err(e),
                    }
                }
                (Ok(()), _, Some((src, out))) => self.move_buffer(src, out).map(|()| None),
                (Ok(()), Instr::Copy { src, .. }, None) if self.defers(k, *src) => Ok(None),
                (Ok(()), Instr::Free { .. }, None)
                    if let Some((moved, to)) = self.handing_on.remove(&k) =>
                {
                    self.move_buffer(moved, to).map(|()| None)
                }
                (Ok(()), Instr::Copy { src, dst }, None)
                    if self.step_moves.get(k).copied().unwrap_or(false) =>
                {
                    self.move_buffer(*src, *dst).map(|()| None)
                }
                (Ok(()), _, None) => match self.run_fused(k, ins) {
                    Ok(true) => Ok(None),
                    Ok(false) => self.exec(ins, r, None, Some(batch)),
                    Err(e) => Err(e),
                },
            };
            if result.is_ok() {
                let keep = stash_plan.after.get(k).map_or(&[][..], Vec::as_slice);
                result = self.stash(keep).and(result);
            }
            if t0.is_some() && result.is_ok() {
                // A device runs launches asynchronously: wait for this instruction's work, so
                // that its time is the device's, not the launch's.
                result = self.backend.synchronize().and(result);
            }
            if let (Some(t0), Some(ot)) = (t0, self.op_times.as_mut()) {
                let kind = op_times::kind(ins);
                if let (Some(before), Some(after)) = (launched, self.backend.launch_tally()) {
                    ot.add_launches(&kind, &after.since(&before));
                }
                ot.add(k, kind, t0.elapsed());
            }
            if let Some(m) = self.backend.memory_stats()
                && self
                    .peak_at
                    .as_ref()
                    .is_none_or(|p| m.peak_in_use > p.bytes)
            {
                let kind = op_times::kind(ins);
                let live = self.live_by_class();
                peak::note(
                    &mut self.peak_at,
                    peak::PeakAt {
                        index: k,
                        kind,
                        bytes: m.peak_in_use,
                        live,
                    },
                );
            }
            match result {
                Ok(Some(l)) => loss += l,
                Ok(None) => {}
                Err(e) => {
                    self.step_reads = reads;
                    self.keep_stash_plan(stash_plan);
                    for t in self.packed.drain() {
                        self.backend.free(t);
                    }
                    return Err(self.at("step", k, ins, e));
                }
            }
        }
        self.step_reads = reads;
        self.keep_stash_plan(stash_plan);
        self.unstash_all()?;
        for t in self.kept.drain().into_iter().chain(self.packed.drain()) {
            self.backend.free(t);
        }
        self.expand_all_words()?;
        self.exchange(&[])?;
        self.zero_all_pending()?;
        if let dp_comm::DpSync::LocalSgd { every } = self.dp_comm.sync
            && self.steps.is_multiple_of(every)
        {
            self.average_parameters()?;
        }
        let loss = self.sum_loss(loss)?;
        if let Some(ot) = self.op_times.as_mut() {
            ot.end_step(step_start.elapsed());
        }
        Ok(loss)
    }

    fn at(&self, phase: &'static str, index: usize, ins: &Instr, e: RuntimeError) -> RuntimeError {
        RuntimeError::Instr {
            rank: self.rank,
            phase,
            index,
            instr: instr_name(ins),
            source: Box::new(e),
        }
    }

    fn prog(&self, what: impl Into<String>) -> RuntimeError {
        RuntimeError::Program {
            rank: self.rank,
            what: what.into(),
        }
    }

    /// Σ over the world in rank order, in f64.
    fn sum_loss(&self, local: f64) -> Result<f64, RuntimeError> {
        let hi = local as f32;
        let lo = (local - f64::from(hi)) as f32;
        let mut all = vec![0.0; 2 * self.world.size()];
        self.world.all_gather(&[hi, lo], &mut all)?;
        Ok(all
            .chunks(2)
            .map(|c| c.iter().map(|&x| f64::from(x)).sum::<f64>())
            .sum())
    }

    /// Issues the pending sends and `recvs` (shape, source) as one group of device
    /// point-to-point messages, as Megatron-LM batches a stage's send and receive: under
    /// NCCL a send waits for its receiver, so two stages that each send before they receive
    /// would otherwise wait on each other. Returns the received buffers in order.
    fn exchange(&mut self, recvs: &[(Vec<usize>, usize)]) -> Result<Vec<B::Buffer>, RuntimeError> {
        if self.pending_sends.is_empty() && recvs.is_empty() {
            return Ok(Vec::new());
        }
        let sends = std::mem::take(&mut self.pending_sends);
        let refs: Vec<(&B::Buffer, usize)> = sends.iter().map(|(b, p)| (b, *p)).collect();
        let got = self
            .backend
            .device_exchange(&self.world, &refs, recvs)
            .unwrap_or_else(|| {
                Err(self.prog("device sends on a backend without device collectives"))
            });
        for (b, _) in sends {
            self.backend.free(b);
        }
        got
    }

    fn decl_shape(&self, b: BufferId) -> Result<Vec<usize>, RuntimeError> {
        let d = self
            .tpl
            .buffer(b)
            .ok_or_else(|| self.prog(format!("buffer {b} is not declared")))?;
        Ok(d.shape.iter().map(|&x| x as usize).collect())
    }

    fn skipped(&self, b: BufferId) -> bool {
        self.tpl.buffer(b).is_some_and(|d| {
            matches!(d.role, Role::Reserve | Role::Saved | Role::Fp8Copy(_)) || d.elem == Elem::U8
        })
    }

    fn get(&self, b: BufferId) -> Result<&B::Buffer, RuntimeError> {
        self.bufs
            .get(b.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| self.prog(format!("buffer {b} is used but not allocated")))
    }

    /// `copy src -> dst` where `src` is freed next: `dst` takes `src`'s buffer (relabelled to
    /// its shape), and the free finds nothing left to free.
    fn move_buffer(&mut self, src: BufferId, dst: BufferId) -> Result<(), RuntimeError> {
        self.zero_if_pending(src)?;
        let t = self
            .bufs
            .get_mut(src.index())
            .and_then(Option::take)
            .ok_or_else(|| self.prog(format!("buffer {src} is used but not allocated")))?;
        // Held as words alone, it stays so under its new name.
        let words = std::mem::take(&mut self.words_only[src.index()]);
        self.put_buffer(dst, t)?;
        self.words_only[dst.index()] = words;
        Ok(())
    }

    /// Holds each of `bufs` as bf16 words until its next use ([`stash`]): those written, with
    /// no pending zero-fill or wide copy. A backend that keeps f32 only turns stashing off.
    fn stash(&mut self, bufs: &[BufferId]) -> Result<(), RuntimeError> {
        if self.stash_off {
            return Ok(());
        }
        for &b in bufs {
            let i = b.index();
            let pending = self.zero_on_read.get(i).copied().unwrap_or(true);
            let wide = self.wide.get(i).is_some_and(Option::is_some);
            if pending || wide {
                continue;
            }
            let Some(x) = self.bufs.get_mut(i).and_then(Option::take) else {
                continue;
            };
            // Its words are what the stash keeps (the device backend's twin; a buffer held at
            // a pitch is made dense first).
            self.words_only[i] = false;
            self.pitched[i] = false;
            match self.backend.stash_bf16(x)? {
                crate::backend::Stashed::Words(words) => self.stashed[i] = Some(words),
                crate::backend::Stashed::Kept(x) => {
                    self.bufs[i] = Some(x);
                    self.stash_off = true;
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Puts the step's stash plan back for the next step, or an empty one once the backend
    /// has said it keeps f32 only (the step loop then looks up nothing).
    fn keep_stash_plan(&mut self, plan: stash::StashPlan) {
        self.stash_plan = if self.stash_off {
            stash::StashPlan::default()
        } else {
            plan
        };
    }

    /// Brings each of `bufs` that is held as bf16 back into its f32 buffer: expanded, or as
    /// words only where `ins`, the instruction about to run, reads it only so
    /// ([`words_only`]).
    fn unstash(&mut self, bufs: &[BufferId], ins: Option<&Instr>) -> Result<(), RuntimeError> {
        for &b in bufs {
            if let Some(words) = self.stashed.get_mut(b.index()).and_then(Option::take) {
                if ins.is_some_and(|ins| overwrites(ins, b)) {
                    // Its value ends here: the instruction writes it whole without reading it.
                    self.backend.free(words);
                    continue;
                }
                let shape = self.decl_shape(b)?;
                let lazy = ins.is_some_and(|ins| self.reads_words_only(ins, b));
                let x = if lazy {
                    self.backend.unstash_bf16_words(words, &shape)?
                } else {
                    self.backend.unstash_bf16(words, &shape)?
                };
                self.bufs[b.index()] = Some(x);
                self.words_only[b.index()] = lazy;
            }
        }
        Ok(())
    }

    /// Expands whatever a step left stashed (none in a verified program: every stash has a
    /// next use in the step), so state read between steps is f32.
    fn unstash_all(&mut self) -> Result<(), RuntimeError> {
        let held: Vec<BufferId> = (0..self.stashed.len())
            .filter(|&i| self.stashed[i].is_some())
            .map(|i| BufferId(i as u32))
            .collect();
        self.unstash(&held, None)
    }

    /// Zero-fills `b` if it was allocated and not written since.
    /// Fills `b` with zeros when it is next read, as an allocation is ([`Self::zero_if_pending`]):
    /// until then it holds no memory, and a stash finds nothing to convert. A gradient
    /// accumulator zeroed at the top of the step and first added to in the backward, a
    /// thousand instructions on, would otherwise be held (or stashed, then expanded) across
    /// the whole forward.
    fn zero_later(&mut self, b: BufferId) -> Result<(), RuntimeError> {
        let i = b.index();
        if i >= self.bufs.len() {
            return Err(self.prog(format!("fill: buffer {b} is not declared")));
        }
        if let Some(t) = self.bufs[i].take() {
            self.backend.free(t);
        }
        if let Some(words) = self.stashed[i].take() {
            self.backend.free(words);
        }
        if let Some(w) = self.wide.get_mut(i) {
            *w = None;
        }
        self.words_only[i] = false;
        self.pitched[i] = false;
        self.zero_on_read[i] = true;
        Ok(())
    }

    pub(super) fn zero_if_pending(&mut self, b: BufferId) -> Result<(), RuntimeError> {
        if self.zero_on_read.get(b.index()).copied().unwrap_or(false) {
            let z = self.backend.zeros(&self.decl_shape(b)?)?;
            self.zero_on_read[b.index()] = false;
            self.bufs[b.index()] = Some(z);
        }
        Ok(())
    }

    /// Zero-fills every pending buffer, so that state read from outside the program (shard
    /// states, checkpoints) sees what eager allocation would have shown.
    fn zero_all_pending(&mut self) -> Result<(), RuntimeError> {
        for i in 0..self.zero_on_read.len() {
            self.zero_if_pending(BufferId(i as u32))?;
        }
        Ok(())
    }

    fn host(&self, b: BufferId) -> Result<Tensor32, RuntimeError> {
        self.backend.download(self.get(b)?)
    }

    /// Stores `data` into `b` with its declared shape.
    fn put(&mut self, b: BufferId, data: Vec<f32>) -> Result<(), RuntimeError> {
        let shape = self.decl_shape(b)?;
        let n: usize = shape.iter().product();
        if data.len() != n {
            return Err(RuntimeError::BadLength {
                op: "store",
                what: "result",
                got: data.len(),
                want: n,
            });
        }
        let t = self.backend.upload_owned(Tensor32 { shape, data })?;
        self.put_buffer(b, t)
    }

    /// Stores a backend buffer into `b`; one of another shape (with as many elements) goes
    /// through the host to take `b`'s declared shape.
    /// Sets buffer `b` to `value`: in place where it holds a buffer of its declared shape
    /// already (a gradient accumulator from the last step), else as a new buffer.
    fn fill(&mut self, b: BufferId, value: f32) -> Result<(), RuntimeError> {
        if value == 0.0 && !self.skipped(b) {
            return self.zero_later(b);
        }
        let shape = self.decl_shape(b)?;
        let backend = &self.backend;
        match self.bufs.get_mut(b.index()) {
            Some(Some(t)) if backend.shape(t) == shape.as_slice() => {
                backend.fill_in_place(t, value)?;
                self.mark_written(b);
                Ok(())
            }
            _ => {
                let t = self.backend.fill(&shape, value)?;
                self.put_buffer(b, t)
            }
        }
    }

    /// The bytes of the buffers live now (as f32, or as the bf16 words a stashed one or one
    /// held as words alone holds; rounded as the caching allocator rounds a request), by the
    /// class of their role ([`peak::role_class`]).
    fn live_by_class(&self) -> Vec<(&'static str, u64)> {
        let held = self.bufs.iter().zip(&self.stashed).enumerate();
        let packed = self
            .packed
            .iter()
            .map(|(b, t)| (b.index(), (Some(t), None)));
        let held = held
            .map(|(i, (b, s))| (i, (b.as_ref(), s.as_ref())))
            .chain(packed);
        peak::by_class(held.filter_map(|(i, (buf, stashed))| {
            let t = buf.or(stashed)?;
            let role = &self.tpl.buffers.get(i)?.role;
            let elems: usize = self.backend.shape(t).iter().product();
            let words = buf.is_some_and(|b| {
                self.words_only.get(i).copied().unwrap_or(false)
                    || self.backend.holds_words_alone(b)
            });
            let bytes = if words {
                crate::backend::pool::rounded(4 * elems.div_ceil(2))
            } else {
                crate::backend::pool::rounded(4 * elems)
            };
            Some((peak::role_class(role), bytes as u64))
        }))
    }

    /// Buffer `b` holds new values: it no longer reads as zero, nor has a wide copy.
    fn mark_written(&mut self, b: BufferId) {
        if let Some(w) = self.words_only.get_mut(b.index()) {
            *w = false;
        }
        if let Some(p) = self.pitched.get_mut(b.index()) {
            *p = false;
        }
        if let Some(z) = self.zero_on_read.get_mut(b.index()) {
            *z = false;
        }
        if let Some(w) = self.wide.get_mut(b.index()) {
            *w = None;
        }
    }

    fn put_buffer(&mut self, b: BufferId, t: B::Buffer) -> Result<(), RuntimeError> {
        let shape = self.decl_shape(b)?;
        let t = if self.backend.shape(&t) == shape.as_slice() {
            t
        } else {
            self.backend.reshape(t, &shape)?
        };
        self.mark_written(b);
        let slot = self
            .bufs
            .get_mut(b.index())
            .ok_or_else(|| RuntimeError::Program {
                rank: self.rank,
                what: format!("buffer {b} is not declared"),
            })?;
        *slot = Some(t);
        Ok(())
    }

    fn members(&self, s: Slot) -> Members<'_, C> {
        let i = Slot::ALL.iter().position(|&x| x == s).unwrap_or(0);
        match self.slots.get(i).and_then(Option::as_ref) {
            Some(c) => Members::Group(c),
            None => Members::Solo,
        }
    }

    fn tag(&self, tag: u64) -> u32 {
        let chunk = tag >> 33;
        let mb = (tag >> 1) & 0xffff_ffff;
        let back = tag & 1;
        let m = u64::from(self.set.mesh.micro_batches.max(1));
        (((chunk * m + mb) * 2 + back) % (u64::from(MAX_TAG) + 1)) as u32
    }

    /// Executes one instruction, which reads `reads`; `Some(loss share)` for `Loss`.
    fn exec(
        &mut self,
        ins: &Instr,
        reads: &[BufferId],
        init: Option<&Init>,
        batch: Option<&Batch>,
    ) -> Result<Option<f64>, RuntimeError> {
        for &b in reads {
            self.zero_if_pending(b)?;
        }
        match ins {
            Instr::Alloc { buf } => {
                if let Some(w) = self.wide.get_mut(buf.index()) {
                    *w = None;
                }
                if !self.skipped(*buf)
                    && let Some(z) = self.zero_on_read.get_mut(buf.index())
                {
                    *z = true;
                }
            }
            Instr::Free { buf } => {
                if let Some(z) = self.zero_on_read.get_mut(buf.index()) {
                    *z = false;
                }
                if let Some(w) = self.words_only.get_mut(buf.index()) {
                    *w = false;
                }
                if let Some(p) = self.pitched.get_mut(buf.index()) {
                    *p = false;
                }
                if let Some(s) = self.stashed.get_mut(buf.index())
                    && let Some(words) = s.take()
                {
                    self.backend.free(words);
                }
                if let Some(w) = self.wide.get_mut(buf.index()) {
                    *w = None;
                }
                if let Some(s) = self.bufs.get_mut(buf.index())
                    && let Some(b) = s.take()
                    && let Some(b) = self.kept.free(*buf, b)
                {
                    self.backend.free(b);
                }
                if let Some(qkv) = self.packed.free(*buf) {
                    self.backend.free(qkv);
                }
            }
            Instr::Task { micro_batch, .. } => self.micro_batch = *micro_batch,
            Instr::RecomputeBegin { .. } | Instr::RecomputeEnd { .. } => {}
            Instr::InitParams { .. } => {
                let init = init.ok_or_else(|| self.prog("init_params outside init"))?;
                self.init_params(init)?;
            }
            Instr::LoadTokens {
                micro_batch,
                input_ids,
                targets,
            } => {
                let batch = batch.ok_or_else(|| self.prog("load_tokens outside a step"))?;
                self.load_tokens(batch, *micro_batch, *input_ids, *targets)?;
            }
            Instr::Fill { buf, value } => self.fill(*buf, *value as f32)?,
            Instr::Copy { src, dst } => {
                let t = self.backend.duplicate(self.get(*src)?)?;
                self.put_buffer(*dst, t)?;
            }
            Instr::Compute {
                kind,
                inputs,
                outputs,
                ..
            } => self.compute(kind, inputs, outputs)?,
            Instr::Collective {
                op,
                group,
                axis,
                pairs,
                purpose,
                ..
            } => {
                self.exchange(&[])?;
                let changed = *purpose == Purpose::GradReduce
                    && *group == Slot::Dp
                    && self.dp_exchange(*op, *axis, pairs)?;
                for &(i, o) in pairs.iter().filter(|_| !changed) {
                    let out_len: usize = self.decl_shape(o)?.iter().product();
                    let wide = self.backend.wide_partial_sums()
                        && *group == Slot::Tp
                        && matches!(op, CollectiveOp::AllReduce | CollectiveOp::ReduceScatter)
                        && self.tpl.buffer(i).is_some_and(|d| d.partial);
                    if !wide && self.collective_on_device(*op, *group, *axis, i, o)? {
                        continue;
                    }
                    let y = match wide {
                        true => {
                            let w = match self.wide.get_mut(i.index()).and_then(Option::take) {
                                Some(w) => w,
                                None => self.host(i)?.data.iter().map(|&v| f64::from(v)).collect(),
                            };
                            collective::run_wide(
                                self.members(*group),
                                *op,
                                *axis,
                                &w,
                                &self.decl_shape(i)?,
                                out_len,
                            )?
                        }
                        false => {
                            let x = self.host(i)?;
                            collective::run(
                                self.members(*group),
                                *op,
                                *axis,
                                &x.data,
                                &x.shape,
                                out_len,
                            )?
                        }
                    };
                    self.put(o, y)?;
                }
            }
            Instr::Vocab { .. } => {
                self.vocab(ins)?;
            }
            Instr::Context {
                kind,
                group,
                inputs,
                outputs,
                ..
            } => self.context(kind, *group, inputs, outputs)?,
            Instr::Chunk {
                src,
                dst,
                axis,
                group,
            } => {
                if self.chunk_on_device(*src, *dst, *axis, *group)? {
                    return Ok(None);
                }
                let g = self.members(*group);
                let (size, r) = (g.size(), g.rank());
                let x = self.host(*src)?;
                let y = collective::chunk(&x.data, &x.shape, *axis, size, r)
                    .map_err(|d| self.prog(format!("chunk: {d}")))?;
                self.put(*dst, y)?;
            }
            Instr::Send { buf, peer, tag } => {
                let info = self.info()?;
                if self.device_p2p {
                    // Held (a copy: the program may free or overwrite the buffer) until the
                    // next receive or collective, then sent in one group with them.
                    let copy = self.backend.duplicate(self.get(*buf)?)?;
                    self.pending_sends.push((copy, info.peer(*peer) as usize));
                    return Ok(None);
                }
                let x = self.host(*buf)?;
                self.world
                    .send(&x.data, info.peer(*peer) as usize, self.tag(*tag))?;
            }
            Instr::Recv { buf, peer, tag } => {
                let info = self.info()?;
                if self.device_p2p {
                    let recv = (self.decl_shape(*buf)?, info.peer(*peer) as usize);
                    let mut got = self.exchange(&[recv])?;
                    if let Some(y) = got.pop() {
                        self.put_buffer(*buf, y)?;
                    }
                    return Ok(None);
                }
                let n: usize = self.decl_shape(*buf)?.iter().product();
                let mut data = vec![0.0; n];
                self.world
                    .recv(&mut data, info.peer(*peer) as usize, self.tag(*tag))?;
                self.put(*buf, data)?;
            }
            Instr::AdamW {
                config,
                param,
                grad,
                m,
                v,
            } => {
                let take = |s: &mut Self, b: BufferId| {
                    s.bufs
                        .get_mut(b.index())
                        .and_then(Option::take)
                        .ok_or_else(|| s.prog(format!("adamw: buffer {b} is not allocated")))
                };
                let mut p = take(self, *param)?;
                let mut mm = take(self, *m)?;
                let mut vv = take(self, *v)?;
                let frozen = self.frozen_variance(*grad);
                let r = self.get(*grad).and_then(|g| match frozen {
                    Some(f) => self
                        .backend
                        .adamw_frozen_variance(config, &mut p, g, &mut mm, &mut vv, self.steps, f),
                    None => self
                        .backend
                        .adamw(config, &mut p, g, &mut mm, &mut vv, self.steps),
                });
                for (b, t) in [(*param, p), (*m, mm), (*v, vv)] {
                    if let Some(s) = self.bufs.get_mut(b.index()) {
                        *s = Some(t);
                    }
                }
                r?;
            }
            Instr::Loss { buf, weight } => {
                let x = self.host(*buf)?;
                let v: f64 = x.data.iter().map(|&a| f64::from(a)).sum();
                return Ok(Some(weight * v));
            }
        }
        Ok(None)
    }

    /// The update after which `grad`'s parameter keeps its second moment, where it does:
    /// only gradients top-k exchanged (not those of a rank without a data-parallel group, nor
    /// experts' reduced over their own group).
    fn frozen_variance(&self, grad: BufferId) -> Option<u64> {
        self.dp_comm
            .frozen_variance_after()
            .filter(|_| self.topk_grads.contains(&grad))
    }

    fn info(&self) -> Result<&'s program::RankInfo, RuntimeError> {
        self.set
            .rank(self.rank)
            .ok_or_else(|| self.prog("no rank info"))
    }

    /// A position-dependent op on this rank's chunks of the sequence: member `i` of the
    /// context-parallel `group` holds chunks `i` and `2·cp − 1 − i` (`kernels::Chunks`).
    fn context(
        &mut self,
        kind: &OpKind,
        group: Slot,
        inputs: &[BufferId],
        outputs: &[BufferId],
    ) -> Result<(), RuntimeError> {
        let at = kernels::Chunks {
            size: self.set.mesh.cp.max(1) as usize,
            index: self.members(group).rank(),
        };
        let xs = inputs
            .iter()
            .map(|&i| self.get(i))
            .collect::<Result<Vec<_>, _>>()?;
        let acc = if self.backend.wide_partial_sums() {
            kernels::Accumulate::F64
        } else {
            kernels::Accumulate::F32
        };
        let ys = self.backend.context_op(kind, &xs, at, acc)?;
        if ys.len() != outputs.len() {
            let n = ys.len();
            ys.into_iter().for_each(|y| self.backend.free(y));
            return Err(self.prog(format!(
                "{}: {n} results for {} outputs",
                kind.mnemonic(),
                outputs.len()
            )));
        }
        for (y, &o) in ys.into_iter().zip(outputs) {
            self.put_buffer(o, y)?;
        }
        Ok(())
    }

    /// Runs step instruction `k` in one of the ways the backend fuses more into (in this
    /// order): attention keeping its statistics ([`kept`]), results made as words alone
    /// ([`words_only`]), a result held at its GEMM's pitch ([`pitched`]), a result made with
    /// its twin ([`twins`]); `false` where none applies
    /// (it runs as usual).
    fn run_fused(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        Ok(self.run_packed_split(k)?
            || self.run_packed_join(k, ins)?
            || self.run_bias_sum(k, ins)?
            || self.run_kept(k, ins)?
            || self.unpack_reads(ins)?
            || self.run_words(k, ins)?
            || self.run_some_words(k, ins)?
            || self.run_pitched(k, ins)?
            || self.run_twin(k, ins)?)
    }

    /// Runs step instruction `k` where it is an attention forward that keeps its row
    /// statistics or the gradient that reads them ([`kept`]); `false` where it is neither, or
    /// the backend keeps none, or the forward's output is not at hand (then it runs as usual:
    /// the gradient recomputes the statistics).
    fn run_kept(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        let Some((kind, inputs, outputs)) = made::compute_parts(ins) else {
            return Ok(false);
        };
        if self.kept_plan.forward.get(k).is_some_and(Option::is_some)
            || self.kept_plan.grad.get(k).is_some_and(Option::is_some)
        {
            // As `exec` does for every operand: an allocation never written reads as zeros.
            for &b in inputs {
                self.zero_if_pending(b)?;
            }
        }
        if let Some(keep) = self.kept_plan.forward.get(k).copied().flatten() {
            let as_words = self.step_words.get(k).copied().unwrap_or(false);
            let kf = match self.packed.packed(inputs) {
                Some(qkv) => {
                    let shapes = self.part_shapes(inputs)?;
                    let parts = [&shapes[0][..], &shapes[1][..], &shapes[2][..]];
                    self.backend
                        .attention_forward_keeping_packed(kind, qkv, parts, as_words)?
                }
                None => None,
            };
            let kf = match kf {
                Some(kf) => Some(kf),
                None => {
                    self.unpack_reads(ins)?;
                    let xs = inputs
                        .iter()
                        .map(|&i| self.get(i))
                        .collect::<Result<Vec<_>, _>>()?;
                    self.backend
                        .attention_forward_keeping(kind, &xs, as_words)?
                }
            };
            let Some(kf) = kf else {
                return Ok(false);
            };
            self.put_buffer(keep.out, kf.out)?;
            if let Some(w) = self.words_only.get_mut(keep.out.index()) {
                *w = kf.out_as_words;
            }
            for old in self.kept.keep(keep, kf.stats) {
                self.backend.free(old);
            }
            return Ok(true);
        }
        let (Some(keep), OpKind::Grad { of, .. }, &[q, k_in, v, dy]) =
            (self.kept_plan.grad.get(k).copied().flatten(), kind, inputs)
        else {
            return Ok(false);
        };
        let Some((stats, held)) = self.kept.take(keep) else {
            return Ok(false);
        };
        let as_words = self.step_words.get(k).copied().unwrap_or(false);
        let joined = self.packed_plan.joins.get(k).copied().unwrap_or(false);
        let grads = self.kept_gradients(
            of,
            [q, k_in, v, dy],
            keep.out,
            (&stats, held.as_ref()),
            (as_words, joined),
        );
        self.backend.free(stats);
        if let Some(h) = held {
            self.backend.free(h);
        }
        let Some(mut kb) = grads? else {
            return Ok(false);
        };
        if let (&[dq, dk, dv], 1) = (outputs, kb.grads.len()) {
            // Written side by side, for the concatenation that reads them next (`packed`).
            let dqkv = kb.grads.remove(0);
            match self.split_of(outputs) {
                Ok(split) => self.hold_parts(dqkv, split, [dq, dk, dv]),
                Err(e) => {
                    self.backend.free(dqkv);
                    return Err(e);
                }
            }
            return Ok(true);
        }
        if kb.grads.len() != outputs.len() {
            return Err(self.prog(format!(
                "attention's kept backward gave {} gradients for {} outputs",
                kb.grads.len(),
                outputs.len()
            )));
        }
        for (g, &o) in kb.grads.into_iter().zip(outputs) {
            self.put_buffer(o, g)?;
            if let Some(w) = self.words_only.get_mut(o.index()) {
                *w = kb.as_words;
            }
        }
        Ok(true)
    }

    /// Attention's gradients from its kept statistics `stats` and output (`held`, or the
    /// buffer `out` still live), reading q, k and v in place where they are held so; `None`
    /// where the backend declines.
    fn kept_gradients(
        &mut self,
        of: &OpKind,
        [q, k, v, dy]: [BufferId; 4],
        out: BufferId,
        (stats, held): (&B::Buffer, Option<&B::Buffer>),
        (as_words, joined): (bool, bool),
    ) -> Result<Option<crate::backend::KeptBackward<B::Buffer>>, RuntimeError> {
        let packed = match self.packed.packed(&[q, k, v]) {
            Some(qkv) => {
                let shapes = self.part_shapes(&[q, k, v])?;
                let parts = [&shapes[0][..], &shapes[1][..], &shapes[2][..]];
                let o = held.or_else(|| self.bufs.get(out.index()).and_then(Option::as_ref));
                match o {
                    Some(o) => self.backend.attention_backward_kept_packed(
                        of,
                        qkv,
                        parts,
                        [self.get(dy)?, o, stats],
                        (as_words, joined),
                    )?,
                    None => None,
                }
            }
            None => None,
        };
        if packed.is_some() {
            return Ok(packed);
        }
        for b in [q, k, v] {
            self.unpack(b)?;
        }
        let xs = [self.get(q)?, self.get(k)?, self.get(v)?];
        let o = held.or_else(|| self.bufs.get(out.index()).and_then(Option::as_ref));
        match o {
            Some(o) => {
                self.backend
                    .attention_backward_kept(of, &xs, [self.get(dy)?, o, stats], as_words)
            }
            None => Ok(None),
        }
    }

    fn compute(
        &mut self,
        kind: &OpKind,
        inputs: &[BufferId],
        outputs: &[BufferId],
    ) -> Result<(), RuntimeError> {
        if let OpKind::Dropout { p, seed } = kind {
            let input = inputs.first().copied().unwrap_or(BufferId(u32::MAX));
            let out = outputs.first().copied().unwrap_or(BufferId(u32::MAX));
            let x = self.get(input)?;
            let shape = self.backend.shape(x).to_vec();
            let len = shape.iter().product();
            if let Some(m) =
                dropout::mask(&shape, len, *p, *seed, self.place()?).map_err(|d| self.prog(d))?
            {
                let y = self.backend.dropout(x, &m)?;
                return self.put_buffer(out, y);
            }
            let x = self.host(input)?;
            let mut data = x.data;
            dropout::apply(&mut data, &x.shape, *p, *seed, self.place()?)
                .map_err(|d| self.prog(d))?;
            let out = outputs.first().copied().unwrap_or(BufferId(u32::MAX));
            return self.put(out, data);
        }
        let binding = ir::Binding {
            batch: self.set.mesh.micro_batch,
            seq: self.set.mesh.seq,
        };
        // Source ops that carry their value in their attributes (made on the device).
        let constant = match kind {
            OpKind::Iota { len } => Some(self.backend.iota(len.eval(binding) as usize)?),
            OpKind::Scalar { value } => Some(self.backend.fill(&[], *value as f32)?),
            _ => None,
        };
        if let Some(t) = constant {
            let out = outputs.first().copied().unwrap_or(BufferId(u32::MAX));
            return self.put_buffer(out, t);
        }
        let (results, wides) = {
            let mut xs = Vec::with_capacity(inputs.len());
            for &i in inputs {
                xs.push(self.get(i)?);
            }
            let wides = self.partial_sums(kind, inputs, outputs, &xs)?;
            // Every result already computed in f64 (a row-parallel product): rounding it is
            // what the backend's f64 mode computes, without a second product.
            if !wides.is_empty() && wides.iter().all(Option::is_some) {
                (None, wides)
            } else {
                (Some(self.backend.forward(kind, &xs, binding)?), wides)
            }
        };
        let Some(results) = results else {
            for (w, &o) in wides.into_iter().zip(outputs) {
                let w = w.unwrap_or_default();
                self.put(o, w.iter().map(|&v| v as f32).collect())?;
                if let Some(slot) = self.wide.get_mut(o.index()) {
                    *slot = Some(w);
                }
            }
            return Ok(());
        };
        if results.len() != outputs.len() {
            return Err(self.prog(format!(
                "{} computed {} results for {} outputs",
                kind.mnemonic(),
                results.len(),
                outputs.len()
            )));
        }
        for (t, &o) in results.into_iter().zip(outputs) {
            let shape = self.decl_shape(o)?;
            if self.backend.shape(&t) == shape.as_slice() {
                if let Some(s) = self.bufs.get_mut(o.index()) {
                    *s = Some(t);
                }
                self.mark_written(o);
            } else {
                let h = self.backend.download(&t)?;
                self.put(o, h.data)?;
            }
        }
        for (w, &o) in wides.into_iter().zip(outputs) {
            if let Some(slot) = self.wide.get_mut(o.index()) {
                *slot = w;
            }
        }
        Ok(())
    }

    /// The f64 values of the outputs that hold tensor-parallel partial sums, where the
    /// backend carries them wide: computed by the backend, or, for a sum of partial sums, added
    /// from the operands' f64 values.
    fn partial_sums(
        &self,
        kind: &OpKind,
        inputs: &[BufferId],
        outputs: &[BufferId],
        xs: &[&B::Buffer],
    ) -> Result<Vec<Option<Vec<f64>>>, RuntimeError> {
        if !self.backend.wide_partial_sums() {
            return Ok(vec![None; outputs.len()]);
        }
        let mut out = Vec::with_capacity(outputs.len());
        for (j, &o) in outputs.iter().enumerate() {
            if !self.tpl.buffer(o).is_some_and(|d| d.partial) {
                out.push(None);
                continue;
            }
            let w = if matches!(kind, OpKind::Add) {
                let parts: Option<Vec<&Vec<f64>>> = inputs
                    .iter()
                    .map(|i| self.wide.get(i.index()).and_then(Option::as_ref))
                    .collect();
                parts.and_then(|p| match p[..] {
                    [a, b] if a.len() == b.len() => {
                        Some(a.iter().zip(b).map(|(x, y)| x + y).collect())
                    }
                    _ => None,
                })
            } else {
                self.backend.partial_sum(kind, xs, j)?
            };
            out.push(w);
        }
        Ok(out)
    }

    fn place(&self) -> Result<dropout::Place, RuntimeError> {
        let info = self.info()?;
        let mesh = &self.set.mesh;
        let b = mesh.micro_batch as usize;
        let m = mesh.micro_batches as usize;
        let cp = mesh.cp.max(1) as usize;
        Ok(dropout::Place {
            row: (info.coords.dp as usize / cp * m + self.micro_batch as usize) * b,
            seq: mesh.seq as usize,
            cp: (cp > 1).then(|| kernels::Chunks {
                size: cp,
                index: info.coords.dp as usize % cp,
            }),
            sp: mesh
                .sequence_parallel
                .then_some((mesh.tp as usize, info.coords.tp as usize)),
            step: self.steps.max(1),
        })
    }

    fn load_tokens(
        &mut self,
        batch: &Batch,
        micro_batch: u32,
        input_ids: Option<BufferId>,
        targets: Option<BufferId>,
    ) -> Result<(), RuntimeError> {
        let info = self.info()?;
        let mesh = &self.set.mesh;
        let b = mesh.micro_batch as usize;
        let m = mesh.micro_batches as usize;
        let cp = mesh.cp.max(1) as usize;
        let s = batch.seq;
        let replica = info.coords.dp as usize / cp;
        let row = (replica * m + micro_batch as usize) * b;
        let rows = m * mesh.batch_replicas() as usize * b;
        if batch.rows != rows || s != mesh.seq as usize {
            return Err(RuntimeError::BadLength {
                op: "load_tokens",
                what: "global batch (sequences x length)",
                got: batch.rows * s,
                want: rows * mesh.seq as usize,
            });
        }
        // With context parallelism, this rank's chunks of each sequence.
        let positions = kernels::Chunks {
            size: cp,
            index: info.coords.dp as usize % cp,
        }
        .positions(s / cp);
        let pick = |v: &[u32]| -> Vec<f32> {
            (row..row + b)
                .flat_map(|r| positions.iter().map(move |&p| r * s + p))
                .map(|i| v.get(i).map_or(0.0, |&t| t as f32))
                .collect()
        };
        if let Some(ids) = input_ids {
            self.put(ids, pick(&batch.input_ids))?;
        }
        if let Some(t) = targets {
            self.put(t, pick(&batch.targets))?;
        }
        Ok(())
    }

    fn init_params(&mut self, init: &Init) -> Result<(), RuntimeError> {
        let info = self.info()?;
        let mesh = &self.set.mesh;
        for sh in &self.tpl.shards {
            let p =
                self.set.params.get(sh.param.index()).ok_or_else(|| {
                    self.prog(format!("parameter {} is not in the table", sh.param))
                })?;
            let full = init.full(p)?;
            let slice = sh.slice_at(&p.shape, program::ShardAt::of(mesh, info.coords));
            let axis = sh.tp.map_or(0, |t| usize::from(t.axis));
            let local = layout::extract(&full.data, &full.shape, &slice, axis);
            let n: usize = self.decl_shape(sh.init)?.iter().product();
            let data = if n == local.len() {
                local
            } else {
                let (s, e) = (slice.owned.0 as usize, slice.owned.1 as usize);
                let mut v = local.get(s..e).unwrap_or_default().to_vec();
                v.resize(n, 0.0);
                v
            };
            self.put(sh.init, data)?;
        }
        Ok(())
    }

    /// A parameter-state buffer's host copy (checkpoints and gathering).
    pub(crate) fn buffer(&self, b: BufferId) -> Result<Tensor32, RuntimeError> {
        self.host(b)
    }

    pub(crate) fn store(&mut self, b: BufferId, data: Vec<f32>) -> Result<(), RuntimeError> {
        self.put(b, data)
    }

    pub(crate) fn parts(&self) -> (&'s ProgramSet, &'s Template, u32) {
        (self.set, self.tpl, self.rank)
    }
}
