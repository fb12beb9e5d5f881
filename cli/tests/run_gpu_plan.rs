//! A plan for a GPU cluster is never trained silently on CPU threads: `plait run` exits 2 with
//! a message naming the GPUs and what to do, unless `--on-cpu` asks for exactly that.

mod common;

use common::{dir, plait};

#[test]
fn a_gpu_plan_is_refused_on_cpu_threads_unless_asked() {
    let d = dir("run-gpu-plan");
    let model = d.join("m.json");
    std::fs::write(
        &model,
        r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":4,"vocab_size":256,"n_positions":64}"#,
    )
    .unwrap_or_default();
    let plan = d.join("plan.json");
    let (m, p) = (model.to_string_lossy(), plan.to_string_lossy());
    let (code, _, err) = plait(&[
        "compile",
        &m,
        "--cluster",
        "dgx-h100",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "--seq",
        "64",
        "-o",
        &p,
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = plait(&["run", &p, "--steps", "1"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("H100") && err.contains("CUDA"), "{err}");
    assert!(
        !out.lines().any(|l| l.starts_with("step ")),
        "trained anyway: {out}"
    );
    let (code, out, err) = plait(&["run", &p, "--steps", "1", "--on-cpu"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l.starts_with("step ")), "{out}");
}
