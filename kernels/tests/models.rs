//! Whole tiny models: the training graph (forward, backward, AdamW) executed op by op with the
//! f32 kernels for 3 steps, against the f64 reference interpreter from the same (f32-rounded)
//! starting point. Loss, every gradient and every updated parameter (and AdamW moment) agree
//! within 1e-5 (tensor-wise relative), each implementation following its own trajectory.
//!
//! One exception, by construction of AdamW rather than of the kernels: a gradient element whose
//! magnitude is below 1e-5 of its tensor's scale (GPT-2's key bias, whose gradient is exactly 0
//! because softmax ignores a per-row shift; barely routed expert weights) is rounding noise
//! in either implementation (~1e-17 in f64, ~1e-9 in f32), and m/√v turns noise of any size into a full
//! ±lr step. Such elements are excluded from the parameter comparison once seen (exact zeros in both, such as
//! unused embedding rows, move both alike and stay compared) (their gradient
//! still is compared, within the tolerance), and their count is reported.

mod common;

use std::collections::BTreeMap;

use common::{rel_err, round};
use ir::autodiff::training_graph;
use ir::testing::{Rng, TinyConfig, random_batch, random_weights, tiny_gpt2, tiny_llama};
use ir::{AdamWConfig, Binding, Graph, OpKind, Tensor, ValueId};
use kernels::Tensor32;
use kernels::exec;

const TOL: f64 = 1e-5;
const STEPS: u32 = 3;
const BIND: Binding = Binding { batch: 2, seq: 6 };

type Named<T> = BTreeMap<String, T>;

/// One training run's state: parameters and optimizer moments by parameter name.
struct State<T> {
    params: Named<T>,
    m: Named<T>,
    v: Named<T>,
}

fn to32(map: &Named<Tensor>) -> Named<Tensor32> {
    map.iter()
        .map(|(k, t)| (k.clone(), Tensor32::from_ir(t)))
        .collect()
}

/// The gradient value the AdamW update of `param.NAME` reads, if the parameter has one.
fn grad_of(train: &Graph, name: &str) -> Option<ValueId> {
    let v = train.output(&format!("param.{name}"))?;
    let op = train.op(train.def_op(v));
    matches!(op.kind, OpKind::AdamW(_)).then(|| op.inputs[1])
}

/// max |got − want| over the elements not in `skip`, relative to the tensor's scale.
fn masked_rel_err(got: &[f64], want: &[f64], skip: &[bool]) -> f64 {
    let diff = got
        .iter()
        .zip(want)
        .zip(skip)
        .filter(|(_, s)| !**s)
        .map(|((a, b), _)| (a - b).abs())
        .fold(0.0, f64::max);
    diff / want.iter().map(|v| v.abs()).fold(1e-6, f64::max)
}

