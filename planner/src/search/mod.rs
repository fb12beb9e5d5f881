//! The outer search: device-mesh shapes (TP inside a node), pipeline degree and stage split,
//! data parallelism, micro-batch, schedule, ZeRO stage, recomputation and sequence
//! parallelism, every candidate costed by [`estimate`]. A memory lower bound prunes meshes
//! that cannot fit whatever else is chosen; the best plan and the best rejected alternatives
//! are kept with the reason they lost.

mod broken_pin;
pub mod cutoff;
mod pin_conflict;
pub mod split;

pub use broken_pin::NORM_ACROSS_HEADS;

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cost::compute::{AttentionKernel, Kernels};
use crate::cost::memory::state_bytes;
use crate::engine::Engine;
use crate::error::PlanError;
use crate::estimate::{Estimate, RESERVE_BYTES, estimate, estimate_within};
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::precision::Precision;
use crate::strategy::{Recompute, Schedule, Strategy};

/// Knobs the user fixed; `None` leaves the knob to the search.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pins {
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub dp: Option<u32>,
    pub micro_batch: Option<u64>,
    pub zero: Option<u8>,
    pub recompute: Option<Recompute>,
    pub schedule: Option<Schedule>,
    pub virtual_stages: Option<u32>,
    pub sequence_parallel: Option<bool>,
    pub precision: Option<Precision>,
    pub stage_layers: Option<Vec<u32>>,
    pub attention: Option<AttentionKernel>,
    /// Element-wise kernel fusion (default: the cluster's, [`Cluster::default_kernels`]).
    #[serde(default)]
    pub kernels: Option<Kernels>,
    /// Context-parallel degree (default: searched for sequences of 8192 tokens and more).
    #[serde(default)]
    pub cp: Option<u32>,
    /// Expert-parallel degree (default: searched over the divisors of dp that divide the
    /// experts, for mixture-of-experts models).
    #[serde(default)]
    pub ep: Option<u32>,
    /// The engine that will run the plan (default: megatron).
    #[serde(default)]
    pub engine: Option<Engine>,
    /// Keep to what the engine can run ([`Engine::runs`]; `plait compile --target`). Off:
    /// plait's whole space, priced with the engine's profile.
    #[serde(default)]
    pub target: bool,
    /// The data-parallel exchange every candidate uses (never searched: compression and
    /// local SGD trade convergence, which is the user's choice); not plain: ZeRO-0 only.
    #[serde(default)]
    pub dp_comm: crate::dp_comm::DpComm,
}

/// The shortest sequence for which the search tries context parallelism: Megatron-Core's
/// guide recommends it for long contexts, where activations (∝ s) and attention (∝ s²) grow
/// past what tensor parallelism alone splits well (docs/source/api-guide/context_parallel.rst);
/// below it, cp only adds ring traffic and the search skips it to stay fast.
pub const CP_MIN_SEQ: u64 = 8192;

/// The context-parallel degrees to try for `seq` on `gpus` GPUs.
fn cp_options(p: &Pins, seq: u64, gpus: u64) -> Vec<u64> {
    if let Some(cp) = p.cp {
        return vec![u64::from(cp)];
    }
    if seq < CP_MIN_SEQ {
        return vec![1];
    }
    [1u64, 2, 4, 8]
        .into_iter()
        .filter(|&cp| cp == 1 || (gpus.is_multiple_of(cp) && seq.is_multiple_of(2 * cp)))
        .collect()
}

/// The expert-parallel degrees to try at data-parallel degree `dp`: the pin, or every divisor
/// of dp that divides the model's experts (1 for a dense model, and beside context
/// parallelism, which expert parallelism is not modelled with).
fn ep_options(p: &Pins, info: &ModelInfo<'_>, cp: u32, dp: u64) -> Vec<u32> {
    if let Some(ep) = p.ep {
        return vec![ep];
    }
    if info.experts == 0 || cp > 1 {
        return vec![1];
    }
    divisors(dp)
        .into_iter()
        .filter(|&e| info.experts.is_multiple_of(e))
        .map(|e| e as u32)
        .collect()
}

/// What to search for.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchRequest {
    pub gpus: u64,
    pub global_batch: u64,
    pub seq: u64,
    pub pins: Pins,
    /// How many rejected alternatives to keep.
    pub top_k: usize,
}

/// A candidate that lost, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    pub strategy: Strategy,
    pub iteration_time_s: f64,
    pub fits: bool,
    pub peak_memory_bytes: f64,
    /// Bytes over the GPU's capacity on the fullest stage (0 when it fits).
    pub shortfall_bytes: f64,
    pub shortfall_stage: u32,
    pub reason: String,
}

