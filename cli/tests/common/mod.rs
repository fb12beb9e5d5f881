//! Shared helpers for the `plait report` tests: run the binary, compile small plans.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// Runs plait; returns (exit code, stdout, stderr), failing the test on a panic.
pub fn plait(args: &[&str]) -> (i32, String, String) {
    plait_env(args, &[])
}

/// [`plait`] with the environment variables `env` set.
pub fn plait_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_plait"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("plait runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "plait panicked: {stderr}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

/// A fresh per-test directory.
pub fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("plait-report-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub const GPT2_AUTO: [&str; 9] = [
    "gpt2",
    "--cluster",
    "dgx-a100-80gb",
    "--gpus",
    "8",
    "--global-batch",
    "32",
    "--seq",
    "1024",
];

pub const PINNED_PIPELINE: [&str; 6] = ["--tp", "2", "--pp", "2", "--dp", "2"];

/// The cluster of the 64-H100 sweeps (8 DGX H100 nodes), global batch 128.
pub const H100_64: [&str; 6] = [
    "--cluster",
    "dgx-h100",
    "--gpus",
    "64",
    "--global-batch",
    "128",
];

/// Compiles gpt2 (with extra pins) into `dir/name`, returning the path.
pub fn compile(test: &str, name: &str, extra: &[&str]) -> PathBuf {
    let path = dir(test).join(name);
    let p = path.to_string_lossy().to_string();
    let mut args = vec!["compile"];
    args.extend(GPT2_AUTO);
    args.extend(extra);
    args.extend(["-o", &p]);
    let (code, _, stderr) = plait(&args);
    assert_eq!(code, 0, "compile failed: {stderr}");
    path
}
