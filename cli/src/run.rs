//! `plait run [PLAN] [--steps K] [--data FILE] [--seed S] [--log-json FILE]`: generate the
//! programs of a plan (or read a codegen directory) and train, all ranks as threads of this
//! process (or one rank per process under `mpirun` when built with the `mpi` feature).
//!
//! With no PLAN it compiles a built-in tiny GPT-2 (4 layers, hidden 64, vocabulary 256, seq
//! 64) for `--cluster cpu --gpus 2` and trains it on a built-in text: a zero-config demo.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use codegen::ProgramSet;
use indicatif::{ProgressBar, ProgressStyle};
use runtime::data::Tokens;
use runtime::exec::Init;
use runtime::train::{Device, StepLog, TrainOptions};

use crate::compile::compile;
use crate::strategy_args::{ClusterArgs, StrategyArgs};

/// The built-in demo model and text.
const DEMO_CONFIG: &str = r#"{"model_type": "gpt2", "n_layer": 4, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 64}"#;
const DEMO_TEXT: &str = include_str!("../../data/tiny.txt");

/// Default of `--timeout` (seconds): short enough that a rank that died or hung is named, and
/// the job ended, within 30 s of the failure.
const DEFAULT_TIMEOUT_S: u64 = 20;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A plan.json (`plait compile -o`) or a program directory (`plait codegen -o`); none: the
    /// built-in tiny GPT-2 on 2 CPU ranks.
    plan: Option<PathBuf>,
    /// Training steps.
    #[arg(long, default_value_t = 20)]
    steps: u64,
    /// Token data: a nanoGPT `.bin` of token ids (`--data-width`), a text tokenized with
    /// `--tokenizer`, or any other file read as bytes (vocabulary 256) [default: a built-in
    /// text].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Width of the ids in a `.bin` file: u16 (nanoGPT) or u32 (vocabularies above 65,535;
    /// what `plait tokenize` writes for them).
    #[arg(long, default_value = "u16")]
    data_width: runtime::data::TokenWidth,
    /// The data-parallel gradient exchange: none (f32), bf16, int8 (a scale per 256 elements,
    /// what rounding loses carried to the next step) or topk:FRACTION (the largest entries,
    /// the rest carried to the next step; as 1-bit
    /// Adam, the first 4 steps exchange the whole gradient and Adam's second moment is then
    /// frozen, so that error feedback applies in full). Every rank
    /// still applies the same update; what the smaller exchange does to convergence is the
    /// user's trade.
    /// [default: the plan's (`compile --grad-compression`), else none]
    #[arg(long)]
    grad_compression: Option<planner::dp_comm::GradCompression>,
    /// When data-parallel ranks synchronise: sync (every step) or local-sgd:H (no gradient
    /// exchange; parameters averaged every H steps; needs ZeRO-0).
    /// [default: the plan's (`compile --dp-sync`), else sync]
    #[arg(long)]
    dp_sync: Option<planner::dp_comm::DpSync>,
    /// A Hugging Face tokenizer.json: `--data` is a text, tokenized with it (the model's own
    /// tokenizer, for a real vocabulary).
    #[arg(long, requires = "data")]
    tokenizer: Option<PathBuf>,
    /// Seed of the initial parameters, the data order and dropout.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write one JSON object per step, replacing the file (`step`, `loss`, `tokens_per_s`, `step_time_s`,
    /// `comm_bytes`: the bytes the first rank sent in the step over all its communicators, as
    /// ring collectives send them).
    #[arg(long)]
    log_json: Option<PathBuf>,
    /// Write a checkpoint into this directory every `--checkpoint-every` steps and at the end.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
    /// Continue from the latest checkpoint in `--checkpoint-dir` (any layout).
    #[arg(long)]
    resume: bool,
    /// Seconds a rank waits for another at any collective or message before failing with an
    /// error that names it (it died or hung). With the default, a rank that dies or hangs ends
    /// the run within 30 s even when the launcher does not notice; raise it when ranks compute
    /// longer than this between messages (large models, long pipeline stages). On a GPU the
    /// collectives run on the device: a rank waits for its GPU's queued work up to
    /// `PLAIT_DEVICE_TIMEOUT` seconds (default 600), then asks the other ranks, under this
    /// timeout, which one is missing.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_S)]
    timeout: u64,
    /// After training, print where a step's time goes: wall time per instruction kind
    /// (computes by op, collectives by communicator) on the first rank of each pipeline
    /// stage, the first step left out as a warm-up. On a GPU each instruction then waits for
    /// the device, so that its time is the GPU's (and the step is slower). On the plan's
    /// hardware each kind's predicted milliseconds (the plan's `kernel_s`) stand beside it.
    #[arg(long)]
    op_times: bool,
    /// Reproducible arithmetic: matrix products accumulate in f64 and round once, and
    /// tensor-parallel partial sums cross the all-reduce in f64, so that a product's rounding
    /// hardly depends on how tensor parallelism split it and a parallel run trains to one
    /// device's parameters (not only its losses). Slower (f64 matrix products).
    #[arg(long)]
    reproducible: bool,
    /// Where the ranks train: cpu (this machine's threads) or cuda (GPUs; a build with
    /// `--features cuda`). A GPU plan on the CPU checks that its programs train as one device
    /// does; their speed and memory are not the plan's. dry runs no kernel and counts what a
    /// CUDA run would allocate: the memory line then compares the GPU allocator's high-water
    /// mark with the plan's peak, on any machine (losses print as 0).
    /// [default: the plan's cluster: cuda for a GPU cluster, cpu for `--cluster cpu`]
    #[arg(long, value_enum)]
    device: Option<crate::device::RunDeviceArg>,
    /// The same as `--device cpu` (kept for earlier scripts).
    #[arg(long, hide = true, conflicts_with = "device")]
    on_cpu: bool,
}

