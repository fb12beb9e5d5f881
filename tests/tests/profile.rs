//! `plait profile`'s measurement in quick mode writes a cluster file the planner accepts.
#![allow(clippy::unwrap_used)]

use runtime::backend::device::DeviceBackend;
use tests::emulator::Emulator;

use runtime::profile::{ProfileOptions, measure};

#[test]
fn quick_profile_writes_a_loadable_cluster() {
    let p = measure(&ProfileOptions { quick: true }).unwrap();
    assert!(p.sgemm_rank_gflops > 0.0 && p.sgemm_one_gflops > 0.0 && p.copy_all_gb_per_s > 0.0);
    assert!(p.allreduce_alpha_us > 0.0 && p.allreduce_gb_per_s > 0.0);
    let text = p.to_cluster_toml("this-machine");
    let dir = std::env::temp_dir().join(format!("plait-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cpu.toml");
    std::fs::write(&path, &text).unwrap();
    let c = planner::Cluster::load(path.to_str().unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(c.name, "this-machine");
    assert_eq!(c.gpus_per_node as usize, p.threads);
    assert!(c.gpu.peak_tflops.fp32.unwrap() > 0.0);
    assert!(c.gpu.peak_tflops.bf16.is_none());
    // The measured kernel classes and the packing pass reach the planner.
    let k = c.gpu.kernel_fractions.unwrap();
    let f = p.kernel_fractions;
    for (loaded, measured) in [
        (k.pointwise, f.pointwise),
        (k.activation, f.activation),
        (k.norm, f.norm),
        (k.softmax, f.softmax),
        (k.dropout, f.dropout),
    ] {
        let loaded = loaded.unwrap();
        assert!(loaded > 0.0 && (loaded - measured).abs() <= 1e-3 * measured);
    }
    assert!(c.gpu.matmul_packs_operands);
}

/// `plait profile --device cuda`'s measurement, run here on the emulated device, without and
/// with tensor cores: every figure comes from the device backend's own kernels (no host
/// fallback) and is a positive rate.
#[test]
fn the_gpu_profile_measures_the_device_backend() {
    for tensor_cores in [false, true] {
        let bf16 = if tensor_cores {
            tests::emulator::emulator_mma(64)
        } else {
            tests::emulator::emulator_bf16(64)
        };
        measures_the_device_backend(&bf16, tensor_cores);
    }
}

fn measures_the_device_backend(bf16: &DeviceBackend<Emulator>, tensor_cores: bool) {
    use runtime::profile::{GpuProfileOptions, measure_gpu};
    let f32 = tests::emulator::emulator(64);
    let host_ops = bf16.host_ops();
    let p = measure_gpu(
        &f32,
        bf16,
        bf16.properties(),
        &GpuProfileOptions { quick: true },
    )
    .unwrap();
    let k = p.kernel_fractions;
    for (what, v) in [
        ("copy", p.copy_gb_per_s),
        ("f32 gemm", p.gemm_f32_tflops),
        ("bf16 gemm", p.gemm_bf16_tflops),
        ("attention forward", p.attention_fwd_tflops),
        ("attention backward", p.attention_bwd_tflops),
        ("add", k.pointwise),
        ("gelu", k.activation),
        ("layernorm", k.norm),
        ("softmax", k.softmax),
        ("dropout", k.dropout),
    ] {
        assert!(v.is_finite() && v > 0.0, "{what}: {v}");
    }
    // Per-op time is a difference of two timings: zero within their noise, never negative.
    assert!(
        p.launch_us.is_finite() && p.launch_us >= 0.0,
        "{}",
        p.launch_us
    );
    assert!(
        host_ops.by_kind().is_empty(),
        "ops ran on the host: {:?}",
        host_ops.by_kind()
    );
    // Each kernel reads and writes what the runtime's does in a GPT: the bf16 GEMM's
    // operands as words, a GELU's input, output and gradients as words, a norm's output and
    // output gradient as words. Those operands are converted once, before the timing (two
    // GEMM operands, GELU's x and dy, the norm's dy; and the tensor-core attention's q, k, v
    // and dO), and nothing is converted or expanded in the timed passes.
    let tally = runtime::Backend::launch_tally(bf16).unwrap();
    for kernel in [
        "gemm (cuBLAS)",
        "unary_forward_words_bf16x",
        "unary_backward_words_bf16xg",
        "layer_norm_forward_warp_words",
    ] {
        assert!(tally.get(kernel).launches > 0, "no {kernel}: {tally:?}");
    }
    let operands = if tensor_cores { 9 } else { 5 };
    assert_eq!(tally.get("to_bf16").launches, operands, "{tally:?}");
    assert_eq!(tally.get("from_bf16").launches, 0, "{tally:?}");
    if !tensor_cores {
        return;
    }
    // Attention is measured as a GPT's runs: the tensor-core kernels on bf16 words, the
    // forward keeping each row's log-sum-exp for a backward that does not recompute it.
    for kernel in [
        "attention_forward_words_mma32",
        "attention_backward_dq_words_mma32",
        "attention_backward_dkv_words_mma32",
    ] {
        assert!(tally.get(kernel).launches > 0, "no {kernel}: {tally:?}");
    }
    assert_eq!(tally.get("attention_row_stats_mma32").launches, 0);
    assert_eq!(tally.get("attention_forward_mma32").launches, 0);
}
