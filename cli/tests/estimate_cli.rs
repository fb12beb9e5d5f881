//! `plait estimate` through the command line: the JSON contract, exit codes, messages.

mod common;

use common::plait;

const BASE: [&str; 8] = [
    "estimate",
    "gpt-7.5b",
    "--cluster",
    "dgx-a100-80gb",
    "--gpus",
    "64",
    "--global-batch",
    "512",
];

#[test]
fn json_has_the_contract_fields() {
    let mut args = BASE.to_vec();
    args.extend([
        "--tp",
        "4",
        "--pp",
        "2",
        "--dp",
        "8",
        "--micro-batch",
        "2",
        "--json",
    ]);
    let (code, out, err) = plait(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    for k in [
        "tp",
        "pp",
        "dp",
        "micro_batch",
        "global_batch",
        "seq",
        "zero",
        "recompute",
        "schedule",
        "virtual_stages",
        "sequence_parallel",
        "precision",
    ] {
        assert!(!v["strategy"][k].is_null(), "strategy.{k}");
    }
    for k in [
        "iteration_time_s",
        "tokens_per_s",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "peak_memory_bytes",
    ] {
        assert!(
            v["predicted"][k].as_f64().is_some_and(|x| x > 0.0),
            "predicted.{k}"
        );
    }
    assert!(v["predicted"]["fits"].is_boolean());
    for k in ["weights", "grads", "optimizer", "activations", "other"] {
        assert!(v["predicted"]["memory"][k].as_f64().is_some(), "memory.{k}");
    }
    for k in [
        "compute",
        "tp_comm",
        "pp_comm",
        "dp_comm",
        "bubble",
        "optimizer",
    ] {
        assert!(v["predicted"]["time"][k].as_f64().is_some(), "time.{k}");
    }
    // Defaults: ZeRO 0, no recompute, 1F1B, SP off, bf16.
    assert_eq!(v["strategy"]["zero"], 0);
    assert_eq!(v["strategy"]["recompute"], "none");
    assert_eq!(v["strategy"]["schedule"], "1f1b");
    assert_eq!(v["strategy"]["sequence_parallel"], false);
    assert_eq!(v["strategy"]["precision"], "bf16");
}

#[test]
fn a_strategy_that_does_not_fit_still_prints_and_exits_zero() {
    let (code, out, err) = plait(&[
        "estimate",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--tp",
        "8",
        "--pp",
        "1",
        "--dp",
        "1",
        "--micro-batch",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["predicted"]["fits"], false);
}

fn invalid(extra: &[&str], fragment: &str) {
    let mut args = BASE.to_vec();
    args.extend_from_slice(extra);
    let (code, _, err) = plait(&args);
    assert_eq!(code, 2, "{extra:?}: {err}");
    assert!(
        err.contains(fragment),
        "{extra:?}: `{err}` lacks `{fragment}`"
    );
}

#[test]
fn invalid_strategies_exit_2_naming_the_constraint() {
    invalid(
        &["--tp", "4", "--pp", "2", "--dp", "4", "--micro-batch", "1"],
        "tp x pp x dp = 4 x 2 x 4 = 32 must equal the 64 GPUs (--gpus",
    );
    invalid(
        &["--tp", "64", "--pp", "1", "--dp", "1", "--micro-batch", "1"],
        "heads 32 are not divisible by tp 64",
    );
    invalid(
        &["--tp", "1", "--pp", "64", "--dp", "1", "--micro-batch", "1"],
        "36 layers cannot fill",
    );
    invalid(
        &["--tp", "1", "--pp", "1", "--dp", "64", "--micro-batch", "3"],
        "global batch 512 must be divisible",
    );
    invalid(
        &[
            "--tp",
            "8",
            "--pp",
            "1",
            "--dp",
            "8",
            "--micro-batch",
            "1",
            "--zero",
            "5",
        ],
        "ZeRO stage 5 does not exist",
    );
    invalid(
        &[
            "--tp",
            "8",
            "--pp",
            "1",
            "--dp",
            "8",
            "--micro-batch",
            "1",
            "--schedule",
            "interleaved",
        ],
        "interleaved schedule needs pp >= 2",
    );
    invalid(
        &["--tp", "8", "--pp", "1", "--dp", "8"],
        "estimate needs --micro-batch",
    );
    invalid(
        &[
            "--tp",
            "8",
            "--pp",
            "1",
            "--dp",
            "8",
            "--micro-batch",
            "1",
            "--precision",
            "fp64",
        ],
        "unknown precision",
    );
}

#[test]
fn unknown_cluster_lists_the_presets() {
    let (code, _, err) = plait(&[
        "estimate",
        "gpt2",
        "--cluster",
        "dgx-z9000",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "8",
        "--micro-batch",
        "1",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("dgx-a100-80gb") && err.contains("dgx-z9000"),
        "{err}"
    );
}

/// A small cluster file plait accepts: one node of 8 GPUs on one node link.
const SMALL_CLUSTER: &str = "name = \"x\"\ngpus_per_node = 8\n[gpu]\nname = \"g\"\nsm_count = 1\n\
     launch_overhead_us = 1\nmemory_gib = 80\nhbm_gb_per_s = 1000\nmatmul_efficiency = 0.5\n\
     memory_efficiency = 0.9\n[gpu.peak_tflops]\nfp32 = 10\n[[link]]\nname = \"nv\"\n\
     scope = \"node\"\ngb_per_s = 100\nlatency_us = 1\nefficiency = 0.5\n";

/// `plait estimate` of GPT-2 at dp 8 on the cluster file `text` (written under a directory
/// named by `tag`): exit code, stdout, stderr, and the file's path.
fn estimate_on(text: &str, tag: &str) -> (i32, String, String, String) {
    let dir = std::env::temp_dir().join(format!("plait-cluster-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join("c.toml");
    std::fs::write(&p, text).expect("write the cluster file");
    let ps = p.to_string_lossy().to_string();
    let (code, out, err) = plait(&[
        "estimate",
        "gpt2",
        "--cluster",
        &ps,
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "8",
        "--micro-batch",
        "1",
    ]);
    (code, out, err, ps)
}

#[test]
fn a_broken_cluster_file_names_the_field() {
    let text = SMALL_CLUSTER.replace("matmul_efficiency = 0.5", "matmul_efficiency = 1.5");
    let (code, _, err, ps) = estimate_on(&text, "broken");
    assert_eq!(code, 2);
    assert!(
        err.contains("gpu.matmul_efficiency") && err.contains(&ps),
        "{err}"
    );
}

/// Values no machine has (a launch of 1e308 µs, 10^8 GPUs a node, a bandwidth of 1e-300 GB/s)
/// are refused naming the field: they once reached the estimate, whose products of them left
/// f64's range (a debug build panicked on an infinite time).
#[test]
fn absurd_cluster_values_name_the_field() {
    let (code, _, err, _) = estimate_on(SMALL_CLUSTER, "absurd");
    assert_eq!(code, 0, "{err}");
    for (from, to, field) in [
        (
            "launch_overhead_us = 1\n",
            "launch_overhead_us = 1e308\n",
            "gpu.launch_overhead_us",
        ),
        (
            "gpus_per_node = 8",
            "gpus_per_node = 100000000",
            "gpus_per_node",
        ),
        (
            "hbm_gb_per_s = 1000",
            "hbm_gb_per_s = 1e-300",
            "gpu.hbm_gb_per_s",
        ),
        ("fp32 = 10", "fp32 = 1e300", "gpu.peak_tflops.fp32"),
        (
            "latency_us = 1\n",
            "latency_us = 1e300\n",
            "link[0].latency_us",
        ),
    ] {
        let (code, _, err, _) = estimate_on(&SMALL_CLUSTER.replace(from, to), "absurd");
        assert_eq!(code, 2, "{to}: {err}");
        assert!(err.contains(field), "{to}: {err}");
    }
}

/// Links the cost model would ignore or price wrongly are refused naming the field: a second
/// link of one scope (the first was priced, the second silently dropped), a node link with
/// NIC fields; and GPUs over several nodes of a cluster with no link between nodes (priced at
/// the node link's speed).
#[test]
fn links_the_cost_model_would_ignore_are_refused() {
    let node = "[[link]]\nname = \"nv\"\nscope = \"node\"\ngb_per_s = 100\nlatency_us = 1\n\
                efficiency = 0.5\n";
    let twice = format!("{SMALL_CLUSTER}{node}");
    let (code, _, err, _) = estimate_on(&twice, "twice");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("link[1].scope"), "{err}");
    let nic = SMALL_CLUSTER.replace("gb_per_s = 100\n", "gb_per_s = 100\nnic_gb_per_s = 50\n");
    let (code, _, err, _) = estimate_on(&nic, "nic");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("link[0]") && err.contains("nic"), "{err}");
    let dir = std::env::temp_dir().join(format!("plait-cluster-nodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join("c.toml");
    std::fs::write(&p, SMALL_CLUSTER).expect("write the cluster file");
    let ps = p.to_string_lossy().to_string();
    let (code, _, err) = plait(&[
        "estimate",
        "gpt2",
        "--cluster",
        &ps,
        "--gpus",
        "16",
        "--global-batch",
        "16",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "16",
        "--micro-batch",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no link between nodes"), "{err}");
}

#[test]
fn a_cluster_file_that_is_not_toml_says_where_on_one_line() {
    let dir = std::env::temp_dir().join(format!("plait-cluster-syntax-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("syntax.toml");
    std::fs::write(&p, "name = \"x\"\ngpus_per_node = = 8\n").unwrap();
    let ps = p.to_string_lossy().to_string();
    let (code, _, err) = plait(&[
        "compile",
        "gpt2",
        "--cluster",
        &ps,
        "--gpus",
        "8",
        "--global-batch",
        "8",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(code, 2);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    assert!(line.contains("syntax.toml: line 2, column 17"), "{err}");
}
