//! Expert parallelism in the cost model and the search: each layer's experts split over `ep` of
//! the data-parallel ranks (their states shrink by ep, their gradients reduce over dp ÷ ep), the
//! all-gather dispatcher's communication priced per expert layer, and the degrees the search
//! tries. Checked against parameter counts from the published Mixtral-8x7B configuration, not
//! against plait's own model.
#![allow(clippy::unwrap_used)]

use import::{Family, ModelSpec, build_forward};
use planner::engine::Engine;
use planner::search::{Pins, SearchRequest, search};
use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule, Strategy, estimate};

/// Mixtral-8x7B's shape (mistralai/Mixtral-8x7B-v0.1 config.json), trimmed to 4 layers.
fn mixtral(layers: u64) -> ir::Graph {
    let spec = ModelSpec {
        name: "mixtral-4l".into(),
        family: Family::Mixtral,
        variant: Default::default(),
        layers,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ffn: 14336,
        vocab: 32000,
        max_positions: 32768,
        tied_embeddings: false,
        norm_eps: 1e-5,
        rope_theta: 1e6,
        rope_scaling: ir::RopeScaling::None,
        experts: 8,
        experts_per_token: 2,
        default_seq: 4096,
        dropout: 0.0,
    };
    build_forward(&spec, ir::DType::F32).unwrap()
}

/// One layer's routed experts: 8 × (gate, up and down projections of 4096 × 14336).
const EXPERT_PARAMS_PER_LAYER: u64 = 8 * 3 * 4096 * 14336;

fn strategy(tp: u32, dp: u32, ep: u32, zero: u8) -> Strategy {
    Strategy {
        tp,
        pp: 1,
        dp,
        micro_batch: 1,
        global_batch: 8 * u64::from(dp),
        seq: 4096,
        zero,
        recompute: Recompute::None,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        sequence_parallel: tp > 1,
        precision: Precision::Bf16,
        attention: Default::default(),
        kernels: Default::default(),
        stage_layers: None,
        cp: 1,
        ep,
        engine: Engine::Megatron,
        overlap: Engine::Megatron.overlap(zero),
        dp_comm: Default::default(),
    }
}

#[test]
fn the_model_knows_its_routed_experts() {
    let g = mixtral(4);
    let info = ModelInfo::new(&g).unwrap();
    assert_eq!(info.experts, 8);
    assert_eq!(info.expert_params_per_layer, EXPERT_PARAMS_PER_LAYER);
}

#[test]
fn experts_states_split_over_ep_and_the_dense_ones_do_not() {
    let g = mixtral(4);
    let info = ModelInfo::new(&g).unwrap();
    let h100 = Cluster::load("dgx-h100").unwrap();
    let weights = |ep: u32| {
        let e = estimate(&info, &h100, 8, &strategy(1, 8, ep, 0)).unwrap();
        e.predicted.memory.weights
    };
    // bf16 weights: every rank holds the dense part whole and 1/ep of the experts.
    let experts = 2.0 * 4.0 * EXPERT_PARAMS_PER_LAYER as f64;
    for ep in [2, 4, 8] {
        let saved = weights(1) - weights(ep);
        let want = experts * (1.0 - 1.0 / f64::from(ep));
        assert!(
            (saved - want).abs() <= 1e-9 * want,
            "ep {ep}: weights shrink by {saved:.4e} bytes, the experts' share is {want:.4e}"
        );
    }
    // ZeRO-1 shards the optimizer state over the ranks holding the same weights: at ep 1 the
    // experts' over all 8 ranks, at ep 8 not at all (each expert lives on one rank), so the
    // optimizer bytes per rank are the same, while the gradients (not sharded at ZeRO-1)
    // shrink by the experts' 7/8.
    let zero1 = |ep: u32| {
        let e = estimate(&info, &h100, 8, &strategy(1, 8, ep, 1)).unwrap();
        (e.predicted.memory.optimizer, e.predicted.memory.grads)
    };
    let ((opt1, grads1), (opt8, grads8)) = (zero1(1), zero1(8));
    assert!((opt1 - opt8).abs() <= 1e-9 * opt1, "{opt1} vs {opt8}");
    let want = experts * 7.0 / 8.0;
    assert!((grads1 - grads8 - want).abs() <= 1e-9 * want);
}

