//! `plait profile`: measure this machine and write a cluster description for `--cluster`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::Args;
use runtime::profile::{ProfileOptions, measure, sgemm_gflops};

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Where to write the cluster description (TOML, docs/hardware.md).
    #[arg(short, long, default_value = "cpu.toml")]
    output: PathBuf,
    /// The cluster's name inside the file.
    #[arg(long, default_value = "this-machine")]
    name: String,
    /// Small sizes and few repetitions: about a second, less accurate.
    #[arg(long)]
    quick: bool,
    /// Internal: print this process's sgemm GFLOP/s and exit (run with MATMUL_NUM_THREADS=1).
    #[arg(long, hide = true)]
    sgemm_only: bool,
}

fn sgemm_size(quick: bool) -> (usize, usize) {
    if quick { (256, 2) } else { (1024, 5) }
}

/// The 1-thread sgemm rate, measured in a child process whose matmul pool has one thread
/// (the pool's size is fixed per process). `None`, with a warning, if that fails.
fn one_thread_gflops(quick: bool) -> Option<f64> {
    let exe = std::env::current_exe().ok()?;
    let mut cmd = Command::new(exe);
    cmd.args(["profile", "--sgemm-only"])
        .env("MATMUL_NUM_THREADS", "1");
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.output().ok()?;
    let g = String::from_utf8_lossy(&out.stdout).trim().parse().ok();
    if g.is_none() {
        eprintln!("warning: could not measure the 1-thread matmul rate; leaving it out");
    }
    g
}

pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    let (n, reps) = sgemm_size(args.quick);
    if args.sgemm_only {
        println!("{}", sgemm_gflops(n, reps)?);
        return Ok(());
    }
    let p = measure(&ProfileOptions {
        quick: args.quick,
        sgemm_one_thread_gflops: one_thread_gflops(args.quick),
    })?;
    let text = p.to_cluster_toml(&args.name);
    std::fs::write(&args.output, &text)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!("{} ({} threads)", p.cpu, p.threads);
    let one = p
        .sgemm_one_gflops
        .map_or(String::new(), |g| format!(", 1 thread {g:.1}"));
    println!(
        "  matmul {n}^3:       {:.1} GFLOP/s all threads{one}",
        p.sgemm_all_gflops
    );
    println!(
        "  copy bandwidth:    {:.1} GB/s all threads",
        p.copy_all_gb_per_s
    );
    println!(
        "  threads all-reduce: alpha {:.2} us, 1/beta {:.2} GB/s (2 ranks)",
        p.allreduce_alpha_us, p.allreduce_gb_per_s
    );
    println!(
        "wrote {}; use it with `plait compile MODEL --cluster {} --gpus N --precision fp32`",
        args.output.display(),
        args.output.display()
    );
    Ok(())
}
