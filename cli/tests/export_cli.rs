//! `plait export`: a compiled plan becomes a Megatron-LM launch script, as text, as a file and
//! as JSON; a plan an engine cannot run is refused with exit 2 and the reason.

mod common;

use common::{PINNED_PIPELINE, compile, dir, plait};

#[test]
fn a_compiled_plan_exports_to_a_megatron_launch() {
    let plan = compile("export", "plan.json", &PINNED_PIPELINE);
    let p = plan.to_string_lossy().to_string();
    let (code, out, err) = plait(&["export", &p, "--to", "megatron"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("#!/usr/bin/env bash"), "{out}");
    for want in [
        "pretrain_gpt.py",
        "--tensor-model-parallel-size 2",
        "--pipeline-model-parallel-size 2",
    ] {
        assert!(out.contains(want), "{want} missing from:\n{out}");
    }
    let script = dir("export").join("launch.sh");
    let s = script.to_string_lossy().to_string();
    let (code, _, err) = plait(&["export", &p, "--to", "megatron", "-o", &s]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&script).unwrap_or_default(), out);
    let (code, json, err) = plait(&["export", &p, "--to", "megatron", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
    assert_eq!(v["engine"], "megatron");
    assert_eq!(v["version"], "core_v0.15.0");
    assert!(v["args"].as_array().is_some_and(|a| !a.is_empty()));
}

#[test]
fn a_plan_the_engine_cannot_run_is_refused_with_the_reason() {
    let plan = compile("export-refused", "plan.json", &PINNED_PIPELINE);
    let p = plan.to_string_lossy().to_string();
    // GPT-2 is none of torchtitan's registered models.
    let (code, out, err) = plait(&["export", &p, "--to", "torchtitan"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("torchtitan"), "{err}");
    assert!(out.is_empty(), "nothing written on refusal: {out}");
}

/// A plan priced with plait's own compressed exchange is refused by every engine (they
/// exchange plain gradients every step): exporting it dropped the exchange the plan was priced
/// with, and wrote a launch that ran another plan.
#[test]
fn a_compressed_exchange_is_refused_by_every_engine() {
    let plan = compile(
        "export-int8",
        "plan.json",
        &["--grad-compression", "int8", "--zero", "0"],
    );
    let p = plan.to_string_lossy().to_string();
    for engine in ["megatron", "torchtitan", "deepspeed"] {
        let (code, out, err) = plait(&["export", &p, "--to", engine]);
        assert_eq!(code, 2, "{engine}: {out}{err}");
        assert!(err.contains("--grad-compression int8"), "{engine}: {err}");
        assert!(out.is_empty(), "nothing written on refusal: {out}");
    }
}

/// A pipeline whose layers do not divide evenly (Llama-3 70B's 80 layers over 6 stages):
/// `compile --target megatron` plans a split Megatron-LM can state (the middle stages even),
/// and `export` writes it as `--decoder-first/last-pipeline-num-layers`. The even default
/// ([14, 14, 13, 13, 13, 13]) it cannot state.
#[test]
fn a_targeted_uneven_pipeline_exports_to_megatron() {
    let d = dir("export-uneven");
    let plan = d.join("plan.json").to_string_lossy().to_string();
    let (code, out, err) = plait(&[
        "compile",
        "llama3-70b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "48",
        "--global-batch",
        "96",
        "--pp",
        "6",
        "--target",
        "megatron",
        "-o",
        &plan,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = plait(&["export", &plan, "--to", "megatron"]);
    assert_eq!(code, 0, "{err}");
    let value = |flag: &str| -> u32 {
        out.split(flag)
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{flag} missing from:\n{out}"))
    };
    let (first, last) = (
        value("--decoder-first-pipeline-num-layers"),
        value("--decoder-last-pipeline-num-layers"),
    );
    let middle = 80 - first - last;
    assert!(middle.is_multiple_of(4), "{first} + 4 x middle + {last}");
}
