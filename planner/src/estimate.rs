//! Predicts one strategy's iteration time and per-rank memory: the function the search calls
//! thousands of times, so it plans one layer and replicates it.

use std::collections::BTreeMap;

use ir::{Binding, Graph, OpId, OpKind, cost};

use serde::{Deserialize, Serialize};

use crate::cost::comm::{Collective, Mesh, collective_time, p2p_time};
use crate::cost::compute::{TpLayout, tp_layout};
use crate::cost::memory::{
    ActivationPolicy, LayerShape, layer_activation_bytes, layer_backward_gradient_bytes,
};
use crate::cost::pipeline::{Timeline, WorkingSet, finish_lower_bound, simulate_with};
use crate::error::PlanError;
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::strategy::{Recompute, Strategy};

mod kernels;
mod runs;
mod setup;
mod stages;
mod work;

use runs::{RunCost, mean_per_layer};
use setup::Setup;
use work::Pricer;

/// Bytes held back on every GPU for the CUDA context, cuBLAS/NCCL workspaces and allocator
/// fragmentation. An assumption, not a measurement: PyTorch's CUDA context alone takes
/// ~0.3–0.5 GiB on A100/H100; see docs/cost-model.md.
pub const RESERVE_BYTES: f64 = 1.0 * (1u64 << 30) as f64;

/// Bytes per parameter the optimizer step reads and writes: fp32 master weight, m, v (read and
/// write, 24), the gradient (read) and the new low-precision weight (write), 2 each.
pub const OPTIMIZER_BYTES_PER_PARAM: f64 = 28.0;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    pub weights: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub other: f64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> f64 {
        self.weights + self.grads + self.optimizer + self.activations + self.other
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    pub compute: f64,
    pub tp_comm: f64,
    pub pp_comm: f64,
    pub dp_comm: f64,
    pub bubble: f64,
    pub optimizer: f64,
    /// Expert parallelism's token dispatch and combine (not overlapped).
    #[serde(default)]
    pub ep_comm: f64,
}

/// One pipeline stage (device row) of the prediction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageEstimate {
    pub stage: u32,
    pub layers: u32,
    pub busy_s: f64,
    pub finish_s: f64,
    pub memory: MemoryBreakdown,
    pub peak_memory_bytes: f64,
    pub micro_batches_in_flight: u32,
    /// The stage's predicted seconds per step by instruction kind, as `plait run --op-times`
    /// names them ([`kernels`]); only in a compiled plan's own prediction.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_s: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    pub iteration_time_s: f64,
    pub tokens_per_s: f64,
    pub model_tflops_per_gpu: f64,
    pub hardware_tflops_per_gpu: f64,
    pub mfu: f64,
    pub peak_memory_bytes: f64,
    pub memory_capacity_bytes: f64,
    pub fits: bool,
    pub memory: MemoryBreakdown,
    pub time: TimeBreakdown,
    pub bubble_fraction: f64,
    pub stages: Vec<StageEstimate>,
    /// Days, GPU-hours, energy and cost to train on `--train-tokens` tokens (when asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<crate::training::TrainingRun>,
    /// A compressed or local-SGD exchange against the plain one, on the critical stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_exchange: Option<DpExchange>,
    /// How one layer's tensor-parallel communication was priced (tp > 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_tp_comm: Option<LayerTpComm>,
    /// How the embedding's (the ops before the first layer) tensor-parallel communication was
    /// priced (tp > 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_tp_comm: Option<LayerTpComm>,
    /// How the head's (final norm, head and loss) tensor-parallel communication was priced
    /// (tp > 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_tp_comm: Option<LayerTpComm>,
}

/// One layer's (or the embedding's, or the head's) tensor-parallel communication per
/// micro-batch, before any overlap with compute, and where it comes from: the collectives of
/// the sharding extraction's layout ([`crate::layer_tp`]), or Megatron-LM's rule (one
/// all-reduce, or a reduce-scatter and an all-gather with SP, per row-parallel product and
/// pass; the head's vocabulary-parallel loss is not in it) where the extraction cannot price
/// it (`source` then says why).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerTpComm {
    pub source: String,
    pub fwd_s: f64,
    /// The backward's collectives, with the step's once-per-step parameter-gradient reductions
    /// shared over its micro-batches.
    pub bwd_s: f64,
    /// Collectives in the extraction's layout of the block (forward, backward, per step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collectives: Option<usize>,
}

impl LayerTpComm {
    pub const EXTRACTION: &'static str = "e-graph extraction";
    pub const RULES: &'static str = "megatron rules";

    /// Priced from an extraction of `collectives` collectives, or by the rule for the reason
    /// given, at (forward, backward) seconds.
    fn of(collectives: Result<usize, &String>, (fwd_s, bwd_s): (f64, f64)) -> LayerTpComm {
        LayerTpComm {
            source: match &collectives {
                Ok(_) => LayerTpComm::EXTRACTION.to_string(),
                Err(why) => format!("{} ({why})", LayerTpComm::RULES),
            },
            fwd_s,
            bwd_s,
            collectives: collectives.ok(),
        }
    }
}

/// What one rank of the critical stage exchanges with its data-parallel group per step, as
/// the plan asks and as the plain (uncompressed, synchronous) exchange would.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DpExchange {
    pub grad_compression: crate::dp_comm::GradCompression,
    pub dp_sync: crate::dp_comm::DpSync,
    /// Bytes the rank sends per step (ring all-reduce: 2(n − 1)/n of the buffer; local SGD:
    /// the parameter average's, over its period).
    pub bytes_per_step: f64,
    pub plain_bytes_per_step: f64,
    /// Seconds of the exchange per step before any overlap (compression kernels included).
    pub exchange_s: f64,
    pub plain_exchange_s: f64,
}

/// Per-micro-batch seconds of one layer and of the ops before and after the layers: what the
/// search needs to balance a pipeline split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChunkProfile {
    pub layer_s: f64,
    /// Each run's layer seconds ([`ModelInfo::runs`]; `layer_s` is their mean per layer).
    pub run_layer_s: Vec<f64>,
    pub pre_s: f64,
    pub post_s: f64,
    /// Activation bytes one layer keeps per micro-batch.
    pub layer_activation_bytes: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub strategy: Strategy,
    pub predicted: Predicted,
    #[serde(skip)]
    pub profile: ChunkProfile,
    #[serde(skip)]
    pub timeline: Timeline,
    #[serde(skip)]
    pub mesh: Option<Mesh>,
}

impl Estimate {
    /// Adds what training on `tokens` tokens takes with this plan on `cluster`.
    pub fn with_training(mut self, cluster: &Cluster, tokens: Option<f64>) -> Estimate {
        self.predicted.training = tokens.map(|t| {
            crate::training::training_run(
                cluster,
                self.strategy.gpus(),
                self.predicted.tokens_per_s,
                self.predicted.iteration_time_s,
                t,
            )
        });
        self
    }
}

