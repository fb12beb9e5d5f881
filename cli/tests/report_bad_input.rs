//! `plait report` on bad input: exit 2 with one message naming the file.

mod common;

use common::{dir, plait};

fn expect_error(path: &str, fragments: &[&str]) {
    let (code, _, stderr) = plait(&["report", path]);
    assert_eq!(code, 2, "exit code: {stderr}");
    assert!(stderr.contains(path), "message names the file: {stderr}");
    for f in fragments {
        assert!(stderr.contains(f), "message lacks `{f}`: {stderr}");
    }
    assert_eq!(stderr.trim().lines().count(), 1, "one message: {stderr}");
}

fn write(test: &str, contents: &str) -> String {
    let p = dir(test).join("plan.json");
    std::fs::write(&p, contents).expect("write");
    p.to_string_lossy().to_string()
}

#[test]
fn missing_plan_file() {
    expect_error("/nonexistent/plait/plan.json", &["cannot read"]);
}

#[test]
fn not_json() {
    let p = write("notjson", "this is not { json");
    expect_error(&p, &["not a valid plan", "JSON error at line 1"]);
}

#[test]
fn wrong_format_string() {
    let p = write("format", r#"{"format": "plait-plan/99", "model": {}}"#);
    expect_error(
        &p,
        &[
            "plan format `plait-plan/99` is not supported",
            "plait-plan/1",
        ],
    );
}

#[test]
fn no_format_field() {
    let p = write("noformat", r#"{"model": "gpt2"}"#);
    expect_error(&p, &["no `format` field"]);
}

#[test]
fn right_format_wrong_content() {
    let p = write("content", r#"{"format": "plait-plan/1", "model": 3}"#);
    expect_error(&p, &["not a valid plait-plan/1 plan"]);
}
