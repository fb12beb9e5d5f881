//! `plait-mpi-check MODE`: the MPI communicator's checks, run by `tests/mpi.rs` under
//! `mpirun --allow-run-as-root --oversubscribe -np 4`. Each rank prints `rank R: ok ...` or
//! `rank R: FAILED ...`; the exit status is non-zero on failure.
//!
//! - `conformance`: every collective and send/recv against sequential references, on the
//!   world and on subgroups (evens, odds, a reordered group), several lengths.
//! - `timeout`: the last rank skips an all-reduce; every other rank must fail within the
//!   two-second deadline with an error naming it.
//! - `die`: the last rank exits without finalising MPI; `mpirun` ends the job and names it
//!   (the other ranks' deadline is the fallback when the launcher does not).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use runtime::comm::conformance::check_all;
use runtime::comm::mpi::{MpiComm, MpiWorld};
use runtime::{Communicator, RuntimeError};

const LENS: [usize; 5] = [0, 1, 7, 1000, 4099];

fn conformance(world: &MpiComm) -> Result<String, String> {
    let n = world.size();
    check_all(world, &LENS).map_err(|e| format!("world: {e}"))?;
    let me = world.rank();
    let evens: Vec<usize> = (0..n).filter(|r| r % 2 == 0).collect();
    let odds: Vec<usize> = (0..n).filter(|r| r % 2 == 1).collect();
    let mine = if me.is_multiple_of(2) { &evens } else { &odds };
    let g = world.group(mine).map_err(|e| e.to_string())?;
    check_all(&g, &LENS).map_err(|e| format!("group {mine:?}: {e}"))?;
    let reversed: Vec<usize> = (0..n).rev().collect();
    let r = world.group(&reversed).map_err(|e| e.to_string())?;
    check_all(&r, &LENS[..4]).map_err(|e| format!("group {reversed:?}: {e}"))?;
    world.barrier().map_err(|e| e.to_string())?;
    Ok(format!(
        "{} collective checks passed on 3 groups",
        LENS.len()
    ))
}

fn timeout(world: &mut MpiComm, die: bool) -> Result<String, String> {
    let last = world.size() - 1;
    world.set_timeout(Duration::from_secs(2));
    if world.rank() == last {
        if die {
            // Dies without finalising MPI: `mpirun` reports it and ends the job.
            std::process::exit(3);
        }
        // Absent from the all-reduce; stay alive past the others' deadline.
        // Long past the deadline, so a loaded machine (CI runs 4 ranks on 2 cores) still
        // separates "timed out" from "the rank came late".
        std::thread::sleep(Duration::from_secs(12));
        return Ok("skipped the all-reduce".into());
    }
    let start = Instant::now();
    let mut buf = vec![1.0f32; 1000];
    match world.all_reduce_sum(&mut buf) {
        Ok(()) => Err("the all-reduce succeeded without the last rank".into()),
        Err(e @ RuntimeError::Timeout { .. }) => {
            let took = start.elapsed();
            let named = e.to_string().contains(&format!("world rank {last})"));
            if named && took < Duration::from_secs(10) {
                Ok(format!("timed out after {took:?} naming rank {last}: {e}"))
            } else {
                Err(format!(
                    "after {took:?}, the error does not name rank {last}: {e}"
                ))
            }
        }
        Err(e) => Err(format!("unexpected error: {e}")),
    }
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let world = match MpiWorld::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("MPI init failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut comm = world.communicator();
    let rank = comm.rank();
    let result = match mode.as_str() {
        "conformance" => conformance(&comm),
        "timeout" => timeout(&mut comm, false),
        "die" => timeout(&mut comm, true),
        other => Err(format!(
            "unknown mode `{other}` (conformance, timeout, die)"
        )),
    };
    match result {
        Ok(msg) => {
            println!("rank {rank}: ok: {msg}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            println!("rank {rank}: FAILED: {msg}");
            ExitCode::FAILURE
        }
    }
}
