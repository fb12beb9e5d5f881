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
    /// Time one strategy estimate of GPT-3 175B on 1024 A100s (the search's inner loop).
    EstimateSpeed,
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match args.which {
        BenchKind::CostModel => cost_model(),
        BenchKind::EstimateSpeed => estimate_speed(),
    }
}

fn spec(r: &Sc21Row) -> ModelSpec {
    ModelSpec {
        name: r.model.clone(),
        family: Family::Gpt2,
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
    };
    let runs = 200;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let e = planner::estimate(&info, &cluster, 1024, &s)?;
        times.push(t0.elapsed().as_secs_f64());
        std::hint::black_box(e);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "GPT-3 175B on 1024 x A100 (tp 8, pp 8, dp 16, interleaved v=2, 96 micro-batches): one estimate takes \
         median {:.3} ms, min {:.3} ms, max {:.3} ms over {runs} runs",
        1e3 * times[runs / 2],
        1e3 * times[0],
        1e3 * times[runs - 1]
    );
    Ok(())
}