/// Per-micro-batch work of one group of ops (a layer, or the embedding/head).
#[derive(Clone, Copy, Debug, Default)]
struct Work {
    fwd: f64,
    bwd: f64,
    /// Of `fwd` and `bwd`: the GEMMs next to the TP collectives (linear layers, experts).
    gemm_fwd: f64,
    gemm_bwd: f64,
    /// Of `fwd` and `bwd`: the attention core, behind which the context-parallel ring hides.
    attn_fwd: f64,
    attn_bwd: f64,
    tp_fwd: f64,
    tp_bwd: f64,
    recompute: f64,
    fwd_flops: f64,
    recompute_flops: f64,
    /// Exposed context-parallel ring time (forward + backward), included in `fwd`/`bwd`.
    cp_comm: f64,
    /// Expert-parallel dispatch and combine (forward + backward), included in `fwd`/`bwd`.
    ep_comm: f64,
    /// Of `ep_comm`, the forward's (repeated by a full recompute).
    ep_fwd: f64,
}

impl Work {
    fn fwd_total(&self) -> f64 {
        self.fwd + self.tp_fwd
    }
    fn bwd_total(&self) -> f64 {
        self.bwd + self.tp_bwd + self.recompute
    }
}

/// Estimates `strategy` for the model `info` on `cluster` with `gpus` GPUs.
pub fn estimate(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    s: &Strategy,
) -> Result<Estimate, PlanError> {
    estimate_impl(info, cluster, gpus, s, Mode::default()).and_then(unbounded)
}

/// Like [`estimate`], but `Ok(None)` without simulating the pipeline when its lower bound
/// ([`crate::cost::pipeline::finish_lower_bound`]) already exceeds `cutoff` seconds: the
/// iteration cannot be faster than that (the search skips such candidates).
pub fn estimate_within(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    s: &Strategy,
    cutoff: f64,
) -> Result<Option<Estimate>, PlanError> {
    let mode = Mode {
        cutoff,
        ..Mode::default()
    };
    estimate_impl(info, cluster, gpus, s, mode)
}

/// The estimate of a run without a cutoff, which always has one.
fn unbounded(e: Option<Estimate>) -> Result<Estimate, PlanError> {
    e.ok_or_else(|| PlanError::invalid("the pipeline bound exceeded an infinite cutoff"))
}

/// How [`estimate_impl`] runs: whether it records the simulated tasks, the iteration time
/// past which it stops at the pipeline's lower bound, and how a layer's TP communication is
/// priced.
#[derive(Clone, Copy, Debug)]
struct Mode<'a> {
    record: bool,
    /// Break each stage's time down by instruction kind (`StageEstimate::kernel_s`).
    kernels: bool,
    cutoff: f64,
    tp: Pricing<'a>,
}

impl Default for Mode<'_> {
    fn default() -> Self {
        Mode {
            record: false,
            kernels: false,
            cutoff: f64::INFINITY,
            tp: Pricing::SEARCH,
        }
    }
}

/// Which layout a layer's tensor-parallel communication is priced for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TpPricing<'a> {
    /// The sharding extraction's, where its layout splits the work as the compute and memory
    /// model prices it ([`crate::layer_tp::layer_tp`]): how the search prices every candidate.
    #[default]
    Extraction,
    /// The extraction's, because the program runs it: `compile` lowered it and checked its
    /// memory ([`crate::layer_tp::layer_tp_as_lowered`]).
    Lowered,
    /// Megatron-LM's rule, because the program runs it (codegen did not lower the
    /// extraction): the reason.
    Rules(&'a str),
}

/// Which layouts the layer's and the embedding and head's tensor-parallel communication are
/// priced for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pricing<'a> {
    pub layer: TpPricing<'a>,
    /// The ops before and after the layers ([`crate::layer_tp::outer_tp`]).
    pub embedding_head: TpPricing<'a>,
}

impl Pricing<'_> {
    /// How the search prices every candidate: each extraction where it prices.
    pub const SEARCH: Pricing<'static> = Pricing {
        layer: TpPricing::Extraction,
        embedding_head: TpPricing::Extraction,
    };
}

/// Like [`estimate`], priced for the layouts `tp` names.
pub fn estimate_priced(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    s: &Strategy,
    tp: Pricing<'_>,
) -> Result<Estimate, PlanError> {
    let mode = Mode {
        tp,
        ..Mode::default()
    };
    estimate_impl(info, cluster, gpus, s, mode).and_then(unbounded)
}

/// Like [`estimate_priced`], and keeps every simulated task in `timeline.tasks` (for traces)
/// and each stage's seconds by instruction kind (`StageEstimate::kernel_s`: what a compiled
/// plan records for `plait run --op-times`).
pub fn estimate_traced(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    s: &Strategy,
    tp: Pricing<'_>,
) -> Result<Estimate, PlanError> {
    let mode = Mode {
        record: true,
        kernels: true,
        tp,
        ..Mode::default()
    };
    estimate_impl(info, cluster, gpus, s, mode).and_then(unbounded)
}

/// A layer Megatron-LM's layout cannot split (OLMo 2's q/k norms over all heads) is priced
/// only as the sharding extraction lays it out: at tp > 1 its runs must have priced by it.
fn extraction_runs_the_layer(
    info: &ModelInfo<'_>,
    s: &Strategy,
    runs: &[RunCost],
) -> Result<(), PlanError> {
    if s.tp <= 1 || !info.norm_across_heads() {
        return Ok(());
    }
    match runs
        .iter()
        .find_map(|r| r.prices.layer.as_ref()?.as_ref().err())
    {
        None => Ok(()),
        Some(why) => Err(PlanError::NeedsExtraction {
            tp: s.tp,
            feature: crate::search::NORM_ACROSS_HEADS,
            why: why.clone(),
        }),
    }
}

