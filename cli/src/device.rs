//! `plait run --device`: where the ranks train. A plan for a GPU cluster trains on CUDA GPUs by
//! default and is never run on CPU threads unless asked (`--device cpu`); where CUDA cannot run
//! (a build without the `cuda` feature, no driver, no GPU) the run stops before any step and
//! says what to do.

use std::path::Path;

use runtime::RuntimeError;
use runtime::train::Device;

/// The device `--device` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// This machine's CPU threads (f32 kernels).
    Cpu,
    /// CUDA GPUs: rank r of a node on GPU r mod the GPUs visible (needs a build with
    /// `--features cuda` and an NVIDIA driver).
    Cuda,
}

/// The device `plait run --device` names: [`DeviceArg`]'s, or none at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RunDeviceArg {
    /// This machine's CPU threads (f32 kernels).
    Cpu,
    /// CUDA GPUs: rank r of a node on GPU r mod the GPUs visible (needs a build with
    /// `--features cuda` and an NVIDIA driver).
    Cuda,
    /// No device: a CUDA run's allocations counted by its caching allocator, no kernel run
    /// (losses are 0), to see a GPU plan's memory high-water mark on any machine.
    Dry,
}

/// The device a run uses: the flag's, else what the plan's cluster is (a GPU cluster means
/// CUDA; the CPU cluster, and a program directory, the CPU).
pub fn resolve(flag: Option<RunDeviceArg>, plan: Option<&planner::plan::Plan>) -> Device {
    match flag {
        Some(RunDeviceArg::Cpu) => Device::Cpu,
        Some(RunDeviceArg::Cuda) => Device::Cuda,
        Some(RunDeviceArg::Dry) => Device::Dry,
        None => match plan {
            Some(p) if !p.cluster.runs_on_cpu_threads() => Device::Cuda,
            _ => Device::Cpu,
        },
    }
}

/// `--device cuda` for a plan compiled for CPU threads, where CUDA cannot start: the plan runs
/// as it is on the CPU, which is what to do.
fn cpu_plan_on_cuda(path: &Path, p: &planner::plan::Plan, e: &RuntimeError) -> anyhow::Error {
    anyhow::anyhow!(
        "--device cuda cannot start here ({e}); {} is a plan for {} CPU threads ({}): drop \
         --device cuda (or pass --device cpu) to train it on them, or compile the model for a \
         GPU cluster to train on GPUs",
        path.display(),
        p.gpus,
        p.cluster.name
    )
}

/// Refuses at once a CUDA run that cannot start here, naming the plan's GPUs, why CUDA cannot
/// run and what to do instead.
pub fn check(
    device: Device,
    plan: Option<&planner::plan::Plan>,
    path: Option<&Path>,
) -> anyhow::Result<()> {
    let Err(e) = device.available() else {
        return Ok(());
    };
    let what = match (plan, path) {
        // A CPU plan run with --device cuda: the flag asked for CUDA, not the plan.
        (Some(p), Some(path)) if p.cluster.runs_on_cpu_threads() => {
            return Err(cpu_plan_on_cuda(path, p, &e));
        }
        (Some(p), Some(path)) => format!(
            "{} is a plan for {} x {} ({}): it trains on CUDA GPUs",
            path.display(),
            p.gpus,
            p.cluster.gpu.name,
            p.cluster.name
        ),
        _ => "--device cuda trains on CUDA GPUs".to_string(),
    };
    let why = match &e {
        RuntimeError::NotCompiledWithCudaSupport => {
            "this plait was built without CUDA: on the GPU machine, build it with \
             `cargo build --release --features cuda`"
                .to_string()
        }
        RuntimeError::NoCudaDevice { reason } => {
            format!("this machine has no usable CUDA GPU ({reason}): run it on the GPU machine")
        }
        other => format!("CUDA cannot start: {other}"),
    };
    let export = path
        .filter(|_| plan.is_some())
        .map(|p| {
            format!(
                "; to train with an engine, `plait export {} --to megatron`",
                p.display()
            )
        })
        .unwrap_or_default();
    anyhow::bail!(
        "{what}, and {why}. To train here, compile the model for `--cluster cpu`, or add \
         `--device cpu` to check these programs on CPU threads (not the plan's speed or \
         memory){export}"
    )
}
