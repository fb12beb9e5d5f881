//! What every part of one estimate reads: the strategy's degrees, its mesh, the binding a
//! rank's ops run at, the device model, and the collectives priced from them.

use ir::{Binding, Graph, OpKind};

use super::layer_shape;
use crate::cost::comm::{Collective, Mesh, collective_time, mesh_ep, p2p_time};
use crate::cost::compute::Device;
use crate::error::PlanError;
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::strategy::Strategy;

/// One strategy's estimate context.
pub(super) struct Setup<'a, 'g> {
    pub info: &'a ModelInfo<'g>,
    pub cluster: &'a Cluster,
    pub s: &'a Strategy,
    pub g: &'g Graph,
    pub device: Device<'a>,
    pub tp: u64,
    pub pp: u64,
    pub dp: u64,
    pub cp: u64,
    pub ep: u64,
    pub m: Mesh,
    /// Every op but attention sees the rank's share of the sequence.
    pub b: Binding,
    /// A graph element's bytes scaled to the strategy's activation precision.
    pub act_scale: f64,
    /// One hidden-sized activation of the micro-batch, in bytes.
    pub act_bytes: f64,
}

impl<'a, 'g> Setup<'a, 'g> {
    /// Checks the strategy and builds its context.
    pub fn new(
        info: &'a ModelInfo<'g>,
        cluster: &'a Cluster,
        gpus: u64,
        s: &'a Strategy,
    ) -> Result<Setup<'a, 'g>, PlanError> {
        s.validate(info, gpus)?;
        let g = info.graph;
        let score_dropout = info
            .layer_ops
            .iter()
            .any(|&o| matches!(g.op(o).kind, OpKind::Dropout { p, .. } if p > 0.0));
        let mut device = Device::new(cluster, s.precision, s.attention, s.kernels, score_dropout)
            .ok_or_else(|| {
            PlanError::invalid(format!(
                "{} has no {} support (its cluster file lists no peak for it)",
                cluster.gpu.name, s.precision
            ))
        })?;
        let (tp, pp, dp, cp) = (
            u64::from(s.tp),
            u64::from(s.pp),
            u64::from(s.dp),
            u64::from(s.cp),
        );
        device.cp = cp;
        device.layer_windows = info.layer_windows;
        let ep = u64::from(s.ep.max(1));
        let b = Binding {
            batch: s.micro_batch,
            seq: s.local_seq(),
        };
        let graph_elem = g.ty(g.op(info.layer_ops[0]).results[0]).dtype.size_bytes() as f64;
        Ok(Setup {
            info,
            cluster,
            s,
            g,
            device,
            tp,
            pp,
            dp,
            cp,
            ep,
            m: mesh_ep(cluster, tp, cp, dp, pp, ep),
            b,
            act_scale: cluster.activation_traffic_bytes(s.precision) / graph_elem,
            act_bytes: (b.batch * b.seq * info.hidden) as f64 * s.precision.activation_bytes(),
        })
    }

    /// Whether an overlap the strategy turns `on` happens: the cluster must run
    /// communication beside compute.
    pub fn overlaps(&self, on: bool) -> bool {
        on && self.cluster.comm_overlaps_compute
    }

    /// Megatron-LM's tensor-parallel collectives of `n` row-parallel products, one pass: an
    /// all-reduce each, or a reduce-scatter and an all-gather with SP.
    pub fn tp_collective(&self, n: usize) -> f64 {
        if self.tp <= 1 {
            return 0.0;
        }
        let (c, m, bytes) = (self.cluster, &self.m, self.act_bytes);
        let one = if self.s.sequence_parallel {
            collective_time(c, &m.tp, Collective::ReduceScatter, bytes)
                + collective_time(c, &m.tp, Collective::AllGather, bytes)
        } else {
            collective_time(c, &m.tp, Collective::AllReduce, bytes)
        };
        n as f64 * one
    }

    /// The all-gathers that sequence parallelism repeats in the backward, for `n` row-parallel
    /// products: each column-parallel product keeps its input's sequence shard and gathers it
    /// again for its weight gradient (Megatron-LM's `LinearWithGradAccumulationAndAsyncCommunication`
    /// and TransformerEngine's `LayerNormLinear` backward; plait's codegen likewise).
    pub fn tp_regather(&self, n: usize) -> f64 {
        if self.tp <= 1 || !self.s.sequence_parallel {
            return 0.0;
        }
        let (c, m, bytes) = (self.cluster, &self.m, self.act_bytes);
        n as f64 * collective_time(c, &m.tp, Collective::AllGather, bytes)
    }

    /// The context-parallel ring of one layer's attention.
    pub fn cp_ring(&self) -> CpRing {
        let (s, b) = (self.s, self.b);
        let kv_width = layer_shape(self.g, self.info).kv_width;
        let kv_bytes = 2.0 * (b.batch * b.seq) as f64 * kv_width / self.tp as f64
            * s.precision.activation_bytes();
        let cross = self.m.cp.nodes > 1;
        let sharing = if cross {
            self.m.cp.sharing * self.m.cp.per_node
        } else {
            1
        };
        CpRing {
            steps: self.cp.saturating_sub(1) as f64,
            step_s: p2p_time(self.cluster, kv_bytes, cross, sharing),
        }
    }
}

/// Context parallelism (Megatron-Core / Transformer Engine's ring attention, `cp_comm_type
/// p2p`): each of the cp − 1 steps passes a K and V chunk to the next rank while the current
/// block's attention runs; the backward passes K, V and their gradients (twice the bytes).
/// Only a ring slower than the attention shows.
#[derive(Clone, Copy, Debug)]
pub(super) struct CpRing {
    steps: f64,
    step_s: f64,
}

impl CpRing {
    /// The exposed (forward, backward) seconds beside an attention of `attn_fwd`, `attn_bwd`.
    pub fn exposed(&self, attn_fwd: f64, attn_bwd: f64) -> (f64, f64) {
        if self.steps <= 0.0 || attn_fwd <= 0.0 {
            return (0.0, 0.0);
        }
        (
            (self.steps * self.step_s - attn_fwd).max(0.0),
            (2.0 * self.steps * self.step_s - attn_bwd).max(0.0),
        )
    }
}