fn estimate_impl(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    s: &Strategy,
    mode: Mode<'_>,
) -> Result<Option<Estimate>, PlanError> {
    let cx = Setup::new(info, cluster, gpus, s)?;
    let g = info.graph;
    // One representative layer of each run of identical layers, the embedding side and the
    // head side; with fused kernels each group of fused point-wise ops is one kernel.
    let policy = ActivationPolicy {
        tp: cx.tp as f64,
        sequence_parallel: s.sequence_parallel,
        recompute: s.recompute,
        precision: s.precision,
        attention: s.attention,
        ep: cx.ep as f64,
    };
    let runs: Vec<RunCost> = info
        .runs()
        .iter()
        .map(|r| RunCost::new(&cx, mode, r.info, &policy))
        .collect();
    extraction_runs_the_layer(info, s, &runs)?;
    let prices = &runs[0].prices;
    let pricer = Pricer {
        cx: &cx,
        ring: cx.cp_ring(),
        ep: ExpertDispatch::new(
            g,
            info,
            cluster,
            &cx.m,
            cx.b,
            s.precision.activation_bytes(),
        ),
    };
    let outer_layout = |o: OpId| prices.outer_layout(&cx, o);
    let pre = pricer.work(
        &info.pre_ops,
        &info.pre_groups,
        prices.pre_times,
        &outer_layout,
    );
    let post = pricer.work(
        &info.post_ops,
        &info.post_groups,
        prices.post_times,
        &outer_layout,
    );
    let chunk_layers = s.chunk_layers(info.layers);
    let chunk_runs = info.chunk_run_counts(&chunk_layers);
    let rep = if s.sequence_parallel {
        cx.tp as f64
    } else {
        1.0
    };
    let p2p = p2p_time(
        cluster,
        cx.act_bytes / rep,
        cx.m.pp_cross_node,
        cx.m.pp_sharing,
    );
    let chunks = stages::chunk_costs(
        &chunk_runs,
        &stages::ChunkInputs {
            pre: &pre,
            post: &post,
            runs: &runs,
            p2p,
        },
    );
    let micro_batches = s.micro_batches();
    if finish_lower_bound(s.pp, micro_batches as u32, &chunks) > mode.cutoff {
        return Ok(None);
    }
    let timeline = simulate_with(s.schedule, s.pp, micro_batches as u32, &chunks, mode.record);
    let mut results: Vec<stages::StageResult> = (0..s.pp as usize)
        .map(|d| stages::stage_result(&cx, d, (&chunk_layers, &chunk_runs), &chunks, &timeline))
        .collect();
    if mode.kernels {
        let by_kind = |ops: &[OpId], groups: &[Vec<OpId>], layout: &dyn Fn(OpId) -> TpLayout| {
            kernels::by_kind(&pricer, ops, groups, layout)
        };
        let run_kinds: Vec<kernels::KernelSeconds> = info
            .runs()
            .iter()
            .zip(&runs)
            .map(|(r, c)| {
                by_kind(&r.info.layer_ops, &r.info.layer_groups, &|o| {
                    c.prices.layer_layout(&cx, o)
                })
            })
            .collect();
        let kinds = kernels::StageKernels {
            pre: &by_kind(&info.pre_ops, &info.pre_groups, &outer_layout),
            post: &by_kind(&info.post_ops, &info.post_groups, &outer_layout),
            runs: &run_kinds,
            chunk_runs: &chunk_runs,
        };
        for (d, r) in results.iter_mut().enumerate() {
            r.estimate.kernel_s = kinds.stage(&cx, d, r.optimizer, r.estimate.finish_s);
        }
    }
    let critical = results
        .iter()
        .enumerate()
        .fold((0, 0.0f64), |(best, end), (d, r)| {
            if r.estimate.finish_s > end {
                (d, r.estimate.finish_s)
            } else {
                (best, end)
            }
        })
        .0;
    let iteration = results
        .iter()
        .map(|r| r.estimate.finish_s)
        .fold(0.0, f64::max);
    let time = Breakdown {
        cx: &cx,
        outer: [&pre, &post],
        runs: &runs,
        chunk_runs: &chunk_runs,
        critical,
        p2p,
    }
    .time(iteration, &results[critical]);
    let stages: Vec<StageEstimate> = results.iter().map(|r| r.estimate.clone()).collect();
    let peak_stage = stages
        .iter()
        .max_by(|a, b| a.peak_memory_bytes.total_cmp(&b.peak_memory_bytes))
        .cloned()
        .unwrap_or_default();
    let tokens = (s.global_batch * s.seq) as f64;
    let model_flops = training_flops_per_token(info, cx.b) * tokens;
    let layers_recompute: f64 = info
        .runs()
        .iter()
        .zip(&runs)
        .map(|(r, c)| f64::from(r.count) * c.work.recompute_flops)
        .sum();
    let recompute_flops = (layers_recompute + pre.recompute_flops + post.recompute_flops)
        * cx.tp as f64
        * (s.global_batch / s.micro_batch) as f64;
    let n = gpus as f64;
    let model_tflops = model_flops / (iteration * n) / 1e12;
    let peak = cluster.peak_flops(s.precision).unwrap_or(f64::INFINITY);
    let capacity = cluster.memory_bytes();
    let ideal = timeline.device_busy.iter().cloned().fold(0.0, f64::max);
    let critical_stage = &results[critical];
    Ok(Some(Estimate {
        strategy: s.clone(),
        predicted: Predicted {
            iteration_time_s: iteration,
            tokens_per_s: tokens / iteration,
            model_tflops_per_gpu: model_tflops,
            hardware_tflops_per_gpu: (model_flops + recompute_flops) / (iteration * n) / 1e12,
            mfu: model_tflops * 1e12 / peak,
            peak_memory_bytes: peak_stage.peak_memory_bytes,
            memory_capacity_bytes: capacity,
            fits: peak_stage.peak_memory_bytes <= capacity,
            memory: peak_stage.memory.clone(),
            time,
            bubble_fraction: if iteration > 0.0 {
                ((iteration - ideal - critical_stage.optimizer - critical_stage.dp_exposed)
                    / iteration)
                    .max(0.0)
            } else {
                0.0
            },
            stages,
            training: None,
            dp_exchange: critical_stage.exchange,
            layer_tp_comm: prices.layer_comm(),
            embedding_tp_comm: prices.outer_comm(true),
            head_tp_comm: prices.outer_comm(false),
        },
        timeline,
        mesh: Some(cx.m),
        profile: ChunkProfile {
            layer_s: mean_per_layer(info, &runs, |r| r.fwd + r.bwd),
            run_layer_s: runs.iter().map(|r| r.fwd + r.bwd).collect(),
            pre_s: pre.fwd_total() + pre.bwd_total(),
            post_s: post.fwd_total() + post.bwd_total(),
            layer_activation_bytes: mean_per_layer(info, &runs, |r| r.act),
        },
    }))
}

