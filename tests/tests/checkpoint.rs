//! Checkpoints: 10 steps, a checkpoint, then a resumed run of 10 more gives the same loss
//! trajectory bit for bit as 20 straight steps; and a checkpoint written under DP2 resumes
//! under TP2 x PP2 (resharding) with the losses of an uninterrupted DP2 run; compressed and
//! local-SGD runs resume bit for bit on their own mesh.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use codegen::ProgramSet;
use common::{Config, MODEL, loss_diff, programs, text};
use runtime::exec::Init;
use runtime::exec::dp_comm::{DpComm, DpSync, GradCompression};
use runtime::train::{CheckpointOptions, TrainOptions, train_threads};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("plait-ckpt-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

fn losses(set: &ProgramSet, steps: u64, ckpt: Option<CheckpointOptions>) -> Vec<f64> {
    losses_with(set, steps, ckpt, DpComm::default())
}

fn losses_with(
    set: &ProgramSet,
    steps: u64,
    ckpt: Option<CheckpointOptions>,
    dp_comm: DpComm,
) -> Vec<f64> {
    let opts = TrainOptions {
        steps,
        seed: 7,
        init: Init::Seed(7),
        timeout: Duration::from_secs(60),
        checkpoint: ckpt,
        reproducible: false,
        dp_comm,
        device: Default::default(),
        op_times: false,
    };
    train_threads(set, &text(), &opts, &|_, _| {}).unwrap()[0]
        .losses
        .clone()
}

#[test]
fn resume_continues_bit_identically() {
    let mut c = Config::new(1, 2, 2);
    c.zero = 1;
    let set = programs(MODEL, &c);
    let straight = losses(&set, 20, None);
    let d = dir("resume");
    let ck = |resume| {
        Some(CheckpointOptions {
            dir: d.clone(),
            every: 5,
            resume,
        })
    };
    let mut two = losses(&set, 10, ck(false));
    assert!(d.join("latest").exists());
    two.extend(losses(&set, 20, ck(true)));
    std::fs::remove_dir_all(&d).ok();
    assert_eq!(two.len(), 20);
    assert_eq!(two, straight, "resumed trajectory differs");
}

/// Top-k's and int8's residuals and local SGD's diverged replicas are checkpointed too: a
/// resume in the middle of any (step 5 of 10; local SGD averages at 4 and 8) continues bit
/// for bit.
#[test]
fn compressed_and_local_sgd_runs_resume_bit_identically() {
    let set = programs(MODEL, &Config::new(1, 1, 2));
    let modes = [
        DpComm {
            compression: GradCompression::TopK(0.01),
            sync: DpSync::Sync,
        },
        DpComm {
            compression: GradCompression::Int8,
            sync: DpSync::Sync,
        },
        DpComm {
            compression: GradCompression::None,
            sync: DpSync::LocalSgd { every: 4 },
        },
    ];
    for dp_comm in modes {
        let straight = losses_with(&set, 10, None, dp_comm);
        let d = dir(&format!(
            "resume-{}",
            dp_comm.describe().replace([' ', ':', '-'], "_")
        ));
        let ck = |resume| {
            Some(CheckpointOptions {
                dir: d.clone(),
                every: 5,
                resume,
            })
        };
        let mut two = losses_with(&set, 5, ck(false), dp_comm);
        two.extend(losses_with(&set, 10, ck(true), dp_comm));
        std::fs::remove_dir_all(&d).ok();
        assert_eq!(
            two,
            straight,
            "{}: resumed trajectory differs",
            dp_comm.describe()
        );
    }
}

#[test]
fn a_dp2_checkpoint_resumes_under_tp2_pp2() {
    let dp2 = programs(MODEL, &Config::new(1, 1, 2));
    let mut c = Config::new(2, 2, 1);
    c.sp = true;
    let tp_pp = programs(MODEL, &c);
    let straight = losses(&dp2, 20, None);
    let d = dir("reshard");
    let ck = |resume| {
        Some(CheckpointOptions {
            dir: d.clone(),
            every: 0,
            resume,
        })
    };
    let mut two = losses(&dp2, 10, ck(false));
    two.extend(losses(&tp_pp, 20, ck(true)));
    std::fs::remove_dir_all(&d).ok();
    let diff = loss_diff(&two, &straight);
    println!(
        "DP2 10 steps + TP2xPP2 10 steps vs DP2 20 steps: max relative loss difference {diff:.2e}"
    );
    assert_eq!(two.len(), 20);
    assert!(diff <= 1e-5, "{two:?} vs {straight:?}");
}

/// A vocabulary of 250 at tp 4 is padded to 63 rows per rank (the last rank's table and head
/// end in 2 zero rows): a checkpoint written under TP4 x DP2 with ZeRO-3 holds the unpadded
/// tensors and resumes under DP2 with the losses of an uninterrupted DP2 run.
#[test]
fn a_padded_vocabulary_checkpoint_resumes_unpadded() {
    let d = dir("padded");
    std::fs::create_dir_all(&d).unwrap();
    let config = std::fs::read_to_string(MODEL).unwrap();
    let config = config.replace("\"vocab_size\": 256", "\"vocab_size\": 250");
    assert!(config.contains("250"));
    let model = d.join("gpt-v250.json");
    std::fs::write(&model, config).unwrap();
    padded_checkpoint_resumes(&d, &model.to_string_lossy());
}

/// Phi's biased head over a vocabulary of 251 at tp 4: the bias is padded with the head's
/// columns (63 per rank), and the checkpoint resumes unpadded under DP2 as above.
#[test]
fn a_padded_biased_head_checkpoint_resumes_unpadded() {
    let d = dir("padded-bias");
    std::fs::create_dir_all(&d).unwrap();
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tiny-phi-odd-vocab.json"
    );
    padded_checkpoint_resumes(&d, model);
}

