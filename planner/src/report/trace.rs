//! The simulated iteration as slices on tracks (a compute stream and communication streams per
//! pipeline stage), and as Chrome/Perfetto trace-event JSON.
//!
//! Compute slices are the pipeline simulation's tasks; a point-to-point send follows every task
//! whose output another stage needs (for the transfer's duration, as the simulation charges it);
//! after the last backward each stage shows its data-parallel synchronisation (ending where its
//! exposed part ends, so the part hidden behind the backward overlaps it) and its optimizer step.
//! Communication slices that would overlap go to further communication lanes, so no track ever
//! has two slices at once.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::cost::pipeline::Timeline;
use crate::strategy::Strategy;

/// What a slice shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SliceKind {
    Forward,
    Backward,
    Send,
    DpSync,
    Optimizer,
}

/// One interval of work on one track.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slice {
    pub stage: u32,
    /// 0: compute; 1, 2, ...: communication lanes.
    pub lane: u32,
    pub kind: SliceKind,
    pub name: String,
    /// Seconds from the iteration's start.
    pub start: f64,
    pub end: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk: Option<u32>,
}

/// What happens on a stage after its last backward.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageTail {
    /// End of the stage's last task.
    pub device_finish: f64,
    /// End of the stage's iteration (after DP sync and optimizer).
    pub finish: f64,
    /// Seconds of its optimizer step.
    pub optimizer: f64,
    /// Seconds its data-parallel (and tied-embedding) collectives take in all.
    pub dp_collectives: f64,
}

/// Every slice of the iteration, compute first, then communication, in time order per track.
pub fn slices(timeline: &Timeline, s: &Strategy, p2p_s: f64, tails: &[StageTail]) -> Vec<Slice> {
    let n_chunks = s.chunks();
    let mut compute = Vec::new();
    let mut comm = Vec::new();
    for t in &timeline.tasks {
        let (kind, letter) = if t.forward {
            (SliceKind::Forward, "F")
        } else {
            (SliceKind::Backward, "B")
        };
        compute.push(Slice {
            stage: t.device,
            lane: 0,
            kind,
            name: format!("{letter} mb{} chunk{}", t.micro_batch, t.chunk),
            start: t.start,
            end: t.end,
            micro_batch: Some(t.micro_batch),
            chunk: Some(t.chunk),
        });
        let to = if t.forward && t.chunk + 1 < n_chunks {
            Some((t.chunk + 1, "act"))
        } else if !t.forward && t.chunk > 0 {
            Some((t.chunk - 1, "grad"))
        } else {
            None
        };
        if let Some((to, what)) = to.filter(|_| p2p_s > 0.0) {
            comm.push(Slice {
                stage: t.device,
                lane: 1,
                kind: SliceKind::Send,
                name: format!("send {what} mb{} chunk{}->{to}", t.micro_batch, t.chunk),
                start: t.end,
                end: t.end + p2p_s,
                micro_batch: Some(t.micro_batch),
                chunk: Some(t.chunk),
            });
        }
    }
    for (d, tail) in tails.iter().enumerate() {
        let d = d as u32;
        let opt_start = (tail.finish - tail.optimizer).max(tail.device_finish);
        if tail.dp_collectives > 0.0 {
            comm.push(Slice {
                stage: d,
                lane: 1,
                kind: SliceKind::DpSync,
                name: "DP sync".into(),
                start: (opt_start - tail.dp_collectives).max(0.0),
                end: opt_start,
                micro_batch: None,
                chunk: None,
            });
        }
        if tail.finish > opt_start {
            compute.push(Slice {
                stage: d,
                lane: 0,
                kind: SliceKind::Optimizer,
                name: "optimizer step".into(),
                start: opt_start,
                end: tail.finish,
                micro_batch: None,
                chunk: None,
            });
        }
    }
    compute.sort_by(|a, b| a.stage.cmp(&b.stage).then(a.start.total_cmp(&b.start)));
    comm.sort_by(|a, b| a.stage.cmp(&b.stage).then(a.start.total_cmp(&b.start)));
    // Lanes: each communication slice takes the first lane of its stage that is free.
    let mut lane_end: Vec<(u32, Vec<f64>)> = Vec::new();
    for c in &mut comm {
        if lane_end.last().is_none_or(|(st, _)| *st != c.stage) {
            lane_end.push((c.stage, Vec::new()));
        }
        let Some((_, ends)) = lane_end.last_mut() else {
            continue;
        };
        match ends.iter().position(|&e| e <= c.start) {
            Some(i) => {
                ends[i] = c.end;
                c.lane = i as u32 + 1;
            }
            None => {
                ends.push(c.end);
                c.lane = ends.len() as u32;
            }
        }
    }
    compute.extend(comm);
    compute
}

/// Name of a track.
pub fn lane_name(lane: u32) -> String {
    match lane {
        0 => "compute".into(),
        1 => "comm".into(),
        n => format!("comm {n}"),
    }
}

/// One trace event (Chrome trace-event format).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cat: String,
    pub ph: String,
    /// Microseconds.
    pub ts: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    pub pid: u32,
    pub tid: u32,
    #[serde(default)]
    pub args: Map<String, Value>,
}

