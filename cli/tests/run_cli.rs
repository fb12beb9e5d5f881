//! `plait run` says what it does: a plan for a GPU cluster trains on CUDA by default and never
//! silently on CPU threads (exit 2 naming the GPUs where CUDA cannot run, unless `--device
//! cpu`), it compares the step time with the plan's, and checkpoints report what they wrote
//! and loaded.

mod common;

use common::{dir, plait};

/// A tiny GPT-2 compiled for two H100s (with `extra` compile flags) into directory `name`:
/// the plan's path.
fn gpu_plan(name: &str, extra: &[&str]) -> String {
    let d = dir(name);
    let model = d.join("m.json");
    std::fs::write(
        &model,
        r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":4,"vocab_size":256,"n_positions":64}"#,
    )
    .unwrap_or_default();
    let plan = d.join("plan.json");
    let (m, p) = (model.to_string_lossy(), plan.to_string_lossy());
    let mut args = vec![
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
    ];
    args.extend_from_slice(extra);
    let (code, _, err) = plait(&args);
    assert_eq!(code, 0, "{err}");
    p.into_owned()
}

#[test]
fn a_gpu_plan_is_refused_on_cpu_threads_unless_asked() {
    let p = gpu_plan("run-gpu-plan", &[]);
    // The default device of a GPU plan is CUDA: without it here (this build has no `cuda`
    // feature, or the machine no GPU) the run stops before any step and says what to do.
    let t0 = std::time::Instant::now();
    let (code, out, err) = plait(&["run", &p, "--steps", "1"]);
    refused_or_on_cuda(code, &out, &err);
    if code == 2 {
        assert!(
            err.contains("H100") && err.contains("--device cpu"),
            "{err}"
        );
        assert!(
            t0.elapsed().as_secs() <= 10,
            "refused after {:?}",
            t0.elapsed()
        );
    }
    // Asked for, the CPU threads train it; the step time is not compared with the GPU's.
    for flag in [&["--device", "cpu"][..], &["--on-cpu"][..]] {
        let mut run = vec!["run", &p, "--steps", "2"];
        run.extend_from_slice(flag);
        let (code, out, err) = plait(&run);
        assert_eq!(code, 0, "{flag:?}: {err}");
        assert!(out.lines().any(|l| l.starts_with("step ")), "{out}");
        assert!(out.contains("no prediction to compare"), "{out}");
    }
    // `--device cuda` for the CPU demo: the same refusal where CUDA cannot run.
    let (code, out, err) = plait(&["run", "--steps", "1", "--device", "cuda"]);
    refused_or_on_cuda(code, &out, &err);
}

#[test]
fn a_dry_run_counts_a_gpu_plans_memory_without_a_gpu() {
    let p = gpu_plan("run-dry", &["--precision", "bf16"]);
    let (code, out, err) = plait(&["run", &p, "--steps", "2", "--device", "dry"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("device      dry"), "{out}");
    // Each stage's allocator high-water mark beside the plan's peak (an independent model of
    // the same memory): of the same size.
    let ratios: Vec<f64> = out
        .lines()
        .filter(|l| l.starts_with("memory      stage"))
        .filter_map(|l| l.split("measured / predicted ").nth(1))
        .filter_map(|r| r.trim_end_matches(')').parse().ok())
        .collect();
    assert!(!ratios.is_empty(), "{out}");
    for r in ratios {
        assert!((0.5..2.0).contains(&r), "measured / predicted {r}: {out}");
    }
    // What was live there, in the classes the plan's report itemizes.
    let live = out
        .lines()
        .find(|l| l.trim_start().starts_with("at that peak:"))
        .unwrap_or_default();
    for class in ["parameters", "optimizer state", "activations"] {
        assert!(live.contains(class), "{class}: {out}");
    }
    // The launches a GPU would run, counted: a bf16 plan converts GEMM operands to bf16.
    let kernels = out
        .lines()
        .find(|l| l.starts_with("kernels     last step"))
        .unwrap_or_default();
    let launches: u64 = kernels
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(launches > 0, "{out}");
    assert!(out.contains("gemm (cuBLAS)"), "{out}");
    // Two ranks reduce their gradients as a GPU run with NCCL does, on device buffers: only
    // the batch goes up (ids and targets) and the loss comes down; `PLAIT_NCCL=0` stages the
    // collectives through the host instead, as it does on GPUs.
    let host = |out: &str| {
        let line = out.lines().find(|l| l.starts_with("host")).unwrap_or("");
        line.split(", ")
            .filter_map(|part| part.split(' ').find_map(|w| w.parse::<u64>().ok()))
            .collect::<Vec<u64>>()
    };
    assert!(out.contains("dp 2") || out.contains("tp 2"), "{out}");
    assert_eq!(host(&out)[..3], [0, 2, 1], "{out}");
    let staged = common::plait_env(
        &["run", &p, "--steps", "2", "--device", "dry"],
        &[("PLAIT_NCCL", "0")],
    );
    assert_eq!(staged.0, 0, "{}", staged.2);
    assert!(
        host(&staged.1)[1] > 2,
        "staged through the host: {}",
        staged.1
    );
}

/// Either CUDA cannot run here and the run was refused (exit 2, naming CUDA and the fix, no
/// step), or it ran on CUDA (a build with `--features cuda` on a GPU machine).
fn refused_or_on_cuda(code: i32, out: &str, err: &str) {
    let unavailable = err.contains("built without CUDA") || err.contains("no usable CUDA GPU");
    if unavailable {
        assert_eq!(code, 2, "{out}{err}");
        assert!(
            err.contains("--features cuda") || err.contains("GPU machine"),
            "{err}"
        );
        assert!(
            !out.lines().any(|l| l.starts_with("step ")),
            "trained anyway: {out}"
        );
    } else {
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("device      cuda"), "{out}");
    }
}

