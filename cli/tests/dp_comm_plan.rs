//! The planner prices compressed exchanges and local SGD as the runtime runs them: on a
//! bandwidth-starved cluster (25 Gb/s Ethernet between nodes), Llama-2-7B at dp 16, the bytes
//! a rank sends per step follow from the parameter count `plait inspect` reports and the
//! encoding, and the exchange's time shrinks with them.

mod common;

use common::plait;

/// `predicted.dp_exchange` of `estimate --json` with `extra` flags.
fn exchange(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "estimate",
        "llama2-7b",
        "--cluster",
        "aws-p3.16xlarge",
        "--gpus",
        "16",
        "--global-batch",
        "16",
        "--seq",
        "2048",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "16",
        "--micro-batch",
        "1",
        "--zero",
        "0",
        "--precision",
        "fp32",
        "--json",
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = plait(&args);
    assert_eq!(code, 0, "{extra:?}: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    v["predicted"]["dp_exchange"].clone()
}

fn parameters() -> f64 {
    let (code, out, err) = plait(&["inspect", "llama2-7b", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    v["params"].as_f64().expect("params")
}

#[test]
fn compressed_exchanges_and_local_sgd_shrink_by_their_factors() {
    // A ring all-reduce of the f32 gradients sends 2 (n - 1) / n of them per rank.
    let plain = 2.0 * 15.0 / 16.0 * 4.0 * parameters();
    for (flags, wire_per_element, at_least) in [
        (["--grad-compression", "bf16"], 2.0, 1.9),
        (["--grad-compression", "int8"], 1.0 + 4.0 / 256.0, 3.5),
        (["--grad-compression", "topk:0.01"], 0.01 * 8.0, 10.0),
        (["--dp-sync", "local-sgd:8"], 4.0 / 8.0, 6.0),
    ] {
        let x = exchange(&flags);
        let sent = x["bytes_per_step"].as_f64().expect("bytes_per_step");
        let plain_sent = x["plain_bytes_per_step"].as_f64().expect("plain");
        assert!(
            (plain_sent - plain).abs() / plain < 1e-9,
            "{plain_sent} vs {plain}"
        );
        let want = plain / 4.0 * wire_per_element;
        assert!(
            (sent - want).abs() / want < 1e-9,
            "{flags:?}: {sent} vs {want}"
        );
        let faster =
            x["plain_exchange_s"].as_f64().expect("plain s") / x["exchange_s"].as_f64().expect("s");
        println!(
            "{flags:?}: {:.1}x fewer bytes, {faster:.1}x less time",
            plain / sent
        );
        assert!(faster >= at_least, "{flags:?}: {faster}");
    }
}

#[test]
fn the_plain_exchange_reports_nothing_and_zero_sharding_is_refused() {
    assert!(exchange(&[]).is_null());
    let (code, _, err) = plait(&[
        "estimate",
        "llama2-7b",
        "--cluster",
        "aws-p3.16xlarge",
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
        "--zero",
        "1",
        "--grad-compression",
        "int8",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("pass --zero 0"), "{err}");
}

/// `compile --search-dp-comm MODES` plans the synchronous exchange and each accepted one (at
/// ZeRO-0) and keeps the fastest: GPT-2 on the Ethernet-linked V100 nodes, where a compressed
/// exchange lets data parallelism beat the synchronous plan's; without the flag no exchange
/// is ever chosen for the user.
#[test]
fn search_dp_comm_keeps_the_fastest_accepted_exchange() {
    let base = [
        "compile",
        "gpt2",
        "--cluster",
        "aws-p3.16xlarge",
        "--gpus",
        "16",
        "--global-batch",
        "16",
        "--seq",
        "1024",
        "--json",
    ];
    let json = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let (code, out, err) = plait(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("JSON")
    };
    let plain = json(&[]);
    assert!(plain["strategy"].get("dp_comm").is_none(), "{plain}");
    let v = json(&["--search-dp-comm", "bf16,int8,topk:0.01,local-sgd:8"]);
    let tried = v["dp_exchange_search"]
        .as_array()
        .expect("dp_exchange_search");
    let modes: Vec<&str> = tried.iter().filter_map(|t| t["mode"].as_str()).collect();
    assert_eq!(
        modes,
        ["synchronous", "bf16", "int8", "topk:0.01", "local-sgd:8"]
    );
    let times: Vec<f64> = tried
        .iter()
        .filter_map(|t| t["iteration_time_s"].as_f64())
        .collect();
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    let chosen = v["predicted"]["iteration_time_s"].as_f64().expect("time");
    assert_eq!(chosen, fastest);
    assert_eq!(
        times[0],
        plain["predicted"]["iteration_time_s"]
            .as_f64()
            .expect("plain time"),
        "the synchronous trial is the plain compile"
    );
    assert!(
        chosen < times[0],
        "no accepted exchange beat the synchronous plan here"
    );
    assert!(v["strategy"]["dp_comm"].is_object(), "{}", v["strategy"]);
    let refused: Vec<&str> = base
        .iter()
        .chain(&["--search-dp-comm", "bf16", "--zero", "1"])
        .copied()
        .collect();
    let (code, _, err) = plait(&refused);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--zero"), "{err}");
}
