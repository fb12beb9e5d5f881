#![allow(clippy::unwrap_used)]
//! The cost model against independent numbers: the ZeRO paper's formulas, the published
//! Megatron-LM SC'21 runs, and the constraints a strategy must satisfy.

use import::{Family, ModelSpec, build_forward};
use ir::{DType, Graph};
use planner::calibration::{SC21_CSV, predict_row, sc21_rows};
use planner::{Cluster, ModelInfo, PlanError, Precision, Recompute, Schedule, Strategy, estimate};

fn gpt(layers: u64, hidden: u64, heads: u64, vocab: u64, seq: u64) -> Graph {
    let spec = ModelSpec {
        name: format!("gpt-{layers}x{hidden}"),
        family: Family::Gpt2,
        variant: Default::default(),
        layers,
        hidden,
        heads,
        kv_heads: heads,
        ffn: 4 * hidden,
        vocab,
        max_positions: seq,
        tied_embeddings: true,
        norm_eps: 1e-5,
        rope_theta: 0.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: seq,
        dropout: 0.1,
    };
    build_forward(&spec, DType::F32).expect("builds")
}

fn strategy(tp: u32, pp: u32, dp: u32, mb: u64, batch: u64) -> Strategy {
    Strategy {
        tp,
        pp,
        dp,
        micro_batch: mb,
        global_batch: batch,
        seq: 2048,
        zero: 0,
        recompute: Recompute::Full,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        sequence_parallel: false,
        precision: Precision::Fp16,
        attention: Default::default(),
        kernels: Default::default(),
        cp: 1,
        ep: 1,
        engine: planner::engine::Engine::Megatron,
        overlap: planner::engine::Overlap::LEGACY,
        stage_layers: None,
        dp_comm: Default::default(),
    }
}

#[test]
fn zero_model_states_match_rajbhandari_for_the_7_5b_gpt() {
    // ZeRO (SC'20): 16Ψ; 4Ψ + 12Ψ/N_d; 2Ψ + 14Ψ/N_d; 16Ψ/N_d for Ψ parameters.
    let g = gpt(36, 4096, 32, 51200, 2048);
    let info = ModelInfo::new(&g).unwrap();
    let psi = g.param_count() as f64;
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let nd = 64.0;
    let want = [
        16.0 * psi,
        4.0 * psi + 12.0 * psi / nd,
        2.0 * psi + 14.0 * psi / nd,
        16.0 * psi / nd,
    ];
    for (zero, want) in want.into_iter().enumerate() {
        let mut s = strategy(1, 1, 64, 1, 512);
        s.zero = zero as u8;
        let e = estimate(&info, &cluster, 64, &s).unwrap();
        let m = &e.predicted.memory;
        let got = m.weights + m.grads + m.optimizer;
        assert!(
            (got - want).abs() / want < 0.01,
            "ZeRO-{zero}: {got:.4e} vs {want:.4e}"
        );
    }
}

#[test]
fn megatron_sc21_rows_within_ten_percent() {
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let rows = sc21_rows(SC21_CSV).unwrap();
    assert_eq!(rows.len(), 22);
    let mut errors = Vec::new();
    for r in &rows {
        let g = gpt(r.layers, r.hidden, r.heads, r.vocab, r.seq);
        let p = predict_row(r, &g, &cluster)
            .unwrap()
            .expect("a fitting strategy");
        errors.push(p.error.abs());
    }
    let within = errors.iter().filter(|e| **e <= 0.10).count();
    let mape = errors.iter().sum::<f64>() / errors.len() as f64;
    // The goal: 18 of 22 (the model reaches 19 with Megatron's fused kernels, see
    // docs/cost-model.md).
    assert!(within >= 18, "{within}/22 rows within 10 %: {errors:?}");
    assert!(mape <= 0.10, "MAPE {mape}");
}

#[test]
fn fused_kernels_group_gpt_dropout_and_residual_add() {
    use ir::OpKind;
    let g = gpt(2, 512, 8, 1000, 128);
    let info = ModelInfo::new(&g).unwrap();
    let fused: Vec<Vec<&str>> = info
        .layer_groups
        .iter()
        .filter(|gr| gr.len() > 1)
        .map(|gr| gr.iter().map(|&o| g.op(o).kind.mnemonic()).collect())
        .collect();
    // Megatron's bias-dropout-add, after the attention projection and after the MLP; GELU
    // stays alone (its input is a product's output, its output a product's input).
    assert_eq!(fused, vec![vec!["dropout", "add"], vec!["dropout", "add"]]);
    let compute = info
        .layer_ops
        .iter()
        .filter(|&&o| !g.op(o).kind.is_source())
        .count();
    assert_eq!(
        info.layer_groups.iter().map(Vec::len).sum::<usize>(),
        compute
    );
    assert!(
        info.layer_groups
            .iter()
            .flatten()
            .any(|&o| matches!(g.op(o).kind, OpKind::Gelu { .. }))
    );
}

