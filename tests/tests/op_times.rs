//! `TrainOptions::op_times`: each rank's wall time per instruction kind, the first step left
//! out as a warm-up; the kinds' times add up to no more than the steps' wall time.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Config, MODEL, programs, text};
use runtime::exec::Init;
use runtime::train::{TrainOptions, train_threads};

#[test]
fn op_times_account_for_the_steps_after_the_first() {
    let set = programs(MODEL, &Config::new(1, 1, 2));
    let opts = TrainOptions {
        steps: 4,
        seed: 7,
        init: Init::Seed(7),
        timeout: Duration::from_secs(60),
        checkpoint: None,
        reproducible: false,
        dp_comm: Default::default(),
        device: Default::default(),
        op_times: true,
    };
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
        let table = t.table();
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
