//! A cluster's own kernel measurements (what `plait profile` writes for the CPU): per-class
//! bandwidth fractions replace plait's H200 ones, and a packing matmul library pays one
//! read-and-write pass over both operands of every GEMM on top of the arithmetic; a runtime
//! whose bf16 GEMMs take f32 operands (plait's CUDA runtime) pays their conversions.
#![allow(clippy::unwrap_used)]

use ir::{Binding, DType, Graph, OpId, OpKind, Shape, TensorType};
use planner::Cluster;
use planner::cost::compute::{AttentionKernel, Device, Kernels, TpLayout, bandwidth_fraction};
use planner::hardware::KernelFractions;
use planner::precision::Precision;

const ROWS: u64 = 512;
const H: u64 = 256;
const B: Binding = Binding { batch: 1, seq: 1 };

/// x[512, 256] · w[256, 1024] → GELU; returns (graph, linear, gelu).
fn graph() -> (Graph, OpId, OpId) {
    let mut g = Graph::new("t");
    let ty = |d: &[u64]| TensorType::new(DType::F32, Shape::fixed(d));
    let x = g.push_source(OpKind::Input { name: "x".into() }, ty(&[ROWS, H]), None);
    let w = g.push_source(OpKind::Param { name: "w".into() }, ty(&[H, 4 * H]), None);
    let y = g
        .push_op(OpKind::Linear { bias: false }, vec![x, w], None)
        .unwrap()[0];
    g.push_op(OpKind::Gelu { tanh: true }, vec![y], None)
        .unwrap();
    let order = g.order().to_vec();
    (g, order[2], order[3])
}

fn device(c: &Cluster) -> Device<'_> {
    Device::new(
        c,
        Precision::Fp32,
        AttentionKernel::Materialized,
        Kernels::Eager,
        false,
    )
    .unwrap()
}

#[test]
fn measured_fractions_replace_the_h200_ones_class_by_class() {
    let mut c = Cluster::load("cpu").unwrap();
    c.gpu.kernel_fractions = Some(KernelFractions {
        activation: Some(0.1),
        ..KernelFractions::default()
    });
    let d = device(&c);
    assert_eq!(d.fraction(&OpKind::Gelu { tanh: true }), 0.1);
    // A class the file leaves out keeps plait's H200 figure.
    let norm = OpKind::LayerNorm {
        eps: 1e-5,
        bias: true,
    };
    assert_eq!(d.fraction(&norm), bandwidth_fraction(&norm));
    // A memory-bound op's time scales with 1 / fraction (less the launch).
    let (g, _, gelu) = graph();
    let slow = d.op_time(&g, gelu, B, 1, TpLayout::Replicated, 1.0);
    c.gpu.kernel_fractions = Some(KernelFractions {
        activation: Some(0.2),
        ..KernelFractions::default()
    });
    let fast = device(&c).op_time(&g, gelu, B, 1, TpLayout::Replicated, 1.0);
    let launch = c.gpu.launch_overhead_us * 1e-6;
    let ratio = (slow.fwd - launch) / (fast.fwd - launch);
    assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
}

#[test]
fn packing_adds_one_pass_over_both_operands() {
    let mut c = Cluster::load("cpu").unwrap();
    c.gpu.matmul_packs_operands = false;
    let (g, linear, _) = graph();
    c.gpu.matmul_packs_operands = true;
    let d = device(&c);
    let packed = d.op_time(&g, linear, B, 1, TpLayout::Replicated, 1.0);
    let (x, w, y) = (
        (ROWS * H * 4) as f64,
        (H * 4 * H * 4) as f64,
        (ROWS * 4 * H * 4) as f64,
    );
    // This GEMM is compute-bound on the preset (arithmetic > its bytes over bandwidth), so
    // the time is arithmetic + launch + packing.
    let flops = 2.0 * (ROWS * H * 4 * H) as f64;
    let arithmetic = flops / d.matmul_peak;
    let launch = c.gpu.launch_overhead_us * 1e-6;
    assert!(arithmetic > (x + w + y) / d.hbm);
    let extra_fwd = packed.fwd - (arithmetic + launch);
    assert!(
        (extra_fwd - 2.0 * (x + w) / d.hbm).abs() < 1e-12,
        "{extra_fwd} vs {}",
        2.0 * (x + w) / d.hbm
    );
    let extra_bwd = packed.bwd - (2.0 * arithmetic + 2.0 * launch);
    assert!((extra_bwd - 2.0 * (x + w + 2.0 * y) / d.hbm).abs() < 1e-12);
}