#[test]
fn fused_kernels_group_swiglu() {
    let spec = ModelSpec {
        name: "llama-tiny".into(),
        family: Family::Llama,
        variant: Default::default(),
        layers: 2,
        hidden: 512,
        heads: 8,
        kv_heads: 8,
        ffn: 1376,
        vocab: 1000,
        max_positions: 128,
        tied_embeddings: false,
        norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: 128,
        dropout: 0.0,
    };
    let g = build_forward(&spec, DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let fused: Vec<Vec<&str>> = info
        .layer_groups
        .iter()
        .filter(|gr| gr.len() > 1)
        .map(|gr| gr.iter().map(|&o| g.op(o).kind.mnemonic()).collect())
        .collect();
    // SiLU's output feeds only the gating product: one SwiGLU kernel. The residual adds read
    // products' outputs and feed norms: alone.
    assert_eq!(fused, vec![vec!["silu", "mul"]]);
}

#[test]
fn fused_kernels_are_faster_and_cpu_runs_eager() {
    use planner::cost::compute::Kernels;
    let g = gpt(8, 1024, 16, 51200, 2048);
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    assert_eq!(cluster.default_kernels(), Kernels::Fused);
    assert_eq!(
        Cluster::load("cpu").unwrap().default_kernels(),
        Kernels::Eager
    );
    let mut s = strategy(1, 1, 8, 2, 64);
    s.kernels = Kernels::Eager;
    let eager = estimate(&info, &cluster, 8, &s).unwrap().predicted;
    s.kernels = Kernels::Fused;
    let fused = estimate(&info, &cluster, 8, &s).unwrap().predicted;
    assert!(fused.iteration_time_s < eager.iteration_time_s);
    // Fusion moves fewer bytes; it changes no FLOPs and no memory.
    assert!(fused.iteration_time_s > 0.85 * eager.iteration_time_s);
    assert_eq!(fused.peak_memory_bytes, eager.peak_memory_bytes);
    let flops = |p: &planner::estimate::Predicted| p.hardware_tflops_per_gpu * p.iteration_time_s;
    assert!((flops(&fused) - flops(&eager)).abs() / flops(&eager) < 1e-9);
}

#[test]
fn plans_without_kernels_read_as_eager() {
    use planner::cost::compute::Kernels;
    let mut v = serde_json::to_value(strategy(1, 1, 1, 1, 8)).unwrap();
    v.as_object_mut().unwrap().remove("kernels");
    let s: Strategy = serde_json::from_value(v).unwrap();
    assert_eq!(s.kernels, Kernels::Eager);
}

#[test]
fn zero3_rows_at_scale_are_communication_bound() {
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let rows = sc21_rows(SC21_CSV).unwrap();
    let big: Vec<_> = rows
        .iter()
        .filter(|r| r.zero == 3 && r.gpus >= 1536)
        .collect();
    assert_eq!(big.len(), 2);
    for r in big {
        let g = gpt(r.layers, r.hidden, r.heads, r.vocab, r.seq);
        let p = predict_row(r, &g, &cluster).unwrap().expect("fits");
        assert!(
            p.dp_comm_s > p.compute_s,
            "{} on {} GPUs: DP comm {:.1} s vs compute {:.1} s",
            r.model,
            r.gpus,
            p.dp_comm_s,
            p.compute_s
        );
    }
}

#[test]
fn one_f_one_b_keeps_p_minus_stage_micro_batches() {
    let g = gpt(8, 1024, 16, 51200, 2048);
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let e = estimate(&info, &cluster, 4, &strategy(1, 4, 1, 1, 16)).unwrap();
    let in_flight: Vec<u32> = e
        .predicted
        .stages
        .iter()
        .map(|s| s.micro_batches_in_flight)
        .collect();
    assert_eq!(in_flight, vec![4, 3, 2, 1]);
}

#[test]
fn doubling_data_parallelism_shortens_the_iteration() {
    let g = gpt(8, 1024, 16, 51200, 2048);
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let t8 = estimate(&info, &cluster, 8, &strategy(1, 1, 8, 1, 64)).unwrap();
    let t16 = estimate(&info, &cluster, 16, &strategy(1, 1, 16, 1, 64)).unwrap();
    assert!(t16.predicted.iteration_time_s < t8.predicted.iteration_time_s);
}

fn rejected(s: &Strategy, gpus: u64, fragment: &str) {
    let g = gpt(8, 1024, 16, 51200, 2048);
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    match estimate(&info, &cluster, gpus, s) {
        Err(PlanError::InvalidStrategy { constraint }) => {
            assert!(
                constraint.contains(fragment),
                "`{constraint}` lacks `{fragment}`"
            )
        }
        other => panic!("expected an invalid strategy ({fragment}), got {other:?}"),
    }
}

#[test]
fn invalid_strategies_name_their_constraint() {
    rejected(
        &strategy(2, 2, 2, 1, 64),
        16,
        "must equal the 16 GPUs (--gpus; in a plan, its `gpus` field)",
    );
    rejected(
        &strategy(3, 1, 1, 1, 64),
        3,
        "heads 16 are not divisible by tp 3",
    );
    rejected(&strategy(1, 16, 1, 1, 64), 16, "8 layers cannot fill");
    rejected(
        &strategy(1, 1, 4, 3, 64),
        4,
        "global batch 64 must be divisible by dp x micro-batch",
    );
    let mut s = strategy(1, 2, 1, 1, 8);
    s.schedule = Schedule::Interleaved;
    s.virtual_stages = 1;
    rejected(&s, 2, "needs --virtual-stages >= 2");
    let mut s = strategy(1, 1, 1, 1, 8);
    s.zero = 4;
    rejected(&s, 1, "ZeRO stage 4 does not exist");
    let mut s = strategy(1, 1, 1, 1, 8);
    s.virtual_stages = 2;
    rejected(&s, 1, "needs --schedule interleaved");
    let mut s = strategy(1, 2, 1, 1, 8);
    s.stage_layers = Some(vec![5, 4]);
    rejected(&s, 2, "must be positive and sum to the model's 8 layers");
    let mut s = strategy(1, 1, 1, 1, 8);
    s.seq = 4096;
    rejected(&s, 1, "exceeds the model's 2048 positions");
    let mut s = strategy(2, 1, 1, 1, 8);
    s.sequence_parallel = true;
    s.seq = 2047;
    rejected(
        &s,
        2,
        "sequence parallelism needs seq 2047 divisible by tp 2",
    );
}

#[test]
fn a_precision_the_gpu_lacks_is_refused() {
    let g = gpt(8, 1024, 16, 51200, 2048);
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load("dgx1-v100").unwrap();
    let mut s = strategy(1, 1, 1, 1, 8);
    s.precision = Precision::Bf16;
    match estimate(&info, &cluster, 1, &s) {
        Err(PlanError::InvalidStrategy { constraint }) => {
            assert!(constraint.contains("no bf16 support"), "{constraint}")
        }
        other => panic!("{other:?}"),
    }
}

/// Model FLOPs from the block structure (embedding side + layers × one layer + head side), as
/// every estimate computes them, equal the sum over every op of the whole graph, for each zoo
/// model, gpt-oss-20b (windowed and full layers alternating) and DeepSeek-V3 (three dense
/// layers, then expert layers: per run of identical
/// layers) at two sequence lengths; so do the parameters.
#[test]
fn block_structured_model_flops_equal_the_whole_graph() {
    let deepseek = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/deepseek-v3/config.json"
    ))
    .unwrap();
    let deepseek =
        import::hf::parse_config(&deepseek, std::path::Path::new("config.json")).unwrap();
    // gpt-oss-20b: a window of 128 keys on layer 0 and every second layer after it, full
    // attention between (the sequences are longer than the window).
    let gpt_oss = import::hf::read_config(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/gpt-oss-20b/config.json"
    )))
    .unwrap();
    for spec in import::zoo::zoo().into_iter().chain([deepseek, gpt_oss]) {
        let g = build_forward(&spec, DType::F32).unwrap();
        let info = ModelInfo::new(&g).unwrap();
        assert_eq!(info.params(), g.param_count(), "{}", spec.name);
        for seq in [128, 2048] {
            let b = ir::Binding { batch: 2, seq };
            let whole = ir::cost::training_flops_per_token(&g, b);
            let blocks = planner::estimate::training_flops_per_token(&info, b);
            assert!(
                (whole - blocks).abs() <= 1e-9 * whole,
                "{} seq {seq}: whole graph {whole:e}, by blocks {blocks:e}",
                spec.name
            );
        }
    }
}
