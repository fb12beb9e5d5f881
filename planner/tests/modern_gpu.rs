//! The knobs of GPU training as it runs today, each checked against what it must do physically:
//! FlashAttention's memory and time, context parallelism's split, FP8's GEMM speed-up, and the
//! engines' overlap.
#![allow(clippy::unwrap_used)]

use import::{Family, ModelSpec, build_forward};
use planner::cost::compute::AttentionKernel;
use planner::engine::Engine;
use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule, Strategy, estimate};

/// A Llama-3-8B-shaped model, trimmed to 4 layers so the tests stay fast.
fn llama() -> ir::Graph {
    let spec = ModelSpec {
        name: "llama-4x4096".into(),
        family: Family::Llama,
        variant: Default::default(),
        layers: 4,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ffn: 14336,
        vocab: 128_256,
        max_positions: 16384,
        tied_embeddings: false,
        norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: 8192,
        dropout: 0.0,
    };
    build_forward(&spec, ir::DType::F32).unwrap()
}

fn strategy(dp: u32, cp: u32, precision: Precision, attention: AttentionKernel) -> Strategy {
    Strategy {
        tp: 1,
        pp: 1,
        dp,
        micro_batch: 1,
        global_batch: 8,
        seq: 8192,
        zero: 1,
        recompute: Recompute::None,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        sequence_parallel: false,
        precision,
        attention,
        kernels: planner::cost::compute::Kernels::Fused,
        stage_layers: None,
        cp,
        ep: 1,
        engine: Engine::Megatron,
        overlap: Engine::Megatron.overlap(1),
        dp_comm: Default::default(),
    }
}

#[test]
fn flash_attention_is_the_gpu_default_and_drops_the_score_memory() {
    let h100 = Cluster::load("dgx-h100").unwrap();
    assert_eq!(h100.default_attention(), AttentionKernel::Fused);
    assert_eq!(
        Cluster::load("dgx1-v100").unwrap().default_attention(),
        AttentionKernel::Materialized,
        "FlashAttention-2 needs Ampere or newer"
    );
    assert_eq!(
        Cluster::load("cpu").unwrap().default_attention(),
        AttentionKernel::Materialized
    );
    let g = llama();
    let info = ModelInfo::new(&g).unwrap();
    let m = estimate(
        &info,
        &h100,
        8,
        &strategy(8, 1, Precision::Bf16, AttentionKernel::Materialized),
    )
    .unwrap();
    let f = estimate(
        &info,
        &h100,
        8,
        &strategy(8, 1, Precision::Bf16, AttentionKernel::Fused),
    )
    .unwrap();
    // Materialized scores: 2·heads·s²·b bytes per layer (bf16, no dropout); fused keeps 4·heads·s·b.
    // At the peak a backward also holds its working set: the head's the fp32 logits and their
    // gradient, which Megatron (the default engine) holds in bf16 ((4 + 2)·s·V), a
    // materialized layer's the scores' and softmax's gradients (2·2·heads·s²), whichever is
    // larger; the fused layer's MLP gradients are smaller than the logits'.
    let (s, heads, layers, vocab): (f64, f64, f64, f64) = (8192.0, 32.0, 4.0, 128_256.0);
    let logits = (4.0 + 2.0) * s * vocab;
    let scores_grad = 2.0 * 2.0 * heads * s * s;
    let want = layers * (2.0 * heads * s * s - 4.0 * heads * s) + scores_grad.max(logits) - logits;
    let got = m.predicted.memory.activations - f.predicted.memory.activations;
    assert!((got - want).abs() / want < 1e-9, "{got} vs {want}");
    assert!(f.predicted.iteration_time_s < m.predicted.iteration_time_s);
}

#[test]
fn context_parallelism_splits_activations_and_keeps_the_work() {
    let h100 = Cluster::load("dgx-h100").unwrap();
    let g = llama();
    let info = ModelInfo::new(&g).unwrap();
    let one = estimate(
        &info,
        &h100,
        8,
        &strategy(8, 1, Precision::Bf16, AttentionKernel::Fused),
    )
    .unwrap();
    let two = estimate(
        &info,
        &h100,
        8,
        &strategy(4, 2, Precision::Bf16, AttentionKernel::Fused),
    )
    .unwrap();
    // Every activation term is linear in the rank's tokens once the scores are not stored.
    let ratio = two.predicted.memory.activations / one.predicted.memory.activations;
    assert!((ratio - 0.5).abs() < 0.01, "activation ratio {ratio}");
    // The same tokens on the same GPUs: the work per GPU is the same, so the time is within a
    // few percent (the ring hides behind attention; shorter GEMMs quantize a little worse).
    let t = two.predicted.iteration_time_s / one.predicted.iteration_time_s;
    assert!((0.95..1.15).contains(&t), "time ratio {t}");
    // Gradients reduce over dp x cp: the optimizer shard is the same size.
    assert!((two.predicted.memory.optimizer - one.predicted.memory.optimizer).abs() < 1.0);
}

