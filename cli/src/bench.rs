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
use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule, Strategy};

const SC21: &str = include_str!("../../data/megatron_sc21_runs.csv");

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

struct Row {
    table: String,
    model: String,
    layers: u64,
    hidden: u64,
    heads: u64,
    seq: u64,
    vocab: u64,
    gpus: u64,
    batch: u64,
    micro_batch: Option<u64>,
    tp: u32,
    pp: u32,
    dp: u32,
    zero: u8,
    tflops: f64,
}

fn rows() -> anyhow::Result<Vec<Row>> {
    let mut lines = SC21.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| anyhow::anyhow!("column {name} missing"))
    };
    let idx = [
        "table_ref",
        "model",
        "layers",
        "hidden",
        "heads",
        "seq_len",
        "vocab",
        "num_gpus",
        "global_batch_seqs",
        "micro_batch",
        "tp",
        "pp",
        "dp",
        "zero_stage",
        "tflops_per_gpu",
    ]
    .iter()
    .map(|n| col(n))
    .collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let get = |i: usize| f.get(idx[i]).copied().unwrap_or("");
        let num = |i: usize| get(i).parse::<u64>();
        out.push(Row {
            table: get(0).into(),
            model: get(1).into(),
            layers: num(2)?,
            hidden: num(3)?,
            heads: num(4)?,
            seq: num(5)?,
            vocab: num(6)?,
            gpus: num(7)?,
            batch: num(8)?,
            micro_batch: num(9).ok(),
            tp: num(10)? as u32,
            pp: num(11)? as u32,
            dp: num(12)? as u32,
            zero: num(13).unwrap_or(0) as u8,
            tflops: get(14).parse()?,
        });
    }
    Ok(out)
}

fn spec(r: &Row) -> ModelSpec {
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

/// Megatron's hardware FLOPs per iteration (with full recompute): 96·B·s·l·h²·(1 + s/6h + V/16lh).
fn megatron_flops(r: &Row) -> f64 {
    let (b, s, l, h, v) = (
        r.batch as f64,
        r.seq as f64,
        r.layers as f64,
        r.hidden as f64,
        r.vocab as f64,
    );
    96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
}

fn cost_model() -> anyhow::Result<()> {
    let cluster = Cluster::load("dgx-a100-80gb")?;
    let rows = rows()?;
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
        let info = ModelInfo::new(&graph)?;
        let mbs: Vec<u64> = match r.micro_batch {
            Some(m) => vec![m],
            None => [1, 2, 4, 8]
                .into_iter()
                .filter(|m| (r.batch / u64::from(r.dp)) % m == 0)
                .collect(),
        };
        let mut schedules = vec![(Schedule::OneFOneB, 1)];
        if r.pp > 1 {
            for v in [2u32, 3, 4] {
                if r.layers % u64::from(r.pp) == 0
                    && (r.layers / u64::from(r.pp)) % u64::from(v) == 0
                {
                    schedules.push((Schedule::Interleaved, v));
                }
            }
        }
        let mut best: Option<(f64, u64, Schedule, u32)> = None;
        for &mb in &mbs {
            for &(sch, v) in &schedules {
                let s = Strategy {
                    tp: r.tp,
                    pp: r.pp,
                    dp: r.dp,
                    micro_batch: mb,
                    global_batch: r.batch,
                    seq: r.seq,
                    zero: r.zero,
                    recompute: Recompute::Full,
                    schedule: sch,
                    virtual_stages: v,
                    sequence_parallel: false,
                    precision: Precision::Fp16,
                    stage_layers: None,
                    attention: Default::default(),
                };
                let Ok(e) = planner::estimate(&info, &cluster, r.gpus, &s) else {
                    continue;
                };
                if e.predicted.fits && best.is_none_or(|b| e.predicted.iteration_time_s < b.0) {
                    best = Some((e.predicted.iteration_time_s, mb, sch, v));
                }
            }
        }
        match best {
            Some((t, mb, sch, v)) => {
                let tf = megatron_flops(r) / (t * r.gpus as f64) / 1e12;
                let err = (tf - r.tflops) / r.tflops;
                errors.push(err.abs());
                let sch = if sch == Schedule::Interleaved {
                    format!("i{v}")
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
                    mb,
                    sch,
                    t,
                    r.tflops,
                    tf,
                    100.0 * err
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
