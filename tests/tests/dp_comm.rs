//! The data-parallel replicas stay one model under communication-efficient exchanges: with a
//! compressed gradient exchange every rank applies the same update every step (its weights
//! equal bit for bit), and under local SGD the replicas drift between averages and agree again
//! at each one.

mod common;

use std::time::Duration;

use common::{Config, programs, text};
use runtime::exec::dp_comm::{DpComm, DpSync, GradCompression};
use runtime::exec::init::Init;
use runtime::train::{TrainOptions, train_threads};

/// Every rank's weights after `steps` (ranks in order).
fn weights(d: DpComm, steps: u64) -> Vec<Vec<f32>> {
    let set = programs(common::MODEL, &Config::new(1, 1, 2));
    let opts = TrainOptions {
        steps,
        seed: 4,
        init: Init::Seed(4),
        timeout: Duration::from_secs(60),
        checkpoint: None,
        reproducible: false,
        dp_comm: d,
        device: Default::default(),
        op_times: false,
    };
    let outs = train_threads(&set, &text(), &opts, &|_, _| {}).expect("trains");
    outs.iter()
        .map(|o| {
            o.states
                .iter()
                .flat_map(|s| s.weight.data.clone())
                .collect()
        })
        .collect()
}

#[test]
fn compressed_exchanges_keep_the_replicas_identical() {
    for compression in [
        GradCompression::Bf16,
        GradCompression::Int8,
        GradCompression::TopK(0.05),
    ] {
        let d = DpComm {
            compression,
            sync: DpSync::Sync,
        };
        let w = weights(d, 3);
        assert_eq!(w.len(), 2);
        assert!(w[0] == w[1], "{compression:?}: the replicas differ");
    }
}

#[test]
fn local_sgd_replicas_drift_and_agree_at_each_average() {
    let every = |every| DpComm {
        compression: GradCompression::None,
        sync: DpSync::LocalSgd { every },
    };
    let between = weights(every(4), 3);
    assert!(between[0] != between[1], "no drift between averages");
    let at = weights(every(4), 4);
    assert!(at[0] == at[1], "the replicas differ right after an average");
}