#[test]
fn context_parallelism_is_refused_where_it_cannot_run() {
    let h100 = Cluster::load("dgx-h100").unwrap();
    let g = llama();
    let info = ModelInfo::new(&g).unwrap();
    let materialized = strategy(4, 2, Precision::Bf16, AttentionKernel::Materialized);
    let e = estimate(&info, &h100, 8, &materialized).unwrap_err();
    assert!(e.to_string().contains("--attention fused"), "{e}");
    let mut odd = strategy(4, 2, Precision::Bf16, AttentionKernel::Fused);
    odd.seq = 8190;
    let e = estimate(&info, &h100, 8, &odd).unwrap_err();
    assert!(e.to_string().contains("2 x cp"), "{e}");
    let e = estimate(
        &info,
        &h100,
        4,
        &strategy(4, 2, Precision::Bf16, AttentionKernel::Fused),
    )
    .unwrap_err();
    assert!(e.to_string().contains("x cp"), "{e}");
    // Local SGD steps each rank on its own gradient: a share of a sequence's under cp.
    let mut local_sgd = strategy(4, 2, Precision::Bf16, AttentionKernel::Fused);
    local_sgd.zero = 0;
    local_sgd.dp_comm.dp_sync = planner::dp_comm::DpSync::LocalSgd { every: 8 };
    let e = estimate(&info, &h100, 8, &local_sgd).unwrap_err();
    assert!(e.to_string().contains("--cp 1"), "{e}");
}

#[test]
fn fp8_speeds_up_the_gemms_only_and_needs_fp8_hardware() {
    let h100 = Cluster::load("dgx-h100").unwrap();
    let g = llama();
    let info = ModelInfo::new(&g).unwrap();
    let bf16 = estimate(
        &info,
        &h100,
        8,
        &strategy(8, 1, Precision::Bf16, AttentionKernel::Fused),
    )
    .unwrap();
    let fp8 = estimate(
        &info,
        &h100,
        8,
        &strategy(8, 1, Precision::Fp8, AttentionKernel::Fused),
    )
    .unwrap();
    let speedup = bf16.predicted.time.compute / fp8.predicted.time.compute;
    // Less than the GEMMs' own speed-up (attention, norms and element-wise work stay 16-bit).
    assert!(
        speedup > 1.2 && speedup < planner::cost::compute::FP8_GEMM_SPEEDUP,
        "{speedup}"
    );
    // Per-tensor current scaling: between delayed scaling and BF16, and only its GEMMs differ
    // (their time in the ratio of the two measured speed-ups).
    let tensorwise = estimate(
        &info,
        &h100,
        8,
        &strategy(8, 1, Precision::Fp8Tensorwise, AttentionKernel::Fused),
    )
    .unwrap();
    let (t, d, b) = (
        tensorwise.predicted.time.compute,
        fp8.predicted.time.compute,
        bf16.predicted.time.compute,
    );
    assert!(d < t && t < b, "{d} < {t} < {b}");
    assert_eq!(
        tensorwise.predicted.peak_memory_bytes,
        fp8.predicted.peak_memory_bytes
    );
    let a100 = Cluster::load("dgx-a100-80gb").unwrap();
    for p in [Precision::Fp8, Precision::Fp8Tensorwise] {
        let e = estimate(&info, &a100, 8, &strategy(8, 1, p, AttentionKernel::Fused)).unwrap_err();
        assert!(e.to_string().contains("fp8"), "{e}");
    }
}

#[test]
fn engines_differ_in_what_they_overlap() {
    let h100 = Cluster::load("dgx-h100").unwrap();
    let g = llama();
    let info = ModelInfo::new(&g).unwrap();
    let mut s = strategy(8, 1, Precision::Bf16, AttentionKernel::Fused);
    s.global_batch = 8;
    let megatron = estimate(&info, &h100, 8, &s).unwrap().predicted;
    s.engine = Engine::Deepspeed;
    s.overlap = Engine::Deepspeed.overlap(s.zero);
    let deepspeed = estimate(&info, &h100, 8, &s).unwrap().predicted;
    // DeepSpeed's ZeRO-1 does not overlap its reduction (`overlap_comm` is false below
    // stage 3): the whole reduce-scatter and gather show.
    assert!(deepspeed.time.dp_comm > megatron.time.dp_comm);
    assert!(!Engine::Deepspeed.overlap(1).grad_reduce);
    assert!(Engine::Deepspeed.overlap(3).grad_reduce);
    for e in Engine::ALL {
        assert_eq!(e.name().parse::<Engine>().unwrap(), e);
    }
    assert!("nemo".parse::<Engine>().is_err());
}

