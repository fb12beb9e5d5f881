//! The measurements: matmul rate, copy bandwidth, and the threads communicator's α–β fit.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::{Communicator, RuntimeError, ThreadComm};

fn profile_err(message: String) -> RuntimeError {
    RuntimeError::Profile { message }
}

/// The best of `reps` timings of `f` (after one warm-up run).
fn best_of(
    reps: usize,
    mut f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<Duration, RuntimeError> {
    f()?;
    let mut best = Duration::MAX;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best.max(Duration::from_nanos(1)))
}

/// `kernels::sgemm` at `n`³ on the calling thread alone, GFLOP/s (best of `reps`).
pub fn sgemm_gflops(n: usize, reps: usize) -> Result<f64, RuntimeError> {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.2).collect();
    let mut c = vec![0f32; n * n];
    let t = best_of(reps, || {
        kernels::sgemm(black_box(&a), black_box(&b), &mut c, n, n, n)
            .map_err(RuntimeError::kernel("sgemm"))
    })?;
    black_box(&c);
    Ok(2.0 * (n as f64).powi(3) / t.as_secs_f64() / 1e9)
}

/// Aggregate copy bandwidth with `threads` threads each copying its own `bytes`-byte buffer,
/// GB/s counting bytes read plus bytes written (best of `reps`).
pub fn copy_gb_per_s(threads: usize, bytes: usize, reps: usize) -> Result<f64, RuntimeError> {
    let len = bytes / 4;
    let mut bufs: Vec<(Vec<f32>, Vec<f32>)> = (0..threads.max(1))
        .map(|i| (vec![i as f32; len], vec![0f32; len]))
        .collect();
    let t = best_of(reps, || {
        std::thread::scope(|s| {
            for (src, dst) in bufs.iter_mut() {
                s.spawn(move || dst.copy_from_slice(black_box(src)));
            }
        });
        Ok(())
    })?;
    let moved = 2.0 * (len * 4) as f64 * threads.max(1) as f64;
    Ok(moved / t.as_secs_f64() / 1e9)
}

/// Times the threads communicator's all-reduce across 2 ranks at `small` and `large` bytes
/// (mean of `reps` after a warm-up) and fits `t = α + β·bytes`: returns (α s, β s/byte).
pub fn threads_all_reduce_fit(
    small: usize,
    large: usize,
    reps: usize,
) -> Result<(f64, f64), RuntimeError> {
    if large <= small {
        return Err(profile_err(format!(
            "the large all-reduce ({large} B) must exceed the small one ({small} B)"
        )));
    }
    let time = |bytes: usize| -> Result<f64, RuntimeError> {
        let per_rank = ThreadComm::run(2, crate::DEFAULT_TIMEOUT, |c| {
            let mut buf = vec![1.0f32; bytes / 4];
            c.all_reduce_sum(&mut buf)?;
            c.barrier()?;
            let t = Instant::now();
            for _ in 0..reps.max(1) {
                c.all_reduce_sum(&mut buf)?;
            }
            Ok::<f64, RuntimeError>(t.elapsed().as_secs_f64() / reps.max(1) as f64)
        })?;
        per_rank
            .into_iter()
            .try_fold(0f64, |m, t| t.map(|t| m.max(t)))
    };
    let (ts, tl) = (time(small)?, time(large)?);
    let beta = ((tl - ts) / (large - small) as f64).max(1e-15);
    let alpha = (ts - beta * small as f64).max(1e-9);
    Ok((alpha, beta))
}

/// `model name` of the first CPU in /proc/cpuinfo.
pub(super) fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// `MemTotal` from /proc/meminfo, GiB.
pub(super) fn memory_gib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1u64 << 20) as f64)
}
