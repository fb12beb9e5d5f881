//! Inputs edited by hand, or pointed at each other, are refused at once with exit code 2 and
//! a message naming the file or the field: a plan whose strategy was changed, a program
//! directory that no longer verifies, an output path that is the command's own input, sizes
//! beyond what plait schedules. Never a panic, a crash or a run of something unverified.

mod common;

use std::path::{Path, PathBuf};

use common::{dir, plait};

fn s(p: &Path) -> String {
    p.to_string_lossy().to_string()
}

/// `plait compile` of `cfg` for two CPU ranks, written to `out`.
fn compile_tiny(cfg: &Path, out: &Path) -> (i32, String, String) {
    plait(&[
        "compile",
        &s(cfg),
        "--cluster",
        "cpu",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "-o",
        &s(out),
    ])
}

/// A two-rank CPU plan of a tiny GPT-2 under `d`.
fn tiny_plan(d: &Path) -> PathBuf {
    let cfg = d.join("tiny.json");
    std::fs::write(
        &cfg,
        r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":4,"vocab_size":256,"n_positions":64}"#,
    )
    .expect("config");
    let plan = d.join("plan.json");
    let (code, _, err) = compile_tiny(&cfg, &plan);
    assert_eq!(code, 0, "{err}");
    plan
}

/// [`tiny_plan`]'s programs, written by `plait codegen` under `d`.
fn tiny_programs(d: &Path) -> PathBuf {
    let plan = tiny_plan(d);
    let progs = d.join("programs");
    let (code, _, err) = plait(&["codegen", &s(&plan), "-o", &s(&progs)]);
    assert_eq!(code, 0, "{err}");
    progs
}

/// `plan` with `strategy.<field>` set to `value`, written beside it.
fn edited(plan: &Path, field: &str, value: serde_json::Value) -> PathBuf {
    let text = std::fs::read_to_string(plan).expect("plan");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("plan JSON");
    v["strategy"][field] = value;
    let out = plan.with_file_name(format!("edited-{field}.json"));
    std::fs::write(&out, v.to_string()).expect("write");
    out
}

