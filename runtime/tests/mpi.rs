//! The MPI communicator under `mpirun -np 4` (feature `mpi`): runs `plait-mpi-check` and reads
//! each rank's verdict. Skipped with a note when `mpirun` is not installed.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RANKS: usize = 4;

fn mpirun_available() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "note: skipping the MPI test: `mpirun` is not installed (apt install openmpi-bin)"
        );
    }
    ok
}

/// Runs the check program on `RANKS` ranks in `mode`, killing it after `limit`; returns
/// (exit success, stdout + stderr).
fn mpirun(mode: &str, limit: Duration) -> (bool, String) {
    // One job at a time: three jobs of 4 busy-polling ranks on a 2-core machine starve each
    // other past their deadlines.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(RANKS.to_string())
        .arg(env!("CARGO_BIN_EXE_plait-mpi-check"))
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        status.is_some(),
        "mpirun {mode} hung past {limit:?}:\n{text}"
    );
    (status.is_some_and(|s| s.success()), text)
}

#[test]
fn collectives_match_the_sequential_reference_on_4_ranks() {
    if !mpirun_available() {
        return;
    }
    let (ok, out) = mpirun("conformance", Duration::from_secs(120));
    assert!(ok, "{out}");
    for r in 0..RANKS {
        assert!(out.contains(&format!("rank {r}: ok")), "rank {r}:\n{out}");
    }
}

#[test]
fn a_rank_that_skips_a_collective_is_named_within_the_deadline() {
    if !mpirun_available() {
        return;
    }
    let (ok, out) = mpirun("timeout", Duration::from_secs(60));
    assert!(ok, "{out}");
    for r in 0..RANKS - 1 {
        assert!(
            out.contains(&format!("rank {r}: ok: timed out")) && out.contains("world rank 3)"),
            "rank {r}:\n{out}"
        );
    }
}

#[test]
fn a_rank_that_dies_ends_the_job_and_is_named() {
    if !mpirun_available() {
        return;
    }
    let (ok, out) = mpirun("die", Duration::from_secs(60));
    assert!(!ok, "the job should fail:\n{out}");
    // Open MPI names the dead process as `[[job,1],3]`; ranks that reached their deadline
    // first name it too.
    assert!(
        out.contains(",1],3]") || out.contains("world rank 3)"),
        "{out}"
    );
}
