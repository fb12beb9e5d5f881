//! The device kernels (`kernels/cuda`) compile under NVRTC, the compiler the CUDA backend runs
//! when it opens a GPU, for the architectures plait targets: to the cubin the backend loads
//! (an ELF image holding every kernel's symbol) and to the PTX it falls back to. NVRTC needs
//! no GPU, only its library: `.ci/run` installs it from PyPI (`nvidia-cuda-nvrtc-cu12`).
//! Without the library the test says `skipped: no NVRTC` (a CUDA build on a machine without
//! it cannot check this).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)]

use runtime::backend::nvrtc::{Output, compile_kernels};

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Turing has no bf16 tensor-core instructions: the program still compiles for it (the
/// tensor-core kernels' products trap there, and the backend never launches them).
#[test]
fn every_kernel_compiles_for_turing_ampere_and_hopper() {
    for (major, minor) in [(7, 5), (8, 0), (9, 0)] {
        let ptx = match compile_kernels(major, minor, Output::Ptx) {
            Ok(ptx) => ptx,
            Err(runtime::RuntimeError::NoCudaDevice { reason }) => {
                println!("skipped: no NVRTC ({reason})");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let cubin = compile_kernels(major, minor, Output::Cubin).unwrap();
        assert!(
            cubin.starts_with(b"\x7fELF"),
            "sm_{major}{minor}: not an ELF cubin"
        );
        for name in kernels::device::kernel_names() {
            assert!(
                holds(&ptx, &format!(".entry {name}(")),
                "sm_{major}{minor}: no PTX entry for {name}"
            );
            assert!(
                holds(&cubin, name),
                "sm_{major}{minor}: no cubin symbol {name}"
            );
        }
        println!(
            "sm_{major}{minor}: {} bytes of PTX, {} bytes of cubin",
            ptx.len(),
            cubin.len()
        );
    }
}
