//! `plait bench step-time`: the cost model's predicted step time against the runtime's
//! measured one on this machine. Measures the machine (what `plait profile` writes) unless a
//! cluster file is given, compiles three 2-rank plans of a small GPT (data, tensor and pipeline
//! parallel) against it, trains each for a few steps on the threads communicator and prints
//! predicted vs median measured step time.
//!
//! Timings are only comparable on a quiet machine: the profile and the runs share the cores,
//! so run it with nothing else busy.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use runtime::data::Tokens;
use runtime::exec::Init;
use runtime::profile::{ProfileOptions, measure};
use runtime::train::{StepLog, TrainOptions, train_threads};

use crate::compile::compile;
use crate::strategy_args::{ClusterArgs, StrategyArgs, Switch};

/// A GPT-2-shaped model big enough that compute, not per-instruction overhead, dominates a
/// step, small enough to train on two CPU cores in about a second per step.
const MODEL: &str = r#"{"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 8, "vocab_size": 256, "n_positions": 256, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}"#;
const SEQ: u64 = 128;
const GLOBAL_BATCH: u64 = 8;
const TEXT: &str = include_str!("../../data/tiny.txt");

#[derive(Args, Debug)]
pub struct StepTimeArgs {
    /// A cluster file from `plait profile` [default: measure this machine now].
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Measured steps per plan (after one warm-up step).
    #[arg(long, default_value_t = 8)]
    steps: u64,
}

/// The three plans: (label, tp, pp, dp).
const PLANS: [(&str, u32, u32, u32); 3] = [
    ("dp 2", 1, 1, 2),
    ("tp 2", 2, 1, 1),
    ("pp 2 (1f1b)", 1, 2, 1),
];

fn pins(tp: u32, pp: u32, dp: u32) -> StrategyArgs {
    StrategyArgs {
        tp: Some(tp),
        pp: Some(pp),
        dp: Some(dp),
        micro_batch: Some(1),
        zero: Some(0),
        recompute: Some(planner::Recompute::None),
        schedule: Some(planner::Schedule::OneFOneB),
        virtual_stages: Some(1),
        sequence_parallel: Some(Switch::Off),
        precision: Some(planner::Precision::Fp32),
        attention: None,
        // What the cluster file says (eager: plait's CPU runtime launches one kernel per op).
        kernels: None,
        cp: None,
        ep: None,
        engine: None,
        stage_layers: None,
        grad_compression: None,
        dp_sync: None,
    }
}

pub fn run(args: &StepTimeArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("plait-step-time-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let model = dir.join("config.json");
    std::fs::write(&model, MODEL).with_context(|| format!("cannot write {}", model.display()))?;
    let cluster = match &args.cluster {
        Some(c) => c.clone(),
        None => {
            eprintln!("measuring this machine (plait profile) ...");
            let p = measure(&ProfileOptions { quick: false })?;
            let path = dir.join("cpu.toml");
            std::fs::write(&path, p.to_cluster_toml("this-machine"))
                .with_context(|| format!("cannot write {}", path.display()))?;
            path
        }
    };
    let tokens = Tokens::from_bytes("built-in text".into(), TEXT.as_bytes());
    println!(
        "GPT-2 4 x 256 (8 heads, vocabulary 256), seq {SEQ}, global batch {GLOBAL_BATCH}, fp32, \
         2 ranks on {}; median of {} steps after 1 warm-up",
        cluster.display(),
        args.steps
    );
    println!(
        "{:<12} {:>14} {:>14} {:>8}",
        "plan", "predicted (s)", "measured (s)", "error"
    );
    let mut worst = 0f64;
    for (label, tp, pp, dp) in PLANS {
        let c = compile(
            &model.display().to_string(),
            &ClusterArgs {
                cluster: cluster.display().to_string(),
                gpus: 2,
                global_batch: GLOBAL_BATCH,
                seq: Some(SEQ),
                train_tokens: None,
            },
            &pins(tp, pp, dp),
            0,
            None,
        )?;
        let predicted = c.plan.predicted.iteration_time_s;
        let (set, _) = codegen::generate(&c.plan)?;
        let times = Mutex::new(Vec::new());
        let on_step = |rank: u32, s: StepLog| {
            if rank == 0
                && s.step > 1
                && let Ok(mut t) = times.lock()
            {
                t.push(s.seconds);
            }
        };
        let opts = TrainOptions {
            steps: args.steps + 1,
            seed: 0,
            init: Init::Seed(0),
            timeout: Duration::from_secs(120),
            checkpoint: None,
            reproducible: false,
            dp_comm: Default::default(),
            device: Default::default(),
            op_times: false,
        };
        train_threads(&set, &tokens, &opts, &on_step)?;
        let measured = crate::bench::median(times.into_inner().unwrap_or_default());
        let error = predicted / measured - 1.0;
        worst = worst.max(error.abs());
        println!(
            "{label:<12} {predicted:>14.4} {measured:>14.4} {:>+7.1}%",
            100.0 * error
        );
    }
    println!("largest |error| {:.1}%", 100.0 * worst);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