/// The critical stage's time breakdown.
struct Breakdown<'c, 'a, 'g, 'w> {
    cx: &'c Setup<'a, 'g>,
    /// The embedding side's and the head side's work.
    outer: [&'w Work; 2],
    /// One layer of each run of identical layers.
    runs: &'w [RunCost],
    /// Each chunk's layers per run.
    chunk_runs: &'w [Vec<u32>],
    /// The stage that finishes last.
    critical: usize,
    p2p: f64,
}

impl Breakdown<'_, '_, '_, '_> {
    /// Compute, TP, EP, PP and DP communication, the optimizer and the bubble of the critical
    /// stage (`stage`) over an iteration of `iteration` seconds.
    fn time(&self, iteration: f64, stage: &stages::StageResult) -> TimeBreakdown {
        let s = self.cx.s;
        let n_chunks = self.chunk_runs.len();
        let my_chunks: Vec<usize> = (0..n_chunks)
            .filter(|c| c % s.pp as usize == self.critical)
            .collect();
        let mb = s.micro_batches() as f64;
        let full = s.recompute == Recompute::Full;
        let (compute, tp_time) =
            device_work(self.outer, self.runs, self.chunk_runs, &my_chunks, mb, full);
        let (mut ep_time, mut zero3) = (0.0, 0.0);
        for (k, run) in self.runs.iter().enumerate() {
            let my_layers: f64 = my_chunks
                .iter()
                .map(|&c| f64::from(self.chunk_runs[c][k]))
                .sum();
            let layer = &run.work;
            ep_time += my_layers * mb * (layer.ep_comm + if full { layer.ep_fwd } else { 0.0 });
            zero3 += my_layers * mb * run.zero3;
        }
        let compute = compute - ep_time;
        let sends = my_chunks.iter().filter(|&&c| c + 1 < n_chunks).count() as f64
            + my_chunks.iter().filter(|&&c| c > 0).count() as f64;
        let pp_time = sends * mb * self.p2p;
        let dp_time = stage.dp_exposed + zero3;
        let opt = stage.optimizer;
        let bubble = (iteration - compute - tp_time - ep_time - dp_time - opt).max(0.0);
        TimeBreakdown {
            compute,
            tp_comm: tp_time,
            pp_comm: pp_time.min(bubble),
            dp_comm: dp_time,
            bubble: (bubble - pp_time.min(bubble)).max(0.0),
            optimizer: opt,
            ep_comm: ep_time,
        }
    }
}

/// The parameters one rank of pipeline stage `d` holds (after tensor parallelism), as (the
/// weights replicated over dp × cp, this rank's routed experts: 1/ep of them, replicated over
/// the expert-data-parallel ranks).
pub fn stage_local_split(info: &ModelInfo<'_>, s: &Strategy, d: u32) -> (f64, f64) {
    let chunk_runs = info.chunk_run_counts(&s.chunk_layers(info.layers));
    stage_local_split_of(info, s, d, &chunk_runs)
}

/// [`stage_local_split`] given each chunk's layers per run ([`ModelInfo::chunk_run_counts`]),
/// which an estimate counts once for all its stages (per stage, a pipeline of 844 stages of
/// 65,537 layers took minutes).
pub(crate) fn stage_local_split_of(
    info: &ModelInfo<'_>,
    s: &Strategy,
    d: u32,
    chunk_runs: &[Vec<u32>],
) -> (f64, f64) {
    let n = chunk_runs.len();
    let mine: Vec<usize> = (0..n)
        .filter(|c| *c % s.pp as usize == d as usize)
        .collect();
    let tp = f64::from(s.tp);
    let (mut experts, mut layer_params) = (0.0, 0.0);
    for (k, run) in info.runs().iter().enumerate() {
        let layers: u32 = mine.iter().map(|&c| chunk_runs[c][k]).sum();
        let run = run.info;
        experts += f64::from(layers) * run.expert_params_per_layer as f64 / tp / f64::from(s.ep);
        layer_params += f64::from(layers) * run.dense_params_per_tp_rank(s.tp);
    }
    let mut params = 0.0;
    // A learned position table and the final norm stay whole on every rank (Megatron-LM);
    // the vocabulary-sized matrices are split ([`ModelInfo::vocabulary_matrix`]), padded to
    // ⌈vocab / tp⌉ rows per rank where the vocabulary does not divide. Where it does not
    // split, plait's program keeps them whole too.
    let splits = info.vocabulary_splits(s.tp);
    let (pre_whole, post_whole) = if splits {
        (info.pre_whole_params, info.post_whole_params)
    } else {
        (info.pre_params, info.post_params)
    };
    let mut whole = 0.0;
    if mine.contains(&0) {
        params += (info.pre_params - pre_whole) as f64;
        params += info.vocabulary_padding_params(s.tp, &info.pre_ops) as f64;
        whole += pre_whole as f64;
    }
    if mine.contains(&(n - 1)) {
        params += (info.post_params - post_whole) as f64;
        params += info.vocabulary_padding_params(s.tp, &info.post_ops) as f64;
        whole += post_whole as f64;
        if s.pp > 1 {
            // The last stage keeps its own copy of a tied embedding (Megatron-LM), split as
            // the first stage's.
            if splits {
                params += info.tied_params as f64 * info.vocabulary_share(s.tp) * tp;
            } else {
                whole += info.tied_params as f64;
            }
        }
    }
    (layer_params + params / tp + whole, experts)
}

/// Row-parallel products in `ops`: each needs one all-reduce of the hidden-sized output in the
/// forward (and its column-parallel partner one in the backward) under Megatron's sharding.
pub fn row_parallel_ops(g: &Graph, ops: &[OpId], hidden: u64) -> usize {
    ops.iter()
        .filter(|&&o| {
            let op = g.op(o);
            let width = |v| g.ty(v).shape.last().and_then(|d| d.fixed());
            match op.kind {
                // Row-parallel: back to the hidden width from an input that is split across the
                // TP group (the attention output, split by heads, or the MLP's inner activation).
                OpKind::Linear { .. } => {
                    let producer = g.def_op(op.inputs[0]);
                    width(op.results[0]) == Some(hidden)
                        && tp_layout(g, producer, hidden, false) == TpLayout::Split
                        && !g.op(producer).kind.is_source()
                        && !crate::model::reads_routing_weights(g, o)
                }
                OpKind::MoeExperts { .. } => true,
                OpKind::Embedding => {
                    // Vocabulary-parallel token embedding (not the position table).
                    !matches!(g.op(g.def_op(op.inputs[1])).kind, OpKind::Iota { .. })
                }
                _ => false,
            }
        })
        .count()
}

/// Element-wise ops after the head on vocabulary-wide tensors whose backward reads their
/// operand (a tanh, GELU, ...), each keeping one more logits-sized tensor; scales and adds keep
/// nothing.
fn logit_ops_keeping_input(g: &Graph, info: &ModelInfo<'_>) -> usize {
    logit_ops(g, info)
        .filter(|&o| {
            !matches!(
                g.op(o).kind,
                OpKind::Scale { .. } | OpKind::Add | OpKind::Sub | OpKind::Neg
            )
        })
        .count()
}

/// The element-wise ops after the head on vocabulary-wide tensors (Gemma 2's soft-cap).
fn logit_ops<'a>(g: &'a Graph, info: &'a ModelInfo<'_>) -> impl Iterator<Item = OpId> + 'a {
    let vocab_wide =
        |v: ir::ValueId| g.ty(v).shape.last().and_then(|d| d.fixed()) == Some(info.vocab);
    info.post_ops.iter().copied().filter(move |&o| {
        let op = g.op(o);
        op.kind.is_pointwise() && op.results.first().is_some_and(|&r| vocab_wide(r))
    })
}