/// Megatron-Core turns Transformer Engine's TP overlap off for a model whose linear layers
/// include latent attention's projections (`TELinear`: buffers other than qkv, proj, fc1 and
/// fc2): DeepSeek-V2-Lite's TP communication shows whole under the Megatron profile, where a
/// Llama's is hidden behind its GEMMs.
#[test]
fn megatron_overlaps_no_tp_communication_of_latent_attention() {
    let h100 = Cluster::load("dgx-h100").unwrap();
    let exposed = |info: &ModelInfo<'_>, overlap: bool| {
        let mut s = strategy(4, 1, Precision::Bf16, AttentionKernel::Fused);
        (s.tp, s.sequence_parallel, s.seq) = (2, true, 4096);
        s.overlap.tp_comm = overlap;
        estimate(info, &h100, 8, &s).unwrap().predicted.time.tp_comm
    };
    let g = llama();
    let info = ModelInfo::new(&g).unwrap();
    assert!(exposed(&info, true) < 0.9 * exposed(&info, false));
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf");
    let spec = import::hf::read_config(&fixtures.join("deepseek-v2-lite/config.json")).unwrap();
    let g = build_forward(&spec, ir::DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    assert!(info.latent.is_some());
    assert!(exposed(&info, false) > 0.0);
    assert_eq!(exposed(&info, true), exposed(&info, false));
}

/// A runtime whose kernels and collectives move f32 whatever the plan's precision (plait's
/// CUDA runtime, as `plait profile --device cuda` describes it) takes longer on a bf16 plan's
/// memory-bound work and keeps the plan's memory: the buffers are still held in 16 bits.
#[test]
fn f32_activations_slow_the_memory_bound_work_and_keep_the_memory() {
    let mut h200 = Cluster::load("dgx-h200").unwrap();
    let g = llama();
    let info = ModelInfo::new(&g).unwrap();
    let mut s = strategy(8, 1, Precision::Bf16, AttentionKernel::Fused);
    s.kernels = planner::cost::compute::Kernels::Eager;
    let bf16 = estimate(&info, &h200, 8, &s).unwrap();
    assert_eq!(h200.activation_traffic_bytes(Precision::Bf16), 2.0);
    h200.gpu.f32_activations = true;
    assert_eq!(h200.activation_traffic_bytes(Precision::Bf16), 4.0);
    let f32 = estimate(&info, &h200, 8, &s).unwrap();
    assert!(
        f32.predicted.iteration_time_s > 1.05 * bf16.predicted.iteration_time_s,
        "{} vs {}",
        f32.predicted.iteration_time_s,
        bf16.predicted.iteration_time_s
    );
    assert_eq!(f32.predicted.memory, bf16.predicted.memory);
    // Only the memory-bound kernels move more: the GEMMs and attention are priced alike, and no
    // conversion pass is priced for holding the activations in 16 bits (the runtime makes
    // them as bf16 words).
    let by_kind = |c: &Cluster| {
        planner::estimate::estimate_traced(&info, c, 8, &s, planner::Pricing::SEARCH)
            .unwrap()
            .predicted
            .stages[0]
            .kernel_s
            .clone()
    };
    let f32_kinds = by_kind(&h200);
    h200.gpu.f32_activations = false;
    let bf16_kinds = by_kind(&h200);
    h200.gpu.f32_activations = true;
    for k in ["linear", "grad.linear", "attention", "grad.attention"] {
        assert_eq!(f32_kinds[k], bf16_kinds[k], "{k}");
    }
    let memory_bound = ["rmsnorm", "grad.rmsnorm", "add", "silu", "grad.silu", "mul"];
    for k in memory_bound {
        assert!(f32_kinds[k] > bf16_kinds[k], "{k}");
    }
    assert!(
        !f32_kinds.keys().any(|k| k.contains("stash")),
        "{f32_kinds:?}"
    );
    // An fp32 plan moves f32 and holds f32 either way: priced the same.
    s.precision = Precision::Fp32;
    let on = estimate(&info, &h200, 8, &s).unwrap();
    h200.gpu.f32_activations = false;
    let off = estimate(&info, &h200, 8, &s).unwrap();
    assert_eq!(
        on.predicted.iteration_time_s,
        off.predicted.iteration_time_s
    );
}
