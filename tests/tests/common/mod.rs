//! Plans pinned to one configuration (what `plait compile --cluster cpu` with every knob
//! pinned writes) and training runs on the threads communicator.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use codegen::ProgramSet;
use kernels::Tensor32;
use planner::cost::compute::AttentionKernel;
use planner::plan::{ModelRef, Plan, SearchSummary};
use planner::search::{Pins, SearchRequest, search};
use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule};
use runtime::data::Tokens;
use runtime::exec::{Field, Init, assemble};
use runtime::train::{TrainOptions, train_threads};

pub const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/tiny-gpt2-nodrop.json"
);
/// A 2-layer Llama (grouped-query attention, SwiGLU, separate q/k/v and gate/up projections).
pub const LLAMA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-llama.json");
/// The same Llama with one key/value head (multi-query attention).
pub const LLAMA_MQA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/tiny-llama-mqa.json"
);
/// A 2-layer GPT with heads 32 wide, the narrowest the tensor-core attention takes.
/// GPT-2 with a vocabulary of odd width (251), as GPT-2's own 50257: a bf16 plan's LM head then
/// writes its logits at a padded row pitch (`runtime::exec::pitched`).
pub const ODD_VOCAB: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/tiny-gpt2-odd-vocab.json"
);
pub const WIDE_HEADS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/tiny-gpt2-wide-heads.json"
);
pub const GLOBAL_BATCH: u64 = 8;
pub const SEQ: u64 = 32;

/// A configuration: tp, pp, dp and the other knobs.
#[derive(Clone, Debug)]
pub struct Config {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub zero: u8,
    pub sp: bool,
    pub schedule: Schedule,
    pub v: u32,
    pub recompute: Recompute,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Expert-parallel degree (within dp).
    pub ep: u32,
    /// Context-parallel degree (beside dp: gpus = tp × pp × dp × cp); planned with fused
    /// attention, which context parallelism needs.
    pub cp: u32,
    /// The training precision (fp32 by default: the CPU kernels' own).
    pub precision: Precision,
    /// The cluster the plan is priced for (`cpu` by default; a mixed-precision plan needs a
    /// GPU cluster, whose file prices bf16).
    pub cluster: &'static str,
}

impl Config {
    pub fn new(tp: u32, pp: u32, dp: u32) -> Config {
        Config {
            tp,
            pp,
            dp,
            zero: 0,
            sp: false,
            schedule: Schedule::OneFOneB,
            v: 1,
            recompute: Recompute::None,
            micro_batch: 1,
            ep: 1,
            cp: 1,
            precision: Precision::Fp32,
            cluster: "cpu",
        }
    }
}

/// The plan the search finds with every knob pinned.
pub fn plan(model: &str, c: &Config) -> Plan {
    plan_for(model, c, GLOBAL_BATCH, SEQ)
}

/// [`plan`] for another global batch and sequence length.
pub fn plan_for(model: &str, c: &Config, global_batch: u64, seq: u64) -> Plan {
    let m = import::load_model(model, 1, Some(seq)).unwrap();
    let info = ModelInfo::new(&m.graph).unwrap();
    let cluster = Cluster::load(c.cluster).unwrap();
    let gpus = u64::from(c.tp * c.pp * c.dp * c.cp);
    let req = SearchRequest {
        gpus,
        global_batch,
        seq,
        pins: Pins {
            tp: Some(c.tp),
            pp: Some(c.pp),
            dp: Some(c.dp),
            micro_batch: Some(c.micro_batch),
            zero: Some(c.zero),
            recompute: Some(c.recompute),
            schedule: Some(c.schedule),
            virtual_stages: Some(c.v),
            sequence_parallel: Some(c.sp),
            precision: Some(c.precision),
            stage_layers: None,
            attention: (c.cp > 1).then_some(AttentionKernel::Fused),
            kernels: None,
            cp: Some(c.cp),
            ep: Some(c.ep),
            engine: None,
            target: false,
            dp_comm: Default::default(),
        },
        top_k: 0,
    };
    let r = search(&info, &cluster, &req, &mut |_, _| {})
        .unwrap()
        .unwrap_or_else(|_| panic!("{c:?} does not fit"));
    let model_ref = ModelRef::of("config", model, &info);
    Plan::new(
        model_ref,
        &info,
        &cluster,
        gpus,
        &r.best,
        SearchSummary {
            candidates_evaluated: r.candidates_evaluated,
            candidates_pruned: r.candidates_pruned,
            target: None,
        },
        vec![],
    )
}

