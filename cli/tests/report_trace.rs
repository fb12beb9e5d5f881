//! `plait report --trace`: valid Chrome trace-event JSON whose slices never overlap on a track.

mod common;

use std::collections::BTreeMap;

use common::{PINNED_PIPELINE, compile, dir, plait};

/// Slices of one track: (start, end, name).
type Track = Vec<(f64, f64, String)>;

fn check_trace(extra: &[&str], test: &str) -> serde_json::Value {
    let plan = compile(test, "plan.json", extra);
    let trace = dir(test).join("trace.json");
    let (p, t) = (
        plan.to_string_lossy().to_string(),
        trace.to_string_lossy().to_string(),
    );
    let (code, _, stderr) = plait(&["report", &p, "--trace", &t]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    assert!(!events.is_empty());
    let mut tracks: BTreeMap<(u64, u64), Track> = BTreeMap::new();
    let mut named = BTreeMap::new();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        let name = e["name"].as_str().expect("name").to_string();
        let pid = e["pid"].as_u64().expect("pid");
        let tid = e["tid"].as_u64().expect("tid");
        let ts = e["ts"].as_f64().expect("ts");
        assert!(ts >= 0.0, "{e}");
        match ph {
            "X" => {
                let dur = e["dur"].as_f64().expect("dur");
                assert!(dur >= 0.0, "{e}");
                assert!(e["cat"].is_string(), "{e}");
                tracks
                    .entry((pid, tid))
                    .or_default()
                    .push((ts, ts + dur, name));
            }
            "M" => {
                assert!(e["args"]["name"].is_string() || e["args"]["sort_index"].is_u64());
                if name == "thread_name" {
                    named.insert((pid, tid), e["args"]["name"].clone());
                }
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    for (track, slices) in &mut tracks {
        assert!(
            named.contains_key(track),
            "track {track:?} has no thread_name"
        );
        slices.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in slices.windows(2) {
            // 1e-6 µs of slack for the µs conversion.
            assert!(
                w[1].0 >= w[0].1 - 1e-6,
                "overlap on {track:?}: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
    v
}

#[test]
fn pipeline_trace_has_stages_streams_and_micro_batches() {
    let v = check_trace(&PINNED_PIPELINE, "pipeline");
    let events = v["traceEvents"].as_array().expect("events");
    let x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    // 2 micro-batches x 12 chunks x forward and backward.
    let compute = x
        .iter()
        .filter(|e| {
            let n = e["name"].as_str().unwrap_or("");
            n.starts_with("F ") || n.starts_with("B ")
        })
        .count();
    assert_eq!(compute, 2 * 12 * 2);
    assert!(x.iter().any(|e| e["name"] == "F mb1 chunk3"
        && e["args"]["micro_batch"] == 1
        && e["args"]["chunk"] == 3
        && e["pid"] == 1
        && e["tid"] == 0));
    assert!(
        x.iter()
            .any(|e| e["cat"] == "comm" && e["tid"].as_u64() >= Some(1))
    );
    assert!(x.iter().any(|e| e["name"] == "DP sync"));
    assert!(x.iter().any(|e| e["name"] == "optimizer step"));
    let pids: std::collections::BTreeSet<_> = x.iter().map(|e| e["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 2);
}

#[test]
fn data_parallel_trace_is_valid() {
    check_trace(&[], "dp");
}