/// The widths of one layer as the activation formula needs them, read off the graph: q and kv
/// widths from the attention's operands, the MLP's inner width from the input of its last
/// projection back to the hidden size, a gated MLP from a product of two inner-wide tensors,
/// dropout from its ops.
fn layer_shape(g: &Graph, info: &ModelInfo<'_>) -> LayerShape {
    let h = info.hidden;
    let width = |v: ir::ValueId| g.ty(v).shape.last().and_then(|d| d.fixed());
    let mut shape = LayerShape {
        hidden: h as f64,
        heads: info.heads as f64,
        q_width: h as f64,
        kv_width: h as f64,
        ffn: 4.0 * h as f64,
        gated: false,
        experts_per_token: 1.0,
        routed: false,
        gate_scaled: 0.0,
        dropout: false,
        extra_norms: 0.0,
        qk_norm: false,
        shared_ffn: 0.0,
        latent_width: 0.0,
        shared_inputs: 0.0,
        head_spanning_norms: 0.0,
        composed_q_norms: 0.0,
        composed_kv_norms: 0.0,
        clamped_qkv: false,
    };
    let mut residual_norms = 0.0f64;
    let mut residual_norm_inputs = std::collections::BTreeSet::new();
    let mut inner_widths = Vec::new();
    // The attention output's width (the output projection's input): narrower than the
    // queries in multi-head latent attention.
    let mut attention_out = h as f64;
    for &o in &info.layer_ops {
        let op = g.op(o);
        match &op.kind {
            OpKind::Attention { .. } => {
                shape.q_width = width(op.inputs[0]).unwrap_or(h) as f64;
                shape.kv_width = width(op.inputs[1]).unwrap_or(h) as f64;
                attention_out = width(op.results[0]).unwrap_or(h) as f64;
            }
            OpKind::Dropout { p, .. } if *p > 0.0 => shape.dropout = true,
            OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. }
                if info.norms_across_heads.contains(&o) =>
            {
                shape.head_spanning_norms += width(op.inputs[0]).unwrap_or(h) as f64;
            }
            OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. } => {
                let x = g.ty(op.inputs[0]);
                if width(op.inputs[0]) == Some(h) {
                    residual_norms += 1.0;
                    residual_norm_inputs.insert(op.inputs[0]);
                } else if x.shape.rank() == 3 {
                    // A latent's norm (MLA): its input and output, whole on every rank.
                    shape.latent_width += 2.0 * width(op.inputs[0]).unwrap_or(0) as f64;
                } else {
                    shape.qk_norm = true;
                }
            }
            // The routing weights' product (gpt-oss's down-projection bias) is no MLP.
            OpKind::Linear { .. } if crate::model::reads_routing_weights(g, o) => {}
            OpKind::Linear { .. } => {
                let (k, n) = (width(op.inputs[0]), width(op.results[0]));
                if n == Some(h)
                    && let Some(k) = k
                    && k as f64 != attention_out
                {
                    inner_widths.push(k as f64);
                }
            }
            OpKind::Mul => {
                let w = width(op.results[0]);
                let both = op.inputs.iter().all(|&v| width(v) == w);
                if both && w.is_some_and(|w| w != h) {
                    shape.gated = true;
                }
                // A composed norm's rsqrt (OLMo 1's LayerNorm) scales no branch.
                let one_column = op
                    .inputs
                    .iter()
                    .any(|&v| width(v) == Some(1) && g.op(g.def_op(v)).kind != OpKind::Rsqrt);
                if w == Some(h) && one_column {
                    shape.gate_scaled += 1.0;
                }
            }
            // A squared ReLU (Nemotron) keeps the projection's output, the ReLU's and the
            // square's: three inner-wide tensors, as a gated MLP.
            OpKind::Pow { .. } if width(op.results[0]).is_some_and(|w| w != h) => {
                shape.gated = true;
            }
            OpKind::MoeExperts { .. } => {
                if let Some(f) = g
                    .ty(op.inputs[2])
                    .shape
                    .dims()
                    .get(2)
                    .and_then(|d| d.fixed())
                {
                    shape.ffn = f as f64;
                }
                shape.gated = true;
            }
            OpKind::TopKRouter { k, .. } => {
                shape.experts_per_token = *k as f64;
                shape.routed = true;
            }
            // OLMo's clip_qkv: each clamp keeps its input, q's, k's or v's projection.
            OpKind::Clamp { .. } => shape.clamped_qkv = true,
            // A norm composed of elementwise ops over each head of `[B, S, heads, d]` (Llama
            // 4's L2 norms): the mean of the square. It keeps the input (d a head; the mean's
            // gradient reads no value) and the mean shifted by eps and its rsqrt (one each a
            // head). A composed norm over the hidden axis (OLMo 1's weightless LayerNorm,
            // `[B, S, H]`) keeps its centred input in place of a norm's input, which the
            // block's count has, and three statistics a token (under 0.1 % of it): no term.
            OpKind::ReduceMean if g.ty(op.inputs[0]).shape.rank() == 4 => {
                let dims = g.ty(op.inputs[0]).shape.dims().to_vec();
                let fixed = |i: usize| dims.get(i).and_then(|d| d.fixed()).unwrap_or(0) as f64;
                let (heads, d) = (fixed(2), fixed(3));
                let kept = heads * d + 2.0 * heads;
                if heads as u64 == info.heads {
                    shape.composed_q_norms += kept;
                } else {
                    shape.composed_kv_norms += kept;
                }
            }
            _ => {}
        }
    }
    let moe = info
        .layer_ops
        .iter()
        .any(|&o| matches!(g.op(o).kind, OpKind::MoeExperts { .. }));
    match (moe, inner_widths.first()) {
        // A dense MLP's inner width; beside routed experts, a shared expert's.
        (false, Some(&f)) => shape.ffn = f,
        (true, Some(&f)) => shape.shared_ffn = f,
        _ => {}
    }
    shape.extra_norms = (residual_norms - 2.0).max(0.0);
    // A parallel block: one norm both branches read (a pre-norm block has two), or two
    // norms reading the same input.
    shape.shared_inputs = if residual_norms == 1.0 {
        2.0
    } else {
        residual_norms - residual_norm_inputs.len() as f64
    };
    shape
}

/// Expert parallelism's communication per micro-batch, Megatron-Core's all-gather token
/// dispatcher (`--moe-token-dispatcher-type allgather`, its default): before each expert
/// layer the group all-gathers its members' tokens and routing weights, every rank runs its
/// own experts on all of them, and a reduce-scatter returns each rank's tokens with every
/// expert's contribution summed. The backward mirrors it (the output gradient gathered, the
/// input gradient reduce-scattered, the routing weights' gradient gathered by expert). None of
/// it overlaps compute in that dispatcher.
struct ExpertDispatch {
    /// Forward and backward seconds of one expert layer.
    fwd: f64,
    bwd: f64,
}

