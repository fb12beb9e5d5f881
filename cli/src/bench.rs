//! `plait bench cost-model`: the cost model against the published Megatron-LM SC'21 runs.
//!
//! For each row: the row's model, GPUs, tp, pp, dp, global batch and ZeRO stage on
//! `dgx-a100-80gb` in fp16 with full recompute; the row's micro-batch where published, otherwise
//! the fastest fitting choice among micro-batch 1, 2, 4, 8 and the 1F1B / interleaved schedules.
//! Throughput uses the paper's own hardware-FLOPs formula, so the comparison is like for like.

use std::time::Instant;

use clap::{Args, Subcommand};
use import::{ModelSpec, build_forward, spec::Family};
use ir::DType;
use planner::calibration::{SC21_CSV, Sc21Row, predict_row, sc21_rows};
use planner::search::{Pins, SearchRequest, search};
use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule, Strategy};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: BenchKind,
}

#[derive(Subcommand, Debug)]
enum BenchKind {
    /// Predicted vs published TFLOP/s per GPU for the 22 Megatron-LM SC'21 runs.
    CostModel,
    /// plait's collective model against the NCCL bus bandwidths NCCL's maintainers and
    /// nccl-tests users report (shared data `nccl_busbw.md`).
    Collectives,
    /// The planner's per-stage peak memory against the programs' liveness on 20 pinned plans.
    Memory,
    /// Time `plait codegen` and `plait verify` of GPT-3 175B on 1,024 A100s, phase by phase
    /// (goal: 10 s a plan).
    Codegen,
    /// Time one strategy estimate of GPT-3 175B on 1024 A100s (the search's inner loop).
    EstimateSpeed,
    /// Search time (GPT-3 175B on 1024 GPUs, the 1T model on 3072) and plan quality against the
    /// published Megatron-LM configurations of SC'21 Table 1.
    Search,
    /// Predicted vs measured step time of three 2-rank plans of a small GPT on this machine
    /// (run it on a quiet machine).
    StepTime(crate::step_time::StepTimeArgs),
    /// Every op family of the device backend, forward and backward, against the CPU kernels
    /// (`--device cuda` on a GPU: the first check there).
    Kernels(crate::bench_kernels::KernelsArgs),
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match &args.which {
        BenchKind::CostModel => cost_model(),
        BenchKind::Collectives => collectives(),
        BenchKind::Memory => crate::bench_memory::run(),
        BenchKind::Codegen => crate::bench_codegen::run(),
        BenchKind::EstimateSpeed => estimate_speed(),
        BenchKind::Search => search_bench(),
        BenchKind::StepTime(a) => crate::step_time::run(a),
        BenchKind::Kernels(a) => crate::bench_kernels::run(a),
    }
}

/// The median of `v` (NaN when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

fn spec(r: &Sc21Row) -> ModelSpec {
    ModelSpec {
        name: r.model.clone(),
        family: Family::Gpt2,
        variant: Default::default(),
        layers: r.layers,
        hidden: r.hidden,
        heads: r.heads,
        kv_heads: r.heads,
        ffn: 4 * r.hidden,
        vocab: r.vocab,
        max_positions: r.seq,
        tied_embeddings: true,
        norm_eps: 1e-5,
        rope_theta: 0.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: r.seq,
        // Megatron-LM's GPT trains with dropout 0.1 (hidden and attention).
        dropout: 0.1,
    }
}

