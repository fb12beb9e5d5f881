//! `plait profile` and the `cpu` preset through the command line: the measured file and the
//! preset both drive `plait compile`.

use std::process::Command;

fn plait(args: &[&str], dir: &std::path::Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_plait"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("plait-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

const COMPILE: [&str; 9] = [
    "compile",
    "gpt2",
    "--gpus",
    "2",
    "--global-batch",
    "8",
    "--seq",
    "64",
    "--precision",
];

#[test]
fn compile_on_the_cpu_preset() {
    let dir = scratch("cpu-preset");
    let mut args = COMPILE.to_vec();
    args.extend(["fp32", "--cluster", "cpu"]);
    let (code, out, err) = plait(&args, &dir);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("2 x cpu-thread (cpu)"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_quick_profile_drives_compile() {
    let dir = scratch("profile");
    let (code, out, err) = plait(&["profile", "--quick", "-o", "me.toml"], &dir);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("GFLOP/s") && out.contains("wrote me.toml"),
        "{out}"
    );
    let text = std::fs::read_to_string(dir.join("me.toml")).expect("written");
    assert!(
        text.contains("alone). fp32 only")
            && text.contains("[gpu.kernel_fractions]")
            && text.contains("matmul_packs_operands = true"),
        "{text}"
    );
    let mut args = COMPILE.to_vec();
    args.extend(["fp32", "--cluster", "me.toml"]);
    let (code, out, err) = plait(&args, &dir);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("(this-machine)"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a GPU (or a build without CUDA) the GPU profile stops at once, says why and what to
/// do, and leaves no half-written file behind.
#[test]
fn a_gpu_profile_without_a_gpu_says_so_and_writes_nothing() {
    let dir = scratch("profile-gpu");
    let (code, out, err) = plait(&["profile", "--device", "cuda"], &dir);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains("GPU 0") && err.contains("--device cpu"),
        "{err}"
    );
    assert!(!dir.join("gpu.toml").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