/// A CPU plan run on CPU threads prints its measured step time beside the prediction.
#[test]
fn a_cpu_plan_prints_measured_and_predicted_step_time() {
    let (code, out, err) = plait(&["run", "--steps", "3"]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("time/step"))
        .unwrap_or_else(|| panic!("no step time line: {out}"));
    assert!(
        line.contains("measured")
            && line.contains("predicted")
            && line.contains("measured / predicted"),
        "{line}"
    );
}

/// Checkpoints say what was written and loaded, and how long it took.
#[test]
fn checkpoints_say_what_they_wrote_and_loaded() {
    let d = dir("run-checkpoint");
    let ckpt = d.join("ckpt");
    let c = ckpt.to_string_lossy().to_string();
    let (code, out, err) = plait(&[
        "run",
        "--steps",
        "2",
        "--checkpoint-dir",
        &c,
        "--checkpoint-every",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    for step in [1, 2] {
        let want = format!("checkpoint  step {step} written to {c}");
        assert!(out.contains(&want), "{want} missing:\n{out}");
    }
    let (code, out, err) = plait(&["run", "--steps", "3", "--checkpoint-dir", &c, "--resume"]);
    assert_eq!(code, 0, "{err}");
    let want = format!("resumed     from step 2 of the latest checkpoint in {c}");
    assert!(out.contains(&want), "{want} missing:\n{out}");
    assert!(out.contains("step     3"), "{out}");
}

/// `--log-json` records `comm_bytes`, what the first rank sent in the step: for data
/// parallelism over 2 ranks, the ring all-reduce of every f32 gradient sends each element
/// once (2·(n−1)/n = 1), plus the loss's all-gather of two f32 words; one rank sends nothing.
#[test]
fn the_step_log_counts_the_bytes_a_rank_sends() {
    let d = dir("run-comm-bytes");
    let model = d.join("m.json");
    std::fs::write(
        &model,
        r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":4,"vocab_size":256,"n_positions":64}"#,
    )
    .expect("config written");
    let m = model.to_string_lossy().into_owned();
    let (code, out, err) = plait(&["inspect", &m, "--json"]);
    assert_eq!(code, 0, "{err}");
    let params = serde_json::from_str::<serde_json::Value>(&out).expect("JSON")["params"]
        .as_u64()
        .expect("a parameter count");
    for (dp, want) in [(2, 4 * params + 8), (1, 0)] {
        let plan = d.join(format!("dp{dp}.json"));
        let p = plan.to_string_lossy().into_owned();
        let (code, _, err) = plait(&[
            "compile",
            &m,
            "--cluster",
            "cpu",
            "--gpus",
            &dp.to_string(),
            "--global-batch",
            "8",
            "--seq",
            "64",
            "--tp",
            "1",
            "--pp",
            "1",
            "--dp",
            &dp.to_string(),
            "--micro-batch",
            "4",
            "--precision",
            "fp32",
            "-o",
            &p,
        ]);
        assert_eq!(code, 0, "{err}");
        let log = d.join(format!("dp{dp}.jsonl"));
        let (code, out, err) = plait(&[
            "run",
            &p,
            "--steps",
            "2",
            "--log-json",
            &log.to_string_lossy(),
        ]);
        assert_eq!(code, 0, "{out}{err}");
        let text = std::fs::read_to_string(&log).expect("log written");
        let bytes: Vec<u64> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .map(|v| v["comm_bytes"].as_u64().expect("comm_bytes"))
            .collect();
        assert_eq!(bytes, vec![want, want], "dp {dp}");
    }
}

/// A process that torchrun (or srun) started as one of several ranks joins the others over
/// TCP; where it cannot (the plan has another number of ranks, or no master address says where
/// to meet) it stops at once naming what is wrong, before any step. A bad launcher variable is
/// named too. One rank under torchrun runs as usual.
#[test]
fn a_torchrun_rank_that_cannot_join_is_refused_and_bad_launcher_variables_are_named() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_plait"))
            .args(["run", "--steps", "1"])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("plait runs");
        let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    };
    // The built-in plan has two ranks: a third process cannot join it, and two cannot meet
    // without a master address.
    let (code, out, err) = run(&[], &[("RANK", "1"), ("WORLD_SIZE", "3")]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("torchrun started 3 processes, and the plan has 2 ranks"),
        "{err}"
    );
    assert!(!out.contains("step "), "no step runs: {out}");
    let torchrun = [("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")];
    let (code, out, err) = run(&[], &torchrun);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("MASTER_ADDR"), "{err}");
    assert!(!out.contains("step "), "no step runs: {out}");
    let (code, _, err) = run(&[], &[("RANK", "0"), ("WORLD_SIZE", "2x")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("WORLD_SIZE=\"2x\""), "{err}");
    let (code, out, err) = run(&[], &[("RANK", "0"), ("WORLD_SIZE", "1")]);
    assert_eq!(code, 0, "{out}{err}");
}