fn demo_plan() -> anyhow::Result<planner::plan::Plan> {
    // Written whole under a name of this process's, then renamed: demo runs started together
    // (tests, a launcher's ranks) never read another's half-written file.
    let dir = std::env::temp_dir();
    let path = dir.join("plait-demo-tiny-gpt2.json");
    let part = dir.join(format!("plait-demo-tiny-gpt2.json.{}", std::process::id()));
    std::fs::write(&part, DEMO_CONFIG)
        .and_then(|()| std::fs::rename(&part, &path))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let cluster = ClusterArgs {
        cluster: "cpu".into(),
        gpus: 2,
        global_batch: 8,
        seq: Some(64),
        train_tokens: None,
    };
    let pins = StrategyArgs {
        tp: None,
        pp: None,
        dp: None,
        micro_batch: None,
        zero: None,
        recompute: None,
        schedule: None,
        virtual_stages: None,
        sequence_parallel: None,
        precision: Some(planner::Precision::Fp32),
        attention: None,
        kernels: None,
        cp: None,
        ep: None,
        engine: None,
        stage_layers: None,
        grad_compression: None,
        dp_sync: None,
    };
    Ok(compile(&path.display().to_string(), &cluster, &pins, 0, None)?.plan)
}

/// Compressed exchanges and local SGD replace the whole data-parallel gradient all-reduce, so a
/// plan with ZeRO runs at ZeRO-0, and plait says so: local SGD's replicas each step with their
/// own whole optimizer state (DiLoCo's inner optimizers), which ZeRO shards; a compressed
/// exchange is a compressed all-reduce (its reduce-scatter and all-gather both carry the small
/// form, as DeepSpeed's 1-bit Adam runs without ZeRO's partitioning), where ZeRO's exact
/// parameter all-gather would send the full size again.
fn unsharded_for_dp_comm(
    mut plan: planner::plan::Plan,
    d: runtime::exec::dp_comm::DpComm,
) -> planner::plan::Plan {
    // The gradient-sharing ranks: data parallelism × context parallelism.
    let replicas = plan.strategy.dp * plan.strategy.cp.max(1);
    if !d.is_plain() && plan.strategy.zero > 0 && replicas > 1 {
        eprintln!(
            "note: {} exchanges the whole gradient each replica holds, so this ZeRO-{} plan runs \
             at ZeRO-0 (each rank holds the whole optimizer state; compile with --zero 0 to plan \
             its memory so)",
            d.describe(),
            plan.strategy.zero
        );
        plan.strategy.zero = 0;
    }
    plan
}

/// What a run trains: the programs, where initial weights come from, the vocabulary, the
/// data-parallel exchange (the flags', else the plan's) and the device.
struct Job {
    set: ProgramSet,
    init: Init,
    vocab: Option<u64>,
    dp: runtime::exec::dp_comm::DpComm,
    device: runtime::train::Device,
    /// The plan's predicted step seconds, where the run is on the hardware the plan was
    /// priced for (a GPU plan on CUDA, a CPU plan on CPU threads).
    predicted_step_s: Option<f64>,
    /// The plan's predicted peak bytes per pipeline stage, likewise.
    predicted_peak_bytes: Option<Vec<f64>>,
    /// The plan's predicted seconds per step by instruction kind, per stage, likewise.
    predicted_kernel_s: Option<Vec<std::collections::BTreeMap<String, f64>>>,
}