pub fn programs(model: &str, c: &Config) -> ProgramSet {
    let p = plan(model, c);
    let s = &p.strategy;
    assert_eq!(
        (
            s.tp,
            s.pp,
            s.dp,
            s.zero,
            s.sequence_parallel,
            s.virtual_stages,
            s.cp
        ),
        (c.tp, c.pp, c.dp, c.zero, c.sp, c.v, c.cp),
        "the search did not keep the pins"
    );
    codegen::generate(&p).unwrap().0
}

/// The text every test trains on.
pub fn text() -> Tokens {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/tiny.txt");
    Tokens::load(std::path::Path::new(path)).unwrap()
}

pub struct Run {
    pub losses: Vec<f64>,
    pub params: Vec<Tensor32>,
}

pub fn train(set: &ProgramSet, steps: u64, seed: u64) -> Run {
    train_with(set, steps, seed, false)
}

/// [`train`], in reproducible mode or not.
pub fn train_with(set: &ProgramSet, steps: u64, seed: u64, reproducible: bool) -> Run {
    let opts = TrainOptions {
        steps,
        seed,
        init: Init::Seed(seed),
        timeout: Duration::from_secs(60),
        checkpoint: None,
        reproducible,
        dp_comm: Default::default(),
        device: Default::default(),
        op_times: false,
    };
    let outs = train_threads(set, &text(), &opts, &|_, _| {}).unwrap();
    let states: Vec<_> = outs.iter().flat_map(|o| o.states.clone()).collect();
    for o in &outs {
        assert_eq!(o.losses, outs[0].losses, "ranks disagree on the loss");
    }
    Run {
        losses: outs[0].losses.clone(),
        params: assemble(&set.params, &states, Field::Weight),
    }
}

/// Largest relative difference of the losses.
pub fn loss_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs())
        .fold(0.0, f64::max)
}

/// Whether element `i` of parameter `name` is an attention key bias: its gradient is zero
/// in exact arithmetic (softmax is invariant to adding `q·b` to every score of a row), so its
/// computed gradient is f32 rounding noise, which Adam normalizes to steps of up to `lr`.
pub fn key_bias(name: &str, i: usize, hidden: usize) -> bool {
    name.ends_with("attn.c_attn.bias") && (hidden..2 * hidden).contains(&i)
}

/// Largest parameter difference relative to each tensor's largest magnitude, and the largest
/// absolute difference, over elements `skip` does not exclude.
pub fn param_diff_where(
    names: &[String],
    a: &[Tensor32],
    b: &[Tensor32],
    skip: &dyn Fn(&str, usize) -> bool,
) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut rel, mut abs) = (0f64, 0f64);
    for ((x, y), name) in a.iter().zip(b).zip(names) {
        assert_eq!(x.shape, y.shape);
        let scale = y.data.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        for (i, (p, q)) in x.data.iter().zip(&y.data).enumerate() {
            if skip(name, i) {
                continue;
            }
            rel = rel.max(f64::from((p - q).abs() / scale));
            abs = abs.max(f64::from((p - q).abs()));
        }
    }
    (rel, abs)
}

/// [`param_diff_where`] over every element: (relative, absolute).
pub fn param_diff(names: &[String], a: &[Tensor32], b: &[Tensor32]) -> (f64, f64) {
    param_diff_where(names, a, b, &|_, _| false)
}

/// Largest per-tensor ‖a − b‖₂ / ‖b‖₂.
pub fn param_norm_diff(a: &[Tensor32], b: &[Tensor32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d: f64 = x
                .data
                .iter()
                .zip(&y.data)
                .map(|(p, q)| f64::from(p - q).powi(2))
                .sum();
            let n: f64 = y.data.iter().map(|q| f64::from(*q).powi(2)).sum();
            (d / n.max(1e-300)).sqrt()
        })
        .fold(0.0, f64::max)
}
