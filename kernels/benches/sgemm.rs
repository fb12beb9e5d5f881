//! 1024×1024×1024 f32 matmul throughput of `kernels::sgemm`, timed like `sgemm_numpy.py`:
//! one warm-up, then the best of `REPS` runs, GFLOP/s = 2·n³ / seconds / 1e9.
//! One thread: plait's CPU ranks each run their matmuls on their own thread (no pool).
//! Run with `cargo bench -p kernels`, or `benches/compare.sh` for the comparison with numpy.

use std::time::Instant;

const N: usize = 1024;
const REPS: usize = 10;

fn main() -> Result<(), kernels::KernelError> {
    let a: Vec<f32> = (0..N * N)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let b: Vec<f32> = (0..N * N)
        .map(|i| ((i * 104_729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut c = vec![0f32; N * N];
    kernels::sgemm(&a, &b, &mut c, N, N, N)?;
    let mut best = f64::INFINITY;
    for _ in 0..REPS {
        let t = Instant::now();
        kernels::sgemm(&a, &b, &mut c, N, N, N)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let gflops = 2.0 * (N as f64).powi(3) / best / 1e9;
    println!(
        "kernels sgemm {N}^3: {gflops:.1} GFLOP/s (best of {REPS}, {:.2} ms; 1 thread)",
        best * 1e3
    );
    Ok(())
}