/// The tiny GPT's DP2 plan on the `cpu` cluster, written under a fresh test directory.
fn dp2_plan(name: &str) -> String {
    let d = dir(name);
    let model = d.join("m.json");
    std::fs::write(
        &model,
        r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":4,"vocab_size":256,"n_positions":64}"#,
    )
    .expect("config written");
    let plan = d.join("dp2.json").to_string_lossy().into_owned();
    let (code, _, err) = plait(&[
        "compile",
        &model.to_string_lossy(),
        "--cluster",
        "cpu",
        "--gpus",
        "2",
        "--global-batch",
        "8",
        "--seq",
        "64",
        "--dp",
        "2",
        "--tp",
        "1",
        "--pp",
        "1",
        "--precision",
        "fp32",
        "-o",
        &plan,
    ]);
    assert_eq!(code, 0, "{err}");
    plan
}

/// Two processes launched as torchrun launches them (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT) meet over TCP and train the DP2 plan to the very losses of one
/// `plait run` running both ranks as threads: the communicators sum in rank order alike.
#[test]
fn two_processes_over_tcp_train_as_the_threads_do() {
    let plan = dp2_plan("run-torchrun-tcp");
    let d = dir("run-torchrun-tcp-logs");
    let losses = |path: &std::path::Path| -> Vec<f64> {
        std::fs::read_to_string(path)
            .expect("log written")
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("a JSON line")["loss"]
                    .as_f64()
                    .expect("a loss")
            })
            .collect()
    };
    let threads = d.join("threads.jsonl");
    let (code, out, err) = plait(&[
        "run",
        &plan,
        "--steps",
        "3",
        "--log-json",
        &threads.to_string_lossy(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_or(29_611, |a| a.port());
    // The mesh meets two ports past MASTER_PORT (the rendezvous takes the one after it).
    let master_port = (port - 2).to_string();
    let log = d.join("tcp.jsonl");
    let procs: Vec<_> = (0..2)
        .map(|r| {
            std::process::Command::new(env!("CARGO_BIN_EXE_plait"))
                .args([
                    "run",
                    &plan,
                    "--steps",
                    "3",
                    "--log-json",
                    &log.to_string_lossy(),
                ])
                .envs([
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "2".into()),
                    ("LOCAL_RANK", r.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", master_port.clone()),
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("plait starts")
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|child| child.wait_with_output().expect("plait ends"))
        .collect();
    for (r, p) in procs.iter().enumerate() {
        let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
        assert_eq!(
            p.status.code(),
            Some(0),
            "rank {r}: {}{}",
            text(&p.stdout),
            text(&p.stderr)
        );
    }
    assert_eq!(losses(&log), losses(&threads));
}
