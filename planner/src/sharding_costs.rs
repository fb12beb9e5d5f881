//! The sharding extraction's cost oracle, backed by plait's own cost model: the roofline of
//! [`crate::cost::compute::Device`] and the α–β collectives of [`crate::cost::comm`] over the
//! tensor-parallel group of the strategy's mesh.

use ir::Binding;

use crate::cost::comm::{Collective, collective_time, mesh};
use crate::cost::compute::Device;
use crate::error::PlanError;
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::sharding::{
    BlockPlan, CollectiveKind, ComputeKind, CostOracle, ShardOptions, plan_block,
};
use crate::strategy::Strategy;

/// Seconds per kernel and per TP collective as the estimate sees them.
#[derive(Debug)]
pub struct ClusterCosts<'c> {
    device: Device<'c>,
    cluster: &'c Cluster,
    mesh: crate::cost::comm::Mesh,
    /// Element-size scale from the graph's dtype to the run's precision.
    act_scale: f64,
}

impl<'c> ClusterCosts<'c> {
    pub fn new(cluster: &'c Cluster, s: &Strategy, act_scale: f64) -> Option<ClusterCosts<'c>> {
        Some(ClusterCosts {
            device: Device::new(cluster, s.precision, s.attention, s.kernels, false)?,
            cluster,
            mesh: mesh(cluster, u64::from(s.tp), u64::from(s.dp), u64::from(s.pp)),
            act_scale,
        })
    }
}

impl CostOracle for ClusterCosts<'_> {
    fn compute_seconds(&self, kind: ComputeKind, flops: f64, bytes: f64) -> f64 {
        let compute = match kind {
            ComputeKind::Matmul => flops / self.device.matmul_peak,
            ComputeKind::Elementwise => flops / self.device.vector_peak,
        };
        compute.max(bytes * self.act_scale / self.device.hbm) + self.device.launch
    }

    fn collective_seconds(&self, kind: CollectiveKind, bytes: f64, _group: u32) -> f64 {
        let kind = match kind {
            CollectiveKind::AllReduce => Collective::AllReduce,
            CollectiveKind::AllGather => Collective::AllGather,
            CollectiveKind::ReduceScatter => Collective::ReduceScatter,
            CollectiveKind::AllToAll => Collective::AllToAll,
        };
        collective_time(self.cluster, &self.mesh.tp, kind, bytes * self.act_scale)
    }
}

/// Extracts the sharding of the strategy's block by equality saturation + exact extraction.
/// Solver timings are cleared so that plans stay byte-identical across runs.
pub fn block_plan(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
) -> Result<BlockPlan, PlanError> {
    let g = info.graph;
    let elem = info
        .layer_ops
        .first()
        .and_then(|&o| g.op(o).results.first().map(|&v| g.ty(v).dtype.size_bytes()))
        .unwrap_or(4) as f64;
    let costs =
        ClusterCosts::new(cluster, s, s.precision.activation_bytes() / elem).ok_or_else(|| {
            PlanError::invalid(format!(
                "{} has no {} support",
                cluster.gpu.name, s.precision
            ))
        })?;
    let opts = ShardOptions::new(
        s.tp,
        s.sequence_parallel,
        Binding {
            batch: s.micro_batch,
            seq: s.seq,
        },
    );
    let mut plan =
        plan_block(g, &info.layer_ops, &opts, &costs).map_err(|e| PlanError::Sharding {
            message: e.to_string(),
        })?;
    plan.solve.seconds = 0.0;
    Ok(plan)
}