impl ExpertDispatch {
    fn new(
        g: &Graph,
        info: &ModelInfo<'_>,
        cluster: &Cluster,
        m: &Mesh,
        b: Binding,
        act_bytes: f64,
    ) -> ExpertDispatch {
        let n = m.ep.size;
        if n <= 1 || info.experts == 0 {
            return ExpertDispatch { fwd: 0.0, bwd: 0.0 };
        }
        // The experts see whole tokens (a sequence-parallel layer gathers them over tp
        // first): the group's gathered tensors hold n micro-batches of them.
        let tokens = (b.batch * b.seq) as f64 * n as f64;
        let width = |v: ir::ValueId| g.ty(v).shape.last().and_then(|d| d.fixed()).unwrap_or(0);
        let (hidden, experts) = info
            .layer_ops
            .iter()
            .find_map(|&o| match g.op(o).kind {
                OpKind::MoeExperts { experts, .. } => Some((width(g.op(o).inputs[0]), experts)),
                _ => None,
            })
            .unwrap_or((info.hidden, info.experts));
        let x = tokens * hidden as f64 * act_bytes;
        let gates = tokens * experts as f64 * act_bytes;
        let t = |kind, bytes| collective_time(cluster, &m.ep, kind, bytes);
        let (ag, rs) = (Collective::AllGather, Collective::ReduceScatter);
        ExpertDispatch {
            fwd: t(ag, x) + t(ag, gates) + t(rs, x),
            bwd: t(ag, x) + t(rs, x) + t(ag, gates),
        }
    }

    /// Seconds of the expert layers among `ops`, forward and backward.
    fn times(&self, g: &Graph, ops: &[OpId]) -> (f64, f64) {
        let n = ops
            .iter()
            .filter(|&&o| matches!(g.op(o).kind, OpKind::MoeExperts { .. }))
            .count() as f64;
        (n * self.fwd, n * self.bwd)
    }
}

/// The transient bytes of a backward task beside what is in flight, and what the head keeps.
struct Transients {
    /// A layer's backward: its activation gradients at their widest; under full recompute its
    /// whole activations rebuilt; under ZeRO-2 and 3 its gradient until the reduce-scatter,
    /// under ZeRO-3 its gathered parameters too (the engine decides how much of a layer is
    /// live at once).
    layer: WorkingSet,
    /// What the head keeps from its forward to its backward: the fp32 logits, and the input
    /// of each element-wise op on them whose backward reads it (Gemma 2's soft-capping tanh).
    logits_kept: f64,
    /// What the head's forward holds beside what it keeps: the fresh fp32 output of an
    /// element-wise op on the logits beside its operand (none where the loss reads the head's
    /// product itself).
    logits_forward: f64,
    /// The gradient of the logits, live during the head's backward only: in the compute
    /// dtype or fp32 as the engine holds it ([`crate::engine::Engine::logits_grad_in_compute_dtype`]).
    logits_grad: f64,
    /// The head's weights gathered whole while it runs (ZeRO-3), beside what every stage
    /// stores ([`head_weight_elems`]).
    head_gathered: f64,
    /// The transposed copy of a weight the head reads through a transpose, live while its
    /// product runs: made for the forward's product and freed after it (before the
    /// element-wise ops on the logits), made again for the backward's (after the kept logits
    /// died).
    head_transposed: f64,
    /// The gradient of the head's transposed weight copy, live in its backward beside the
    /// logits' gradient and the copy (after the kept logits died) until it is transposed back
    /// into the stored gradient.
    head_weight_grads: f64,
    /// The embedding tables' gradient from one backward, whole-table sized (a lookup's
    /// backward scatters into a fresh dense table: PyTorch's `embedding_dense_backward`,
    /// plait's `grad_part`), live at the end of the first chunk's backward before it is added
    /// to the stored gradient.
    embedding_grads: f64,
    /// What the embedding's backward holds beside that gradient as a state: under ZeRO-3 its
    /// weights gathered whole (FSDP unshards a module for its backward whether or not it reads
    /// them; so does plait's program), and under ZeRO-2 and 3 the gradient's reduce-scattered
    /// shard before it is added to the stored one (codegen's `g.NAME.part`).
    embedding_weights: f64,
}

impl Transients {
    /// The working set of the chunk that ends in the head, whose layers' working set is
    /// `layers` (in flight counts the kept logits). The head's forward runs its product beside
    /// its transposed weight copy, then ends beside the kept logits (with an element-wise
    /// op's fresh output, the copy freed); its backward runs the head first (the logits'
    /// gradient beside the kept logits; then, once the loss's backward and the element-wise
    /// ones have read the kept logits for the last time, the copy made again and its
    /// gradient beside the logits' gradient), then its layers, after the kept logits died.
    /// Under ZeRO-3 the head's gathered weights are live throughout.
    fn head_chunk(&self, layers: WorkingSet) -> WorkingSet {
        let layer_phase = layers.activations + layers.states - self.logits_kept;
        let product_backward =
            (self.head_transposed + self.head_weight_grads - self.logits_kept).max(0.0);
        let head = (self.logits_grad + product_backward)
            .max(self.logits_forward)
            .max(self.head_transposed);
        if head + self.head_gathered >= layer_phase {
            return WorkingSet {
                activations: head,
                states: self.head_gathered,
            };
        }
        let from_activations = self.logits_kept.min(layers.activations);
        WorkingSet {
            activations: layers.activations - from_activations,
            states: layers.states - (self.logits_kept - from_activations),
        }
    }

