//! From one layer's work to the pipeline: ZeRO-3's per-layer gathers, each chunk's cost and
//! working set, and each stage's states, data-parallel synchronisation, optimizer step and
//! memory once the schedule is simulated.

use super::runs::RunCost;
use super::setup::Setup;
use super::{
    DpExchange, MemoryBreakdown, OPTIMIZER_BYTES_PER_PARAM, RESERVE_BYTES, StageEstimate, Work,
    dp_sync_times, stage_local_split_of,
};
use crate::cost::comm::{Collective, collective_time, p2p_time};
use crate::cost::memory::state_bytes;
use crate::cost::pipeline::{ChunkCost, Timeline, WorkingSet};
use crate::strategy::Recompute;

/// One layer's forward and backward seconds per micro-batch once ZeRO-3 gathers its
/// parameters before its forward (and recompute) and backward and reduce-scatters its
/// gradients, prefetching one layer ahead (the layer takes the longer of its compute and its
/// communication), and the seconds that adds. Unchanged without ZeRO-3.
pub(super) fn zero3_layer(
    cx: &Setup<'_, '_>,
    info: &crate::model::ModelInfo<'_>,
    layer: &Work,
) -> (f64, f64, f64) {
    let s = cx.s;
    let (fwd, bwd) = (layer.fwd_total(), layer.bwd_total());
    if s.zero != 3 || cx.dp * cx.cp <= 1 {
        return (fwd, bwd, 0.0);
    }
    let wbytes = s.precision.weight_bytes();
    let dense = info.dense_params_per_tp_rank(cx.tp as u32) * wbytes;
    let experts = info.expert_params_per_layer as f64 / (cx.tp * cx.ep) as f64 * wbytes;
    // A layer's parameters are gathered (and its gradients reduce-scattered) as one flat
    // buffer, as FSDP's flat parameters and DeepSpeed's coalesced gathers do.
    let ceiling = s
        .overlap
        .zero3_gb_per_s
        .map_or(0.0, |bw| (dense + experts) / (bw * 1e9));
    let both = |kind| {
        collective_time(cx.cluster, &cx.m.dp, kind, dense)
            + collective_time(cx.cluster, &cx.m.edp, kind, experts)
    };
    let ag = both(Collective::AllGather).max(ceiling);
    let rs = both(Collective::ReduceScatter).max(ceiling);
    let regathers = if s.recompute == Recompute::Full {
        2.0
    } else {
        1.0
    };
    let (f, b) = if cx.overlaps(s.overlap.zero3_prefetch) {
        (fwd.max(ag), bwd.max(regathers * ag + rs))
    } else if cx.overlaps(s.overlap.grad_reduce) {
        // Synchronous gathers, but the gradients' reduce-scatter on its own stream
        // (DeepSpeed's `overlap_comm`, on by default at stage 3).
        (fwd + ag, bwd.max(rs) + regathers * ag)
    } else {
        (fwd + ag, bwd + regathers * ag + rs)
    };
    (f, b, (f - fwd) + (b - bwd))
}

/// What the pipeline simulation needs of each chunk.
pub(super) struct ChunkInputs<'w> {
    pub pre: &'w Work,
    pub post: &'w Work,
    /// One layer of each run of identical layers: its seconds, kept activations and working
    /// set per micro-batch.
    pub runs: &'w [RunCost],
    /// One activation's send to the next stage.
    pub p2p: f64,
}

/// Each chunk's cost: its layers (`chunk_runs[c]`: how many of each run), the embedding on
/// the first, the head (and the logits it keeps) on the last.
pub(super) fn chunk_costs(chunk_runs: &[Vec<u32>], c: &ChunkInputs<'_>) -> Vec<ChunkCost> {
    let n_chunks = chunk_runs.len();
    let head = &c.runs[0].transients;
    chunk_runs
        .iter()
        .enumerate()
        .map(|(i, counts)| {
            let mut cc = ChunkCost {
                fwd: 0.0,
                bwd: 0.0,
                p2p: if i + 1 < n_chunks { c.p2p } else { 0.0 },
                activation_bytes: 0.0,
                working: WorkingSet::default(),
            };
            for (run, &n) in c.runs.iter().zip(counts) {
                let layers = f64::from(n);
                cc.fwd += layers * run.fwd;
                cc.bwd += layers * run.bwd;
                cc.activation_bytes += layers * run.act;
                if n > 0 {
                    // The widest backward of the chunk's layers.
                    let w = run.transients.layer;
                    cc.working.activations = cc.working.activations.max(w.activations);
                    cc.working.states = cc.working.states.max(w.states);
                }
            }
            if i == 0 {
                cc.fwd += c.pre.fwd_total();
                cc.bwd += c.pre.bwd_total();
                cc.working = head.embedding_chunk(cc.working, cc.activation_bytes);
            }
            if i + 1 == n_chunks {
                cc.fwd += c.post.fwd_total();
                cc.bwd += c.post.bwd_total();
                cc.activation_bytes += head.logits_kept;
                cc.working = head.head_chunk(cc.working);
            }
            cc
        })
        .collect()
}

/// One pipeline stage after the schedule: its estimate, and what the iteration's breakdown
/// needs of it.
pub(super) struct StageResult {
    pub estimate: StageEstimate,
    /// Data-parallel (and tied-embedding) synchronisation not hidden behind compute.
    pub dp_exposed: f64,
    pub exchange: Option<DpExchange>,
    pub optimizer: f64,
}