#[test]
fn dispatch_costs_time_only_with_expert_parallelism_and_more_across_nodes() {
    let g = mixtral(4);
    let info = ModelInfo::new(&g).unwrap();
    let h100 = Cluster::load("dgx-h100").unwrap();
    let ep_time = |tp: u32, dp: u32, ep: u32| {
        let e = estimate(&info, &h100, u64::from(tp * dp), &strategy(tp, dp, ep, 0)).unwrap();
        e.predicted.time.ep_comm
    };
    assert_eq!(ep_time(1, 8, 1), 0.0);
    let inside = ep_time(1, 8, 8);
    assert!(inside > 0.0);
    // The same 8-member group strided by tp 2 spans two nodes: slower per byte (InfiniBand
    // instead of NVLink), and with the same tokens per rank.
    let across = ep_time(2, 8, 8);
    assert!(
        across > inside,
        "ep 8 across two nodes {across:.4} s vs inside one {inside:.4} s"
    );
    // Twice the group gathers about twice the tokens.
    let half = ep_time(1, 8, 4);
    assert!(
        inside > 1.5 * half,
        "ep 8 {inside:.4} s vs ep 4 {half:.4} s"
    );
}

#[test]
fn expert_parallelism_constraints_name_the_fix() {
    let g = mixtral(4);
    let info = ModelInfo::new(&g).unwrap();
    let h100 = Cluster::load("dgx-h100").unwrap();
    let bad = |s: Strategy, gpus: u64| estimate(&info, &h100, gpus, &s).unwrap_err().to_string();
    assert!(bad(strategy(1, 4, 8, 0), 4).contains("must divide dp"));
    assert!(bad(strategy(1, 6, 3, 0), 6).contains("experts do not split"));
    let llama = import::load_model("llama3-8b", 1, Some(4096)).unwrap();
    let dense = ModelInfo::new(&llama.graph).unwrap();
    let e = estimate(&dense, &h100, 8, &strategy(1, 8, 2, 0)).unwrap_err();
    assert!(e.to_string().contains("mixture-of-experts"), "{e}");
}

/// Mixtral-8x7B (32 layers) on two 8-GPU nodes with the mesh pinned (tp 1, pp 1, dp 16,
/// ZeRO-1, full recompute): its 46.7B parameters' bf16 weights alone (93 GB) do not fit in
/// 80 GB replicated, nor split over 2 or 4 ranks; over 8 they do. The search finds the
/// degree itself, and a pin of ep 1 leaves nothing that fits.
#[test]
fn the_search_tries_expert_parallel_degrees() {
    let g = mixtral(32);
    let info = ModelInfo::new(&g).unwrap();
    let h100 = Cluster::load("dgx-h100").unwrap();
    let req = |ep: Option<u32>| SearchRequest {
        gpus: 16,
        global_batch: 64,
        seq: 4096,
        pins: Pins {
            tp: Some(1),
            pp: Some(1),
            dp: Some(16),
            micro_batch: Some(1),
            zero: Some(1),
            recompute: Some(Recompute::Full),
            precision: Some(Precision::Bf16),
            ep,
            ..Pins::default()
        },
        top_k: 2,
    };
    let found = search(&info, &h100, &req(None), &mut |_, _| {})
        .unwrap()
        .unwrap();
    assert_eq!(found.best.strategy.ep, 8, "{:?}", found.best.strategy);
    assert!(found.best.predicted.fits);
    let pinned = search(&info, &h100, &req(Some(1)), &mut |_, _| {}).unwrap();
    assert!(pinned.is_err(), "replicated experts should not fit");
}

