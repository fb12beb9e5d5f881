//! `TrainOptions::op_times`: each rank's wall time per instruction kind, the first step left
//! out as a warm-up; the kinds' times add up to no more than the steps' wall time.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Config, MODEL, programs, text};
use runtime::exec::Init;
use runtime::train::{TrainOptions, train_threads};

/// `steps` steps on `device`, each rank's time per instruction kind recorded.
fn timed(steps: u64, device: runtime::train::Device) -> TrainOptions {
    TrainOptions {
        steps,
        seed: 7,
        init: Init::Seed(7),
        timeout: Duration::from_secs(60),
        checkpoint: None,
        reproducible: false,
        dp_comm: Default::default(),
        device,
        op_times: true,
    }
}

#[test]
fn op_times_account_for_the_steps_after_the_first() {
    let set = programs(MODEL, &Config::new(1, 1, 2));
    let opts = timed(4, runtime::train::Device::Cpu);
    let outs = train_threads(&set, &text(), &opts, &|_, _| {}).unwrap();
    for o in &outs {
        let t = o.op_times.as_ref().unwrap();
        assert_eq!(t.steps, 3, "the first of 4 steps is a warm-up");
        let summed: f64 = t.by_kind.values().map(|&(_, s)| s).sum();
        assert!(
            summed > 0.0 && summed <= t.total_s,
            "{summed} of {}",
            t.total_s
        );
        // Every step runs the same instructions: calls are a multiple of the steps.
        for (k, &(calls, _)) in &t.by_kind {
            assert_eq!(calls % t.steps, 0, "{k}: {calls} calls");
        }
        for k in ["linear", "grad.linear", "all_reduce (dp)", "adamw"] {
            assert!(
                t.by_kind.contains_key(k),
                "no {k} in {:?}",
                t.by_kind.keys()
            );
        }
        let table = t.table(None);
        assert!(
            table.contains("grad.linear") && table.contains("step"),
            "{table}"
        );
    }
    // Not asked for: not recorded.
    let outs = train_threads(
        &set,
        &text(),
        &TrainOptions {
            op_times: false,
            ..opts
        },
        &|_, _| {},
    )
    .unwrap();
    assert!(outs.iter().all(|o| o.op_times.is_none()));
}

/// The plan's predicted seconds by kind (`predicted.stages[].kernel_s`) name the kinds the
/// runtime times (the op mnemonics, `grad.` before a backward's, `adamw`), so `--op-times`
/// sets each measurement beside its prediction.
#[test]
fn the_prediction_by_kind_names_the_kinds_the_runtime_times() {
    let config = Config::new(1, 1, 1);
    let plan = common::plan(MODEL, &config);
    let m = import::load_model(MODEL, 1, Some(plan.strategy.seq)).unwrap();
    let info = planner::ModelInfo::new(&m.graph).unwrap();
    let predicted = planner::estimate::estimate_traced(
        &info,
        &plan.cluster,
        plan.gpus,
        &plan.strategy,
        planner::Pricing::SEARCH,
    )
    .unwrap()
    .predicted
    .stages[0]
        .kernel_s
        .clone();
    let opts = timed(2, runtime::train::Device::Cpu);
    let set = common::programs(MODEL, &config);
    let outs = train_threads(&set, &text(), &opts, &|_, _| {}).unwrap();
    let measured = outs[0].op_times.as_ref().unwrap();
    let core = [
        "linear",
        "grad.linear",
        "attention",
        "grad.attention",
        "layernorm",
        "adamw",
    ];
    for k in core {
        assert!(
            predicted.contains_key(k),
            "predicted: {:?}",
            predicted.keys()
        );
        assert!(
            measured.by_kind.contains_key(k),
            "measured: {:?}",
            measured.by_kind.keys()
        );
    }
    let table = measured.table(Some(&predicted));
    let line = table.lines().find(|l| l.starts_with("linear ")).unwrap();
    let last: f64 = line.split_whitespace().last().unwrap().parse().unwrap();
    assert!((last - 1e3 * predicted["linear"]).abs() < 0.01, "{line}");
    assert!(
        table.lines().next().unwrap().ends_with("predicted ms"),
        "{table}"
    );
}

/// On a device that counts its launches (the dry device here), each kind's kernel launches
/// and the bytes they were handed are recorded too: over the timed steps they are every
/// launch of those steps.
#[test]
fn a_counting_device_s_launches_are_shared_out_by_kind() {
    let config = Config {
        cluster: "dgx-h100",
        precision: planner::Precision::Bf16,
        ..Config::new(1, 1, 1)
    };
    let set = common::programs(MODEL, &config);
    let opts = timed(3, runtime::train::Device::Dry);
    let outs = train_threads(&set, &text(), &opts, &|_, _| {}).unwrap();
    let t = outs[0].op_times.as_ref().unwrap();
    let last = outs[0].launches_last_step.as_ref().unwrap();
    let launches: u64 = t.launches.values().map(|&(n, _)| n).sum();
    let bytes: u64 = t.launches.values().map(|&(_, b)| b).sum();
    assert_eq!(
        (launches, bytes),
        (t.steps * last.launches(), t.steps * last.bytes())
    );
    assert!(t.launches["grad.linear"].0 >= t.by_kind["grad.linear"].0);
    let table = t.table(None);
    assert!(table.lines().next().unwrap().contains("GB/step"), "{table}");
}
