//! A plan predicts the layout its program runs: the search prices a layer's tensor-parallel
//! communication from the block's sharding extraction, and where codegen cannot lower that
//! extraction (and runs Megatron-LM's rules), `compile` prices the winner by the rules again.
//! `plait report` re-estimates a plan the same way, so neither plan is stale.

mod common;

use common::{compile, plait};

fn pins(line: &'static str) -> Vec<&'static str> {
    line.split_whitespace().collect()
}

fn plan_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("plan")).expect("plan JSON")
}

fn estimate_time(args: &[&str]) -> f64 {
    estimate_time_of(&common::GPT2_AUTO, args)
}

/// The iteration time `plait estimate` predicts for `model_and_cluster` with `args`.
fn estimate_time_of(model_and_cluster: &[&str], args: &[&str]) -> f64 {
    let mut all = vec!["estimate"];
    all.extend(model_and_cluster);
    all.extend(args);
    all.push("--json");
    let (code, out, err) = plait(&all);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("estimate JSON");
    v["predicted"]["iteration_time_s"].as_f64().expect("time")
}

fn not_stale(plan: &std::path::Path) {
    let p = plan.to_string_lossy().to_string();
    let (code, out, err) = plait(&["report", &p, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("report JSON");
    assert_eq!(v["stale"], false, "{}", v["recomputed_iteration_time_s"]);
}

/// Phi-3-mini at tp 8 with SP, 16 sequences of 4096 tokens a micro-batch, on 64 H100: the
/// extraction of its embedding and head (vocabulary-parallel with the sequence pieces' tokens
/// gathered otherwise) is not the layout codegen's rules lower, so the program runs the rules
/// there and the plan prices those ops by the rules (slower than the extraction's price,
/// which `estimate` gives). Every layer now runs its extraction: since the e-graph splits
/// attention by query heads beside whole keys and values, a broadcast product along the
/// sequence and the backward cuts a kept value's pieces again, no sweep plan of 18 models at
/// tp 2-8 falls back to the rules for a layer, so the embedding and head carry this check.
#[test]
fn a_plan_lowered_by_the_rules_is_priced_by_the_rules() {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/phi-3-mini-4k/config.json"
    );
    let mut model_and_cluster = vec![config];
    model_and_cluster.extend(common::H100_64);
    let pins = pins(
        "--tp 8 --pp 1 --dp 8 --micro-batch 16 --zero 1 --recompute none --sequence-parallel on",
    );
    let path = common::dir("rules").join("plan.json");
    let p = path.to_string_lossy().to_string();
    let mut args = vec!["compile"];
    args.extend(&model_and_cluster);
    args.extend(&pins);
    args.extend(["-o", &p]);
    let (code, _, err) = plait(&args);
    assert_eq!(code, 0, "{err}");
    let v = plan_json(&path);
    let method = v["sharding"]["embedding_head"].as_str().expect("method");
    assert!(method.starts_with("megatron-rules ("), "{method}");
    for side in ["embedding_tp_comm", "head_tp_comm"] {
        let source = v["predicted"][side]["source"].as_str().expect("source");
        assert!(
            source.starts_with("megatron rules (the e-graph's layout of the embedding and head"),
            "{side}: {source}"
        );
    }
    let planned = v["predicted"]["iteration_time_s"].as_f64().expect("time");
    let extraction = estimate_time_of(&model_and_cluster, &pins);
    assert!(
        planned > extraction,
        "the rules' layout ({planned} s) communicates more than the extraction's ({extraction} s)"
    );
    not_stale(&path);
}

/// GPT-2 at tp 4 without SP on 8 A100: the extraction is Megatron-LM's layout, lowered as
/// extracted, and the plan keeps the extraction's price (what `estimate` predicts).
#[test]
fn a_plan_lowered_as_extracted_keeps_the_extractions_price() {
    let pins = pins("--tp 4 --pp 1 --dp 2 --micro-batch 4 --zero 1 --sequence-parallel off");
    let path = compile("extracted", "plan.json", &pins);
    let v = plan_json(&path);
    let method = v["sharding"]["method"].as_str().expect("method");
    assert!(method.starts_with("e-graph"), "{method}");
    assert_eq!(
        v["predicted"]["layer_tp_comm"]["source"],
        "e-graph extraction"
    );
    let planned = v["predicted"]["iteration_time_s"].as_f64().expect("time");
    assert_eq!(planned, estimate_time(&pins));
    not_stale(&path);
}

/// The program's tensor-parallel collectives of one kind per step, from `plait show`'s listing
/// of rank 0.
fn program_collectives(listing: &str, kind: &str) -> u64 {
    listing
        .lines()
        .filter(|l| l.starts_with("step "))
        .filter(|l| l.split_whitespace().nth(2) == Some(kind) && l.contains(" over tp "))
        .count() as u64
}

/// GPT-2 at tp 2 with SP on 8 A100: the report's tensor-parallel rows are the extraction's
/// collectives, as many per step as the lowered program runs (codegen's listing, an
/// independent count): the all-gathers with each value gathered again for the backward, the
/// reduce-scatters, the all-to-alls codegen lowers as reshards, and the all-reduces with the
/// once-per-step gradient reductions bucketed per layer.
#[test]
fn the_reports_tensor_parallel_rows_count_the_programs_collectives() {
    let pins = pins("--tp 2 --pp 1 --dp 4 --micro-batch 4 --zero 1 --sequence-parallel on");
    let path = compile("tp-rows", "plan.json", &pins);
    let v = plan_json(&path);
    assert_eq!(
        v["predicted"]["layer_tp_comm"]["source"],
        "e-graph extraction"
    );
    let p = path.to_string_lossy().to_string();
    let (code, out, err) = plait(&["report", &p, "--json"]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("report JSON");
    let rows = report["communication"][0]["rows"].as_array().expect("rows");
    let reported = |kind: &str| -> u64 {
        rows.iter()
            .filter(|r| r["parallelism"] == "tp" && r["collective"] == kind)
            .filter_map(|r| r["calls"].as_u64())
            .sum()
    };
    let dir = path.with_file_name("program");
    let d = dir.to_string_lossy().to_string();
    let (code, _, err) = plait(&["codegen", &p, "-o", &d]);
    assert_eq!(code, 0, "{err}");
    let (code, listing, err) = plait(&["show", "--rank", "0", &d]);
    assert_eq!(code, 0, "{err}");
    for (reported_as, listed_as) in [
        ("all-gather", "all_gather"),
        ("reduce-scatter", "reduce_scatter"),
        ("all-to-all", "reshard"),
    ] {
        assert_eq!(
            reported(reported_as),
            program_collectives(&listing, listed_as),
            "{reported_as}: {:#?}",
            rows
        );
    }
    assert!(
        reported("all-gather") > reported("reduce-scatter"),
        "regathers"
    );
    // All-reduces: the embedding's partial sums and the per-step gradient reductions, one
    // bucket per layer as the program runs them.
    assert_eq!(
        reported("all-reduce"),
        program_collectives(&listing, "all_reduce"),
        "{rows:#?}"
    );
}
