//! Pins no strategy can take, named with the flags that break them before any candidate is
//! priced: otherwise every candidate fails to price (or is pruned) and the search would call
//! the model out of memory ("closest by 0.0 GiB").

use super::SearchRequest;
use crate::hardware::Cluster;
use crate::model::ModelInfo;

/// Why a model whose q/k norms span all heads cannot run Megatron-LM's tensor-parallel layout
/// ([`ModelInfo::norms_across_heads`]).
pub const NORM_ACROSS_HEADS: &str = "the model normalizes q and k over all their heads at once \
     (OLMo 2's and OLMoE's q_norm and k_norm), which Megatron-LM's layout splits by heads";

/// A pinned expert-parallel degree no strategy can take, named before any is priced (else every
/// candidate fails and the search would say nothing fits).
pub(super) fn broken_expert_pin(info: &ModelInfo<'_>, req: &SearchRequest) -> Option<String> {
    let ep = u64::from(req.pins.ep.filter(|&e| e > 1)?);
    if info.experts == 0 {
        return Some(format!(
            "--ep {ep} needs a mixture-of-experts model; {} has no routed experts: drop --ep",
            info.graph.name
        ));
    }
    if !info.experts.is_multiple_of(ep) {
        return Some(format!(
            "--ep {ep} does not divide the model's {} experts: pick an ep that divides them",
            info.experts
        ));
    }
    if !req.gpus.is_multiple_of(ep) {
        return Some(format!("--ep {ep} does not divide --gpus {}", req.gpus));
    }
    if let Some(dp) = req.pins.dp.map(u64::from)
        && !dp.is_multiple_of(ep)
    {
        return Some(format!(
            "--ep {ep} does not divide --dp {dp}: the experts are split over data-parallel \
             ranks; pick an ep that divides dp"
        ));
    }
    if req.pins.cp.is_some_and(|c| c > 1) {
        return Some(
            "--ep and --cp together: plait does not model expert parallelism beside context \
             parallelism; drop one of them"
                .into(),
        );
    }
    None
}

/// Pinned stage sizes that no strategy can take, named before any is priced (every candidate
/// would fail to price, and a model whose estimates fail so would be called out of memory).
pub(super) fn broken_stage_pin(info: &ModelInfo<'_>, req: &SearchRequest) -> Option<String> {
    let s = req.pins.stage_layers.as_ref()?;
    let total: u64 = s.iter().map(|&l| u64::from(l)).sum();
    (total != u64::from(info.layers) || s.contains(&0)).then(|| {
        format!(
            "--stage-layers {s:?} must be positive and sum to the model's {} layers",
            info.layers
        )
    })
}

/// The first rule the pinned degrees break, named with the flags that break it.
pub(super) fn broken_pin(info: &ModelInfo<'_>, req: &SearchRequest) -> Option<String> {
    let p = &req.pins;
    let (gpus, batch) = (req.gpus, req.global_batch);
    let tp = p.tp.map(u64::from);
    let pp = p.pp.map(u64::from);
    if let Some(m) = p.micro_batch
        && !batch.is_multiple_of(m)
    {
        return Some(format!(
            "--global-batch {batch} is not divisible by --micro-batch {m}: each replica's \
             batch is a whole number of micro-batches"
        ));
    }
    if let Some(t) = tp {
        if !gpus.is_multiple_of(t) {
            return Some(format!("--tp {t} does not divide --gpus {gpus}"));
        }
        if !info.heads.is_multiple_of(t) {
            return Some(format!(
                "--tp {t} does not divide the model's {} attention heads",
                info.heads
            ));
        }
    }
    if let Some(q) = pp {
        if q > u64::from(info.layers) {
            return Some(format!(
                "--pp {q} exceeds the model's {} layers",
                info.layers
            ));
        }
        if !(gpus / tp.unwrap_or(1)).is_multiple_of(q) {
            return Some(format!(
                "--pp {q} does not divide the {} GPUs left by tp {}",
                gpus / tp.unwrap_or(1),
                tp.unwrap_or(1)
            ));
        }
    }
    if let (Some(t), Some(q), Some(d)) = (tp, pp, p.dp.map(u64::from))
        && t * q * d != gpus
    {
        return Some(format!(
            "--tp {t} x --pp {q} x --dp {d} = {} GPUs, not --gpus {gpus}",
            t * q * d
        ));
    }
    if let Some(d) = p.dp.map(u64::from) {
        if !gpus.is_multiple_of(d) {
            return Some(format!("--dp {d} does not divide --gpus {gpus}"));
        }
        match p.micro_batch {
            Some(m) if !batch.is_multiple_of(d * m) => {
                return Some(format!(
                    "--global-batch {batch} is not divisible by dp {d} x micro-batch {m} = {}",
                    d * m
                ));
            }
            None if !batch.is_multiple_of(d) => {
                return Some(format!(
                    "--global-batch {batch} is not divisible by --dp {d}: each replica takes \
                     the same number of sequences"
                ));
            }
            _ => {}
        }
    }
    None
}

/// Every pin that no strategy can take, checked before the search prices anything.
pub(super) fn before_search(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
) -> Option<String> {
    req.pins
        .dp_comm
        .conflict()
        .or_else(|| broken_expert_pin(info, req))
        .or_else(|| broken_stage_pin(info, req))
        .or_else(|| broken_cp_pin(req))
        .or_else(|| broken_precision_pin(cluster, req))
}

/// A pinned context-parallel degree that splits neither the GPUs nor the sequence (the
/// load-balanced causal split gives each rank two of 2·cp chunks, as Megatron-Core does).
fn broken_cp_pin(req: &SearchRequest) -> Option<String> {
    let cp = u64::from(req.pins.cp?);
    if cp == 0 {
        return Some("--cp 0: the context-parallel degree is at least 1".into());
    }
    if !req.gpus.is_multiple_of(cp) {
        return Some(format!("--cp {cp} does not divide --gpus {}", req.gpus));
    }
    if cp > 1 && !req.seq.is_multiple_of(2 * cp) {
        return Some(format!(
            "--cp {cp} needs the sequence ({} tokens) divisible by 2 x cp = {}: each rank \
             holds two of 2·cp chunks (the causal load balance); pick a cp or --seq that divides",
            req.seq,
            2 * cp
        ));
    }
    None
}

/// A pinned precision the GPU has no tensor-core peak for (fp8 before Hopper).
fn broken_precision_pin(cluster: &Cluster, req: &SearchRequest) -> Option<String> {
    let p = req.pins.precision?;
    if cluster.peak_flops(p).is_some() {
        return None;
    }
    let has: Vec<String> = crate::precision::Precision::ALL
        .into_iter()
        .filter(|&q| cluster.peak_flops(q).is_some())
        .map(|q| q.to_string())
        .collect();
    Some(format!(
        "--precision {p}: the {} has no {p} support (the cluster's `peak_tflops` lists none); \
         it runs {}",
        cluster.gpu.name,
        has.join(", ")
    ))
}
