//! `plait estimate MODEL --cluster C --gpus N ...`: the cost model's prediction for one strategy.

use clap::Args;
use planner::{Cluster, ModelInfo, estimate::Estimate};

use crate::model;
use crate::strategy_args::{ClusterArgs, StrategyArgs};

#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// A zoo name (see `plait models`), a Hugging Face config.json (or its directory), an ONNX
    /// file, or a Hub id (`org/name`) already downloaded to the local Hugging Face cache.
    model: String,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    strategy: StrategyArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &EstimateArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster.cluster)?;
    cluster.check_gpus(args.cluster.gpus)?;
    let mb = args.strategy.micro_batch.unwrap_or(1);
    let m = model::load(&args.model, mb, args.cluster.seq)?;
    let strategy = args
        .strategy
        .complete(&cluster, args.cluster.global_batch, m.binding.seq)?;
    let info = ModelInfo::new(&m.graph)?;
    let e = planner::estimate(&info, &cluster, args.cluster.gpus, &strategy)?
        .with_training(&cluster, args.cluster.train_tokens);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        print_text(&m.graph.name, &cluster, &e);
    }
    Ok(())
}

/// A per-GPU FLOP rate at a readable scale: TFLOP/s on GPUs, GFLOP/s for CPU ranks (whose
/// rates print as 0.0 TFLOP/s otherwise).
pub fn flop_rate(tflops: f64) -> (f64, &'static str) {
    if tflops >= 1.0 || tflops == 0.0 {
        (tflops, "TFLOP/s")
    } else {
        (tflops * 1e3, "GFLOP/s")
    }
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / (1u64 << 30) as f64)
}

pub fn print_text(model: &str, cluster: &Cluster, e: &Estimate) {
    let s = &e.strategy;
    let p = &e.predicted;
    println!(
        "{model} on {} x {} ({})",
        s.gpus(),
        cluster.gpu.name,
        cluster.name
    );
    println!(
        "strategy    tp {} x pp {} x dp {}{}, micro-batch {} ({} per iteration), global batch {}, seq {}",
        s.tp,
        s.pp,
        s.dp,
        match (s.cp > 1, s.ep > 1) {
            (true, _) => format!(" x cp {}", s.cp),
            (false, true) => format!(" (ep {} within dp)", s.ep),
            _ => String::new(),
        },
        s.micro_batch,
        s.micro_batches(),
        s.global_batch,
        s.seq
    );
    println!(
        "            ZeRO-{}, recompute {}, schedule {}{}, sequence parallel {}, {}, {} attention, engine {}",
        s.zero,
        s.recompute,
        s.schedule,
        if s.virtual_stages > 1 {
            format!(" (v = {})", s.virtual_stages)
        } else {
            String::new()
        },
        if s.sequence_parallel { "on" } else { "off" },
        s.precision,
        match s.attention {
            planner::cost::compute::AttentionKernel::Fused => "fused",
            planner::cost::compute::AttentionKernel::Materialized => "materialized",
        },
        s.engine
    );
    println!();
    println!(
        "iteration   {:.4} s   ({:.0} tokens/s)",
        p.iteration_time_s, p.tokens_per_s
    );
    let ((model, unit), (hardware, _)) = (
        flop_rate(p.model_tflops_per_gpu),
        flop_rate(p.hardware_tflops_per_gpu),
    );
    println!(
        "throughput  {model:.1} model {unit} per GPU ({hardware:.1} with recompute), MFU {:.1} %",
        100.0 * p.mfu
    );
    let t = &p.time;
    println!(
        "time        compute {:.4} s, TP comm {:.4} s, PP comm {:.4} s, DP comm {:.4} s, bubble {:.4} s, optimizer {:.4} s",
        t.compute, t.tp_comm, t.pp_comm, t.dp_comm, t.bubble, t.optimizer
    );
    if t.ep_comm > 0.0 {
        println!(
            "            EP comm {:.4} s (token dispatch and combine over {} ranks)",
            t.ep_comm, e.strategy.ep
        );
    }
    if let Some(x) = &p.dp_exchange {
        print_dp_exchange(x);
    }
    let mm = &p.memory;
    println!(
        "memory      peak {} of {} -> {}",
        gib(p.peak_memory_bytes),
        gib(p.memory_capacity_bytes),
        if p.fits {
            "fits".to_string()
        } else {
            format!(
                "DOES NOT FIT (short by {})",
                gib(p.peak_memory_bytes - p.memory_capacity_bytes)
            )
        }
    );
    println!(
        "            weights {}, grads {}, optimizer {}, activations {}, other {}",
        gib(mm.weights),
        gib(mm.grads),
        gib(mm.optimizer),
        gib(mm.activations),
        gib(mm.other)
    );
    if let Some(t) = &p.training {
        print_training(t);
    }
    if p.stages.len() > 1 {
        println!("stages      (stage: layers, busy, peak memory, micro-batches in flight)");
        for st in &p.stages {
            println!(
                "            {:>3}: {:>3} layers, {:.4} s, {}, {}",
                st.stage,
                st.layers,
                st.busy_s,
                gib(st.peak_memory_bytes),
                st.micro_batches_in_flight
            );
        }
    }
}

/// The training-run line: days, GPU-hours, energy and cost.
pub fn print_training(t: &planner::training::TrainingRun) {
    println!("{}", training_line(t));
}

/// `training    N tokens: D days, H GPU-hours, E MWh at PUE p[, cost C]`.
pub fn training_line(t: &planner::training::TrainingRun) -> String {
    let energy = t
        .energy_kwh
        .map_or(String::from("energy unknown (no board power)"), |k| {
            format!("{:.0} MWh at PUE {:.2}", k / 1000.0, t.pue)
        });
    let cost = t.cost.map_or(String::new(), |c| format!(", cost {c:.0}"));
    format!(
        "training    {:.3e} tokens: {:.1} days, {:.0} GPU-hours, {energy}{cost}",
        t.tokens, t.days, t.gpu_hours
    )
}

/// The compressed or local-SGD exchange beside the plain one, and whose trade it is.
fn print_dp_exchange(x: &planner::estimate::DpExchange) {
    let mb = |b: f64| b / 1e6;
    println!(
        "dp exchange --grad-compression {} --dp-sync {}: {:.1} MB sent per rank per step, {:.4} s (plain: {:.1} MB, {:.4} s; {:.1}x less data, {:.1}x less time before overlap)",
        x.grad_compression,
        x.dp_sync,
        mb(x.bytes_per_step),
        x.exchange_s,
        mb(x.plain_bytes_per_step),
        x.plain_exchange_s,
        x.plain_bytes_per_step / x.bytes_per_step.max(f64::MIN_POSITIVE),
        x.plain_exchange_s / x.exchange_s.max(f64::MIN_POSITIVE),
    );
    println!(
        "            what the smaller exchange does to convergence is your trade: plait prices it and picks it only among the modes `compile --search-dp-comm` names"
    );
}