fn check_model(name: &str, forward: &Graph, seed: u64) {
    let cfg = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    let train = training_graph(forward, cfg).expect("training graph builds");
    let mut rng = Rng::new(seed);
    let weights: Named<Tensor> = random_weights(forward, &mut rng, 0.3)
        .iter()
        .map(|(k, t)| (k.clone(), round(t)))
        .collect();
    let zeros = |w: &Named<Tensor>| {
        w.iter()
            .map(|(k, t)| (k.clone(), Tensor::zeros(&t.shape)))
            .collect::<Named<Tensor>>()
    };
    let mut reference = State {
        m: zeros(&weights),
        v: zeros(&weights),
        params: weights.clone(),
    };
    let mut ours = State {
        params: to32(&reference.params),
        m: to32(&reference.m),
        v: to32(&reference.v),
    };
    let mut worst: f64 = 0.0;
    // Per parameter, the elements whose update direction is noise (see the module docs).
    let mut skips: Named<Vec<bool>> = BTreeMap::new();
    for step in 1..=STEPS {
        let batch = random_batch(&mut rng, BIND, 11);
        let feed = |m: &Named<Tensor>, v: &Named<Tensor>| {
            let mut inputs = batch.clone();
            inputs.insert("step".into(), Tensor::scalar(f64::from(step)));
            for (k, t) in m {
                inputs.insert(format!("m.{k}"), t.clone());
            }
            for (k, t) in v {
                inputs.insert(format!("v.{k}"), t.clone());
            }
            inputs
        };
        let ref_inputs = feed(&reference.m, &reference.v);
        let env = ir::interp::Env {
            weights: &reference.params,
            inputs: &ref_inputs,
            binding: BIND,
        };
        let want =
            ir::interp::evaluate(&train, &env).unwrap_or_else(|e| panic!("{name}: reference: {e}"));

        let mut our_inputs = to32(&batch);
        our_inputs.insert("step".into(), Tensor32::scalar(step as f32));
        for (k, t) in &ours.m {
            our_inputs.insert(format!("m.{k}"), t.clone());
        }
        for (k, t) in &ours.v {
            our_inputs.insert(format!("v.{k}"), t.clone());
        }
        let env = exec::Env {
            weights: &ours.params,
            inputs: &our_inputs,
            binding: BIND,
        };
        let got = exec::evaluate(&train, &env).unwrap_or_else(|e| panic!("{name}: kernels: {e}"));

        let compare = |what: &str, out: &str, skip: &[bool]| -> f64 {
            let g = got
                .output(out)
                .unwrap_or_else(|| panic!("{name}: no output {out}"))
                .to_ir();
            let w = want
                .output(out)
                .unwrap_or_else(|| panic!("{name}: no reference output {out}"));
            let e = masked_rel_err(&g.data, &w.data, skip);
            assert!(
                e <= TOL,
                "{name} step {step}: {what} `{out}` relative error {e:e}"
            );
            e
        };
        worst = worst.max(compare("loss", "loss", &[false]));
        for k in weights.keys() {
            let n = weights[k].data.len();
            let skip = skips.entry(k.clone()).or_insert_with(|| vec![false; n]);
            if let Some(gv) = grad_of(&train, k) {
                let (Some(g), w) = (got.value(gv), want.value(gv)) else {
                    panic!("{name}: gradient of {k} not computed");
                };
                let e = rel_err(&g.to_ir().data, &w.data);
                assert!(
                    e <= TOL,
                    "{name} step {step}: gradient of `{k}` relative error {e:e}"
                );
                worst = worst.max(e);
                let scale = w.data.iter().fold(0.0f64, |a, v| a.max(v.abs()));
                // An exact zero in both (an unused embedding row) moves both alike; noise does
                // not, and the parameter then stays apart for the rest of the run.
                for ((s, &wi), &gi) in skip.iter_mut().zip(&w.data).zip(&g.data) {
                    *s |= wi.abs() <= TOL * scale && !(wi == 0.0 && gi == 0.0);
                }
            }
            let skip = skip.clone();
            for (prefix, r, o) in [
                ("param", &mut reference.params, &mut ours.params),
                ("m", &mut reference.m, &mut ours.m),
                ("v", &mut reference.v, &mut ours.v),
            ] {
                let out = format!("{prefix}.{k}");
                let e = compare(prefix, &out, &skip);
                if prefix == "param" {
                    worst = worst.max(e);
                }
                let (Some(w), Some(g)) = (want.output(&out), got.output(&out)) else {
                    panic!("{name}: missing {out}");
                };
                r.insert(k.clone(), w.clone());
                o.insert(k.clone(), g.clone());
            }
        }
        eprintln!(
            "{name} step {step}: loss ref {:.9} ours {:.9}",
            want.output("loss").map_or(f64::NAN, |t| t.data[0]),
            got.output("loss").map_or(f32::NAN, |t| t.data[0])
        );
    }
    let skipped: usize = skips
        .values()
        .map(|s| s.iter().filter(|&&b| b).count())
        .sum();
    let total: usize = weights.values().map(|t| t.data.len()).sum();
    for (k, s) in &skips {
        let n = s.iter().filter(|&&b| b).count();
        if n > 0 {
            eprintln!(
                "{name}: `{k}`: {n} of {} elements have a noise-level gradient",
                s.len()
            );
        }
    }
    // The exclusion stays an exception: most of the model is compared.
    assert!(
        skipped * 10 < total,
        "{name}: {skipped} of {total} elements excluded"
    );
    eprintln!(
        "{name}: {STEPS} AdamW steps, worst relative error over loss, gradients and parameters {worst:.2e} ({skipped} of {total} parameter elements with noise-level gradients excluded)"
    );
}

#[test]
fn gpt2_with_dropout_trains_like_the_reference() {
    let cfg = TinyConfig {
        dropout: 0.1,
        ..TinyConfig::gpt2()
    };
    let g = tiny_gpt2(&cfg).expect("builds");
    check_model("gpt2", &g, 11);
}

#[test]
fn llama_trains_like_the_reference() {
    let g = tiny_llama(&TinyConfig::llama()).expect("builds");
    check_model("llama", &g, 12);
}

#[test]
fn llama_moe_trains_like_the_reference() {
    let cfg = TinyConfig {
        moe: Some((4, 2)),
        ..TinyConfig::llama()
    };
    let g = tiny_llama(&cfg).expect("builds");
    check_model("llama-moe", &g, 13);
}