    fn new(
        g: &Graph,
        info: &ModelInfo<'_>,
        s: &Strategy,
        shape: &LayerShape,
        policy: &ActivationPolicy,
        b: Binding,
    ) -> Transients {
        let tp = s.tp as f64;
        let (seq, batch) = (b.seq as f64, b.batch as f64);
        let rebuilt = if s.recompute == Recompute::Full {
            let whole = ActivationPolicy {
                recompute: Recompute::None,
                ..*policy
            };
            layer_activation_bytes(shape, seq, batch, &whole)
        } else {
            0.0
        };
        let gradients = layer_backward_gradient_bytes(shape, seq, batch, policy);
        let states = if s.zero >= 2 && s.dp * s.cp > 1 {
            // A layer's local parameters: the dense ones whole, this rank's experts. ZeRO-2
            // and 3 reduce-scatter each backward's gradients as the layer ends, so its
            // whole local gradient is live until then; ZeRO-3 also gathers its weights.
            let local = info.dense_params_per_tp_rank(s.tp)
                + info.expert_params_per_layer as f64 / f64::from(s.ep.max(1)) / tp;
            let (gathered, reduced) = s.engine.zero3_working_params(local);
            let gathered = if s.zero >= 3 { gathered } else { 0.0 };
            gathered * s.precision.weight_bytes() + reduced * s.precision.grad_bytes()
        } else {
            0.0
        };
        // Vocabulary shards, or the rank's sequence shard where the vocabulary does not split.
        let logits_split = if info.vocabulary_splits(s.tp) || s.sequence_parallel {
            tp
        } else {
            1.0
        };
        let logit_elems = (b.batch * b.seq * info.padded_vocab(s.tp)) as f64 / logits_split;
        let logits = 4.0 * logit_elems;
        let grad_bytes = if s.engine.logits_grad_in_compute_dtype() {
            s.precision.activation_bytes()
        } else {
            4.0
        };
        let head = head_weight_elems(g, info, s);
        Transients {
            layer: WorkingSet {
                activations: rebuilt + gradients,
                states,
            },
            logits_kept: (1 + logit_ops_keeping_input(g, info)) as f64 * logits,
            logits_forward: if logit_ops(g, info).next().is_some() {
                logits
            } else {
                0.0
            },
            logits_grad: grad_bytes * logit_elems,
            head_gathered: head.gathered * s.precision.weight_bytes(),
            head_transposed: head.transposed * s.precision.weight_bytes(),
            head_weight_grads: head.transposed * s.precision.activation_bytes(),
            embedding_grads: embedding_table_elems(g, info, s) * s.precision.activation_bytes(),
            embedding_weights: embedding_backward_state_elems(g, info, s)
                * s.precision.weight_bytes(),
        }
    }
}

impl Transients {
    /// The working set of the chunk that starts with the embedding, whose layers' working set
    /// is `layers` and whose micro-batch keeps `own` bytes: its lookup's backward ends the
    /// chunk's, its table's gradient and its backward's states (ZeRO-3's gathered table)
    /// beside what is in flight once the micro-batch's own activations died (in flight counts
    /// them), after its layers' working set died. The larger phase is the chunk's. (Counting
    /// the gathered table beside the layers' widest backward put Gemma-2-9B's first stage
    /// at tp 1, pp 2 with interleaving and ZeRO-3 on 8 H100 3.0 % over its program.)
    fn embedding_chunk(&self, layers: WorkingSet, own: f64) -> WorkingSet {
        // Below zero where the micro-batch's own activations outweigh the table's gradient:
        // in flight counts them, and that phase holds less than in flight then.
        let activations = self.embedding_grads - own;
        let embedding_phase = activations + self.embedding_weights;
        if embedding_phase > layers.activations + layers.states {
            WorkingSet {
                activations,
                states: self.embedding_weights,
            }
        } else {
            layers
        }
    }
}

/// Elements (at the rank's share) of the tables the embedding ops before the layers look up.
fn embedding_table_elems(g: &Graph, info: &ModelInfo<'_>, s: &Strategy) -> f64 {
    let is_param = |v: ir::ValueId| matches!(g.op(g.def_op(v)).kind, OpKind::Param { .. });
    let tables: std::collections::BTreeSet<ir::ValueId> = info
        .pre_ops
        .iter()
        .map(|&o| g.op(o))
        .filter(|op| matches!(op.kind, OpKind::Embedding))
        .flat_map(|op| op.inputs.iter().copied().filter(|&x| is_param(x)))
        .collect();
    tables
        .into_iter()
        .map(|v| outer_rank_elems(g, info, s, v))
        .sum()
}

/// The elements of [`Transients::embedding_weights`]: of every parameter the ops before the
/// layers read (at the rank's share), under ZeRO-3 the whole, and under ZeRO-2 and 3 the
/// reduce-scattered shard of its gradient, over more than one replica; none otherwise.
fn embedding_backward_state_elems(g: &Graph, info: &ModelInfo<'_>, s: &Strategy) -> f64 {
    let replicas = f64::from(s.dp * s.cp);
    if s.zero < 2 || replicas <= 1.0 {
        return 0.0;
    }
    let gathered = if s.zero >= 3 { 1.0 } else { 0.0 };
    let is_param = |v: ir::ValueId| matches!(g.op(g.def_op(v)).kind, OpKind::Param { .. });
    let read: std::collections::BTreeSet<ir::ValueId> = info
        .pre_ops
        .iter()
        .flat_map(|&o| g.op(o).inputs.iter().copied().filter(|&x| is_param(x)))
        .collect();
    let elems: f64 = read
        .into_iter()
        .map(|v| outer_rank_elems(g, info, s, v))
        .sum();
    elems * (gathered + 1.0 / replicas)
}

/// The elements of parameter `v` of the ops outside the layers that one rank stores.
fn outer_rank_elems(g: &Graph, info: &ModelInfo<'_>, s: &Strategy, v: ir::ValueId) -> f64 {
    g.ty(v).shape.fixed_numel().unwrap_or(0) as f64 * info.outer_param_share(v, s.tp)
}

/// Elements of the head's weights live while it runs beyond the stored ones.
struct HeadWeights {
    /// A transposed copy of each weight the head reads through a transpose (a tied head
    /// computes `x · wteᵀ`, and plait's runtime materializes the transpose; its backward
    /// materializes the copy's gradient too).
    transposed: f64,
    /// Under ZeRO-3, its gathered weights.
    gathered: f64,
}

/// The head's weights beyond the stored ones ([`HeadWeights`]); the vocabulary-sized ones at
/// the rank's share where the vocabulary splits.
fn head_weight_elems(g: &Graph, info: &ModelInfo<'_>, s: &Strategy) -> HeadWeights {
    let is_param = |v: ir::ValueId| matches!(g.op(g.def_op(v)).kind, OpKind::Param { .. });
    let rank_elems = |v: ir::ValueId| outer_rank_elems(g, info, s, v);
    let mut read = std::collections::BTreeSet::new();
    let mut transposed = 0.0;
    for &o in &info.post_ops {
        let op = g.op(o);
        for &x in op.inputs.iter().filter(|&&x| is_param(x)) {
            read.insert(x);
            if matches!(op.kind, OpKind::Transpose { .. }) {
                transposed += rank_elems(x);
            }
        }
    }
    let gathered = if s.zero >= 3 && s.dp * s.cp > 1 {
        read.into_iter().map(rank_elems).sum()
    } else {
        0.0
    };
    HeadWeights {
        transposed,
        gathered,
    }
}