/// Stage `d`'s parameters and optimizer states, its data-parallel synchronisation (bucketed
/// and overlapped with the backward of the last micro-batch, all but its first layer's worth
/// hidden behind it, where the cluster runs communication beside compute), its optimizer step
/// and its memory at the simulated peak.
pub(super) fn stage_result(
    cx: &Setup<'_, '_>,
    d: usize,
    (chunk_layers, chunk_runs): (&[u32], &[Vec<u32>]),
    chunks: &[ChunkCost],
    timeline: &Timeline,
) -> StageResult {
    let (s, info, cluster, m) = (cx.s, cx.info, cx.cluster, &cx.m);
    let micro_batches = s.micro_batches();
    let n_chunks = chunk_layers.len();
    let my_chunks: Vec<usize> = (0..n_chunks).filter(|c| c % s.pp as usize == d).collect();
    let layers: u32 = my_chunks.iter().map(|&c| chunk_layers[c]).sum();
    // The dense weights are replicated over dp × cp, the experts (split ep ways) over the
    // expert-data-parallel ranks only.
    let (local, local_experts) = stage_local_split_of(info, s, d as u32, chunk_runs);
    let replicas = (cx.dp * cx.cp) as f64;
    let expert_replicas = replicas / cx.ep as f64;
    let mut states = state_bytes(local, replicas, s.zero, s.precision);
    states.add(&state_bytes(
        local_experts,
        expert_replicas,
        s.zero,
        s.precision,
    ));
    if s.precision.is_fp8() {
        // Transformer Engine keeps an FP8 copy of each weight beside the 16-bit one (its
        // transpose is rebuilt when needed: `--keep-fp8-transpose-cache` is off by default).
        states.weights += if s.zero >= 3 {
            local / replicas + local_experts / expert_replicas
        } else {
            local + local_experts
        };
    }
    // The experts' gradients reduce over their own replicas, after the dense ones.
    let mut sync = dp_sync_times(cluster, &m.dp, s, local, micro_batches);
    let expert_sync = dp_sync_times(cluster, &m.edp, s, local_experts, micro_batches);
    sync.reduce += expert_sync.reduce;
    sync.gather += expert_sync.gather;
    sync.average += expert_sync.average;
    let last_bwd: f64 = my_chunks.iter().map(|&c| chunks[c].bwd).sum();
    let first_fwd: f64 = my_chunks.iter().map(|&c| chunks[c].fwd).sum();
    let exposed = exposed_dp_sync(cx, layers, &sync, last_bwd, first_fwd);
    // Tied embedding gradients are summed between the first and last stage.
    let tied_sync = if cx.pp > 1 && info.tied_params > 0 && (d == 0 || d + 1 == s.pp as usize) {
        let bytes = info.tied_params as f64 / cx.tp as f64 * s.precision.grad_bytes();
        p2p_time(cluster, bytes, m.pp_cross_node, m.pp_sharing)
    } else {
        0.0
    };
    let owned = if s.zero >= 1 {
        local / replicas + local_experts / expert_replicas
    } else {
        local + local_experts
    };
    let optimizer = owned * OPTIMIZER_BYTES_PER_PARAM / cx.device.hbm + cx.device.launch;
    let finish = timeline.device_finish[d] + exposed + tied_sync + optimizer + sync.average;
    // Activations: the in-flight micro-batches and the working set of the task running at the
    // device's peak (the pipeline simulation finds which); the states part of that working
    // set (ZeRO-3's gathered layer) is shown as `other`. The first stage also holds the
    // embedding output.
    let working_states = timeline.device_peak_working_states[d];
    let mut other = RESERVE_BYTES + working_states;
    if my_chunks.contains(&0) {
        let rep = if s.sequence_parallel {
            cx.tp as f64
        } else {
            1.0
        };
        other += cx.act_bytes / rep;
    }
    let memory = MemoryBreakdown {
        weights: states.weights,
        grads: states.grads,
        optimizer: states.optimizer,
        activations: timeline.device_peak_activations[d] - working_states,
        other,
    };
    StageResult {
        estimate: StageEstimate {
            stage: d as u32,
            layers,
            busy_s: timeline.device_busy[d],
            finish_s: finish,
            peak_memory_bytes: memory.total(),
            memory,
            micro_batches_in_flight: timeline.device_peak_in_flight[d],
            kernel_s: Default::default(),
        },
        dp_exposed: exposed + tied_sync + sync.average,
        exchange: sync.exchange,
        optimizer,
    }
}

/// The gradient reduction and weight gather a stage of `layers` layers leaves exposed: the
/// reduction hides behind the last micro-batch's backward `last_bwd` (every micro-batch's
/// under ZeRO-2), the updated weights' all-gather behind the next iteration's first forward
/// `first_fwd` with `--overlap-param-gather` (bucket by bucket, all but the first layer's
/// worth), else after the optimizer step; without overlap it adds to the reduction.
fn exposed_dp_sync(
    cx: &Setup<'_, '_>,
    layers: u32,
    sync: &super::DpSyncTimes,
    last_bwd: f64,
    first_fwd: f64,
) -> f64 {
    let s = cx.s;
    let hidden_window = if layers > 0 && cx.overlaps(s.overlap.grad_reduce) {
        let per_mb = if s.zero == 2 {
            s.micro_batches() as f64
        } else {
            1.0
        };
        last_bwd * per_mb * (f64::from(layers) - 1.0) / f64::from(layers)
    } else {
        0.0
    };
    if cx.overlaps(s.overlap.param_gather) {
        let gather_exposed = if layers > 0 {
            (sync.gather - first_fwd * (f64::from(layers) - 1.0) / f64::from(layers)).max(0.0)
        } else {
            sync.gather
        };
        (sync.reduce - hidden_window).max(0.0) + gather_exposed
    } else {
        (sync.reduce + sync.gather - hidden_window).max(0.0)
    }
}
