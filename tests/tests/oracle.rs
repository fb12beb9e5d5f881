//! Independent oracles and dropout: the single-rank run's first loss equals the f64
//! interpreter's on the unsharded graph (the whole global batch at once, same weights, same
//! tokens), with dropout 0 and with GPT-2's default dropout 0.1 (masks on global element
//! indices); and with dropout 0.1, data, pipeline and tensor/sequence parallel runs still
//! equal one device.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::{Config, GLOBAL_BATCH, SEQ, loss_diff, plan, programs, text, train};
use runtime::exec::Init;

const DROPOUT_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/tiny-gpt2-dropout.json"
);

fn interp_first_loss(model: &str, seed: u64) -> f64 {
    let c = Config::new(1, 1, 1);
    let p = plan(model, &c);
    let set = codegen::generate(&p).unwrap().0;
    let graph = codegen::load_graph(&p).unwrap();
    let init = Init::Seed(seed);
    let weights: ir::Weights = set
        .params
        .iter()
        .map(|pi| (pi.name.clone(), init.full(pi).unwrap().to_ir()))
        .collect();
    let b = text()
        .batch(seed, 1, GLOBAL_BATCH as usize, SEQ as usize)
        .unwrap();
    let tok = |v: &[u32]| ir::Tensor {
        shape: vec![b.rows, b.seq],
        data: v.iter().map(|&t| f64::from(t)).collect(),
    };
    let inputs = BTreeMap::from([
        ("input_ids".to_string(), tok(&b.input_ids)),
        ("targets".to_string(), tok(&b.targets)),
    ]);
    let env = ir::interp::Env {
        weights: &weights,
        inputs: &inputs,
        binding: ir::Binding {
            batch: GLOBAL_BATCH,
            seq: SEQ,
        },
    };
    let ev = ir::interp::evaluate(&graph, &env).unwrap();
    ev.output("loss").unwrap().data[0]
}

/// gpt-oss's tiny config: a sliding window of 8 keys (of 32) on layer 0, full attention on
/// layer 1; the program lowers layer 0 once and gives each layer its own window.
const WINDOWED_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-gpt_oss.json");

/// Gemma 3's tiny config: layer 0 in a window rotating by rope_local_base_freq unscaled, layer
/// 1 full rotating by rope_theta with linear scaling; each layer instance its own rotary.
const LOCAL_ROPE_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/tiny-gemma3_text.json"
);

/// SmolLM3's tiny config: layer 0 rotated with full attention, layer 1 unrotated (NoPE) in a
/// window of 8 keys; Cohere2's and EXAONE 4's: layer 0 rotated in a window of 8, layer 1
/// unrotated and full.
const NOPE_MODELS: [&str; 3] = [
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-smollm3.json"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-cohere2.json"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-exaone4.json"),
];

/// Llama 4's tiny config: layers 0 and 2 rotated, q/k L2-normed and attending in chunks of 8
/// keys (of 32) with dense MLPs; layers 1 and 3 unrotated, attending to every earlier key, their
/// queries scaled by the attention temperature (floor 8, scale 0.5) from position 7 on, with
/// top-1 experts whose gate scales their input beside a shared expert.
const LLAMA4_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-llama4.json");

/// OLMo 1's tiny config: LayerNorms of neither weight nor bias composed of means and
/// elementwise ops (their gradients spread over the hidden axis), q, k and v clamped to ±0.2
/// (about a fifth of them clamped at this initialization).
const OLMO_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-olmo.json");

/// NanoChat's tiny config: weightless RMSNorms composed of means (the embedding's too), q and
/// k normed per head after the rotary, a squared-ReLU MLP and logits capped at 15.
const NANOCHAT_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-nanochat.json");

#[test]
fn first_loss_equals_the_interpreter() {
    for model in [
        common::MODEL,
        DROPOUT_MODEL,
        WINDOWED_MODEL,
        LOCAL_ROPE_MODEL,
        NOPE_MODELS[0],
        NOPE_MODELS[1],
        NOPE_MODELS[2],
        LLAMA4_MODEL,
        OLMO_MODEL,
        NANOCHAT_MODEL,
    ] {
        let want = interp_first_loss(model, 7);
        let got = train(&programs(model, &Config::new(1, 1, 1)), 1, 7).losses[0];
        let d = (got - want).abs() / want.abs();
        println!("{model}: runtime {got}, interpreter {want}, relative {d:.2e}");
        assert!(d <= 1e-5, "{model}: {got} vs {want}");
    }
}

#[test]
fn dropout_masks_agree_across_layouts() {
    let steps = 4;
    let reference = train(&programs(DROPOUT_MODEL, &Config::new(1, 1, 1)), steps, 7);
    let mut tp = Config::new(2, 1, 1);
    tp.sp = true;
    for (name, c) in [
        ("dp2", Config::new(1, 1, 2)),
        ("pp2", Config::new(1, 2, 1)),
        ("tp2_sp", tp),
    ] {
        let run = train(&programs(DROPOUT_MODEL, &c), steps, 7);
        let d = loss_diff(&run.losses, &reference.losses);
        println!("dropout 0.1, {name}: {steps} steps, max relative loss difference {d:.2e}");
        assert!(
            d <= 1e-5,
            "{name}: {:?} vs {:?}",
            run.losses,
            reference.losses
        );
    }
}