/// A non-plain data-parallel exchange of `local` parameters' gradients beside the plain one:
/// the compressed all-reduce with its encode and decode passes (overlapped with the backward
/// like the plain one), or local SGD's parameter average amortised over its period (after the
/// optimizer step, with nothing to hide it behind). See [`crate::dp_comm`].
fn dp_exchange(
    cluster: &Cluster,
    group: &crate::cost::comm::Group,
    dp_comm: &crate::dp_comm::DpComm,
    local: f64,
    precision: crate::precision::Precision,
) -> DpExchange {
    use crate::dp_comm::DpSync;
    let ring = 2.0 * (group.size as f64 - 1.0) / group.size as f64;
    let grad = precision.grad_bytes();
    let plain_bytes = local * grad;
    let (bytes, exchange_s) = match dp_comm.dp_sync {
        DpSync::LocalSgd { every } => {
            let weights = local * precision.weight_bytes();
            let average = collective_time(cluster, group, Collective::AllReduce, weights);
            (weights / f64::from(every), average / f64::from(every))
        }
        DpSync::Sync => {
            let wire = local * dp_comm.wire_bytes(grad);
            let kernels = dp_comm.kernel_passes() * plain_bytes / cluster.hbm_bytes_per_s();
            (
                wire,
                collective_time(cluster, group, Collective::AllReduce, wire) + kernels,
            )
        }
    };
    DpExchange {
        grad_compression: dp_comm.grad_compression,
        dp_sync: dp_comm.dp_sync,
        bytes_per_step: ring * bytes,
        plain_bytes_per_step: ring * plain_bytes,
        exchange_s,
        plain_exchange_s: collective_time(cluster, group, Collective::AllReduce, plain_bytes),
    }
}

/// The data-parallel collectives of one stage holding `local` parameters, before overlap.
struct DpSyncTimes {
    /// The gradients' reduction (every micro-batch's under ZeRO-2).
    reduce: f64,
    /// ZeRO-1/2's all-gather of the updated weights.
    gather: f64,
    /// Local SGD's parameter average per step, after the optimizer step.
    average: f64,
    /// A compressed or local-SGD exchange beside the plain one.
    exchange: Option<DpExchange>,
}

fn dp_sync_times(
    cluster: &Cluster,
    group: &crate::cost::comm::Group,
    s: &Strategy,
    local: f64,
    micro_batches: u64,
) -> DpSyncTimes {
    let mut t = DpSyncTimes {
        reduce: 0.0,
        gather: 0.0,
        average: 0.0,
        exchange: None,
    };
    if group.size <= 1 {
        return t;
    }
    let grad_bytes = local * s.precision.grad_bytes();
    let collective = |kind, bytes| collective_time(cluster, group, kind, bytes);
    t.reduce = match s.zero {
        0 if !s.dp_comm.is_plain() => {
            let x = dp_exchange(cluster, group, &s.dp_comm, local, s.precision);
            t.exchange = Some(x);
            match s.dp_comm.dp_sync {
                crate::dp_comm::DpSync::Sync => x.exchange_s,
                crate::dp_comm::DpSync::LocalSgd { .. } => {
                    t.average = x.exchange_s;
                    0.0
                }
            }
        }
        0 => collective(Collective::AllReduce, grad_bytes),
        // Reduce-scatter the gradients, all-gather the updated weights.
        1 => collective(Collective::ReduceScatter, grad_bytes),
        // Gradients are reduce-scattered every micro-batch (they are never held whole).
        2 => micro_batches as f64 * collective(Collective::ReduceScatter, grad_bytes),
        _ => 0.0,
    };
    if s.zero == 1 || s.zero == 2 {
        t.gather = collective(Collective::AllGather, local * s.precision.weight_bytes());
    }
    t
}

/// Compute and tensor-parallel seconds of the device holding `my_chunks` (of
/// `chunk_layers.len()`) over `mb` micro-batches: its layers, plus the embedding on the first
/// chunk and the head on the last; full recompute repeats each layer's forward TP
/// communication, which `Work::recompute` counts as compute.
fn device_work(
    [pre, post]: [&Work; 2],
    runs: &[RunCost],
    chunk_runs: &[Vec<u32>],
    my_chunks: &[usize],
    mb: f64,
    full: bool,
) -> (f64, f64) {
    let n_chunks = chunk_runs.len();
    let (mut compute, mut tp) = (0.0, 0.0);
    for &c in my_chunks {
        for (run, &n) in runs.iter().zip(&chunk_runs[c]) {
            let layer = &run.work;
            let repeated_tp = if full { layer.tp_fwd } else { 0.0 };
            let l = f64::from(n);
            compute += mb * l * (layer.fwd + layer.bwd + layer.recompute - repeated_tp);
            tp += mb * l * (layer.tp_fwd + layer.tp_bwd + repeated_tp);
        }
        if c == 0 {
            compute += mb * (pre.fwd + pre.bwd + pre.recompute);
            tp += mb * (pre.tp_fwd + pre.tp_bwd);
        }
        if c + 1 == n_chunks {
            compute += mb * (post.fwd + post.bwd + post.recompute);
            tp += mb * (post.tp_fwd + post.tp_bwd);
        }
    }
    (compute, tp)
}

/// Training FLOPs per token (forward + backward, no recompute) from the block structure: the
/// embedding side, `layers` times one layer (every layer is structurally identical, but for
/// its attention's window: the representative's attention counts as the layers' mean) and the
/// head side. Equal to [`cost::training_flops_per_token`] over the whole graph, without
/// walking every layer on each estimate (the search's cost stays flat in depth).
pub fn training_flops_per_token(info: &ModelInfo<'_>, b: Binding) -> f64 {
    let sum = |ops: &[OpId]| -> f64 {
        ops.iter()
            .map(|&o| {
                let c = cost::op_cost(info.graph, o, b);
                (c.fwd_flops + c.bwd_flops) * window_mean_share(info, o, b)
            })
            .sum()
    };
    let layers: f64 = info
        .runs()
        .iter()
        .map(|r| f64::from(r.count) * sum(&r.info.layer_ops))
        .sum();
    let total = sum(&info.pre_ops) + layers + sum(&info.post_ops);
    total / (b.batch * b.seq) as f64
}

/// For a layer's attention op, the mean over the model's layers of the keys `ir::cost` counts
/// per query (S × min(S, w) in a window or chunks of w, S × S without) over those it counts for
/// `o`'s own mask: Gemma 2's and gpt-oss's windowed layer 0 stands for full layers too. 1 for any other
/// op, or where no layer has a window.
fn window_mean_share(info: &ModelInfo<'_>, o: OpId, b: Binding) -> f64 {
    let op = info.graph.op(o);
    let (Some(mix), OpKind::Attention { .. }) = (info.layer_windows, &op.kind) else {
        return 1.0;
    };
    let sk = info.graph.ty(op.inputs[1]).shape.eval(b)[1];
    let counted = |w: Option<u64>| w.map_or(sk, |w| sk.min(w)).max(1) as f64;
    let mean: f64 = mix
        .masks()
        .iter()
        .map(|(mask, share)| share * counted(mask.widest()))
        .sum();
    mean / counted(op.kind.attention_mask().widest())
}