/// A runtime whose bf16 GEMMs convert f32 operands first (plait's CUDA runtime) pays 1.5 × the
/// f32 bytes of x and w forward, and of dy (once), x and w backward; an fp32 plan converts
/// nothing.
#[test]
fn casting_adds_the_conversions_of_a_bf16_plans_operands() {
    let mut c = Cluster::load("dgx-h200").unwrap();
    let (g, linear, _) = graph();
    let at = |c: &Cluster, p: Precision| {
        let d = Device::new(c, p, AttentionKernel::Fused, Kernels::Eager, false).unwrap();
        (
            d.op_time(&g, linear, B, 1, TpLayout::Replicated, 1.0),
            d.hbm,
        )
    };
    let (plain, hbm) = at(&c, Precision::Bf16);
    let (plain32, _) = at(&c, Precision::Fp32);
    c.gpu.matmul_casts_operands = true;
    let (cast, _) = at(&c, Precision::Bf16);
    let (cast32, _) = at(&c, Precision::Fp32);
    let (x, w, y) = (
        (ROWS * H * 4) as f64,
        (H * 4 * H * 4) as f64,
        (ROWS * 4 * H * 4) as f64,
    );
    assert!((cast.fwd - plain.fwd - 1.5 * (x + w) / hbm).abs() < 1e-12);
    assert!((cast.bwd - plain.bwd - 1.5 * (x + w + y) / hbm).abs() < 1e-12);
    assert_eq!(cast32, plain32);
}

/// Under casting GEMMs, an output whose rows are not whole 16-byte words (an LM head over a
/// 50257-word vocabulary) is copied out of a padded pitch: one more read and write of it.
#[test]
fn casting_gemms_copy_unaligned_outputs_once_more() {
    let ty = |d: &[u64]| TensorType::new(DType::F32, Shape::fixed(d));
    let product = |n: u64| {
        let mut g = Graph::new("head");
        let x = g.push_source(OpKind::Input { name: "x".into() }, ty(&[ROWS, H]), None);
        let w = g.push_source(OpKind::Param { name: "w".into() }, ty(&[H, n]), None);
        g.push_op(OpKind::Linear { bias: false }, vec![x, w], None)
            .unwrap();
        let o = g.order()[2];
        (g, o)
    };
    let mut c = Cluster::load("dgx-h200").unwrap();
    c.gpu.matmul_casts_operands = true;
    let d = Device::new(
        &c,
        Precision::Bf16,
        AttentionKernel::Fused,
        Kernels::Eager,
        false,
    )
    .unwrap();
    let time = |n: u64| {
        let (g, o) = product(n);
        d.op_time(&g, o, B, 1, TpLayout::Replicated, 1.0)
    };
    // 1001 columns against 1000 (aligned): beyond the one column's own share, the output's
    // copy forward and the weight gradient's backward.
    let (odd, even) = (time(1001), time(1000));
    let y = (ROWS * 1001 * 4) as f64;
    let w = (H * 1001 * 4) as f64;
    let share = |t: f64| t * 1.0 / 1000.0;
    let fwd_extra = odd.fwd - even.fwd - share(even.fwd - d.launch);
    assert!(
        (fwd_extra - 2.0 * y / d.hbm).abs() < 0.05 * 2.0 * y / d.hbm,
        "{fwd_extra}"
    );
    let bwd_extra = odd.bwd - even.bwd - share(even.bwd - 2.0 * d.launch);
    assert!(
        (bwd_extra - 2.0 * w / d.hbm).abs() < 0.05 * 2.0 * w / d.hbm,
        "{bwd_extra}"
    );
}
