//! Compute time of IR ops on one GPU: a roofline of FLOPs over (peak × achievable efficiency)
//! against bytes over sustained HBM bandwidth, plus a fixed launch overhead per kernel.
//!
//! Matmul efficiency = measured maximum achievable fraction of peak (MAMF, in the cluster file)
//! × tile quantization × wave quantization (NVIDIA, "Matrix Multiplication Background User's
//! Guide": output tiles of 128×128 are computed whole, and tiles run in waves of one per SM), so
//! small or skinny GEMMs run slower than large square ones. Non-matmul FLOPs run on the vector
//! units at the fp32 peak.
//!
//! Tensor-parallel sharding follows Megatron-LM (Shoeybi et al. 2019): linear layers, attention
//! heads, rotary, the MLP's inner activations and the vocabulary-parallel embedding and head are
//! split `tp` ways; ops on the hidden-sized residual stream (norms, residual adds) are
//! replicated, or split along the sequence with sequence parallelism (Korthikanti et al. 2022).

use ir::{Binding, Graph, OpId, OpKind, cost::op_cost};

use crate::hardware::Cluster;
use crate::precision::Precision;

const TILE: f64 = 128.0;

/// Forward and backward seconds of one op.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpTime {
    pub fwd: f64,
    pub bwd: f64,
    /// FLOPs actually executed on this GPU (after the tensor-parallel split).
    pub fwd_flops: f64,
    pub bwd_flops: f64,
}

/// How an op is laid out across the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpLayout {
    /// Every TP rank computes the whole op.
    Replicated,
    /// Each TP rank computes 1/tp of it.
    Split,
}

/// Megatron's layout of `o` given the model's hidden size.
pub fn tp_layout(g: &Graph, o: OpId, hidden: u64, sequence_parallel: bool) -> TpLayout {
    let op = g.op(o);
    let out_last = op
        .results
        .first()
        .and_then(|&v| g.ty(v).shape.last())
        .and_then(|d| d.fixed());
    match &op.kind {
        OpKind::Linear { .. }
        | OpKind::MatMul
        | OpKind::Attention { .. }
        | OpKind::Rotary { .. }
        | OpKind::MoeExperts { .. }
        | OpKind::Embedding
        | OpKind::CrossEntropy => TpLayout::Split,
        k if k.is_source() => TpLayout::Replicated,
        _ if out_last != Some(hidden) && out_last != Some(1) => TpLayout::Split,
        _ if sequence_parallel => TpLayout::Split,
        _ => TpLayout::Replicated,
    }
}

/// The device a strategy runs on, with the numbers the roofline needs.
#[derive(Clone, Copy, Debug)]
pub struct Device<'c> {
    pub cluster: &'c Cluster,
    pub matmul_peak: f64,
    pub vector_peak: f64,
    pub hbm: f64,
    pub launch: f64,
}

impl<'c> Device<'c> {
    pub fn new(cluster: &'c Cluster, precision: Precision) -> Option<Device<'c>> {
        Some(Device {
            cluster,
            matmul_peak: cluster.peak_flops(precision)? * cluster.gpu.matmul_efficiency,
            vector_peak: cluster.peak_flops(Precision::Fp32)?,
            hbm: cluster.hbm_bytes_per_s(),
            launch: cluster.gpu.launch_overhead_us * 1e-6,
        })
    }

    /// Tile and wave quantization of a batched (m × k)·(k × n) GEMM.
    pub fn shape_efficiency(&self, batch: f64, m: f64, n: f64) -> f64 {
        if m <= 0.0 || n <= 0.0 {
            return 1.0;
        }
        let tm = (m / TILE).ceil();
        let tn = (n / TILE).ceil();
        let tile = (m * n) / (tm * tn * TILE * TILE);
        let tiles = batch.max(1.0) * tm * tn;
        let sms = f64::from(self.cluster.gpu.sm_count);
        let wave = tiles / ((tiles / sms).ceil() * sms);
        tile * wave
    }

    fn roofline(&self, flops: f64, bytes: f64, matmul_eff: Option<f64>, act_scale: f64) -> f64 {
        let compute = match matmul_eff {
            Some(e) => flops / (self.matmul_peak * e),
            None => flops / self.vector_peak,
        };
        compute.max(bytes * act_scale / self.hbm) + self.launch
    }

    /// Time of op `o` at binding `b` with a tensor-parallel degree `tp`.
    ///
    /// `act_scale` converts the graph's element size to the run's precision (a graph built in
    /// f32 costed for bf16 moves half the bytes).
    pub fn op_time(&self, g: &Graph, o: OpId, b: Binding, tp: u64, layout: TpLayout, act_scale: f64) -> OpTime {
        let op = g.op(o);
        if op.kind.is_source() {
            return OpTime::default();
        }
        let c = op_cost(g, o, b);
        let split = if layout == TpLayout::Split { tp.max(1) as f64 } else { 1.0 };
        let eff = self.matmul_shape(g, o, b, tp, layout);
        let fwd_flops = c.fwd_flops / split;
        let bwd_flops = c.bwd_flops / split;
        OpTime {
            fwd: self.roofline(fwd_flops, c.fwd_bytes() / split, eff, act_scale),
            // A backward of a product op is two GEMMs (two launches).
            bwd: self.roofline(bwd_flops, c.bwd_bytes() / split, eff, act_scale)
                + if eff.is_some() { self.launch } else { 0.0 },
            fwd_flops,
            bwd_flops,
        }
    }

    /// The shape efficiency of a product op after the TP split, or `None` for other ops.
    fn matmul_shape(&self, g: &Graph, o: OpId, b: Binding, tp: u64, layout: TpLayout) -> Option<f64> {
        let op = g.op(o);
        let dims = |i: usize| g.ty(op.inputs[i]).shape.eval(b);
        let split = if layout == TpLayout::Split { tp.max(1) } else { 1 } as f64;
        match &op.kind {
            OpKind::Linear { .. } => {
                let x = dims(0);
                let w = dims(1);
                let k = *x.last()? as f64;
                let m = x.iter().rev().skip(1).product::<u64>() as f64;
                let n = *w.get(1)? as f64;
                // Column-parallel (n split) when the output is wider than the input, else
                // row-parallel (k split): either way the output tile grid is what matters.
                let n_local = if n >= k { n / split } else { n };
                Some(self.shape_efficiency(1.0, m, n_local))
            }
            OpKind::MatMul => {
                let a = dims(0);
                let bm = dims(1);
                let m = *a.get(a.len().checked_sub(2)?)? as f64;
                let n = *bm.last()? as f64;
                let batch = a.iter().rev().skip(2).product::<u64>() as f64 / split;
                Some(self.shape_efficiency(batch, m, n))
            }
            OpKind::Attention { heads, .. } => {
                let q = dims(0);
                let k = dims(1);
                let batch = (q[0] * heads) as f64 / split;
                Some(self.shape_efficiency(batch, q[1] as f64, k[1] as f64))
            }
            OpKind::MoeExperts { experts } => {
                let x = dims(0);
                let f = *dims(2).get(2)? as f64;
                let tokens = x.iter().rev().skip(1).product::<u64>() as f64;
                Some(self.shape_efficiency(*experts as f64, tokens / *experts as f64, f / split))
            }
            OpKind::TopKRouter { .. } => Some(1.0),
            _ => None,
        }
    }
}
