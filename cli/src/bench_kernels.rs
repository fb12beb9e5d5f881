//! `plait bench kernels`: the backend conformance suite (`runtime::backend::conformance`) on a
//! device: every op family forward, backward and as `Grad` against the CPU kernels, one row
//! per case with its largest relative error and time. On a GPU it is the first check to run:
//! a kernel that differs there is named before any training run is tried. The same cases pass
//! on the CPU under the `simt` emulator (`cargo test`), so a failure here is the GPU's.

use std::time::Instant;

use clap::Args;
use runtime::Backend;
use runtime::backend::conformance::{Case, bf16_cases, cases, check};

use crate::device::DeviceArg;

#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Where the ops run: cuda (GPU 0, plait's kernels compiled by NVRTC and cuBLAS; a build
    /// with `--features cuda`) or cpu (the CPU backend: a dry run of this command).
    #[arg(long, value_enum, default_value = "cuda")]
    device: DeviceArg,
    /// Only the cases whose family or op name contains this text (e.g. `attention`).
    #[arg(long)]
    only: Option<String>,
}

/// The cases whose family or op name contains `only` (all without it).
fn chosen(cases: Vec<Case>, only: Option<&str>) -> Vec<Case> {
    cases
        .into_iter()
        .filter(|c| only.is_none_or(|s| c.name.contains(s) || c.kind.mnemonic().contains(s)))
        .collect()
}

pub fn run(args: &KernelsArgs) -> anyhow::Result<()> {
    let only = args.only.as_deref();
    let (chosen, chosen_bf16) = (chosen(cases(), only), chosen(bf16_cases(), only));
    match args.device {
        DeviceArg::Cpu => table(&runtime::CpuBackend::new(), &chosen),
        DeviceArg::Cuda => match runtime::backend::CudaBackend::new(0) {
            Ok(gpu) => {
                let f32_result = table(&gpu, &chosen);
                // A bf16 plan's backend: bf16 GEMMs and the tensor-core attention.
                let bf16 = gpu.with_gemm_precision(runtime::GemmPrecision::Bf16);
                let bf16_result = table(&bf16, &chosen_bf16);
                f32_result.and(bf16_result)
            }
            Err(e) => anyhow::bail!(
                "`plait bench kernels --device cuda` runs on GPU 0, and CUDA cannot start here: \
                 {e}. Build with `cargo build --release --features cuda` and run it on the GPU \
                 machine; `--device cpu` runs the same cases on the CPU backend"
            ),
        },
    }
}

fn table<B: Backend>(b: &B, cases: &[Case]) -> anyhow::Result<()> {
    println!("conformance of {} against the CPU kernels", b.name());
    println!(
        "{:<10} {:<14} {:>10} {:>8} {:>9}  status",
        "family", "op", "max error", "tol", "time ms"
    );
    let mut failed = 0;
    for case in cases {
        let start = Instant::now();
        let result = check(b, case);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let (error, status) = match &result {
            Ok(p) => (format!("{:.1e}", p.max_error), "ok".to_string()),
            Err(e) => {
                failed += 1;
                ("-".to_string(), format!("FAIL: {e}"))
            }
        };
        println!(
            "{:<10} {:<14} {:>10} {:>8.0e} {:>9.1}  {status}",
            case.name,
            case.kind.mnemonic(),
            error,
            case.tol,
            ms
        );
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} cases differ from the CPU kernels on {}",
        cases.len(),
        b.name()
    );
    println!("all {} cases agree with the CPU kernels", cases.len());
    Ok(())
}