/// The search's answer.
#[derive(Clone, Debug)]
pub struct SearchResult {
    pub best: Estimate,
    pub alternatives: Vec<Alternative>,
    pub candidates_evaluated: u64,
    pub candidates_pruned: u64,
    /// Candidates skipped because their pipeline's lower bound proves them slower than every
    /// plan that could be reported ([`cutoff`]).
    pub candidates_bounded: u64,
    pub time_s: f64,
}

/// Why nothing fits, and what would.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Infeasible {
    pub smallest_shortfall_bytes: f64,
    /// The shortfall is a lower bound's (every candidate was pruned by its memory lower bound,
    /// or none could be priced): the closest plan misses by at least that much.
    pub shortfall_is_lower_bound: bool,
    pub closest: Option<Strategy>,
    pub suggestions: Vec<String>,
}

/// Called with (done, total) as candidates are evaluated.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// The divisors of `n`, ascending: pairs `d`, `n / d` up to √n, so that a huge count (a GPU
/// count advised for an absurd model) takes √n steps, not n.
fn divisors(n: u64) -> Vec<u64> {
    let (mut small, mut large) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d <= n / d {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// The default precision: bf16 where the GPU has it, else fp16, else fp32.
pub fn default_precision(cluster: &Cluster) -> Precision {
    [Precision::Bf16, Precision::Fp16, Precision::Fp32]
        .into_iter()
        .find(|p| cluster.peak_flops(*p).is_some())
        .unwrap_or(Precision::Fp32)
}

/// [`default_precision`] among those `engine` trains in: torchtitan has no fp16 mixed
/// precision, so a GPU without bf16 (V100) trains there in fp32.
pub fn engine_default_precision(cluster: &Cluster, engine: Engine) -> Precision {
    match default_precision(cluster) {
        Precision::Fp16 if engine == Engine::Torchtitan => Precision::Fp32,
        p => p,
    }
}

/// Every strategy the request allows, in a fixed order (so results are deterministic).
pub fn candidates(info: &ModelInfo<'_>, cluster: &Cluster, req: &SearchRequest) -> Vec<Strategy> {
    let p = &req.pins;
    let engine = p.engine.unwrap_or_default();
    let precision = p
        .precision
        .unwrap_or_else(|| engine_default_precision(cluster, engine));
    let kernels = p.kernels.unwrap_or_else(|| cluster.engine_kernels(engine));
    let attention = p.attention.unwrap_or_else(|| cluster.default_attention());
    let mut out = Vec::new();
    for cp in cp_options(p, req.seq, req.gpus) {
        let mesh = MeshCandidates {
            gpus: req.gpus / cp,
            cp: cp as u32,
            engine,
            kernels,
            attention,
            precision,
        };
        mesh.push_all(info, cluster, req, &mut out);
    }
    if p.target {
        if engine == Engine::Megatron {
            // Its 1F1B stages: the remainder on the first and last (the even default puts it
            // on the first stages, which Megatron cannot state).
            for s in out.iter_mut().filter(|s| {
                s.pp > 1
                    && s.virtual_stages == 1
                    && s.stage_layers.is_none()
                    && !info.layers.is_multiple_of(s.pp)
            }) {
                s.stage_layers = Some(crate::engine::megatron_split_of(info.layers, s.pp));
            }
        }
        out.retain(|s| engine.runs_on(s, info.layers).is_ok());
    }
    out
}

/// The candidates of one context-parallel degree: every (tp, pp, dp) over the remaining GPUs.
struct MeshCandidates {
    gpus: u64,
    cp: u32,
    engine: Engine,
    kernels: Kernels,
    attention: AttentionKernel,
    precision: Precision,
}

impl MeshCandidates {
    fn push_all(
        &self,
        info: &ModelInfo<'_>,
        cluster: &Cluster,
        req: &SearchRequest,
        out: &mut Vec<Strategy>,
    ) {
        let p = &req.pins;
        let (precision, kernels, attention) = (self.precision, self.kernels, self.attention);
        let gpn = u64::from(cluster.gpus_per_node);
        for tp in divisors(self.gpus) {
            // Tensor parallelism stays inside a node: its collectives run on every layer.
            if p.tp.map_or(tp > gpn, |t| u64::from(t) != tp) {
                continue;
            }
            if !info.heads.is_multiple_of(tp) {
                continue;
            }
            for pp in divisors(self.gpus / tp) {
                if p.pp.is_some_and(|x| u64::from(x) != pp) || pp > u64::from(info.layers) {
                    continue;
                }
                let dp = self.gpus / tp / pp;
                if p.dp.is_some_and(|x| u64::from(x) != dp) || !req.global_batch.is_multiple_of(dp)
                {
                    continue;
                }
                let eps = ep_options(p, info, self.cp, dp);
                let per_replica = req.global_batch / dp;
                let mbs: Vec<u64> = match p.micro_batch {
                    // A replica's batch is a whole number of micro-batches.
                    Some(m) if !per_replica.is_multiple_of(m) => continue,
                    Some(m) => vec![m],
                    // Sizes up to 64 that divide the replica's batch into no more
                    // micro-batches than a step schedules (a scan of 64, not of the batch's
                    // divisors: a global batch of 2^63 is refused at once).
                    None => (1..=64u64)
                        .filter(|&m| {
                            per_replica.is_multiple_of(m)
                                && per_replica / m <= crate::strategy::MAX_MICRO_BATCHES
                        })
                        .collect(),
                };
                let mut schedules: Vec<(Schedule, u32)> = Vec::new();
                if pp == 1 {
                    schedules.push((Schedule::OneFOneB, 1));
                } else {
                    schedules.push((Schedule::OneFOneB, 1));
                    schedules.push((Schedule::Gpipe, 1));
                    let pinned_v = p.virtual_stages.filter(|v| ![2, 3, 4, 6, 8].contains(v));
                    for v in [2u32, 3, 4, 6, 8].into_iter().chain(pinned_v) {
                        if pp * u64::from(v) <= u64::from(info.layers) {
                            schedules.push((Schedule::Interleaved, v));
                        }
                    }
                }
                schedules.retain(|(s, v)| {
                    p.schedule.is_none_or(|x| x == *s) && p.virtual_stages.is_none_or(|x| x == *v)
                });
                let searched_zeros = if p.dp_comm.is_plain() {
                    vec![0, 1, 2, 3]
                } else {
                    vec![0]
                };
                let zeros: Vec<u8> = p.zero.map_or(searched_zeros, |z| vec![z]);
                let recomputes = p.recompute.map_or(
                    vec![Recompute::None, Recompute::Selective, Recompute::Full],
                    |r| vec![r],
                );
                let sps: Vec<bool> = match p.sequence_parallel {
                    // Off at tp 1 whatever the pin says, as Megatron-LM turns it off.
                    Some(x) => vec![x && tp > 1],
                    None if tp > 1 => vec![false, true],
                    None => vec![false],
                };
                for &mb in &mbs {
                    for &(schedule, v) in &schedules {
                        for &zero in &zeros {
                            // ZeRO shards over dp × cp: with neither, it is ZeRO-0.
                            if dp == 1 && self.cp == 1 && zero > 0 && p.zero.is_none() {
                                continue;
                            }
                            for &recompute in &recomputes {
                                for (&sequence_parallel, &ep) in
                                    sps.iter().flat_map(|sp| eps.iter().map(move |e| (sp, e)))
                                {
                                    out.push(Strategy {
                                        tp: tp as u32,
                                        pp: pp as u32,
                                        dp: dp as u32,
                                        micro_batch: mb,
                                        global_batch: req.global_batch,
                                        seq: req.seq,
                                        zero,
                                        recompute,
                                        schedule,
                                        virtual_stages: v,
                                        sequence_parallel,
                                        precision,
                                        attention,
                                        kernels,
                                        stage_layers: p.stage_layers.clone(),
                                        cp: self.cp,
                                        ep,
                                        engine: self.engine,
                                        overlap: self.engine.overlap(zero),
                                        dp_comm: p.dp_comm,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A lower bound on the fullest stage's memory: the model states of an average stage (the
/// fullest holds at least the average) plus the reserve.
fn memory_lower_bound(info: &ModelInfo<'_>, s: &Strategy) -> f64 {
    let experts = info.expert_params() as f64;
    let per_stage = |p: f64| p / f64::from(s.pp) / f64::from(s.tp);
    // ZeRO shards over dp × cp (Megatron's distributed optimizer spans the context-parallel
    // ranks too), as the estimate does.
    let replicas = f64::from(s.dp) * f64::from(s.cp.max(1));
    let dense = state_bytes(
        per_stage(info.params() as f64 - experts),
        replicas,
        s.zero,
        s.precision,
    );
    let expert = state_bytes(
        per_stage(experts) / f64::from(s.ep),
        replicas / f64::from(s.ep.max(1)),
        s.zero,
        s.precision,
    );
    dense.weights
        + dense.grads
        + dense.optimizer
        + expert.weights
        + expert.grads
        + expert.optimizer
        + RESERVE_BYTES
}

fn shortfall(e: &Estimate) -> (f64, u32) {
    let cap = e.predicted.memory_capacity_bytes;
    e.predicted
        .stages
        .iter()
        .map(|st| (st.peak_memory_bytes - cap, st.stage))
        .fold((f64::NEG_INFINITY, 0), |a, b| if b.0 > a.0 { b } else { a })
}

/// Re-splits the layers of a pipelined plan so the end stages (embedding, head) are not the
/// bottleneck; keeps the better of the even and the balanced split.
fn rebalance(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    e: Estimate,
    runnable: &dyn Fn(&Strategy) -> bool,
) -> Estimate {
    let s = &e.strategy;
    if s.pp == 1 || s.stage_layers.is_some() {
        return e;
    }
    let chunks = s.chunks() as usize;
    let mut extra = vec![0.0; chunks];
    extra[0] += e.profile.pre_s;
    extra[chunks - 1] += e.profile.post_s;
    let split = if info.layer_runs.is_empty() {
        split::balanced_split(info.layers, chunks, e.profile.layer_s, &extra)
    } else {
        // Layers of unequal cost: each layer's run's seconds.
        let per_layer: Vec<f64> = info
            .runs()
            .iter()
            .zip(&e.profile.run_layer_s)
            .flat_map(|(r, &t)| std::iter::repeat_n(t, r.count as usize))
            .collect();
        split::bottleneck_split(&per_layer, chunks, &extra)
    };
    let Some(split) = split else {
        return e;
    };
    if split == s.chunk_layers(info.layers) {
        return e;
    }
    let mut t = s.clone();
    t.stage_layers = Some(split);
    if !runnable(&t) {
        return e;
    }
    match estimate(info, cluster, gpus, &t) {
        Ok(b) if better(&b, &e) => b,
        _ => e,
    }
}

/// Estimates one refinement may spend (0.07 ms each for GPT-3 175B on 1024 GPUs).
const REFINE_BUDGET: usize = 1000;

/// Improves a pipelined plan's stage split by moving layers from one chunk to another while
/// the simulated iteration gets faster (first improvement, at most [`REFINE_BUDGET`]
/// estimates). The water-filling split minimizes the slowest chunk; several splits can share
/// that bottleneck, and the schedule's warm-up and drain, which only the simulation sees,
/// decide between them.
///
/// Moves start at a quarter of the average chunk and halve whenever no move of that size
/// helps (a pattern search), so a deep model reaches the same kind of end point, a split no
/// single-layer move improves, in O(chunks² · log layers) estimates instead of one estimate
/// per layer moved.
fn refine_split(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    e: Estimate,
    runnable: &dyn Fn(&Strategy) -> bool,
) -> Estimate {
    if e.strategy.pp == 1 {
        return e;
    }
    let chunks = e.strategy.chunks().max(1);
    let mut step = (info.layers / chunks / 4).max(1);
    let mut best = e;
    let mut spent = 0;
    while spent < REFINE_BUDGET {
        match improving_move(info, cluster, gpus, &best, step, &mut spent, runnable) {
            Some(better) => best = better,
            None if step == 1 => break,
            None => step /= 2,
        }
    }
    best
}

/// The first split, in (from, to) order, that moves `step` layers between two chunks and
/// beats `best`; counts the estimates it spends against [`REFINE_BUDGET`].
fn improving_move(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    gpus: u64,
    best: &Estimate,
    step: u32,
    spent: &mut usize,
    runnable: &dyn Fn(&Strategy) -> bool,
) -> Option<Estimate> {
    let split = best.strategy.chunk_layers(info.layers);
    for from in 0..split.len() {
        for to in 0..split.len() {
            if from == to || split[from] <= step {
                continue;
            }
            if *spent >= REFINE_BUDGET {
                return None;
            }
            let mut t = best.strategy.clone();
            let mut moved = split.clone();
            moved[from] -= step;
            moved[to] += step;
            t.stage_layers = Some(moved);
            if !runnable(&t) {
                continue;
            }
            *spent += 1;
            // A split whose pipeline bound already exceeds `best` cannot beat it: skip its
            // simulation.
            let cutoff = best.predicted.iteration_time_s;
            if let Ok(Some(c)) = estimate_within(info, cluster, gpus, &t, cutoff)
                && better(&c, best)
            {
                return Some(c);
            }
        }
    }
    None
}

/// Fitting beats not fitting; then faster wins.
fn better(a: &Estimate, b: &Estimate) -> bool {
    match (a.predicted.fits, b.predicted.fits) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.predicted.iteration_time_s < b.predicted.iteration_time_s,
        (false, false) => shortfall(a).0 < shortfall(b).0,
    }
}

fn gib(b: f64) -> f64 {
    b / (1u64 << 30) as f64
}

/// Why the request leaves no strategy to price: a pinned degree that breaks a rule, pins that
/// conflict (with each other or with `--target`'s engine), or GPUs that split no way.
fn no_candidates(info: &ModelInfo<'_>, cluster: &Cluster, req: &SearchRequest) -> String {
    if let Some(why) =
        broken_pin::broken_pin(info, req).or_else(|| pin_conflict::explain(info, cluster, req))
    {
        return why;
    }
    // The fewest micro-batches any strategy gives: dp of every GPU, the largest searched
    // (or the pinned) micro-batch.
    let largest = req.pins.micro_batch.unwrap_or(64);
    let fewest = req.global_batch / req.gpus.max(1) / largest.max(1);
    if fewest > crate::strategy::MAX_MICRO_BATCHES {
        return format!(
            "--global-batch {} over {} GPUs is at least {fewest} micro-batches per iteration \
             (of {largest} sequences); plait schedules at most {}: use a smaller \
             --global-batch (or more GPUs)",
            req.global_batch,
            req.gpus,
            crate::strategy::MAX_MICRO_BATCHES
        );
    }
    let p = &req.pins;
    if p.tp.is_some() || p.pp.is_some() || p.dp.is_some() || p.micro_batch.is_some() {
        return format!(
            "no strategy satisfies the pins for {} GPUs and global batch {} (check that tp x pp \
             x dp = --gpus, that tp divides the {} heads, and that dp divides the batch)",
            req.gpus, req.global_batch, info.heads
        );
    }
    format!(
        "{} GPUs cannot be split as tp x pp x dp for this model and global batch {}: tp must \
         divide the {} attention heads, pp be at most the {} layers, and dp divide the global \
         batch; use fewer GPUs or a larger --global-batch",
        req.gpus, req.global_batch, info.heads, info.layers
    )
}

/// Searches the space; `Err(Infeasible)` when no candidate fits, with advice that includes
/// the smallest GPU count that does.
pub fn search(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
    progress: Progress<'_>,
) -> Result<Result<SearchResult, Infeasible>, PlanError> {
    search_with(info, cluster, req, progress, true, true)
}

/// [`search`] simulating every candidate's pipeline (no time bound): the same answer, slower;
/// the reference the bounded search is tested against.
pub fn search_exhaustive(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
) -> Result<Result<SearchResult, Infeasible>, PlanError> {
    search_with(info, cluster, req, &mut |_, _| {}, true, false)
}

fn search_with(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
    progress: Progress<'_>,
    advise_gpus: bool,
    bounded_by_time: bool,
) -> Result<Result<SearchResult, Infeasible>, PlanError> {
    let start = Instant::now();
    if let Some(why) = broken_pin::before_search(info, cluster, req) {
        return Err(PlanError::invalid(why));
    }
    let all = candidates(info, cluster, req);
    if all.is_empty() {
        return Err(PlanError::invalid(no_candidates(info, cluster, req)));
    }
    let capacity = cluster.memory_bytes();
    let total = all.len() as u64;
    let mut evaluated = 0u64;
    let mut pruned = 0u64;
    let mut bounded = 0u64;
    let mut cutoffs = cutoff::Cutoffs::new(req.top_k);
    let mut fitting: Vec<Estimate> = Vec::new();
    let mut closest: Option<Estimate> = None;
    // The pruned strategy nearest to fitting, by its memory lower bound (what a search that
    // pruned everything says it missed by).
    let mut closest_pruned: Option<(f64, Strategy)> = None;
    // Plans that do not fit but were faster than every fitting plan seen when they came:
    // the report's "would have won" alternative is the nearest of those faster than the winner.
    let mut faster_oom: Vec<Estimate> = Vec::new();
    let mut first_error: Option<PlanError> = None;
    for (i, s) in all.iter().enumerate() {
        if i % 256 == 0 {
            progress(i as u64, total);
        }
        let bound = memory_lower_bound(info, s);
        if bound > capacity {
            pruned += 1;
            if closest_pruned.as_ref().is_none_or(|(b, _)| bound < *b) {
                closest_pruned = Some((bound, s.clone()));
            }
            continue;
        }
        let cutoff = if bounded_by_time {
            cutoffs.cutoff_for(s)
        } else {
            f64::INFINITY
        };
        let e = match estimate_within(info, cluster, req.gpus, s, cutoff) {
            Ok(Some(e)) => e,
            Ok(None) => {
                bounded += 1;
                cutoffs.skip(i, s);
                continue;
            }
            Err(err) => {
                first_error.get_or_insert(err);
                continue;
            }
        };
        evaluated += 1;
        if e.predicted.fits {
            cutoffs.record(&e);
            fitting.push(e);
        } else {
            if e.predicted.iteration_time_s < cutoffs.fastest_fitting() {
                faster_oom.push(e.clone());
            }
            if closest.as_ref().is_none_or(|c| better(&e, c)) {
                closest = Some(e);
            }
        }
    }
    progress(total, total);
    if fitting.is_empty() {
        if evaluated == 0
            && pruned == 0
            && let Some(err) = first_error
        {
            return Err(err);
        }
        let mut inf = infeasible(info, cluster, req, closest, closest_pruned);
        if let Some((gpus, best)) = advise_gpus
            .then(|| smallest_fitting_cluster(info, cluster, req))
            .flatten()
        {
            let st = &best.strategy;
            inf.suggestions[0] = format!(
                "use {gpus} GPUs: the smallest count plait finds a plan for (tp {} pp {} dp {}{}, \
                 ZeRO-{}, recompute {}, {:.2} s per iteration)",
                st.tp,
                st.pp,
                st.dp,
                if st.cp > 1 {
                    format!(" cp {}", st.cp)
                } else if st.ep > 1 {
                    format!(" ep {}", st.ep)
                } else {
                    String::new()
                },
                st.zero,
                st.recompute,
                best.predicted.iteration_time_s
            );
        }
        return Ok(Err(inf));
    }
    // Rebalance the stage split of the most promising candidates, then rank.
    fitting.sort_by(|a, b| {
        a.predicted
            .iteration_time_s
            .total_cmp(&b.predicted.iteration_time_s)
    });
    // A split the target engine cannot run is not tried (`--target`).
    let runnable = |s: &Strategy| !req.pins.target || s.engine.runs_on(s, info.layers).is_ok();
    let n = fitting.len().min(cutoff::REBALANCED);
    for e in fitting.iter_mut().take(n) {
        let balanced = rebalance(info, cluster, req.gpus, e.clone(), &runnable);
        evaluated += 1;
        *e = balanced;
    }
    fitting.sort_by(|a, b| {
        a.predicted
            .iteration_time_s
            .total_cmp(&b.predicted.iteration_time_s)
    });
    // Then refine the split of the fastest few by single-layer moves (unless it is pinned).
    if req.pins.stage_layers.is_none() {
        for e in fitting.iter_mut().take(4) {
            *e = refine_split(info, cluster, req.gpus, e.clone(), &runnable);
        }
        fitting.sort_by(|a, b| {
            a.predicted
                .iteration_time_s
                .total_cmp(&b.predicted.iteration_time_s)
        });
    }
    // The winner's mesh shape in full, for the runner-up the report compares it with.
    for &i in cutoffs.skipped_of(&fitting[0].strategy) {
        if let Ok(e) = estimate(info, cluster, req.gpus, &all[i]) {
            evaluated += 1;
            bounded -= 1;
            if e.predicted.fits {
                fitting.push(e);
            }
        }
    }
    fitting[1..].sort_by(|a, b| {
        a.predicted
            .iteration_time_s
            .total_cmp(&b.predicted.iteration_time_s)
    });
    let best = fitting.remove(0);
    let t0 = best.predicted.iteration_time_s;
    let nearest_faster_oom = faster_oom
        .into_iter()
        .filter(|e| e.predicted.iteration_time_s < t0)
        .fold(None::<Estimate>, |acc, e| match acc {
            Some(a) if !better(&e, &a) => Some(a),
            _ => Some(e),
        });
    let alternatives = alternatives(&best, &fitting, nearest_faster_oom.as_ref(), req.top_k);
    Ok(Ok(SearchResult {
        best,
        alternatives,
        candidates_evaluated: evaluated,
        candidates_pruned: pruned,
        candidates_bounded: bounded,
        time_s: start.elapsed().as_secs_f64(),
    }))
}

/// Words each fitting alternative anew against a winner `best` that takes `t0` seconds, after
/// `compile` re-ranked the plans as their programs run: how much slower it is, what it changes
/// where it shares the winner's mesh shape, and `note` for those priced as lowered (their
/// programs' layout) rather than as searched. The out-of-memory alternative keeps its reason.
pub fn reworded(a: &Alternative, best: &Strategy, t0: f64, note: Option<&str>) -> String {
    if !a.fits {
        return a.reason.clone();
    }
    let mesh = |s: &Strategy| (s.tp, s.pp, s.dp);
    let slower = 100.0 * (a.iteration_time_s / t0 - 1.0);
    if slower < 0.0 {
        // Re-ranking lowers every alternative searched faster than the winner runs; one
        // whose estimate failed there keeps its searched price.
        return format!(
            "faster by {:.1} % as searched than the plan as its program runs, but not lowered",
            -slower
        );
    }
    let mut tail = Vec::new();
    if mesh(&a.strategy) == mesh(best) {
        tail.push(differs(best, &a.strategy));
    }
    tail.extend(note.map(str::to_string));
    if tail.is_empty() {
        format!("slower by {slower:.1} %")
    } else {
        format!("slower by {slower:.1} % ({})", tail.join("; "))
    }
}

/// The best losers: the fastest plan of each other mesh shape, and `oom`, the nearest plan
/// that did not fit among those that would have been faster.
fn alternatives(
    best: &Estimate,
    rest: &[Estimate],
    oom: Option<&Estimate>,
    k: usize,
) -> Vec<Alternative> {
    let t0 = best.predicted.iteration_time_s;
    let mesh = |s: &Strategy| (s.tp, s.pp, s.dp);
    let mut seen = vec![mesh(&best.strategy)];
    let mut out = Vec::new();
    let alt = |e: &Estimate, reason: String| {
        let (short, stage) = shortfall(e);
        Alternative {
            strategy: e.strategy.clone(),
            iteration_time_s: e.predicted.iteration_time_s,
            fits: e.predicted.fits,
            peak_memory_bytes: e.predicted.peak_memory_bytes,
            shortfall_bytes: short.max(0.0),
            shortfall_stage: stage,
            reason,
        }
    };
    // The runner-up with the same mesh shows what the other knobs are worth.
    if let Some(e) = rest
        .iter()
        .find(|e| mesh(&e.strategy) == mesh(&best.strategy))
    {
        let slower = 100.0 * (e.predicted.iteration_time_s / t0 - 1.0);
        out.push(alt(
            e,
            format!(
                "slower by {slower:.1} % ({})",
                differs(&best.strategy, &e.strategy)
            ),
        ));
    }
    for e in rest {
        if out.len() >= k {
            break;
        }
        if seen.contains(&mesh(&e.strategy)) {
            continue;
        }
        seen.push(mesh(&e.strategy));
        let slower = 100.0 * (e.predicted.iteration_time_s / t0 - 1.0);
        out.push(alt(e, format!("slower by {slower:.1} %")));
    }
    if let Some(e) = oom
        && e.predicted.iteration_time_s < t0
    {
        let (short, stage) = shortfall(e);
        out.push(alt(
            e,
            format!("out of memory by {:.1} GiB on stage {stage}", gib(short)),
        ));
    }
    // The out-of-memory plan that would have won is kept even when k is reached.
    let oom_alt = out.iter().position(|a| !a.fits).map(|i| out.remove(i));
    out.truncate(k.max(1));
    out.extend(oom_alt);
    out
}

/// A short description of the knobs in which `b` differs from `a`.
fn differs(a: &Strategy, b: &Strategy) -> String {
    let mut d = Vec::new();
    if a.micro_batch != b.micro_batch {
        d.push(format!("micro-batch {}", b.micro_batch));
    }
    if a.schedule != b.schedule || a.virtual_stages != b.virtual_stages {
        d.push(format!("schedule {} v={}", b.schedule, b.virtual_stages));
    }
    if a.zero != b.zero {
        d.push(format!("ZeRO-{}", b.zero));
    }
    if a.recompute != b.recompute {
        d.push(format!("recompute {}", b.recompute));
    }
    if a.sequence_parallel != b.sequence_parallel {
        d.push(format!(
            "sequence parallel {}",
            if b.sequence_parallel { "on" } else { "off" }
        ));
    }
    if a.ep != b.ep {
        d.push(format!("ep {}", b.ep));
    }
    if a.stage_layers != b.stage_layers {
        d.push("even stage split".into());
    }
    if d.is_empty() {
        "same knobs".into()
    } else {
        d.join(", ")
    }
}

/// What would make a model fit, given the closest candidate.
/// The smallest GPU count that fits, tried in whole nodes from what the model states need
/// (then doubling, six counts at most): real advice, where the states bound alone ignores
/// activations and how the degrees must divide.
fn smallest_fitting_cluster(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
) -> Option<(u64, Estimate)> {
    let precision = req
        .pins
        .precision
        .unwrap_or_else(|| engine_default_precision(cluster, req.pins.engine.unwrap_or_default()));
    let per_param = precision.weight_bytes() + precision.grad_bytes() + precision.optimizer_bytes();
    let usable = (cluster.memory_bytes() - RESERVE_BYTES).max(1.0);
    let states = (info.params() as f64 * per_param / usable).ceil() as u64;
    let node = u64::from(cluster.gpus_per_node).max(1);
    let first = states.max(req.gpus + 1).div_ceil(node) * node;
    let fits = |gpus: u64| -> Option<Option<Estimate>> {
        let beyond_cluster = cluster
            .max_nodes
            .is_some_and(|m| gpus > u64::from(m) * node);
        if beyond_cluster || gpus > MAX_ADVISED_GPUS {
            return None;
        }
        let larger = SearchRequest {
            gpus,
            top_k: 0,
            ..req.clone()
        };
        Some(
            match search_with(info, cluster, &larger, &mut |_, _| {}, false, true) {
                Ok(Ok(r)) => Some(r.best),
                _ => None,
            },
        )
    };
    // Node by node from the states' bound, where the answer usually is (memory, not the
    // layout, decides); then doubling, and back down by halves to the smallest count between
    // the last that failed and the first that fit.
    let mut failed = first - node;
    let mut gpus = first;
    for step in 0..ADVICE_NODE_STEPS + ADVICE_DOUBLINGS {
        if let Some(best) = fits(gpus)? {
            return Some(smallest_between(failed, (gpus, best), node, &fits));
        }
        failed = gpus;
        gpus = if step + 1 < ADVICE_NODE_STEPS {
            gpus + node
        } else {
            gpus * 2
        };
    }
    None
}

/// Node counts [`smallest_fitting_cluster`] tries one by one before doubling.
const ADVICE_NODE_STEPS: usize = 8;
/// Doublings it tries after them.
const ADVICE_DOUBLINGS: usize = 6;

/// The smallest count, in whole nodes, above `failed` and at most `fit`'s that fits, by
/// halving the interval (a count between two that fit is taken to fit).
fn smallest_between(
    mut failed: u64,
    mut fit: (u64, Estimate),
    node: u64,
    fits: &dyn Fn(u64) -> Option<Option<Estimate>>,
) -> (u64, Estimate) {
    while fit.0 - failed > node {
        let mid = (failed + (fit.0 - failed) / 2).div_ceil(node) * node;
        match fits(mid).flatten() {
            Some(best) => fit = (mid, best),
            None => failed = mid,
        }
    }
    fit
}

/// The most GPUs plait advises (and fewer where the cluster file's `max_nodes` says so): 2²⁰,
/// beyond the largest training clusters built (a few hundred thousand GPUs in 2025). A model
/// that needs more gets no count; its shortfall is still said.
const MAX_ADVISED_GPUS: u64 = 1 << 20;

fn infeasible(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
    closest: Option<Estimate>,
    closest_pruned: Option<(f64, Strategy)>,
) -> Infeasible {
    let capacity = cluster.memory_bytes();
    let precision = req
        .pins
        .precision
        .unwrap_or_else(|| engine_default_precision(cluster, req.pins.engine.unwrap_or_default()));
    // Smallest shortfall over what was priced; when everything was pruned, the smallest lower
    // bound's; with neither, the states bound of the most sharded layout (ZeRO-3 over all GPUs).
    let lower_bound = closest.is_none();
    let (short, strategy) = match (&closest, closest_pruned) {
        (Some(e), _) => (shortfall(e).0.max(0.0), Some(e.strategy.clone())),
        (None, Some((bound, s))) => ((bound - capacity).max(0.0), Some(s)),
        (None, None) => {
            let st = state_bytes(info.params() as f64 / req.gpus as f64, 1.0, 0, precision);
            (
                (st.weights + st.grads + st.optimizer + RESERVE_BYTES - capacity).max(0.0),
                None,
            )
        }
    };
    // GPUs needed if states alone, fully sharded (ZeRO-3 or pipeline + tensor), must fit.
    let per_param = precision.weight_bytes() + precision.grad_bytes() + precision.optimizer_bytes();
    let min_gpus =
        (info.params() as f64 * per_param / (capacity - RESERVE_BYTES).max(1.0)).ceil() as u64;
    let states = gib(info.params() as f64 * per_param);
    let mut suggestions = vec![if min_gpus > req.gpus {
        format!(
            "use at least {min_gpus} GPUs: the model states alone take {states:.0} GiB \
             ({per_param} bytes per parameter)"
        )
    } else {
        // The states would fit spread over every GPU: what overflows is the pinned layout's
        // (states kept whole on some ranks, or activations), so no count follows from them.
        format!(
            "loosen the pins or use more GPUs: the model states ({states:.0} GiB, {per_param} \
             bytes per parameter) fit on {} GPUs only spread over all of them",
            req.gpus
        )
    }];
    if req.pins.zero.is_some_and(|z| z < 3) {
        suggestions.push(
            "allow ZeRO-3 (drop --zero) to shard weights, gradients and optimizer states".into(),
        );
    } else {
        suggestions.push("ZeRO-3 and full recomputation were already tried".into());
    }
    if req.pins.recompute.is_some_and(|r| r != Recompute::Full) {
        suggestions.push(
            "allow full recomputation (drop --recompute) to keep one activation per layer".into(),
        );
    }
    if req.pins.micro_batch.is_some_and(|m| m > 1) {
        suggestions.push("use micro-batch 1".into());
    }
    Infeasible {
        smallest_shortfall_bytes: short,
        shortfall_is_lower_bound: lower_bound,
        closest: strategy,
        suggestions,
    }
}

#[cfg(test)]
mod tests {
    use super::divisors;

    #[test]
    fn divisors_are_those_of_a_brute_force_scan_in_order() {
        for n in (1..=400).chain([720_720, 1 << 20, 999_983, 1_000_000]) {
            let brute: Vec<u64> = (1..=n).filter(|d| n % d == 0).collect();
            assert_eq!(divisors(n), brute, "{n}");
        }
    }
}
