//! The dependency invariants of docs/architecture.md, checked over `cargo metadata`: what each
//! crate may build on (normal dependencies, transitively; dev-dependencies are the tests' own).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a broken workspace should panic

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Workspace package name → names of its normal (not dev, not build) dependencies, as its
/// manifest declares them (optional ones included: a feature may turn them on).
fn normal_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// Every package `root` builds on, itself excluded: the workspace crates transitively, and the
/// outside crates they name directly (no outside crate depends on a solver or an importer).
fn closure(graph: &BTreeMap<String, BTreeSet<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = vec![root];
    while let Some(p) = todo.pop() {
        for d in graph.get(p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d);
            }
        }
    }
    seen
}

const WORKSPACE: [&str; 9] = [
    "ir", "import", "planner", "program", "codegen", "runtime", "kernels", "simt", "plait",
];

/// The workspace crates `krate` builds on, transitively.
fn workspace_closure(graph: &BTreeMap<String, BTreeSet<String>>, krate: &str) -> BTreeSet<String> {
    closure(graph, krate)
        .into_iter()
        .filter(|d| WORKSPACE.contains(&d.as_str()))
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn crates_build_only_on_what_the_architecture_allows() {
    let g = normal_dependencies();
    // The graph is read at all: codegen lowers plans, so it builds on the planner.
    assert!(
        workspace_closure(&g, "codegen").contains("planner"),
        "{g:?}"
    );
    // Each crate's allowed workspace crates (transitively), as docs/architecture.md draws them.
    let allowed = [
        ("ir", set(&[])),
        ("kernels", set(&["ir"])),
        ("program", set(&["ir"])),
        ("import", set(&["ir"])),
        ("planner", set(&["ir"])),
        ("runtime", set(&["ir", "kernels", "program"])),
        ("simt", set(&["ir", "kernels"])),
    ];
    for (krate, allowed) in allowed {
        let got = workspace_closure(&g, krate);
        assert!(
            got.is_subset(&allowed),
            "{krate} builds on {got:?}; docs/architecture.md allows {allowed:?}"
        );
    }
}

#[test]
fn the_kernel_emulator_is_for_tests_only() {
    // simt runs the device kernels on the host for tests; no shipped crate builds on it.
    let g = normal_dependencies();
    for krate in WORKSPACE {
        assert!(
            !closure(&g, krate).contains("simt"),
            "{krate} builds on simt outside its tests"
        );
    }
}

#[test]
fn the_runtime_carries_no_planner_solver_or_importer() {
    let g = normal_dependencies();
    let runtime = closure(&g, "runtime");
    for banned in ["planner", "codegen", "import", "egg", "good_lp", "prost"] {
        assert!(
            !runtime.contains(banned),
            "runtime builds on {banned} (its closure: {runtime:?})"
        );
    }
}