/// `model` trained 6 steps under TP4 x DP2 with ZeRO-3 (its vocabulary padded), checkpointed
/// in `d`, then 6 more under DP2: the losses of 12 uninterrupted DP2 steps within 1e-5.
fn padded_checkpoint_resumes(d: &std::path::Path, model: &str) {
    let dp2 = programs(model, &Config::new(1, 1, 2));
    let mut c = Config::new(4, 1, 2);
    c.zero = 3;
    let padded = programs(model, &c);
    let pads = padded
        .templates
        .iter()
        .flat_map(|t| &t.shards)
        .any(|s| s.tp.is_some_and(|t| t.padded));
    assert!(pads, "no padded vocabulary shard");
    let ck_dir = d.join("ck");
    let ck = |resume| {
        Some(CheckpointOptions {
            dir: ck_dir.clone(),
            every: 0,
            resume,
        })
    };
    let straight = losses(&dp2, 12, None);
    let mut two = losses(&padded, 6, ck(false));
    two.extend(losses(&dp2, 12, ck(true)));
    std::fs::remove_dir_all(d).ok();
    let diff = loss_diff(&two, &straight);
    println!("{model}: TP4 (padded) 6 steps + DP2 6 steps vs DP2 12 steps: {diff:.2e}");
    assert_eq!(two.len(), 12);
    assert!(diff <= 1e-5, "{two:?} vs {straight:?}");
}

/// Trains with `ckpt` and returns the error and how many steps ran before it.
fn failing(set: &ProgramSet, ckpt: CheckpointOptions) -> (String, usize) {
    let opts = TrainOptions {
        steps: 3,
        seed: 7,
        init: Init::Seed(7),
        timeout: Duration::from_secs(60),
        checkpoint: Some(ckpt),
        reproducible: false,
        dp_comm: Default::default(),
        device: Default::default(),
        op_times: false,
    };
    let ran = std::sync::atomic::AtomicUsize::new(0);
    let on_step = |_: u32, _: runtime::train::StepLog| {
        ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let e = train_threads(set, &text(), &opts, &on_step).unwrap_err();
    (e.to_string(), ran.into_inner())
}

#[test]
fn an_unwritable_checkpoint_directory_fails_before_training() {
    let set = programs(MODEL, &Config::new(1, 1, 2));
    // A directory inside a regular file cannot be created.
    let file = dir("not-a-dir");
    std::fs::write(&file, b"a file").unwrap();
    let (e, ran) = failing(
        &set,
        CheckpointOptions {
            dir: file.join("ckpt"),
            every: 1,
            resume: false,
        },
    );
    std::fs::remove_file(&file).ok();
    println!("{e}");
    assert_eq!(ran, 0, "steps ran before the failure");
    assert!(
        e.contains("cannot create it") && e.contains("not-a-dir"),
        "{e}"
    );
}

#[test]
fn resuming_from_an_empty_directory_says_there_is_no_checkpoint() {
    let set = programs(MODEL, &Config::new(1, 1, 2));
    let d = dir("empty");
    let (e, ran) = failing(
        &set,
        CheckpointOptions {
            dir: d.clone(),
            every: 1,
            resume: true,
        },
    );
    std::fs::remove_dir_all(&d).ok();
    println!("{e}");
    assert_eq!(ran, 0);
    assert!(e.contains("no checkpoint here"), "{e}");
}
