//! `bench/device/check.sh` (issue 15's GPU acceptance in one run) fails fast and clearly where
//! it cannot run: exit 2 within seconds, naming what is missing, before building or training.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn the_device_check_refuses_at_once_without_a_gpu_or_binary() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out_dir = std::env::temp_dir().join(format!("plait-device-check-{}", std::process::id()));
    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg(format!("{root}/bench/device/check.sh"))
        .env("OUT", &out_dir)
        // A binary that is not there: on a GPU machine the check stops at it instead.
        .env("PLAIT", format!("{root}/bench/device/bin/no-such-plait"))
        .output()
        .expect("bash runs");
    let took = t0.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no NVIDIA GPU here") || err.contains("no-such-plait not found"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let _ = std::fs::remove_dir_all(out_dir);
}

/// `plait bench kernels` (check.sh's first row): on the CPU backend every case agrees (a dry
/// run of the command); `--device cuda` where CUDA cannot start exits 2 naming what to do.
#[test]
fn bench_kernels_runs_the_conformance_suite_and_refuses_a_missing_gpu() {
    let plait = env!("CARGO_BIN_EXE_plait");
    let out = Command::new(plait)
        .args(["bench", "kernels", "--device", "cpu", "--only", "attention"])
        .output()
        .expect("plait runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        // Attention plain, with gpt-oss's sinks, with them in a sliding window, and in
        // Llama 4's chunks (alone, and under a window with the sinks).
        text.contains("attention") && text.contains("all 5 cases agree"),
        "{text}"
    );

    let out = Command::new(plait)
        .args(["bench", "kernels", "--device", "cuda"])
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .expect("plait runs");
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // A CUDA build on a GPU machine: the suite ran there and passed.
        println!("a GPU is here: {}", String::from_utf8_lossy(&out.stdout));
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--features cuda") && err.contains("--device cpu"),
        "{err}"
    );
}
