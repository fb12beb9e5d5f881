//! `plait report --html`: one self-contained page with the timeline and the memory bars.

mod common;

use common::{PINNED_PIPELINE, compile, dir, plait};

#[test]
fn html_is_self_contained_with_timeline_and_memory_bars() {
    let plan = compile("html", "plan.json", &PINNED_PIPELINE);
    let html = dir("html").join("report.html");
    let (p, h) = (
        plan.to_string_lossy().to_string(),
        html.to_string_lossy().to_string(),
    );
    let (code, _, stderr) = plait(&["report", &p, "--html", &h]);
    assert_eq!(code, 0, "{stderr}");
    let page = std::fs::read_to_string(&html).expect("html");
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.trim_end().ends_with("</html>"));
    // No network access needed: no external URL anywhere, no external src/href.
    let lower = page.to_lowercase();
    for bad in ["http://", "https://", "src=", "href=", "@import", "url("] {
        assert!(!lower.contains(bad), "page contains `{bad}`");
    }
    assert!(page.contains("<svg id=\"timeline\""));
    assert!(page.contains("<svg id=\"memory\""));
    assert!(page.contains("class=\"fwd\"") && page.contains("class=\"bwd\""));
    assert!(page.contains("class=\"mem\""));
    // A row per stage in the timeline and a bar per stage in the memory chart.
    assert!(page.contains("stage 0 compute") && page.contains("stage 1 compute"));
    assert_eq!(page.matches("class=\"mem\"").count(), 2 * 5);
    assert!(page.contains("capacity 80.0 GiB"));
    assert!(page.contains("<h2>Why</h2>"));
    // Tags balance (a cheap well-formedness check).
    for tag in ["svg", "table", "ul", "body", "html"] {
        assert_eq!(
            page.matches(&format!("<{tag}")).count(),
            page.matches(&format!("</{tag}>")).count(),
            "<{tag}> unbalanced"
        );
    }
}
