//! The device kernels (`kernels/cuda`) compile under NVRTC, the compiler the CUDA backend runs
//! when it opens a GPU, for the architectures plait targets. NVRTC needs no GPU, only its
//! library: `.ci/run` installs it from PyPI (`nvidia-cuda-nvrtc-cu12`). Without the library
//! the test says `skipped: no NVRTC` (a CUDA build on a machine without it cannot check this).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)]

#[test]
fn every_kernel_compiles_for_ampere_and_hopper() {
    for (major, minor) in [(8, 0), (9, 0)] {
        match runtime::backend::compile_kernels_ptx(major, minor) {
            Ok(ptx) => {
                let text = ptx.to_src();
                for name in kernels::device::kernel_names() {
                    assert!(
                        text.contains(&format!(".entry {name}(")),
                        "sm_{major}{minor}: no entry for {name}"
                    );
                }
                println!("sm_{major}{minor}: {} bytes of PTX", text.len());
            }
            Err(runtime::RuntimeError::NoCudaDevice { reason }) => {
                println!("skipped: no NVRTC ({reason})");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
}