/// A trace file: `{"traceEvents": [...], "displayTimeUnit": "ms"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceFile {
    #[serde(rename = "traceEvents")]
    pub trace_events: Vec<TraceEvent>,
    #[serde(rename = "displayTimeUnit")]
    pub display_time_unit: String,
}

fn metadata(name: &str, pid: u32, tid: u32, args: Value) -> TraceEvent {
    TraceEvent {
        name: name.into(),
        cat: String::new(),
        ph: "M".into(),
        ts: 0.0,
        dur: None,
        pid,
        tid,
        args: match args {
            Value::Object(m) => m,
            _ => Map::new(),
        },
    }
}

/// Trace events for `slices`: a process per stage (named by `stage_names`), a thread per track.
pub fn trace(slices: &[Slice], stage_names: &[String]) -> TraceFile {
    let mut events = Vec::new();
    for (d, name) in stage_names.iter().enumerate() {
        let d = d as u32;
        events.push(metadata("process_name", d, 0, json!({ "name": name })));
        events.push(metadata(
            "process_sort_index",
            d,
            0,
            json!({ "sort_index": d }),
        ));
        let lanes = slices
            .iter()
            .filter(|s| s.stage == d)
            .map(|s| s.lane)
            .max()
            .unwrap_or(0);
        for lane in 0..=lanes {
            events.push(metadata(
                "thread_name",
                d,
                lane,
                json!({ "name": lane_name(lane) }),
            ));
            events.push(metadata(
                "thread_sort_index",
                d,
                lane,
                json!({ "sort_index": lane }),
            ));
        }
    }
    for s in slices {
        let mut args = Map::new();
        if let Some(mb) = s.micro_batch {
            args.insert("micro_batch".into(), json!(mb));
        }
        if let Some(c) = s.chunk {
            args.insert("chunk".into(), json!(c));
        }
        let cat = match s.kind {
            SliceKind::Forward | SliceKind::Backward | SliceKind::Optimizer => "compute",
            SliceKind::Send | SliceKind::DpSync => "comm",
        };
        events.push(TraceEvent {
            name: s.name.clone(),
            cat: cat.into(),
            ph: "X".into(),
            ts: s.start * 1e6,
            dur: Some(((s.end - s.start) * 1e6).max(0.0)),
            pid: s.stage,
            tid: s.lane,
            args,
        });
    }
    TraceFile {
        trace_events: events,
        display_time_unit: "ms".into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cost::pipeline::{ChunkCost, simulate_with};
    use crate::precision::Precision;
    use crate::strategy::{Recompute, Schedule};

    fn strategy(pp: u32, v: u32) -> Strategy {
        Strategy {
            tp: 1,
            pp,
            dp: 1,
            micro_batch: 1,
            global_batch: 4,
            seq: 16,
            zero: 0,
            recompute: Recompute::None,
            schedule: if v > 1 {
                Schedule::Interleaved
            } else {
                Schedule::OneFOneB
            },
            virtual_stages: v,
            sequence_parallel: false,
            precision: Precision::Bf16,
            attention: Default::default(),
            kernels: Default::default(),
            cp: 1,
            ep: 1,
            engine: crate::engine::Engine::Megatron,
            overlap: crate::engine::Overlap::LEGACY,
            stage_layers: None,
            dp_comm: Default::default(),
        }
    }

    #[test]
    fn sends_that_overlap_go_to_another_lane() {
        let s = strategy(2, 2);
        // p2p longer than a forward: sends pile up.
        let chunks: Vec<ChunkCost> = (0..4)
            .map(|c| ChunkCost {
                fwd: 1.0,
                bwd: 2.0,
                p2p: if c < 3 { 1.5 } else { 0.0 },
                activation_bytes: 1.0,
                ..Default::default()
            })
            .collect();
        let t = simulate_with(s.schedule, 2, 4, &chunks, true);
        let tails = vec![
            StageTail {
                device_finish: t.device_finish[0],
                finish: t.device_finish[0] + 0.5,
                optimizer: 0.25,
                dp_collectives: 3.0,
            },
            StageTail {
                device_finish: t.device_finish[1],
                finish: t.device_finish[1] + 0.25,
                optimizer: 0.25,
                dp_collectives: 0.0,
            },
        ];
        let sl = slices(&t, &s, 1.5, &tails);
        assert_eq!(
            sl.iter().filter(|x| x.kind == SliceKind::Forward).count(),
            16
        );
        assert!(sl.iter().any(|x| x.lane >= 2));
        for a in &sl {
            for b in &sl {
                if std::ptr::eq(a, b) || a.stage != b.stage || a.lane != b.lane {
                    continue;
                }
                assert!(a.end <= b.start || b.end <= a.start, "{a:?} overlaps {b:?}");
            }
        }
        let dp = sl.iter().find(|x| x.kind == SliceKind::DpSync).unwrap();
        assert!((dp.end - (t.device_finish[0] + 0.25)).abs() < 1e-12);
        let tr = trace(&sl, &["stage 0".into(), "stage 1".into()]);
        let x: Vec<_> = tr.trace_events.iter().filter(|e| e.ph == "X").collect();
        assert_eq!(x.len(), sl.len());
        assert!(x.iter().all(|e| e.dur.unwrap() >= 0.0));
    }
}
