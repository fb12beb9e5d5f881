//! `plait report`: a plan explained. The chosen degrees and the reasons for them, each stage's
//! layers, time and memory, the communication volume per collective and link level, the bubble,
//! the alternatives, and the simulated iteration as slices for traces and timelines.
//!
//! Built from a plan's stored prediction plus a re-run of the estimate with its timeline kept
//! ([`crate::estimate::estimate_traced`]); [`Report::stale`] says when the two disagree.

mod tp_volume;
pub mod trace;
pub mod volume;
pub mod why;

use serde::{Deserialize, Serialize};

use crate::estimate::{Estimate, MemoryBreakdown, OPTIMIZER_BYTES_PER_PARAM, TimeBreakdown};
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::plan::{ModelRef, Plan};
use crate::strategy::Strategy;
use trace::{Slice, StageTail};
use volume::StageVolume;

pub const FORMAT: &str = "plait-report/1";

/// Relative difference in iteration time above which a plan counts as stale.
pub const STALE_TOLERANCE: f64 = 1e-9;

/// The plan's headline numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub iteration_time_s: f64,
    pub tokens_per_s: f64,
    pub model_tflops_per_gpu: f64,
    pub hardware_tflops_per_gpu: f64,
    pub mfu: f64,
    pub peak_memory_bytes: f64,
    pub memory_capacity_bytes: f64,
    pub fits: bool,
    pub bubble_fraction: f64,
    /// The critical stage's breakdown.
    pub time: TimeBreakdown,
    /// Days, GPU-hours, energy and cost of a training run (the plan's `--train-tokens`, or
    /// `plait report --train-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<crate::training::TrainingRun>,
}

/// A contiguous range of layers on a stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkLayers {
    pub chunk: u32,
    /// First layer and one past the last.
    pub layers: [u32; 2],
    pub embedding: bool,
    pub head: bool,
}

/// One pipeline stage: what it holds, how it spends the iteration, its memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    pub stage: u32,
    pub layers: u32,
    pub chunks: Vec<ChunkLayers>,
    /// Seconds running forward and backward tasks (with their TP collectives).
    pub busy_s: f64,
    /// Seconds waiting inside the pipeline (bubble and transfers).
    pub idle_s: f64,
    /// Seconds after its last backward: exposed DP synchronisation and the optimizer step.
    pub tail_s: f64,
    pub finish_s: f64,
    pub memory: MemoryBreakdown,
    pub peak_memory_bytes: f64,
    pub micro_batches_in_flight: u32,
}

/// A plan the search rejected, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlternativeReport {
    pub strategy: String,
    pub iteration_time_s: f64,
    pub fits: bool,
    pub peak_memory_bytes: f64,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub format: String,
    pub model: ModelRef,
    pub cluster: String,
    pub gpu: String,
    pub gpus: u64,
    pub gpus_per_node: u32,
    pub strategy: Strategy,
    /// One line: `tp 2 pp 2 dp 2, micro-batch 8, ...`.
    pub strategy_summary: String,
    /// The engine the search kept to (`compile --target`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<crate::engine::Engine>,
    /// As stored in the plan.
    pub predicted: Summary,
    /// The iteration time the current cost model predicts for the plan's strategy.
    pub recomputed_iteration_time_s: f64,
    /// The peak memory per GPU the current cost model predicts for the plan's strategy.
    pub recomputed_peak_memory_bytes: f64,
    /// The GPU memory the current cost model prices against (the plan's cluster as read now).
    pub recomputed_memory_capacity_bytes: f64,
    /// Whether the strategy fits by the current cost model (a plan edited by hand may not).
    pub recomputed_fits: bool,
    /// Whether the plan's prediction and the current cost model's differ: in time or peak
    /// memory by more than [`STALE_TOLERANCE`] (relative), or in whether the plan fits.
    pub stale: bool,
    pub why: Vec<String>,
    pub stages: Vec<StageReport>,
    /// Per-GPU communication of each stage.
    pub communication: Vec<StageVolume>,
    pub alternatives: Vec<AlternativeReport>,
    /// The simulated iteration (for traces and the HTML timeline).
    #[serde(skip)]
    pub slices: Vec<Slice>,
}

