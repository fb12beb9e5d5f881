//! The published runs plait's cost model is checked against (never fitted to): Megatron-LM
//! SC'21 (Narayanan et al. 2021), Tables 1 and 2, shipped in `data/megatron_sc21_runs.csv`.

use crate::cost::compute::{AttentionKernel, Kernels};
use crate::error::PlanError;
use crate::estimate::estimate;
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::precision::Precision;
use crate::strategy::{Recompute, Schedule, Strategy};

/// The CSV, embedded so the check needs no file next to the binary.
pub const SC21_CSV: &str = include_str!("../../data/megatron_sc21_runs.csv");

/// One published run.
#[derive(Clone, Debug, PartialEq)]
pub struct Sc21Row {
    pub table: String,
    pub model: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub seq: u64,
    pub vocab: u64,
    pub gpus: u64,
    pub global_batch: u64,
    pub micro_batch: Option<u64>,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub zero: u8,
    pub tflops_per_gpu: f64,
}

/// Parses the CSV by column name.
pub fn sc21_rows(csv: &str) -> Result<Vec<Sc21Row>, PlanError> {
    let bad = |m: String| PlanError::ClusterFile {
        file: "megatron_sc21_runs.csv".into(),
        message: m,
    };
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let names = [
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
    ];
    let mut idx = Vec::with_capacity(names.len());
    for n in names {
        idx.push(
            header
                .iter()
                .position(|h| *h == n)
                .ok_or_else(|| bad(format!("column {n} missing")))?,
        );
    }
    let mut out = Vec::new();
    for (line_no, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let get = |i: usize| f.get(idx[i]).copied().unwrap_or("");
        let num = |i: usize| {
            get(i).parse::<u64>().map_err(|_| {
                bad(format!(
                    "line {}: `{}` is not an integer ({})",
                    line_no + 2,
                    get(i),
                    names[i]
                ))
            })
        };
        out.push(Sc21Row {
            table: get(0).into(),
            model: get(1).into(),
            layers: num(2)?,
            hidden: num(3)?,
            heads: num(4)?,
            seq: num(5)?,
            vocab: num(6)?,
            gpus: num(7)?,
            global_batch: num(8)?,
            micro_batch: get(9).parse().ok(),
            tp: num(10)? as u32,
            pp: num(11)? as u32,
            dp: num(12)? as u32,
            zero: get(13).parse().unwrap_or(0),
            tflops_per_gpu: get(14)
                .parse()
                .map_err(|_| bad(format!("line {}: bad tflops_per_gpu", line_no + 2)))?,
        });
    }
    Ok(out)
}

impl Sc21Row {
    /// Megatron's hardware FLOPs per iteration (full recompute): 96·B·s·l·h²·(1 + s/6h + V/16lh).
    pub fn hardware_flops(&self) -> f64 {
        let (b, s, l, h, v) = (
            self.global_batch as f64,
            self.seq as f64,
            self.layers as f64,
            self.hidden as f64,
            self.vocab as f64,
        );
        96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
    }
}

/// The prediction for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowPrediction {
    pub micro_batch: u64,
    pub schedule: Schedule,
    pub virtual_stages: u32,
    pub iteration_time_s: f64,
    pub tflops_per_gpu: f64,
    /// (predicted − published) / published.
    pub error: f64,
    pub dp_comm_s: f64,
    pub compute_s: f64,
}

/// Estimates a row as the acceptance test prescribes: the row's tp, pp, dp, batch and ZeRO stage
/// in fp16 with full recompute; the row's micro-batch where published, else the fastest fitting
/// of micro-batch 1, 2, 4, 8 and of 1F1B / interleaved (v = 2, 3, 4 where layers divide).
/// `graph` is the row's GPT model.
pub fn predict_row(
    row: &Sc21Row,
    graph: &ir::Graph,
    cluster: &Cluster,
) -> Result<Option<RowPrediction>, PlanError> {
    let info = ModelInfo::new(graph)?;
    let per_replica = row.global_batch / u64::from(row.dp.max(1));
    let mbs: Vec<u64> = match row.micro_batch {
        Some(m) => vec![m],
        None => [1, 2, 4, 8]
            .into_iter()
            .filter(|m| per_replica.is_multiple_of(*m))
            .collect(),
    };
    let mut schedules = vec![(Schedule::OneFOneB, 1)];
    if row.pp > 1 {
        for v in [2u32, 3, 4] {
            let pp = u64::from(row.pp);
            if row.layers.is_multiple_of(pp) && (row.layers / pp).is_multiple_of(u64::from(v)) {
                schedules.push((Schedule::Interleaved, v));
            }
        }
    }
    let mut best: Option<RowPrediction> = None;
    for &mb in &mbs {
        for &(schedule, v) in &schedules {
            let s = Strategy {
                tp: row.tp,
                pp: row.pp,
                dp: row.dp,
                micro_batch: mb,
                global_batch: row.global_batch,
                seq: row.seq,
                zero: row.zero,
                recompute: Recompute::Full,
                schedule,
                virtual_stages: v,
                sequence_parallel: false,
                precision: Precision::Fp16,
                // Megatron-LM in 2021 materialized the attention scores.
                attention: AttentionKernel::Materialized,
                // The rows are Megatron-LM runs, which use its fused kernels (SC'21 §4.2).
                kernels: Kernels::Fused,
                cp: 1,
                ep: 1,
                // Megatron-LM as of 2021 (no distributed optimizer, no TP overlap); the ZeRO-3
                // rows ran DeepSpeed's ZeRO-3 of that time (SC'21 §5.2).
                engine: if row.zero == 3 {
                    crate::engine::Engine::Deepspeed
                } else {
                    crate::engine::Engine::Megatron
                },
                overlap: if row.zero == 3 {
                    crate::engine::Overlap::DEEPSPEED_2021
                } else {
                    crate::engine::Overlap::LEGACY
                },
                stage_layers: None,
                dp_comm: Default::default(),
            };
            let Ok(e) = estimate(&info, cluster, row.gpus, &s) else {
                continue;
            };
            let p = &e.predicted;
            if !p.fits
                || best
                    .as_ref()
                    .is_some_and(|b| b.iteration_time_s <= p.iteration_time_s)
            {
                continue;
            }
            let tflops = row.hardware_flops() / (p.iteration_time_s * row.gpus as f64) / 1e12;
            best = Some(RowPrediction {
                micro_batch: mb,
                schedule,
                virtual_stages: v,
                iteration_time_s: p.iteration_time_s,
                tflops_per_gpu: tflops,
                error: (tflops - row.tflops_per_gpu) / row.tflops_per_gpu,
                dp_comm_s: p.time.dp_comm,
                compute_s: p.time.compute,
            });
        }
    }
    Ok(best)
}