/// The report's communication table counts the dispatch the estimate prices: its
/// expert-parallel rows (per expert layer and pass, the tokens gathered and reduce-scattered
/// and the routing weights gathered; written separately from the estimate) add up to the
/// estimate's `ep_comm`; and the experts' gradients reduce over dp / ep ranks.
#[test]
fn the_report_counts_the_dispatch_the_estimate_prices() {
    let g = mixtral(4);
    let info = ModelInfo::new(&g).unwrap();
    let h100 = Cluster::load("dgx-h100").unwrap();
    let mut s = strategy(2, 8, 4, 1);
    for recompute in [Recompute::None, Recompute::Full] {
        s.recompute = recompute;
        let e = estimate(&info, &h100, 16, &s).unwrap();
        let v = planner::report::volume::volumes(
            &info,
            &h100,
            &s,
            planner::report::volume::TpSource::RULES,
        );
        let ep: f64 = v[0]
            .rows
            .iter()
            .filter(|r| r.parallelism == "ep")
            .map(|r| r.seconds)
            .sum();
        let priced = e.predicted.time.ep_comm;
        assert!(
            (ep - priced).abs() <= 1e-9 * priced,
            "{recompute}: table {ep:.6} s vs estimate {priced:.6} s"
        );
    }
    let v = planner::report::volume::volumes(
        &info,
        &h100,
        &s,
        planner::report::volume::TpSource::RULES,
    );
    let expert_rows: Vec<u64> = v[0]
        .rows
        .iter()
        .filter(|r| r.payload.starts_with("expert"))
        .map(|r| r.group_size)
        .collect();
    assert_eq!(
        expert_rows,
        vec![2, 2],
        "reduce-scatter and all-gather over dp / ep"
    );
}

/// The expert-parallel group's extraction holds the experts where expert parallelism puts them,
/// whatever the group spans: at tp 4 beside ep 8 (the group strided over four nodes, two
/// sequences of 4096 tokens a micro-batch) gathering the experts' weights over InfiniBand
/// once read cheaper than moving the tokens, but that is ZeRO-3 over the group, which no
/// program runs and the outer search prices as ZeRO-3; the layout stays Megatron-Core's
/// all-gather dispatcher.
#[test]
fn expert_group_extractions_never_gather_the_experts() {
    let g = mixtral(2);
    let info = ModelInfo::new(&g).unwrap();
    let h100 = Cluster::load("dgx-h100").unwrap();
    for (tp, dp, mb) in [(1, 8, 1), (4, 8, 2), (4, 16, 4)] {
        let s = Strategy {
            micro_batch: mb,
            ..strategy(tp, dp, 8, 1)
        };
        let bp = planner::sharding_costs::expert_block_plan(&info, &h100, &s).unwrap();
        planner::sharding_costs::expert_layout_is_lowered(&bp)
            .unwrap_or_else(|why| panic!("tp {tp} dp {dp} micro-batch {mb}: {why}"));
    }
}

/// DeepSeek-V2-Lite's first layer is dense (`first_k_dense_replace` 1): the expert-parallel
/// group's extraction is of its expert layers, the all-gather dispatcher, not of the first
/// run of layers, which has no expert layer to lay out.
#[test]
fn the_expert_group_extraction_is_of_the_expert_layers() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/deepseek-v2-lite/config.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let spec = import::hf::parse_config(&text, std::path::Path::new(path)).unwrap();
    let g = build_forward(&spec, ir::DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    assert!(
        info.runs().len() > 1,
        "a dense first layer, then expert layers"
    );
    let h100 = Cluster::load("dgx-h100").unwrap();
    let s = Strategy {
        seq: 2048,
        ..strategy(1, 8, 8, 1)
    };
    let bp = planner::sharding_costs::expert_block_plan(&info, &h100, &s).unwrap();
    planner::sharding_costs::expert_layout_is_lowered(&bp).unwrap();
}
