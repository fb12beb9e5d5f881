//! The search against exhaustive enumeration, and its behaviour when nothing fits.
#![allow(clippy::unwrap_used)]

use import::{Family, ModelSpec, build_forward};
use ir::{DType, Graph};
use planner::search::{Pins, SearchRequest, candidates, search};
use planner::{Cluster, ModelInfo, Strategy, estimate};

fn spec(
    family: Family,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    seq: u64,
) -> Graph {
    let s = ModelSpec {
        name: "small".into(),
        family,
        variant: Default::default(),
        layers,
        hidden,
        heads,
        kv_heads,
        ffn: if family == Family::Gpt2 {
            4 * hidden
        } else {
            8 * hidden / 3 / 64 * 64
        },
        vocab,
        max_positions: seq,
        tied_embeddings: family == Family::Gpt2,
        norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: seq,
        dropout: if family == Family::Gpt2 { 0.1 } else { 0.0 },
    };
    build_forward(&s, DType::F32).unwrap()
}

/// Every composition of `layers` into `parts` positive parts.
fn compositions(layers: u32, parts: u32) -> Vec<Vec<u32>> {
    if parts == 1 {
        return vec![vec![layers]];
    }
    let mut out = Vec::new();
    for first in 1..=layers.saturating_sub(parts - 1) {
        for mut rest in compositions(layers - first, parts - 1) {
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

/// The fastest fitting time over the whole space: every candidate, every stage split.
fn brute_force(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
) -> Option<(f64, Strategy)> {
    let mut best: Option<(f64, Strategy)> = None;
    for s in candidates(info, cluster, req) {
        let splits = if s.pp == 1 {
            vec![None]
        } else {
            compositions(info.layers, s.chunks())
                .into_iter()
                .map(Some)
                .collect()
        };
        for split in splits {
            let mut t = s.clone();
            t.stage_layers = split;
            let Ok(e) = estimate(info, cluster, req.gpus, &t) else {
                continue;
            };
            if e.predicted.fits
                && best
                    .as_ref()
                    .is_none_or(|b| e.predicted.iteration_time_s < b.0)
            {
                best = Some((e.predicted.iteration_time_s, t));
            }
        }
    }
    best
}

fn check(graph: &Graph, cluster: &str, gpus: u64, batch: u64, seq: u64) -> Strategy {
    check_pinned(graph, cluster, gpus, batch, seq, Pins::default())
}

fn check_pinned(
    graph: &Graph,
    cluster: &str,
    gpus: u64,
    batch: u64,
    seq: u64,
    pins: Pins,
) -> Strategy {
    let cluster = Cluster::load(cluster).unwrap();
    let info = ModelInfo::new(graph).unwrap();
    let req = SearchRequest {
        gpus,
        global_batch: batch,
        seq,
        pins,
        top_k: 3,
    };
    let (want, want_s) = brute_force(&info, &cluster, &req).expect("something fits");
    let found = search(&info, &cluster, &req, &mut |_, _| {})
        .unwrap()
        .unwrap();
    let got = found.best.predicted.iteration_time_s;
    assert!(
        (got - want).abs() / want <= 1e-3,
        "search {got} ({:?}) vs exhaustive {want} ({want_s:?})",
        found.best.strategy
    );
    found.best.strategy
}

#[test]
fn gpt_4_layers_on_4_gpus() {
    check(
        &spec(Family::Gpt2, 4, 256, 8, 8, 1024, 256),
        "dgx-a100-80gb",
        4,
        16,
        256,
    );
}

#[test]
fn gpt_4_layers_on_8_gpus() {
    check(
        &spec(Family::Gpt2, 4, 512, 8, 8, 4096, 512),
        "dgx-a100-80gb",
        8,
        32,
        512,
    );
}

#[test]
fn gpt_6_layers_on_16_gpus_across_nodes() {
    check(
        &spec(Family::Gpt2, 6, 512, 8, 8, 4096, 512),
        "dgx-a100-40gb",
        16,
        32,
        512,
    );
}

#[test]
fn llama_gqa_8_layers_on_8_gpus() {
    check(
        &spec(Family::Llama, 8, 512, 8, 2, 8192, 512),
        "dgx-h100",
        8,
        16,
        512,
    );
}

#[test]
fn memory_tight_gpt_on_16gb_v100s() {
    // ~0.5 B parameters: 8 GB of model states on 16 GB GPUs forces sharding or pipelining.
    check(
        &spec(Family::Gpt2, 8, 2048, 16, 16, 32768, 1024),
        "aws-p3.16xlarge",
        8,
        16,
        1024,
    );
}

#[test]
fn pipeline_over_a_slow_network() {
    // Two p3.16xlarge nodes joined by 25 Gb/s: data parallelism across them would all-reduce
    // every gradient over the slow link, so the best plan pipelines across the nodes instead.
    let best = check(
        &spec(Family::Gpt2, 8, 1024, 16, 16, 8192, 1024),
        "aws-p3.16xlarge",
        16,
        16,
        1024,
    );
    assert!(best.pp > 1, "{best:?}");
}

#[test]
fn pinned_four_stage_pipeline_finds_the_best_split() {
    let pins = Pins {
        pp: Some(4),
        ..Pins::default()
    };
    let best = check_pinned(
        &spec(Family::Gpt2, 8, 512, 8, 8, 32768, 512),
        "dgx-a100-80gb",
        4,
        16,
        512,
        pins,
    );
    assert_eq!(best.pp, 4);
}

#[test]
fn a_model_that_cannot_fit_reports_the_shortfall() {
    let g = spec(Family::Gpt2, 128, 25600, 160, 160, 51200, 2048);
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let req = SearchRequest {
        gpus: 8,
        global_batch: 8,
        seq: 2048,
        pins: Pins::default(),
        top_k: 3,
    };
    let inf = search(&info, &cluster, &req, &mut |_, _| {})
        .unwrap()
        .unwrap_err();
    assert!(
        inf.smallest_shortfall_bytes > 1e12,
        "{}",
        inf.smallest_shortfall_bytes
    );
    assert!(
        inf.suggestions.iter().any(|s| s.contains("GPUs")),
        "{:?}",
        inf.suggestions
    );
}

#[test]
fn pinning_every_knob_gives_the_estimate() {
    let g = spec(Family::Gpt2, 4, 512, 8, 8, 4096, 512);
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let pins = Pins {
        tp: Some(2),
        pp: Some(2),
        dp: Some(2),
        micro_batch: Some(2),
        zero: Some(1),
        recompute: Some(planner::Recompute::Selective),
        schedule: Some(planner::Schedule::OneFOneB),
        virtual_stages: Some(1),
        sequence_parallel: Some(true),
        precision: Some(planner::Precision::Bf16),
        stage_layers: Some(vec![2, 2]),
        attention: None,
        kernels: None,
        cp: None,
        ep: None,
        engine: None,
        target: false,
        dp_comm: Default::default(),
    };
    let req = SearchRequest {
        gpus: 8,
        global_batch: 32,
        seq: 512,
        pins,
        top_k: 3,
    };
    let found = search(&info, &cluster, &req, &mut |_, _| {})
        .unwrap()
        .unwrap();
    let direct = estimate(&info, &cluster, 8, &found.best.strategy).unwrap();
    assert_eq!(
        found.best.predicted.iteration_time_s,
        direct.predicted.iteration_time_s
    );
    assert_eq!(found.best.strategy.tp, 2);
    assert_eq!(found.best.strategy.stage_layers, Some(vec![2, 2]));
    // Unpinned, the kernels are the cluster's (fused on a GPU cluster).
    assert_eq!(
        found.best.strategy.kernels,
        planner::cost::compute::Kernels::Fused
    );
}

/// The time-bounded search (candidates whose pipeline lower bound exceeds every plan that
/// could be reported are not simulated) gives the answer of simulating every candidate: the
/// same winner, the same alternatives with the same reasons, on zoo models and a deep model
/// whose pipelines reach 64 stages.
#[test]
fn time_bounded_search_equals_the_exhaustive_one() {
    let deep = spec(Family::Llama, 64, 512, 8, 4, 32000, 2048);
    let zoo = |name: &str| build_forward(&import::zoo::find(name).unwrap(), DType::F32).unwrap();
    let cases: Vec<(Graph, &str, u64, u64, u64)> = vec![
        (zoo("llama3-8b"), "dgx-h100", 16, 64, 4096),
        (zoo("gpt-7.5b"), "dgx-a100-80gb", 64, 512, 2048),
        (deep, "dgx-h100", 128, 256, 1024),
    ];
    let mut skipped = 0;
    for (g, cluster, gpus, batch, seq) in cases {
        let cluster = Cluster::load(cluster).unwrap();
        let info = ModelInfo::new(&g).unwrap();
        let req = SearchRequest {
            gpus,
            global_batch: batch,
            seq,
            pins: Pins::default(),
            top_k: 3,
        };
        let fast = search(&info, &cluster, &req, &mut |_, _| {})
            .unwrap()
            .unwrap();
        let full = planner::search::search_exhaustive(&info, &cluster, &req)
            .unwrap()
            .unwrap();
        assert_eq!(fast.best.strategy, full.best.strategy, "{}", g.name);
        assert_eq!(
            fast.best.predicted.iteration_time_s,
            full.best.predicted.iteration_time_s
        );
        assert_eq!(fast.alternatives, full.alternatives, "{}", g.name);
        assert_eq!(full.candidates_bounded, 0);
        skipped += fast.candidates_bounded;
    }
    assert!(skipped > 0, "the bound skipped nothing");
}
