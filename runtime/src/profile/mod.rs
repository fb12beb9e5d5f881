//! `plait profile`: measures this machine and describes it as a cluster for the planner.
//!
//! One rank per hardware thread: the description's "GPU" is one rank's share of the machine
//! when every rank works at once (the matmul rate of one thread while every thread multiplies,
//! the all-thread copy bandwidth divided by the thread count, and the bandwidth plait's own
//! element-wise, activation, norm, softmax and dropout kernels sustain relative to that copy),
//! and its node link is the threads communicator (shared memory), whose α
//! and β come from timing all-reduces of a small and a large buffer across 2 ranks. The file
//! follows docs/hardware.md and loads with `planner::Cluster::load`.

mod gpu;
mod kernels;
mod measure;
mod write;

use crate::RuntimeError;

pub use gpu::{AttentionCase, GpuProfile, GpuProfileOptions, measure_gpu};
pub use kernels::{
    KernelFractions, kernel_fractions, kernel_fractions_on, sgemm_gflops_concurrent,
};
pub use measure::{copy_gb_per_s, sgemm_gflops, threads_all_reduce_fit};
pub use write::utc;

/// How long to measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileOptions {
    /// Small sizes and few repetitions (about a second): for tests.
    pub quick: bool,
}

/// What was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineProfile {
    /// `model name` from /proc/cpuinfo, if readable.
    pub cpu: String,
    /// Hardware threads (`std::thread::available_parallelism`): the ranks one node holds.
    pub threads: usize,
    /// Total memory, GiB (/proc/meminfo), if readable.
    pub memory_gib: Option<f64>,
    /// sgemm at `sgemm_size`³, GFLOP/s of one thread while every thread multiplies at once
    /// (a rank's rate), and of one thread alone.
    pub sgemm_rank_gflops: f64,
    pub sgemm_one_gflops: f64,
    pub sgemm_size: usize,
    /// plait's kernels by class: bandwidth relative to the copy, every thread busy.
    pub kernel_fractions: KernelFractions,
    /// Copy bandwidth with every thread copying its own buffer, GB/s (bytes read + written).
    pub copy_all_gb_per_s: f64,
    /// The threads communicator's 2-rank all-reduce: `t = α + β·bytes`.
    pub allreduce_alpha_us: f64,
    pub allreduce_gb_per_s: f64,
    /// Seconds since the Unix epoch when the measurement ended.
    pub unix_time: u64,
}

/// Runs every measurement.
pub fn measure(opts: &ProfileOptions) -> Result<MachineProfile, RuntimeError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sgemm_size = if opts.quick { 256 } else { 1024 };
    let reps = if opts.quick { 2 } else { 5 };
    let sgemm_one_gflops = sgemm_gflops(sgemm_size, reps)?;
    let sgemm_rank_gflops = sgemm_gflops_concurrent(threads, sgemm_size, reps)?;
    let copy_bytes = if opts.quick { 8 << 20 } else { 128 << 20 };
    let copy_all_gb_per_s = copy_gb_per_s(threads, copy_bytes, reps)?;
    // Activations of the size a small model's layer holds per micro-batch (2 or 8 MiB).
    let (rows, cols) = if opts.quick { (128, 1024) } else { (512, 1024) };
    let kernel_fractions = kernel_fractions(
        threads,
        rows,
        cols,
        reps,
        copy_all_gb_per_s / threads.max(1) as f64,
    )?;
    let (small, large, ar_reps) = if opts.quick {
        (4, 256 << 10, 20)
    } else {
        (4, 16 << 20, 50)
    };
    let (alpha_s, beta_s_per_byte) = threads_all_reduce_fit(small, large, ar_reps)?;
    let unix_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(MachineProfile {
        cpu: measure::cpu_name(),
        threads,
        memory_gib: measure::memory_gib(),
        sgemm_rank_gflops,
        sgemm_one_gflops,
        sgemm_size,
        kernel_fractions,
        copy_all_gb_per_s,
        allreduce_alpha_us: alpha_s * 1e6,
        allreduce_gb_per_s: 1e-9 / beta_s_per_byte,
        unix_time,
    })
}

impl MachineProfile {
    /// The cluster description (TOML, docs/hardware.md's schema) named `name`.
    pub fn to_cluster_toml(&self, name: &str) -> String {
        write::cluster_toml(self, name)
    }
}
