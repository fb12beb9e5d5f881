//! Compiles plait's device kernels (`kernels/cuda/*.cu`) with the host C++ compiler under the
//! emulator's CUDA shim (`cpp/simt.hpp`), and generates the kernel registry from the
//! `extern "C" __global__ void NAME(` declarations, so each kernel is declared once.

use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let sources = manifest.join("../kernels/cuda");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-changed={}", sources.display());
    println!("cargo:rerun-if-changed=cpp");

    let mut files: Vec<PathBuf> = fs::read_dir(&sources)
        .expect("kernels/cuda exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    // The emulator's own test kernels.
    files.push(manifest.join("cpp/selftest.cu"));
    let mut includes = String::new();
    let mut registry = String::new();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        includes.push_str(&format!("#include \"{}\"\n", file.display()));
        for name in kernel_names(file) {
            registry.push_str(&format!("SIMT_REGISTER({name})\n"));
        }
    }
    write(&out.join("simt_kernels.inc"), &includes);
    write(&out.join("simt_registry.inc"), &registry);

    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file(manifest.join("cpp/simt.cpp"))
        .include(manifest.join("cpp"))
        .include(&sources)
        .define("SIMT_KERNELS", Some("\"simt_kernels.inc\""))
        .define("SIMT_REGISTRY", Some("\"simt_registry.inc\""))
        .include(&out)
        .opt_level(2)
        .warnings(false)
        .compile("plait_simt");
}

/// The names in a source's `extern "C" __global__ void NAME(` lines (NAME the last word
/// before the parenthesis: a launch-bounds macro may come first).
fn kernel_names(file: &Path) -> Vec<String> {
    const DECL: &str = "extern \"C\" __global__ void ";
    let text = fs::read_to_string(file).expect("readable kernel source");
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix(DECL))
        .filter_map(|rest| rest.split('(').next())
        .filter_map(|head| head.split_whitespace().last())
        .map(str::to_owned)
        .collect()
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).expect("OUT_DIR is writable");
}
