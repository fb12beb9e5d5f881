//! `plait profile`: measure this machine and write a cluster description for `--cluster`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use runtime::profile::{ProfileOptions, measure};

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
}

pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    // A path that cannot be written fails now, not after the measurements.
    let existed = args.output.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&args.output)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let p = match measure(&ProfileOptions { quick: args.quick }) {
        Ok(p) => p,
        Err(e) => {
            if !existed {
                let _ = std::fs::remove_file(&args.output);
            }
            return Err(e.into());
        }
    };
    let text = p.to_cluster_toml(&args.name);
    std::fs::write(&args.output, &text)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
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
        args.output.display(),
        args.output.display()
    );
    Ok(())
}