fn cost_model() -> anyhow::Result<()> {
    let cluster = Cluster::load("dgx-a100-80gb")?;
    let rows = sc21_rows(SC21_CSV)?;
    println!(
        "{:>3} {:<8} {:<12} {:>5} {:>9} {:>4} {:>4} {:>9} {:>10} {:>10} {:>7}",
        "row",
        "table",
        "model",
        "gpus",
        "tp/pp/dp",
        "mb",
        "sch",
        "iter (s)",
        "published",
        "predicted",
        "error"
    );
    let mut errors = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let graph = build_forward(&spec(r), DType::F32)?;
        match predict_row(r, &graph, &cluster)? {
            Some(p) => {
                errors.push(p.error.abs());
                let sch = if p.schedule == Schedule::Interleaved {
                    format!("i{}", p.virtual_stages)
                } else {
                    "1f1b".into()
                };
                println!(
                    "{:>3} {:<8} {:<12} {:>5} {:>9} {:>4} {:>4} {:>9.2} {:>10.0} {:>10.1} {:>+6.1}%",
                    i + 1,
                    r.table,
                    r.model,
                    r.gpus,
                    format!("{}/{}/{}", r.tp, r.pp, r.dp),
                    p.micro_batch,
                    sch,
                    p.iteration_time_s,
                    r.tflops_per_gpu,
                    p.tflops_per_gpu,
                    100.0 * p.error
                );
            }
            None => {
                errors.push(1.0);
                println!(
                    "{:>3} {:<8} {:<12} {:>5}  no fitting strategy",
                    i + 1,
                    r.table,
                    r.model,
                    r.gpus
                );
            }
        }
    }
    let within = errors.iter().filter(|e| **e <= 0.10).count();
    let mape = 100.0 * errors.iter().sum::<f64>() / errors.len().max(1) as f64;
    println!(
        "\n{within}/{} rows within ±10 %, mean absolute percentage error {mape:.1} %",
        errors.len()
    );
    println!();
    modern_set()
}

/// A modern row's model: NeMo's GPT-3 (learned positions, GELU MLP, LayerNorm, tied
/// embeddings, dropout 0.1 as GPT2Config defaults) or the published Llama architecture.
fn modern_spec(r: &planner::modern_runs::ModernRow) -> ModelSpec {
    let gpt = r.arch == "gpt";
    ModelSpec {
        name: r.model.clone(),
        family: if gpt { Family::Gpt2 } else { Family::Llama },
        variant: Default::default(),
        layers: r.layers,
        hidden: r.hidden,
        heads: r.heads,
        kv_heads: r.kv_heads,
        ffn: r.ffn,
        vocab: r.vocab,
        max_positions: r.seq,
        tied_embeddings: gpt,
        norm_eps: 1e-5,
        rope_theta: if gpt { 0.0 } else { 500_000.0 },
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: r.seq,
        dropout: if gpt { 0.1 } else { 0.0 },
    }
}

/// The modern public set: every row pinned as published on `dgx-h100`, `--engine megatron`.
fn modern_set() -> anyhow::Result<()> {
    use planner::modern_runs::{MODERN_CSV, modern_rows};
    let cluster = Cluster::load("dgx-h100")?;
    println!(
        "{:<22} {:<16} {:>5} {:>14} {:>9} {:>10} {:>10} {:>7}",
        "source", "model", "gpus", "tp/pp/cp/dp", "mb", "published", "predicted", "error"
    );
    let mut errors = Vec::new();
    let mut refused = 0;
    for r in modern_rows(MODERN_CSV)? {
        let graph = build_forward(&modern_spec(&r), DType::F32)?;
        let info = ModelInfo::new(&graph)?;
        let s = r.strategy();
        let mesh = format!("{}/{}/{}/{}", s.tp, s.pp, s.cp, s.dp);
        match planner::estimate(&info, &cluster, r.gpus, &s) {
            Ok(e) => {
                let p = &e.predicted;
                let err = (p.iteration_time_s - r.iteration_s) / r.iteration_s;
                errors.push(err.abs());
                refused += usize::from(!p.fits);
                println!(
                    "{:<22} {:<16} {:>5} {:>14} {:>9} {:>9.3}s {:>9.3}s {:>+6.1}%{}",
                    r.source,
                    r.model,
                    r.gpus,
                    mesh,
                    r.micro_batch,
                    r.iteration_s,
                    p.iteration_time_s,
                    100.0 * err,
                    if p.fits {
                        ""
                    } else {
                        "  (predicted not to fit)"
                    }
                );
            }
            Err(e) => {
                errors.push(1.0);
                refused += 1;
                println!(
                    "{:<22} {:<16} {:>5} {mesh:>14} refused: {e}",
                    r.source, r.model, r.gpus
                );
            }
        }
    }
    let within = errors.iter().filter(|e| **e <= 0.20).count();
    let mape = 100.0 * errors.iter().sum::<f64>() / errors.len().max(1) as f64;
    println!(
        "\nmodern set: {within}/{} rows within ±20 %, MAPE {mape:.1} %, {refused} refused or predicted not to fit",
        errors.len()
    );
    Ok(())
}