/// The vocabulary of a program directory's model, which `--data` is checked against as a
/// plan's is: the rows of the table its first embedding lookup reads (the token embedding;
/// the parameters' shapes are the whole tensors', even where the table is vocabulary-split).
fn program_vocab(set: &codegen::ProgramSet) -> Option<u64> {
    set.templates.iter().find_map(|t| {
        let table = t.instrs.iter().find_map(|i| match i {
            codegen::program::Instr::Compute {
                kind: ir::OpKind::Embedding,
                inputs,
                ..
            } => inputs.first().copied(),
            codegen::program::Instr::Vocab {
                op: codegen::program::VocabOp::Embedding,
                inputs,
                ..
            } => inputs.first().copied(),
            _ => None,
        })?;
        let param = t.buffers.get(table.index())?.role.param()?;
        set.params.get(param.index())?.shape.first().copied()
    })
}

/// The job of `args`; a device that cannot run here is refused before any program is built.
fn programs(args: &RunArgs) -> anyhow::Result<Job> {
    let seeded = Init::Seed(args.seed);
    let (plan, path) = match &args.plan {
        Some(p) if p.is_dir() => {
            let device = device(args, None);
            crate::device::check(device, None, None)?;
            let set = codegen::io::read(p)?;
            crate::codegen::verified_for_run(&set, p)?;
            let vocab = program_vocab(&set);
            return Ok(Job {
                set,
                init: seeded,
                vocab,
                dp: dp_comm(args, None),
                device,
                predicted_step_s: None,
                predicted_peak_bytes: None,
                predicted_kernel_s: None,
            });
        }
        Some(p) => (crate::plan_file::read(p)?, Some(p.as_path())),
        None => (demo_plan()?, None),
    };
    let device = device(args, Some(&plan));
    crate::device::check(device, path.map(|_| &plan), path)?;
    let dp = dp_comm(args, Some(plan.strategy.dp_comm));
    let plan = unsharded_for_dp_comm(plan, dp);
    let (set, _) = codegen::generate(&plan)?;
    let init = if plan.model.source == "onnx" {
        let m = import::load_model(
            &plan.model.reference,
            plan.strategy.micro_batch,
            Some(plan.strategy.seq),
        )?;
        m.weights.map_or(seeded, |w| {
            Init::Weights(runtime::exec::init::from_ir_weights(&w))
        })
    } else {
        seeded
    };
    let on_its_hardware = plan.cluster.runs_on_cpu_threads() == (device == Device::Cpu);
    Ok(Job {
        set,
        init,
        vocab: Some(plan.model.vocab),
        dp,
        device,
        predicted_step_s: on_its_hardware.then_some(plan.predicted.iteration_time_s),
        predicted_kernel_s: on_its_hardware.then(|| {
            plan.predicted
                .stages
                .iter()
                .map(|s| s.kernel_s.clone())
                .collect()
        }),
        predicted_peak_bytes: on_its_hardware.then(|| {
            plan.predicted
                .stages
                .iter()
                .map(|s| s.peak_memory_bytes)
                .collect()
        }),
    })
}

/// The exchange the flags ask for, each flag falling back to what the plan was priced with.
fn dp_comm(
    args: &RunArgs,
    planned: Option<planner::dp_comm::DpComm>,
) -> runtime::exec::dp_comm::DpComm {
    use planner::dp_comm::{DpSync as P, GradCompression as G};
    use runtime::exec::dp_comm::{DpSync, GradCompression};
    let planned = planned.unwrap_or_default();
    let compression = match args.grad_compression.unwrap_or(planned.grad_compression) {
        G::None => GradCompression::None,
        G::Bf16 => GradCompression::Bf16,
        G::Int8 => GradCompression::Int8,
        G::TopK(f) => GradCompression::TopK(f),
    };
    let sync = match args.dp_sync.unwrap_or(planned.dp_sync) {
        P::Sync => DpSync::Sync,
        P::LocalSgd { every } => DpSync::LocalSgd {
            every: u64::from(every),
        },
    };
    runtime::exec::dp_comm::DpComm { compression, sync }
}

