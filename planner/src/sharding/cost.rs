//! The cost interface the extraction minimizes, and a simple roofline/α–β implementation.
//!
//! The planner's real cost model plugs in by implementing [`CostOracle`].

use serde::{Deserialize, Serialize};

/// A collective over the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

impl CollectiveKind {
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::AllGather => "all-gather",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllToAll => "all-to-all",
        }
    }
}

/// What a compute node is, for the oracle's efficiency model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ComputeKind {
    /// Matrix products (linear, attention, experts): tensor cores.
    Matmul,
    /// Everything else: vector units, usually memory-bound.
    Elementwise,
}

/// Seconds and bytes for the extraction's objective and memory constraint.
pub trait CostOracle {
    /// Seconds of one kernel doing `flops` and moving `bytes` on one device.
    fn compute_seconds(&self, kind: ComputeKind, flops: f64, bytes: f64) -> f64;
    /// Seconds of one collective over `group` ranks; `bytes` is the full buffer per rank (the
    /// all-reduced tensor, the gathered output, the scattered input, the exchanged local data).
    fn collective_seconds(&self, kind: CollectiveKind, bytes: f64, group: u32) -> f64;
    /// Resident bytes per rank for `bytes` of a parameter's local shard (weights, gradients and
    /// optimizer state under the caller's precision). Default: the weights only.
    fn param_memory_bytes(&self, bytes: f64) -> f64 {
        bytes
    }
    /// Resident bytes per rank for `bytes` of activations kept for the backward pass.
    fn activation_memory_bytes(&self, bytes: f64) -> f64 {
        bytes
    }
    /// The share of a replicated parameter's gradient all-reduce that one forward + backward
    /// pays. Gradients accumulate over a step's micro-batches and are reduced once per
    /// iteration (Megatron-LM's `finalize_model_grads` all-reduces the sequence-parallel norm
    /// weights' gradients after the last micro-batch), so a step of m micro-batches pays 1/m
    /// per pass. Default: 1 (one micro-batch per step).
    fn weight_gradient_share(&self) -> f64 {
        1.0
    }
}

/// A roofline device and a ring α–β interconnect.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimpleCosts {
    /// Achievable matmul FLOP/s.
    pub matmul_flops: f64,
    /// Achievable vector FLOP/s.
    pub vector_flops: f64,
    /// Memory bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Per-rank link bandwidth (one direction), bytes/s.
    pub link_bytes_per_s: f64,
    /// Latency per ring step, s.
    pub link_latency_s: f64,
    /// Fixed cost per kernel, s.
    pub launch_s: f64,
}

impl SimpleCosts {
    /// An H100 SXM node (NVLink 4) running an f32 graph: ~60 % of the dense TF32 tensor-core
    /// peak, 3.35 TB/s HBM at 80 %, 450 GB/s per direction at ~80 % efficiency.
    pub fn h100_tf32() -> SimpleCosts {
        SimpleCosts {
            matmul_flops: 0.6 * 495e12,
            ..SimpleCosts::h100_bf16()
        }
    }

    /// The same node running bf16 matmuls (~60 % of the dense bf16 peak).
    pub fn h100_bf16() -> SimpleCosts {
        SimpleCosts {
            matmul_flops: 0.6 * 989e12,
            vector_flops: 0.6 * 67e12,
            hbm_bytes_per_s: 0.8 * 3.35e12,
            link_bytes_per_s: 0.8 * 450e9,
            link_latency_s: 5e-6,
            launch_s: 4e-6,
        }
    }
}

impl CostOracle for SimpleCosts {
    fn compute_seconds(&self, kind: ComputeKind, flops: f64, bytes: f64) -> f64 {
        if flops <= 0.0 && bytes <= 0.0 {
            return 0.0;
        }
        let peak = match kind {
            ComputeKind::Matmul => self.matmul_flops,
            ComputeKind::Elementwise => self.vector_flops,
        };
        self.launch_s + (flops / peak).max(bytes / self.hbm_bytes_per_s)
    }

    fn collective_seconds(&self, kind: CollectiveKind, bytes: f64, group: u32) -> f64 {
        if group <= 1 {
            return 0.0;
        }
        let n = f64::from(group);
        // Ring algorithms: all-reduce 2(n−1) steps of S/n; all-gather and reduce-scatter
        // n−1 steps of S/n; all-to-all n−1 exchanges of S/n.
        let (steps, volume) = match kind {
            CollectiveKind::AllReduce => (2.0 * (n - 1.0), 2.0 * (n - 1.0) / n * bytes),
            CollectiveKind::AllGather
            | CollectiveKind::ReduceScatter
            | CollectiveKind::AllToAll => (n - 1.0, (n - 1.0) / n * bytes),
        };
        steps * self.link_latency_s + volume / self.link_bytes_per_s
    }
}