/// `tp 2 pp 2 dp 2, micro-batch 8, interleaved v=6, ZeRO-1, recompute none, SP`.
pub fn strategy_summary(s: &Strategy) -> String {
    let mut out = format!(
        "tp {} pp {} dp {}, micro-batch {}, {}",
        s.tp, s.pp, s.dp, s.micro_batch, s.schedule
    );
    if s.virtual_stages > 1 {
        out += &format!(" v={}", s.virtual_stages);
    }
    out += &format!(", ZeRO-{}, recompute {}", s.zero, s.recompute);
    if s.sequence_parallel {
        out += ", SP";
    }
    if s.ep > 1 {
        out += &format!(", EP {}", s.ep);
    }
    out
}

/// Seconds of stage `d`'s optimizer step (the cost model's memory-bound step).
pub fn optimizer_seconds(info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy, d: u32) -> f64 {
    let (dense, experts) = volume::stage_local_split(info, s, d);
    let owned = if s.zero >= 1 {
        dense / f64::from(s.dp) + experts / f64::from(s.dp / s.ep.max(1))
    } else {
        dense + experts
    };
    owned * OPTIMIZER_BYTES_PER_PARAM / cluster.hbm_bytes_per_s()
        + cluster.gpu.launch_overhead_us * 1e-6
}

impl Report {
    /// What the current cost model predicts for the plan's strategy, for a stale plan's
    /// warning: the iteration, the peak and whether it fits.
    pub fn recomputed_summary(&self) -> String {
        format!(
            "the current cost model predicts {} per iteration and a peak of {} of {} ({})",
            why::secs(self.recomputed_iteration_time_s),
            why::size(self.recomputed_peak_memory_bytes),
            why::size(self.recomputed_memory_capacity_bytes),
            if self.recomputed_fits {
                "fits"
            } else {
                "does not fit"
            }
        )
    }
}

/// Whether `a` and `b` differ by more than [`STALE_TOLERANCE`] relative.
pub fn differs(a: f64, b: f64) -> bool {
    (a - b).abs() > STALE_TOLERANCE * a.abs().max(b.abs())
}

