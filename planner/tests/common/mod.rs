//! Helpers shared by the planner's integration tests.
// Each test uses some of them.
#![allow(dead_code)]

use import::{Family, ModelSpec};
use planner::engine::{Engine, Overlap};
use planner::{Precision, Recompute, Schedule, Strategy};

/// One pipeline stage, one data-parallel rank, 4 micro-batches of `micro_batch` sequences of
/// 1,024 tokens, bf16, no ZeRO or recompute, the legacy (no) overlap: a tensor-parallel group
/// of `tp` with sequence parallelism `sp`.
pub fn tp_strategy(tp: u32, sp: bool, micro_batch: u64) -> Strategy {
    Strategy {
        tp,
        pp: 1,
        dp: 1,
        micro_batch,
        global_batch: 4 * micro_batch,
        seq: 1024,
        zero: 0,
        recompute: Recompute::None,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        sequence_parallel: sp,
        precision: Precision::Bf16,
        attention: Default::default(),
        kernels: Default::default(),
        cp: 1,
        ep: 1,
        engine: Engine::Megatron,
        overlap: Overlap::LEGACY,
        stage_layers: None,
        dp_comm: Default::default(),
    }
}

/// A small GPT-2: 4 layers of 256 (8 heads), a 256-word vocabulary, 128 positions.
pub fn small_gpt2() -> ModelSpec {
    ModelSpec {
        name: "gpt-4x256".into(),
        family: Family::Gpt2,
        variant: Default::default(),
        layers: 4,
        hidden: 256,
        heads: 8,
        kv_heads: 8,
        ffn: 1024,
        vocab: 256,
        max_positions: 128,
        tied_embeddings: true,
        norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: 128,
        dropout: 0.0,
    }
}

/// Tensor-parallel seconds per micro-batch of `collectives` (an f32 graph's extraction under
/// `s`) as the program runs them, and how many collectives that is: each per-micro-batch
/// collective's seconds (forward, backward), and the once-per-step gradient reductions as one
/// all-reduce of all their bytes (codegen's per-layer bucket) shared over the micro-batches,
/// in the backward.
pub fn as_run(
    collectives: &[&planner::sharding::CollectivePlan],
    cluster: &planner::Cluster,
    s: &Strategy,
) -> ((f64, f64), usize) {
    use planner::cost::comm::{Collective, collective_time, mesh_ep};
    use planner::sharding::{CollectivePlan, Pass};
    let (per_step, each): (Vec<&CollectivePlan>, Vec<&CollectivePlan>) =
        collectives.iter().copied().partition(|c| c.per_step);
    let sum = |pass: Pass| -> f64 {
        each.iter()
            .filter(|c| c.pass == pass)
            .map(|c| c.seconds)
            .sum()
    };
    let (fwd, mut bwd) = (sum(Pass::Forward), sum(Pass::Backward));
    if !per_step.is_empty() {
        // The block is an f32 graph; its collectives move the run's activation bytes.
        let scale = cluster.activation_traffic_bytes(s.precision) / 4.0;
        let bytes: f64 = per_step.iter().map(|c| c.bytes).sum::<f64>() * scale;
        let u = u64::from;
        let group = mesh_ep(cluster, u(s.tp), 1, u(s.dp), u(s.pp), 1).tp;
        let bucket = collective_time(cluster, &group, Collective::AllReduce, bytes);
        bwd += bucket / s.micro_batches() as f64;
    }
    ((fwd, bwd), each.len() + usize::from(!per_step.is_empty()))
}