fn estimate_speed() -> anyhow::Result<()> {
    let cluster = Cluster::load("dgx-a100-80gb")?;
    let spec = import::zoo::find("gpt3-175b")
        .ok_or_else(|| anyhow::anyhow!("gpt3-175b missing from the zoo"))?;
    let graph = build_forward(&spec, DType::F32)?;
    let info = ModelInfo::new(&graph)?;
    let s = Strategy {
        tp: 8,
        pp: 8,
        dp: 16,
        micro_batch: 1,
        global_batch: 1536,
        seq: 2048,
        zero: 1,
        recompute: Recompute::Full,
        schedule: Schedule::Interleaved,
        virtual_stages: 2,
        sequence_parallel: true,
        precision: Precision::Bf16,
        stage_layers: None,
        attention: Default::default(),
        kernels: Default::default(),
        cp: 1,
        ep: 1,
        engine: planner::engine::Engine::Megatron,
        overlap: planner::engine::Overlap::LEGACY,
        dp_comm: Default::default(),
    };
    let runs = 200;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let e = planner::estimate(&info, &cluster, 1024, &s)?;
        times.push(t0.elapsed().as_secs_f64());
        std::hint::black_box(e);
    }
    let median_s = median(times.clone());
    times.sort_by(f64::total_cmp);
    println!(
        "GPT-3 175B on 1024 x A100 (tp 8, pp 8, dp 16, interleaved v=2, 96 micro-batches): one estimate takes \
         median {:.3} ms, min {:.3} ms, max {:.3} ms over {runs} runs",
        1e3 * median_s,
        1e3 * times[0],
        1e3 * times[runs - 1]
    );
    Ok(())
}

fn run_search(
    graph: &ir::Graph,
    cluster: &Cluster,
    gpus: u64,
    batch: u64,
    pins: Pins,
) -> anyhow::Result<planner::search::SearchResult> {
    let info = ModelInfo::new(graph)?;
    let req = SearchRequest {
        gpus,
        global_batch: batch,
        seq: 2048,
        pins,
        top_k: 3,
    };
    search(&info, cluster, &req, &mut |_, _| {})?
        .map_err(|inf| anyhow::anyhow!("nothing fits: {:?}", inf.suggestions))
}

/// Search time against depth: a Llama of hidden 1024 with 100 and 1,000 layers on 512 H100
/// (identical layers should cost one block: goal, 1,000 layers within 2x of 100).
fn depth_bench() -> anyhow::Result<()> {
    let cluster = Cluster::load("dgx-h100")?;
    let base =
        import::zoo::find("llama3-8b").ok_or_else(|| anyhow::anyhow!("llama3-8b missing"))?;
    let mut times = Vec::new();
    for layers in [100u64, 1000] {
        let spec = import::ModelSpec {
            name: format!("llama-h1024-l{layers}"),
            layers,
            hidden: 1024,
            heads: 16,
            kv_heads: 16,
            ffn: 2816,
            vocab: 32000,
            ..base.clone()
        };
        let graph = build_forward(&spec, DType::F32)?;
        let mut runs = Vec::new();
        for _ in 0..3 {
            let t0 = Instant::now();
            run_search(&graph, &cluster, 512, 512, Pins::default())?;
            runs.push(t0.elapsed().as_secs_f64());
        }
        times.push(median(runs));
    }
    println!(
        "  depth      Llama h1024 on 512 H100: 100 layers {:.3} s, 1,000 layers {:.3} s, ratio {:.1} (goal <= 2)",
        times[0],
        times[1],
        times[1] / times[0]
    );
    Ok(())
}