/// Explains `plan`, given the model it was made for and `traced`, its strategy re-estimated
/// with [`crate::estimate::estimate_traced`].
pub fn build(plan: &Plan, info: &ModelInfo<'_>, traced: &Estimate) -> Report {
    let s = &plan.strategy;
    let p = &plan.predicted;
    let cluster = &plan.cluster;
    let communication = volume::volumes(info, cluster, s, volume::TpSource::of(p));
    let tl = &traced.timeline;
    let stages: Vec<StageReport> = p
        .stages
        .iter()
        .map(|st| {
            let d = st.stage as usize;
            let device_finish = tl.device_finish.get(d).copied().unwrap_or(st.finish_s);
            StageReport {
                stage: st.stage,
                layers: st.layers,
                chunks: plan
                    .chunks
                    .iter()
                    .filter(|c| c.stage == st.stage)
                    .map(|c| ChunkLayers {
                        chunk: c.chunk,
                        layers: c.layers,
                        embedding: c.embedding,
                        head: c.head,
                    })
                    .collect(),
                busy_s: st.busy_s,
                idle_s: (device_finish - st.busy_s).max(0.0),
                tail_s: (st.finish_s - device_finish).max(0.0),
                finish_s: st.finish_s,
                memory: st.memory.clone(),
                peak_memory_bytes: st.peak_memory_bytes,
                micro_batches_in_flight: st.micro_batches_in_flight,
            }
        })
        .collect();
    let tails: Vec<StageTail> = traced
        .predicted
        .stages
        .iter()
        .map(|st| {
            let d = st.stage;
            let dp_collectives = communication
                .get(d as usize)
                .map(|v| {
                    v.rows
                        .iter()
                        .filter(|r| {
                            (r.parallelism == "dp" && !r.payload.starts_with("layer"))
                                || r.payload.starts_with("tied")
                        })
                        .map(|r| r.seconds)
                        .sum()
                })
                .unwrap_or(0.0);
            StageTail {
                device_finish: tl.device_finish.get(d as usize).copied().unwrap_or(0.0),
                finish: st.finish_s,
                optimizer: optimizer_seconds(info, cluster, s, d),
                dp_collectives,
            }
        })
        .collect();
    let slices = trace::slices(tl, s, volume::p2p_seconds(info, cluster, s), &tails);
    let recomputed = traced.predicted.iteration_time_s;
    Report {
        format: FORMAT.into(),
        model: plan.model.clone(),
        cluster: cluster.name.clone(),
        gpu: cluster.gpu.name.clone(),
        gpus: plan.gpus,
        gpus_per_node: cluster.gpus_per_node,
        strategy: s.clone(),
        strategy_summary: strategy_summary(s),
        target: plan.search.target,
        predicted: Summary {
            iteration_time_s: p.iteration_time_s,
            tokens_per_s: p.tokens_per_s,
            model_tflops_per_gpu: p.model_tflops_per_gpu,
            hardware_tflops_per_gpu: p.hardware_tflops_per_gpu,
            mfu: p.mfu,
            peak_memory_bytes: p.peak_memory_bytes,
            memory_capacity_bytes: p.memory_capacity_bytes,
            fits: p.fits,
            bubble_fraction: p.bubble_fraction,
            time: p.time.clone(),
            training: p.training.clone(),
        },
        recomputed_iteration_time_s: recomputed,
        recomputed_peak_memory_bytes: traced.predicted.peak_memory_bytes,
        recomputed_memory_capacity_bytes: traced.predicted.memory_capacity_bytes,
        recomputed_fits: traced.predicted.fits,
        stale: differs(p.iteration_time_s, recomputed)
            || differs(p.peak_memory_bytes, traced.predicted.peak_memory_bytes)
            || p.fits != traced.predicted.fits,
        why: why::why(plan, info, traced, &communication),
        stages,
        communication,
        alternatives: plan
            .alternatives
            .iter()
            .map(|a| AlternativeReport {
                strategy: strategy_summary(&a.strategy),
                iteration_time_s: a.iteration_time_s,
                fits: a.fits,
                peak_memory_bytes: a.peak_memory_bytes,
                reason: a.reason.clone(),
            })
            .collect(),
        slices,
    }
}

/// Names of the stages for trace processes: `stage 0 (layers 0-5, embedding)`.
pub fn stage_names(r: &Report) -> Vec<String> {
    r.stages
        .iter()
        .map(|st| format!("stage {} ({})", st.stage, layer_ranges(&st.chunks)))
        .collect()
}

/// `layers 0-5, embedding` or `6 chunks: layers 0, 2, 4, 6, 8, 10` style description.
pub fn layer_ranges(chunks: &[ChunkLayers]) -> String {
    let range = |c: &ChunkLayers| {
        if c.layers[1] == c.layers[0] + 1 {
            format!("{}", c.layers[0])
        } else {
            format!("{}-{}", c.layers[0], c.layers[1].saturating_sub(1))
        }
    };
    let mut out = format!(
        "{} {}",
        if chunks.len() == 1 && chunks[0].layers[1] == chunks[0].layers[0] + 1 {
            "layer"
        } else {
            "layers"
        },
        chunks.iter().map(range).collect::<Vec<_>>().join(", ")
    );
    if chunks.iter().any(|c| c.embedding) {
        out += " + embedding";
    }
    if chunks.iter().any(|c| c.head) {
        out += " + head";
    }
    out
}
