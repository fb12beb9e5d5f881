//! Determinism: plan.json and the `plait report` text of small cases are snapshots, and
//! compiling twice gives byte-identical files.

mod common;

use common::{PINNED_PIPELINE, compile, plait};

fn report_text(plan: &std::path::Path) -> String {
    let p = plan.to_string_lossy().to_string();
    let (code, stdout, stderr) = plait(&["report", &p]);
    assert_eq!(code, 0, "report failed: {stderr}");
    assert!(
        !stderr.contains("stale"),
        "a fresh plan is not stale: {stderr}"
    );
    stdout
}

/// The plan file with its model's IR text (one long JSON string, checked to parse back) shown
/// as its line count, so that the snapshot reviews the plan's decisions.
fn plan_text(plan: &std::path::Path) -> String {
    let text = std::fs::read_to_string(plan).expect("plan");
    let v: serde_json::Value = serde_json::from_str(&text).expect("plan JSON");
    let ir = v["model"]["ir"]
        .as_str()
        .expect("the plan carries its model's IR");
    let graph = ir::text::parse(ir).expect("the plan's IR parses");
    assert_eq!(ir::text::print(&graph), ir, "the plan's IR round-trips");
    text.lines()
        .map(|l| match l.trim_start().strip_prefix("\"ir\": \"") {
            Some(_) => {
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}\"ir\": <{} lines of IR text>", ir.lines().count())
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn compile_twice_is_byte_identical() {
    let a = compile("twice", "a.json", &[]);
    let b = compile("twice", "b.json", &[]);
    let (a, b) = (std::fs::read(a).expect("a"), std::fs::read(b).expect("b"));
    assert!(!a.is_empty());
    assert!(a == b, "two compiles differ");
    let c = compile("twice", "c.json", &PINNED_PIPELINE);
    let d = compile("twice", "d.json", &PINNED_PIPELINE);
    assert!(std::fs::read(c).expect("c") == std::fs::read(d).expect("d"));
}

#[test]
fn gpt2_searched_plan() {
    let plan = compile("searched", "plan.json", &[]);
    insta::assert_snapshot!("gpt2_searched_plan_json", plan_text(&plan));
    insta::assert_snapshot!("gpt2_searched_report", report_text(&plan));
}

#[test]
fn gpt2_pinned_pipeline_plan() {
    let plan = compile("pinned", "plan.json", &PINNED_PIPELINE);
    insta::assert_snapshot!("gpt2_tp2_pp2_dp2_plan_json", plan_text(&plan));
    insta::assert_snapshot!("gpt2_tp2_pp2_dp2_report", report_text(&plan));
}

#[test]
fn report_json_is_one_object_with_the_sections() {
    let plan = compile("json", "plan.json", &PINNED_PIPELINE);
    let p = plan.to_string_lossy().to_string();
    let (code, stdout, stderr) = plait(&["report", &p, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    for key in [
        "format",
        "model",
        "strategy",
        "predicted",
        "why",
        "stages",
        "communication",
        "alternatives",
        "stale",
    ] {
        assert!(v.get(key).is_some(), "missing `{key}`");
    }
    assert_eq!(v["format"], "plait-report/1");
    assert_eq!(v["stale"], false);
    assert!(v["predicted"]["bubble_fraction"].as_f64().expect("bubble") > 0.0);
    assert_eq!(v["stages"].as_array().expect("stages").len(), 2);
    assert!(v["why"].as_array().expect("why").len() >= 5);
    let rows = v["communication"][0]["rows"].as_array().expect("rows");
    assert!(rows.iter().any(|r| r["parallelism"] == "tp"));
    assert!(rows.iter().any(|r| r["parallelism"] == "pp"));
    assert!(rows.iter().any(|r| r["parallelism"] == "dp"));
    assert!(rows.iter().all(|r| r["link"]["level"] == "node"));
}

#[test]
fn a_stale_plan_is_reported() {
    let plan = compile("stale", "plan.json", &[]);
    let text = std::fs::read_to_string(&plan).expect("plan");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let t = v["predicted"]["iteration_time_s"].as_f64().expect("time");
    v["predicted"]["iteration_time_s"] = serde_json::json!(t * 1.01);
    std::fs::write(&plan, serde_json::to_string_pretty(&v).expect("json")).expect("write");
    let p = plan.to_string_lossy().to_string();
    let (code, stdout, stderr) = plait(&["report", &p]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("is stale"), "{stderr}");
    assert!(stdout.contains("STALE"), "{stdout}");
}