fn search_bench() -> anyhow::Result<()> {
    let cluster = Cluster::load("dgx-a100-80gb")?;
    println!("search time (wall clock, median of 3, this machine):");
    for (name, gpus, batch, limit) in [
        ("gpt3-175b", 1024u64, 1536u64, 2.0),
        ("gpt-1t", 3072, 3072, 5.0),
    ] {
        let spec = import::zoo::find(name).ok_or_else(|| anyhow::anyhow!("{name} missing"))?;
        let graph = build_forward(&spec, DType::F32)?;
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..3 {
            let t0 = Instant::now();
            let r = run_search(&graph, &cluster, gpus, batch, Pins::default())?;
            times.push(t0.elapsed().as_secs_f64());
            last = Some(r);
        }
        if let Some(r) = last {
            let s = &r.best.strategy;
            println!(
                "  {name:<10} {gpus:>5} GPUs, batch {batch:>5}: {:.2} s (goal <= {limit} s), {} candidates simulated, {} skipped by the time bound -> tp {} pp {} dp {} mb {} {} ZeRO-{} recompute {}",
                median(times.clone()),
                r.candidates_evaluated,
                r.candidates_bounded,
                s.tp,
                s.pp,
                s.dp,
                s.micro_batch,
                s.schedule,
                s.zero,
                s.recompute
            );
        }
    }
    depth_bench()?;
    println!(
        "\nquality against SC'21 Table 1 (same model, GPUs, batch; fp16; published tp/pp/dp with full recompute vs free):"
    );
    println!(
        "  {:<12} {:>5} {:>14} {:>14} {:>7}",
        "model", "gpus", "published (s)", "found (s)", "ratio"
    );
    let mut worst = f64::INFINITY;
    for r in sc21_rows(SC21_CSV)?.iter().filter(|r| r.table == "Table 1") {
        let graph = build_forward(&spec(r), DType::F32)?;
        let fp16 = Pins {
            precision: Some(Precision::Fp16),
            ..Pins::default()
        };
        let pinned = Pins {
            tp: Some(r.tp),
            pp: Some(r.pp),
            dp: Some(r.dp),
            recompute: Some(Recompute::Full),
            ..fp16.clone()
        };
        let published = run_search(&graph, &cluster, r.gpus, r.global_batch, pinned)?;
        let free = run_search(&graph, &cluster, r.gpus, r.global_batch, fp16)?;
        let (tp, tf) = (
            published.best.predicted.iteration_time_s,
            free.best.predicted.iteration_time_s,
        );
        worst = worst.min(tp / tf);
        let s = &free.best.strategy;
        println!(
            "  {:<12} {:>5} {:>14.2} {:>14.2} {:>6.3}x  (found tp {} pp {} dp {} mb {} {} ZeRO-{} {})",
            r.model,
            r.gpus,
            tp,
            tf,
            tp / tf,
            s.tp,
            s.pp,
            s.dp,
            s.micro_batch,
            s.schedule,
            s.zero,
            s.recompute
        );
    }
    println!(
        "\nworst ratio {worst:.3} (>= 1.000 means the search is never slower than the published configuration)"
    );
    Ok(())
}

fn collectives() -> anyhow::Result<()> {
    use planner::nccl_reference::{BUFFER_BYTES, rows};
    println!(
        "{:<38} {:<14} {:>10} {:>10} {:>7}  source",
        "system", "collective", "published", "predicted", "error"
    );
    let mut within = 0;
    let all = rows();
    for r in &all {
        let p = r.predicted_gb_per_s()?;
        let err = (p - r.published_gb_per_s) / r.published_gb_per_s;
        within += usize::from(err.abs() <= 0.15);
        println!(
            "{:<38} {:<14} {:>10.1} {:>10.1} {:>+6.1}%  {}",
            r.system,
            format!("{:?}", r.collective),
            r.published_gb_per_s,
            p,
            100.0 * err,
            r.source
        );
    }
    println!(
        "\n{within}/{} figures within 15 % (bus bandwidth, GB/s, {:.0} GiB buffers)",
        all.len(),
        BUFFER_BYTES / (1u64 << 30) as f64
    );
    println!(
        "not priced: NCCL's tree all-reduce on 2 nodes, which can exceed the NIC limit \
         (NVIDIA/nccl#946); plait prices 2-node all-reduce as a ring, as the measured 2-node \
         figure above (86 GB/s, below its 96 GB/s NIC limit) shows it ran"
    );
    Ok(())
}