#[test]
fn a_plan_whose_strategy_was_edited_is_refused_by_every_command_that_reads_it() {
    let d = dir("strategy");
    let plan = tiny_plan(&d);
    for (field, value, says) in [
        ("micro_batch", serde_json::json!(0), "must be positive"),
        ("zero", serde_json::json!(9), "ZeRO stage 9"),
        ("tp", serde_json::json!(3), "must equal"),
    ] {
        let bad = edited(&plan, field, value);
        let out = d.join("out");
        for args in [
            vec!["codegen", &s(&bad), "-o", &s(&out)][..].to_vec(),
            vec!["export", &s(&bad), "--to", "deepspeed"],
            vec!["run", &s(&bad), "--steps", "1"],
        ] {
            let (code, _, err) = plait(&args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert!(
                err.contains("strategy") && err.contains(says),
                "{args:?}: {err}"
            );
        }
    }
}

/// A key a plan does not have (a hand edit's typo) is refused by every command that reads the
/// plan, naming it: serde dropped it, and the plan ran as it was.
#[test]
fn a_plan_with_a_misspelt_field_is_refused_naming_it() {
    let d = dir("misspelt");
    let plan = tiny_plan(&d);
    let bad = edited(&plan, "zer0", serde_json::json!(3));
    let out = d.join("out");
    for args in [
        vec!["codegen", &s(&bad), "-o", &s(&out)][..].to_vec(),
        vec!["export", &s(&bad), "--to", "deepspeed"],
        vec!["run", &s(&bad), "--steps", "1"],
        vec!["report", &s(&bad)],
    ] {
        let (code, _, err) = plait(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("`strategy.zer0` is no field"),
            "{args:?}: {err}"
        );
    }
}

/// A plan whose strategy no longer fits its GPUs (here its cluster's memory was edited to a
/// few KiB) is refused by the commands that lower it, naming the peak the cost model
/// predicts, and `report` says it is stale and does not fit: export wrote a launch that ran
/// out of memory.
#[test]
fn a_plan_that_no_longer_fits_is_refused_and_reported_stale() {
    let d = dir("no-longer-fits");
    let plan = tiny_plan(&d);
    let text = std::fs::read_to_string(&plan).expect("plan");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("plan JSON");
    v["cluster"]["gpu"]["memory_gib"] = serde_json::json!(1e-5);
    let bad = d.join("small-memory.json");
    std::fs::write(&bad, v.to_string()).expect("edited plan");
    let out = d.join("out");
    for args in [
        vec!["codegen", &s(&bad), "-o", &s(&out)][..].to_vec(),
        vec!["export", &s(&bad), "--to", "deepspeed"],
        vec!["run", &s(&bad), "--steps", "1"],
    ] {
        let (code, _, err) = plait(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("its strategy does not fit") && err.contains("run `plait compile` again"),
            "{args:?}: {err}"
        );
    }
    let (code, json, err) = plait(&["report", &s(&bad), "--json"]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&json).expect("report JSON");
    assert_eq!(
        (&r["stale"], &r["recomputed_fits"]),
        (&true.into(), &false.into())
    );
    assert!(err.contains("does not fit"), "{err}");
    // Against the card as edited, not the plan's stored capacity.
    assert!(err.contains("of 10.5 KiB (does not fit)"), "{err}");
    // The plan as compiled is neither refused nor stale.
    let (code, json, err) = plait(&["report", &s(&plan), "--json"]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&json).expect("report JSON");
    assert_eq!(
        (&r["stale"], &r["recomputed_fits"]),
        (&false.into(), &true.into())
    );
}

/// A plan whose pipeline split was edited (no chunks, a gap, a layer short) is refused naming
/// `chunks`: `export --to megatron` of a plan without chunks panicked.
#[test]
fn a_plan_whose_chunks_were_edited_is_refused_by_every_command_that_reads_it() {
    let d = dir("chunks");
    let plan = tiny_plan(&d);
    let text = std::fs::read_to_string(&plan).expect("plan");
    let v: serde_json::Value = serde_json::from_str(&text).expect("plan JSON");
    let chunk = v["chunks"][0].clone();
    let mut gap = chunk.clone();
    gap["layers"] = serde_json::json!([1, 2]);
    let mut short = chunk.clone();
    short["layers"] = serde_json::json!([0, 1]);
    for (name, chunks) in [
        ("none", serde_json::json!([])),
        ("gap", serde_json::json!([gap])),
        ("short", serde_json::json!([short])),
    ] {
        let mut edited = v.clone();
        edited["chunks"] = chunks;
        refused_naming_chunks(&d, &format!("chunks-{name}"), &edited);
    }
}

/// `edited` written under `d` as `name`: every command that reads a plan (`codegen`, `export`,
/// `run`, `report`) exits 2 naming its `chunks` field.
fn refused_naming_chunks(d: &Path, name: &str, edited: &serde_json::Value) {
    let bad = d.join(format!("{name}.json"));
    std::fs::write(&bad, edited.to_string()).expect("edited plan");
    let out = d.join(format!("{name}-programs"));
    for args in [
        vec!["codegen", &s(&bad), "-o", &s(&out)],
        vec!["export", &s(&bad), "--to", "megatron"],
        vec!["run", &s(&bad), "--steps", "1"],
        vec!["report", &s(&bad)],
    ] {
        let (code, _, err) = plait(&args);
        assert_eq!(code, 2, "{name} {args:?}: {err}");
        assert!(err.contains("`chunks`"), "{name} {args:?}: {err}");
    }
}

/// A pipeline plan whose chunks were moved apart from the strategy's split, or whose second
/// chunk claims the embedding, is refused naming `chunks`: `report` explained the strategy's
/// split beside the edited chunks, and `codegen` lowered a pipeline that deadlocked.
#[test]
fn a_pipeline_plan_whose_chunks_disagree_with_its_split_is_refused() {
    let d = dir("chunks-pp");
    let plan = d.join("plan.json");
    let (code, _, err) = plait(&[
        "compile",
        "gpt2",
        "--cluster",
        "cpu",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "--seq",
        "64",
        "--pp",
        "2",
        "-o",
        &s(&plan),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).expect("plan")).expect("JSON");
    let cut = v["chunks"][0]["layers"][1]
        .as_u64()
        .expect("first chunk's end");
    let moved_cut = if cut + 1 < 12 { cut + 1 } else { cut - 1 };
    let mut moved = v.clone();
    moved["chunks"][0]["layers"][1] = serde_json::json!(moved_cut);
    moved["chunks"][1]["layers"][0] = serde_json::json!(moved_cut);
    let mut two_embeddings = v.clone();
    two_embeddings["chunks"][1]["embedding"] = serde_json::json!(true);
    for (name, edited) in [("moved", moved), ("two-embeddings", two_embeddings)] {
        refused_naming_chunks(&d, name, &edited);
    }
}

#[test]
fn a_program_directory_that_no_longer_verifies_does_not_run() {
    let progs = tiny_programs(&dir("programs"));
    let template = progs.join("template-0.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&template).expect("template"))
            .expect("template JSON");
    let instrs = v["instrs"].as_array_mut().expect("instrs");
    let half = instrs.len() / 2;
    instrs.truncate(half);
    std::fs::write(&template, v.to_string()).expect("write");
    let (code, out, err) = plait(&["run", &s(&progs), "--steps", "1"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("does not pass the verifier"), "{err}");
    assert!(!out.contains("step     1"), "no step runs: {out}");
}

#[test]
fn an_output_path_that_is_the_commands_input_is_refused_and_the_input_kept() {
    let d = dir("overwrite");
    let plan = tiny_plan(&d);
    let before = std::fs::read(&plan).expect("plan");
    let cfg = d.join("tiny.json");
    for args in [
        vec!["export", &s(&plan), "--to", "megatron", "-o", &s(&plan)],
        vec!["report", &s(&plan), "--trace", &s(&plan)],
        vec!["run", &s(&plan), "--steps", "1", "--log-json", &s(&plan)],
    ] {
        let (code, _, err) = plait(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("the plan this command reads"), "{err}");
    }
    assert_eq!(
        std::fs::read(&plan).expect("plan"),
        before,
        "the plan is intact"
    );
    let config = std::fs::read(&cfg).expect("config");
    let (code, _, err) = compile_tiny(&cfg, &cfg);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the model this command reads"), "{err}");
    assert_eq!(
        std::fs::read(&cfg).expect("config"),
        config,
        "the config is intact"
    );
}

/// `codegen -o` names a directory: a file there, or a directory of other files (whose own
/// `index.json` codegen would overwrite), is refused with exit 2 and left as it was; a
/// directory codegen wrote before is written again.
#[test]
fn codegen_writes_only_into_a_new_empty_or_program_directory() {
    let d = dir("codegen-destination");
    let plan = tiny_plan(&d);
    let file = d.join("notes.txt");
    std::fs::write(&file, "mine").expect("file");
    let foreign = d.join("site");
    std::fs::create_dir_all(&foreign).expect("dir");
    std::fs::write(foreign.join("index.json"), r#"{"title": "mine"}"#).expect("index");
    let under_file = file.join("programs");
    let slashed = PathBuf::from(format!("{}/", s(&file)));
    let dangling = d.join("dangling");
    std::os::unix::fs::symlink(d.join("nowhere"), &dangling).expect("link");
    for (out, says) in [
        (&file, "is a file, not a directory"),
        (&under_file, "is a file, not a directory"),
        (&slashed, "is a file, not a directory"),
        (&dangling, "is a link to nothing"),
        (&foreign, "an index.json that is not plait's"),
    ] {
        let (code, _, err) = plait(&["codegen", &s(&plan), "-o", &s(out)]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&s(&file)) || err.contains(&s(out)), "{err}");
        assert!(err.contains(says), "{err}");
    }
    assert_eq!(std::fs::read_to_string(&file).expect("file"), "mine");
    let index = std::fs::read_to_string(foreign.join("index.json")).expect("index");
    assert_eq!(
        index, r#"{"title": "mine"}"#,
        "the directory's own index is intact"
    );
    let progs = tiny_programs(&d);
    let (code, _, err) = plait(&["codegen", &s(&plan), "-o", &s(&progs)]);
    assert_eq!(code, 0, "a program directory is written again: {err}");
}

#[test]
fn sizes_beyond_what_plait_schedules_are_refused_at_once() {
    let started = std::time::Instant::now();
    let (code, _, err) = plait(&[
        "compile",
        "gpt2",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--global-batch",
        "10000000000",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("micro-batches per iteration"), "{err}");
    assert!(started.elapsed().as_secs() < 30, "at once");
    let (code, _, err) = plait(&[
        "compile",
        "gpt2",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--top",
        "18446744073709551615",
    ]);
    assert_eq!(code, 0, "the largest --top keeps every alternative: {err}");
    let (code, _, err) = plait(&[
        "compile",
        "mixtral-8x7b",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "64",
        "--global-batch",
        "64",
        "--ep",
        "3",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--ep 3 does not divide the model's 8 experts"),
        "{err}"
    );
}

/// A program directory checks `--data` against its model's vocabulary as a plan does (the
/// rows of its token table): ids past it are refused before a step, not looked up as zeros.
#[test]
fn a_program_directory_checks_its_data_against_the_vocabulary() {
    let d = dir("vocab");
    let progs = tiny_programs(&d);
    let data = d.join("ids.bin");
    let ids: Vec<u8> = (0..4096u32).flat_map(|i| (300 + i).to_le_bytes()).collect();
    std::fs::write(&data, ids).expect("data");
    let (code, out, err) = plait(&[
        "run",
        &s(&progs),
        "--steps",
        "1",
        "--data",
        &s(&data),
        "--data-width",
        "u32",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("outside the model's vocabulary of 256"),
        "{err}"
    );
}
