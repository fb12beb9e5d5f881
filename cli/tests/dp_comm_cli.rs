//! Communication-efficient data parallelism on 2 CPU ranks (a tiny GPT, 60 steps, one seed):
//! compressed gradient exchanges and local SGD train close to the synchronous uncompressed run
//! while the bytes a rank sends (`comm_bytes` of `--log-json`) fall by the exchange's factor.

mod common;

use common::{dir, plait};

const STEPS: usize = 60;

/// (mean loss of the last 5 steps, total comm_bytes) of one run.
fn train(plan: &str, data: &str, log: &std::path::Path, extra: &[&str]) -> (f64, u64) {
    let steps = STEPS.to_string();
    let log_s = log.to_string_lossy();
    let mut args = vec![
        "run",
        plan,
        "--steps",
        &steps,
        "--seed",
        "1",
        "--data",
        data,
        "--log-json",
        &log_s,
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = plait(&args);
    assert_eq!(code, 0, "{extra:?}: {out}{err}");
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(log)
        .expect("log written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), STEPS, "{extra:?}");
    let tail: f64 = rows[STEPS - 5..]
        .iter()
        .map(|r| r["loss"].as_f64().expect("loss"))
        .sum::<f64>()
        / 5.0;
    let bytes = rows
        .iter()
        .map(|r| r["comm_bytes"].as_u64().expect("comm_bytes"))
        .sum();
    (tail, bytes)
}

#[test]
fn compressed_and_local_sgd_exchanges_train_and_send_less() {
    let d = dir("dp-comm");
    let model = d.join("m.json");
    std::fs::write(
        &model,
        r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":4,"vocab_size":256,"n_positions":64}"#,
    )
    .expect("config written");
    let text = d.join("text.txt");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README");
    std::fs::write(&text, readme.repeat(4)).expect("text written");
    let plan = d.join("dp2.json");
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
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "2",
        "--micro-batch",
        "4",
        "--precision",
        "fp32",
        "-o",
        &plan.to_string_lossy(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (p, t) = (
        plan.to_string_lossy().into_owned(),
        text.to_string_lossy().into_owned(),
    );
    let (base_loss, base_bytes) = train(&p, &t, &d.join("sync.jsonl"), &[]);
    // (flags, loss tolerance relative to sync, least byte saving): the issue's bars.
    // Top-k under Adam as 1-bit Adam runs it (a dense warm-up, then Adam's second moment
    // frozen): without the freeze it trailed by 32 % after 60 steps.
    let modes: [(&[&str], f64, f64); 4] = [
        (&["--grad-compression", "bf16"], 0.05, 1.9),
        (&["--grad-compression", "int8"], 0.05, 3.5),
        (&["--grad-compression", "topk:0.01"], 0.05, 10.0),
        (&["--dp-sync", "local-sgd:8"], 0.10, 6.0),
    ];
    let mut failures = Vec::new();
    for (k, (flags, tol, saving)) in modes.into_iter().enumerate() {
        let (loss, bytes) = train(&p, &t, &d.join(format!("mode{k}.jsonl")), flags);
        let rel = (loss - base_loss) / base_loss;
        let ratio = base_bytes as f64 / bytes.max(1) as f64;
        println!(
            "{flags:?}: loss {loss:.4} vs {base_loss:.4} ({:+.1} %), {ratio:.1}x fewer bytes",
            100.0 * rel
        );
        if rel > tol || ratio < saving {
            failures.push(format!("{flags:?}: loss {rel:+.3}, bytes {ratio:.2}x"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn a_bad_mode_is_refused_by_name() {
    let (code, _, err) = plait(&["run", "--grad-compression", "topk:3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("(0, 1]"), "{err}");
    let (code, _, err) = plait(&["run", "--dp-sync", "async"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("local-sgd:H"), "{err}");
}
