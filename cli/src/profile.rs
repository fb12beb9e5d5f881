//! `plait profile`: measure this machine and write a cluster description for `--cluster`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use runtime::profile::{ProfileOptions, measure};

use crate::device::DeviceArg;

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// What to measure: cpu (this machine, one rank per hardware thread) or cuda (plait's
    /// CUDA runtime on GPU 0; a build with `--features cuda`).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Where to write the cluster description (TOML, docs/hardware.md) [default: cpu.toml,
    /// or gpu.toml with `--device cuda`].
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// The cluster's name inside the file.
    #[arg(long, default_value = "this-machine")]
    name: String,
    /// Small sizes and few repetitions: about a second, less accurate.
    #[arg(long)]
    quick: bool,
}

pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    let output = args.output.clone().unwrap_or_else(|| {
        PathBuf::from(match args.device {
            DeviceArg::Cpu => "cpu.toml",
            DeviceArg::Cuda => "gpu.toml",
        })
    });
    // A path that cannot be written fails now, not after the measurements.
    let existed = output.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    let measured = match args.device {
        DeviceArg::Cpu => cpu(args, &output),
        DeviceArg::Cuda => crate::profile_gpu::run(&output, &args.name, args.quick),
    };
    if measured.is_err() && !existed {
        let _ = std::fs::remove_file(&output);
    }
    measured
}

/// This machine's CPU, one rank per hardware thread.
fn cpu(args: &ProfileArgs, output: &std::path::Path) -> anyhow::Result<()> {
    let p = measure(&ProfileOptions { quick: args.quick })?;
    let text = p.to_cluster_toml(&args.name);
    std::fs::write(output, &text).with_context(|| format!("cannot write {}", output.display()))?;
    println!("{} ({} threads)", p.cpu, p.threads);
    println!(
        "  matmul {n}^3:       {:.1} GFLOP/s per rank with all {} busy, {:.1} alone",
        p.sgemm_rank_gflops,
        p.threads,
        p.sgemm_one_gflops,
        n = p.sgemm_size
    );
    println!(
        "  copy bandwidth:    {:.1} GB/s all threads",
        p.copy_all_gb_per_s
    );
    let k = &p.kernel_fractions;
    println!(
        "  kernels / copy:     add {:.2}, GELU {:.2}, LayerNorm {:.2}, softmax {:.2}, dropout {:.2}",
        k.pointwise, k.activation, k.norm, k.softmax, k.dropout
    );
    println!(
        "  threads all-reduce: alpha {:.2} us, 1/beta {:.2} GB/s (2 ranks)",
        p.allreduce_alpha_us, p.allreduce_gb_per_s
    );
    println!(
        "wrote {}; use it with `plait compile MODEL --cluster {} --gpus N --precision fp32`",
        output.display(),
        output.display()
    );
    Ok(())
}