fn data(args: &RunArgs) -> anyhow::Result<Tokens> {
    Ok(match (&args.data, &args.tokenizer) {
        (Some(text), Some(tokenizer)) => crate::tokenize::tokenize_file(text, tokenizer)?.0,
        (Some(p), None) => {
            let tokens = Tokens::load_as(p, args.data_width)?;
            if args.data_width == runtime::data::TokenWidth::U16
                && tokens.look_like_u32_read_as_u16()
            {
                eprintln!(
                    "note: {} looks like u32 token ids read as u16 (every second id is 0-3); \
                     pass --data-width u32 if it was written so",
                    p.display()
                );
            }
            tokens
        }
        (None, _) => Tokens::from_bytes("built-in text".into(), DEMO_TEXT.as_bytes()),
    })
}

/// The device of the run: `--device` (or `--on-cpu`), else the plan's cluster's.
fn device(args: &RunArgs, plan: Option<&planner::plan::Plan>) -> runtime::train::Device {
    let flag = args
        .device
        .or(args.on_cpu.then_some(crate::device::RunDeviceArg::Cpu));
    crate::device::resolve(flag, plan)
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    if let (Some(log), Some(plan)) = (&args.log_json, &args.plan) {
        crate::outputs::not_an_input(log, &[("plan", plan)])?;
    }
    let launch = runtime::launch::Launch::from_env()?;
    refuse_foreign_launch(launch.as_ref())?;
    let Job {
        set,
        init,
        vocab,
        dp,
        device,
        predicted_step_s,
        predicted_peak_bytes,
        predicted_kernel_s,
    } = programs(args)?;
    let tokens = data(args)?;
    if let Some(v) = vocab {
        tokens.check_vocab(v)?;
    }
    let opts = TrainOptions {
        steps: args.steps,
        seed: args.seed,
        init,
        timeout: Duration::from_secs(args.timeout.max(1)),
        reproducible: args.reproducible,
        dp_comm: dp,
        device,
        op_times: args.op_times,
        checkpoint: args
            .checkpoint_dir
            .as_ref()
            .map(|d| runtime::train::CheckpointOptions {
                dir: d.clone(),
                every: args.checkpoint_every,
                resume: args.resume,
            }),
    };
    if args.resume && args.checkpoint_dir.is_none() {
        anyhow::bail!("--resume needs --checkpoint-dir");
    }
    let world = launched_world(launch, &set, opts.timeout)?;
    let leader = world.as_ref().is_none_or(|w| w.rank() == 0);
    // Only the leader (rank 0) writes the log; other MPI processes leave the file alone.
    let log = match args.log_json.as_ref().filter(|_| leader) {
        Some(p) => Some(Mutex::new(
            std::fs::File::create(p).with_context(|| format!("cannot write {}", p.display()))?,
        )),
        None => None,
    };
    let m = &set.mesh;
    if leader {
        println!(
            "{}: {} ranks (tp {} pp {} dp {}{}), {} micro-batches of {} x {}, {} ZeRO-{}, data {} ({} tokens)",
            set.model,
            set.ranks.len(),
            m.tp,
            m.pp,
            m.batch_replicas(),
            if m.cp > 1 {
                format!(" cp {}: each sequence split over {} ranks", m.cp, m.cp)
            } else {
                String::new()
            },
            m.micro_batches,
            m.micro_batch,
            m.seq,
            m.schedule,
            m.zero,
            tokens.name,
            tokens.ids.len()
        );
        if device == Device::Cuda {
            println!(
                "device      cuda: rank r on GPU r mod the GPUs visible; plait's kernels and \
                 cuBLAS GEMMs (bf16 for a bf16 plan), f32 buffers; collectives on NCCL when \
                 each rank has its own GPU, else staged through host memory"
            );
        }
        if device == Device::Dry {
            println!(
                "device      dry: the CUDA run's allocations counted, no kernel run: losses \
                 print as 0 and times are not a GPU's; the memory line is what a GPU's \
                 allocator would hold"
            );
        }
    }
    let bar = if leader {
        ProgressBar::new(args.steps)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps ({elapsed}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let io_error = Mutex::new(None);
    let step_seconds = Mutex::new(Vec::new());
    let on_step = |rank: u32, s: StepLog| {
        if rank != 0 {
            return;
        }
        if let Ok(mut v) = step_seconds.lock() {
            v.push(s.seconds);
        }
        let mut lines = Vec::new();
        if let (Some((from, secs)), Some(dir)) = (s.resumed, &args.checkpoint_dir) {
            lines.push(format!(
                "resumed     from step {from} of the latest checkpoint in {} ({secs:.2} s to load)",
                dir.display()
            ));
        }
        lines.push(format!(
            "step {:>5}  loss {:.6}  {:>9.0} tokens/s  {:.3} s",
            s.step, s.loss, s.tokens_per_s, s.seconds
        ));
        if let (Some(secs), Some(dir)) = (s.checkpoint_s, &args.checkpoint_dir) {
            lines.push(format!(
                "checkpoint  step {} written to {} ({secs:.2} s)",
                s.step,
                dir.display()
            ));
        }
        // A bar not drawn (no terminal) prints nothing; the steps still go to stdout.
        for line in lines {
            if bar.is_hidden() {
                println!("{line}");
            } else {
                bar.println(line);
            }
        }
        bar.inc(1);
        if let Some(f) = &log {
            let line = serde_json::json!({
                "step": s.step,
                "loss": s.loss,
                "tokens_per_s": s.tokens_per_s,
                "step_time_s": s.seconds,
                "comm_bytes": s.comm_bytes,
            });
            let mut f = f.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = writeln!(f, "{line}")
                && let Ok(mut slot) = io_error.lock()
            {
                *slot = Some(e);
            }
        }
    };
    let result = match &world {
        Some(w) => w
            .train(&set, &tokens, &opts, &on_step)
            .map(|o| vec![(w.rank(), o)]),
        None => runtime::train::train_threads(&set, &tokens, &opts, &on_step)
            .map(|outs| outs.into_iter().enumerate().collect()),
    };
    bar.finish_and_clear();
    if let Ok(outs) = &result {
        print_op_times(&set, outs, predicted_kernel_s.as_deref());
        if leader {
            let seconds = step_seconds.lock().map(|v| v.clone()).unwrap_or_default();
            print_step_time(&seconds, predicted_step_s);
            print_peak_memory(&set, outs, predicted_peak_bytes.as_deref());
            print_transfers(outs);
            print_launches(outs);
        }
    }
    if let Err(e) = result {
        let e = explain(e, args.timeout.max(1));
        match &world {
            // A rank that cannot go on ends the job: peers waiting on it would otherwise wait
            // for their own deadlines, and MPI's finalize waits for every rank.
            Some(w) => w.abort(&e),
            None => return Err(e),
        }
    }
    if let Ok(mut slot) = io_error.lock()
        && let Some(e) = slot.take()
    {
        return Err(e).context("cannot write the JSON log");
    }
    Ok(())
}

/// Rank 0's host transfers per step, where the backend counts them (CUDA): the goal is the
/// batch up and the loss down; each op without a device kernel adds a round trip.
fn print_transfers(outs: &[(usize, runtime::train::RankOutcome)]) {
    let Some(t) = outs.first().and_then(|(_, o)| o.transfers_per_step) else {
        return;
    };
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "host        per step (rank {}): {} ops on the host, {} uploads ({:.1} MB), {} downloads \
         ({:.1} MB)",
        outs[0].0,
        t.host_ops,
        t.uploads,
        mb(t.upload_bytes),
        t.downloads,
        mb(t.download_bytes)
    );
}

/// Kernels the dry device counted in rank 0's last step: launches, and the bytes of the
/// buffers they were handed (what a GPU's memory system would move, at most), the kernels
/// with the most bytes first.
fn print_launches(outs: &[(usize, runtime::train::RankOutcome)]) {
    let Some(t) = outs
        .first()
        .and_then(|(_, o)| o.launches_last_step.as_ref())
    else {
        return;
    };
    let gb = |b: u64| b as f64 / 1e9;
    println!(
        "kernels     last step (rank {}): {} launches handed {:.1} GB of buffers; most bytes:",
        outs[0].0,
        t.launches(),
        gb(t.bytes())
    );
    for (name, c) in t.by_bytes().into_iter().take(LAUNCH_LINES) {
        println!(
            "              {name:<34} {:>5} launches {:>8.2} GB",
            c.launches,
            gb(c.bytes)
        );
    }
}

/// Kernels [`print_launches`] lists.
const LAUNCH_LINES: usize = 12;

/// Each pipeline stage's largest allocator high-water mark (backends that keep one: CUDA)
/// beside the plan's predicted peak for the stage where the run is on its hardware.
fn print_peak_memory(
    set: &ProgramSet,
    outs: &[(usize, runtime::train::RankOutcome)],
    predicted: Option<&[f64]>,
) {
    // Stage → (peak, where the rank that reached it reached it, what was live there).
    let mut by_stage: std::collections::BTreeMap<u32, (u64, String, String)> = Default::default();
    for (rank, o) in outs {
        let (Some(m), Some(info)) = (&o.memory, set.rank(*rank as u32)) else {
            continue;
        };
        let peak = by_stage.entry(info.coords.pp).or_default();
        if m.peak_in_use > peak.0 {
            let at = o.memory_peak_at.as_ref().map_or(String::new(), |p| {
                format!(", reached in step {} ({}) of rank {rank}", p.index, p.kind)
            });
            let live = o
                .memory_peak_at
                .as_ref()
                .map_or(String::new(), |p| live_at_peak(p, m.peak_in_use));
            *peak = (peak.0.max(m.peak_in_use), at, live);
        }
    }
    let gib = |b: f64| b / f64::from(1u32 << 30);
    if let Some((rank, m)) = outs.iter().find_map(|(r, o)| o.memory.map(|m| (r, m))) {
        println!(
            "allocator   rank {rank}: {} blocks from the driver, {} requests from the cache, \
             peak {:.2} GiB reserved",
            m.driver_allocs,
            m.reuses,
            gib(m.peak_reserved as f64)
        );
    }
    for (stage, (peak, at, live)) in by_stage {
        let measured = peak as f64;
        let line = format!(
            "memory      stage {stage}: peak {:.2} GiB in buffers (the allocator's high-water \
             mark{at})",
            gib(measured)
        );
        // The plan's peak holds a reserve for the CUDA context, library workspaces and
        // fragmentation, which no buffer of the allocator holds: compare without it.
        let reserve = planner::estimate::RESERVE_BYTES;
        match predicted
            .and_then(|p| p.get(stage as usize))
            .map(|p| p - reserve)
            .filter(|&p| p > 0.0)
        {
            Some(p) => println!(
                "{line}, predicted {:.2} GiB in buffers (the plan's peak less its {:.0} GiB \
                 reserve; measured / predicted {:.2})",
                gib(p),
                gib(reserve),
                measured / p
            ),
            None => println!("{line}"),
        }
        if !live.is_empty() {
            println!("            at that peak: {live}");
        }
    }
}

/// What the program held at the peak `p` of `peak` bytes, by class, and what only the
/// instruction held while it ran.
fn live_at_peak(p: &runtime::exec::peak::PeakAt, peak: u64) -> String {
    if p.live.is_empty() {
        return String::new();
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let held: u64 = p.live.iter().map(|(_, b)| b).sum();
    let mut parts: Vec<String> = p
        .live
        .iter()
        .map(|(class, b)| format!("{class} {:.2}", gib(*b)))
        .collect();
    parts.push(format!(
        "the instruction's own {:.2} GiB",
        gib(peak.saturating_sub(held))
    ));
    parts.join(", ")
}

/// The measured step time (the mean after the first step, a warm-up, when there are more)
/// beside the plan's prediction where the run is on the hardware the plan was priced for.
fn print_step_time(seconds: &[f64], predicted: Option<f64>) {
    let timed = if seconds.len() > 1 {
        &seconds[1..]
    } else {
        seconds
    };
    if timed.is_empty() {
        return;
    }
    let measured = timed.iter().sum::<f64>() / timed.len() as f64;
    match predicted.filter(|&p| p > 0.0) {
        Some(p) => println!(
            "time/step   measured {measured:.3} s, predicted {p:.3} s (measured / predicted {:.2})",
            measured / p
        ),
        None => println!(
            "time/step   measured {measured:.3} s (not on the hardware the plan was priced for: \
             no prediction to compare)"
        ),
    }
}

/// Each pipeline stage's first rank's time per instruction kind (ranks of a stage run one
/// template and spend their time alike), beside the plan's prediction for the stage where
/// the run is on the plan's hardware and the plan has one by kind.
fn print_op_times(
    set: &ProgramSet,
    outs: &[(usize, runtime::train::RankOutcome)],
    predicted: Option<&[std::collections::BTreeMap<String, f64>]>,
) {
    let mut seen = std::collections::BTreeSet::new();
    for (rank, o) in outs {
        let Some(t) = &o.op_times else { continue };
        let Some(info) = set.rank(*rank as u32) else {
            continue;
        };
        if !seen.insert(info.template) {
            continue;
        }
        println!(
            "\nrank {rank} (stage {}), {} steps:\n{}\nslowest instructions (`plait show` \
             numbers them):\n{}",
            info.coords.pp,
            t.steps,
            t.table(
                predicted
                    .and_then(|p| p.get(info.coords.pp as usize))
                    .filter(|k| !k.is_empty())
            ),
            t.slowest(12)
        );
    }
}

/// The error, with what a timeout means: the rank that did not arrive died or hung.
fn explain(e: runtime::RuntimeError, timeout: u64) -> anyhow::Error {
    let mut root = &e;
    while let runtime::RuntimeError::Instr { source, .. } = root {
        root = source;
    }
    match root {
        runtime::RuntimeError::Timeout { .. } | runtime::RuntimeError::DeviceWaitMissing { .. } => {
            anyhow::anyhow!(
                "{e}; it may have died or hung (or needs more than --timeout {timeout} s between messages)"
            )
        }
        runtime::RuntimeError::DeviceTimeout { .. } => anyhow::anyhow!(
            "{e}; every rank is still here, so the GPUs themselves are stuck or slow (if a \
             step needs longer, set PLAIT_DEVICE_TIMEOUT to more seconds)"
        ),
        _ => e.into(),
    }
}

/// Refuses a process that a launcher started as one of several ranks that this build cannot
/// join into one run (`mpirun` without the `mpi` feature and without `MASTER_ADDR` for the
/// ranks to meet over TCP): each process would run every rank as threads, the same training
/// once per process.
fn refuse_foreign_launch(launch: Option<&runtime::launch::Launch>) -> anyhow::Result<()> {
    let Some(l) = launch.filter(|l| l.world_size > 1) else {
        return Ok(());
    };
    if !over_mpi(l) || cfg!(feature = "mpi") || l.master.is_some() {
        return Ok(());
    }
    let how = "this plait was built without MPI: build it with `cargo build --release --features \
               mpi` to run one rank per process, or set MASTER_ADDR and MASTER_PORT for the ranks \
               to meet over TCP";
    anyhow::bail!(
        "this process is rank {} of {} started by {}, and {how}. Run `plait run` once, \
         without the launcher (it starts every rank itself)",
        l.rank,
        l.world_size,
        l.launcher.name()
    )
}

/// Whether `launch` is an MPI launcher's (whose ranks meet over MPI in a build with `mpi`).
fn over_mpi(launch: &runtime::launch::Launch) -> bool {
    use runtime::launch::Launcher;
    matches!(launch.launcher, Launcher::OpenMpi | Launcher::Mpich)
}

/// This process's place in a launched run of several processes: over MPI (`mpirun`, a build
/// with `mpi`), else over TCP at the launch's master address (torchrun, `srun`, or `mpirun`
/// with `MASTER_ADDR` in a build without MPI); `None` when no launcher started several.
fn launched_world(
    launch: Option<runtime::launch::Launch>,
    set: &ProgramSet,
    timeout: Duration,
) -> anyhow::Result<Option<World>> {
    let Some(l) = launch.filter(|l| l.world_size > 1) else {
        return Ok(None);
    };
    if over_mpi(&l) && cfg!(feature = "mpi") {
        return Ok(mpi_world()?.map(World::Mpi));
    }
    if l.world_size != set.ranks.len() {
        anyhow::bail!(
            "{} started {} processes, and the plan has {} ranks: launch one process per rank \
             (e.g. `torchrun --nproc-per-node {}`)",
            l.launcher.name(),
            l.world_size,
            set.ranks.len(),
            set.ranks.len()
        );
    }
    // Meeting waits for every rank to have built its programs: allow for slow starts.
    let meet = timeout.max(Duration::from_secs(60));
    let mut comm = runtime::comm::tcp::connect(&l, meet)?;
    runtime::Communicator::set_timeout(&mut comm, timeout);
    Ok(Some(World::Tcp(TcpRun {
        comm: Mutex::new(Some(comm)),
        rank: l.rank,
        local_rank: l.local_rank,
    })))
}

/// A launched process's world: MPI's or TCP's.
enum World {
    Mpi(MpiRun),
    Tcp(TcpRun),
}

impl World {
    fn rank(&self) -> usize {
        match self {
            World::Mpi(w) => w.rank,
            World::Tcp(w) => w.rank,
        }
    }

    fn train(
        &self,
        set: &ProgramSet,
        tokens: &Tokens,
        opts: &TrainOptions,
        on_step: &(dyn Fn(u32, StepLog) + Sync),
    ) -> Result<runtime::train::RankOutcome, runtime::RuntimeError> {
        match self {
            World::Mpi(w) => w.train(set, tokens, opts, on_step),
            World::Tcp(w) => {
                let comm = w
                    .comm
                    .lock()
                    .ok()
                    .and_then(|mut c| c.take())
                    .ok_or_else(|| runtime::RuntimeError::Poisoned {
                        op: "train",
                        reason: "this process's communicator was already used".into(),
                    })?;
                runtime::train::train_rank_on_device(set, w.local_rank, comm, tokens, opts, on_step)
            }
        }
    }

    fn abort(&self, e: &anyhow::Error) -> ! {
        match self {
            World::Mpi(w) => w.abort(e),
            // The peers' links break as this process exits: they stop at their next message
            // naming the connection to this rank.
            World::Tcp(w) => {
                eprintln!("error: world rank {}: {}", w.rank, crate::one_line(e));
                std::process::exit(i32::from(crate::EXIT_BAD_INPUT))
            }
        }
    }
}

/// One rank of a run whose processes meet over TCP (`runtime::comm::TcpComm`).
struct TcpRun {
    /// Taken by the one training of this process.
    comm: Mutex<Option<runtime::comm::TcpComm>>,
    rank: usize,
    /// The GPU this rank takes (the launcher's local rank).
    local_rank: usize,
}

/// The MPI world when this process runs under `mpirun` (feature `mpi`).
#[cfg(feature = "mpi")]
fn mpi_world() -> anyhow::Result<Option<MpiRun>> {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() && std::env::var_os("PMI_SIZE").is_none()
    {
        return Ok(None);
    }
    let world = runtime::comm::mpi::MpiWorld::init()?;
    let rank = runtime::Communicator::rank(&world.communicator());
    Ok(Some(MpiRun { world, rank }))
}

/// This process's index among the ranks of its node, as the launcher tells it (torchrun's
/// `LOCAL_RANK`, Open MPI's, MPICH's or Slurm's), else its world rank: which GPU it takes.
#[cfg(feature = "mpi")]
fn local_rank(world_rank: usize) -> usize {
    [
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.parse().ok())
    .unwrap_or(world_rank)
}

#[cfg(not(feature = "mpi"))]
fn mpi_world() -> anyhow::Result<Option<MpiRun>> {
    Ok(None)
}

#[cfg(feature = "mpi")]
struct MpiRun {
    world: runtime::comm::mpi::MpiWorld,
    rank: usize,
}

#[cfg(feature = "mpi")]
impl MpiRun {
    fn train(
        &self,
        set: &ProgramSet,
        tokens: &Tokens,
        opts: &TrainOptions,
        on_step: &(dyn Fn(u32, StepLog) + Sync),
    ) -> Result<runtime::train::RankOutcome, runtime::RuntimeError> {
        let mut comm = self.world.communicator();
        runtime::Communicator::set_timeout(&mut comm, opts.timeout);
        runtime::train::train_rank_on_device(
            set,
            local_rank(self.rank),
            comm,
            tokens,
            opts,
            on_step,
        )
    }

    /// Reports this rank's failure and ends the whole job (`MPI_Abort`, exit code 2).
    fn abort(&self, e: &anyhow::Error) -> ! {
        eprintln!("error: world rank {}: {}", self.rank, crate::one_line(e));
        self.world.abort(i32::from(crate::EXIT_BAD_INPUT))
    }
}

#[cfg(not(feature = "mpi"))]
struct MpiRun {
    rank: usize,
}

#[cfg(not(feature = "mpi"))]
impl MpiRun {
    fn train(
        &self,
        _: &ProgramSet,
        _: &Tokens,
        _: &TrainOptions,
        _: &(dyn Fn(u32, StepLog) + Sync),
    ) -> Result<runtime::train::RankOutcome, runtime::RuntimeError> {
        // Never called: without the feature there is no MPI world.
        let _ = self.rank;
        Ok(runtime::train::RankOutcome {
            losses: Vec::new(),
            states: Vec::new(),
            op_times: None,
            memory: None,
            memory_peak_at: None,
            transfers_per_step: None,
            launches_last_step: None,
        })
    }

    fn abort(&self, e: &anyhow::Error) -> ! {
        eprintln!("error: {}", crate::one_line(e));
        std::process::exit(i32::from(crate::EXIT_BAD_INPUT))
    }
}
