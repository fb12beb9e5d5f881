//! The report as one self-contained HTML page: inline CSS and inline SVG, no scripts, no
//! external references, so it opens anywhere without network access.

use std::fmt::Write;

use planner::report::trace::{SliceKind, lane_name};
use planner::report::why::{secs, size};
use planner::report::{Report, layer_ranges};

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}\
h1{font-size:20px}h2{font-size:16px;margin-top:28px}\
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}\
td:first-child,th:first-child{text-align:left}.l{text-align:left}\
svg text{font:11px system-ui,sans-serif}.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}\
.stale{color:#b00;font-weight:bold}";

const FORWARD: &str = "#4e79a7";
const BACKWARD: &str = "#59a14f";
const SEND: &str = "#f28e2b";
const DP: &str = "#e15759";
const OPTIMIZER: &str = "#9c755f";
const MEMORY: [(&str, &str); 5] = [
    ("weights", "#4e79a7"),
    ("grads", "#59a14f"),
    ("optimizer", "#edc948"),
    ("activations", "#f28e2b"),
    ("other", "#bab0ac"),
];

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(kind: SliceKind) -> &'static str {
    match kind {
        SliceKind::Forward => FORWARD,
        SliceKind::Backward => BACKWARD,
        SliceKind::Send => SEND,
        SliceKind::DpSync => DP,
        SliceKind::Optimizer => OPTIMIZER,
    }
}

fn legend(o: &mut String, items: &[(&str, &str)]) -> std::fmt::Result {
    write!(o, "<p class=\"legend\">")?;
    for (name, c) in items {
        write!(o, "<span style=\"background:{c}\"></span>{name}")?;
    }
    writeln!(o, "</p>")
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = write_page(&mut o, r);
    o
}

fn write_page(o: &mut String, r: &Report) -> std::fmt::Result {
    let p = &r.predicted;
    let title = format!("plait report: {} on {} x {}", r.model.name, r.gpus, r.gpu);
    writeln!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{CSS}</style></head><body>",
        esc(&title)
    )?;
    writeln!(o, "<h1>{}</h1>", esc(&title))?;
    writeln!(
        o,
        "<p>{} ({}), plan <b>{}</b>, global batch {} x seq {}, {} micro-batches per pipeline, {}.</p>",
        esc(&r.cluster),
        esc(&r.gpu),
        esc(&r.strategy_summary),
        r.strategy.global_batch,
        r.strategy.seq,
        r.strategy.micro_batches(),
        r.strategy.precision
    )?;
    writeln!(
        o,
        "<p>Predicted {} per iteration ({:.0} tokens/s), {:.1} model {} per GPU, MFU {:.1} %, bubble {:.1} %, peak memory {} of {}.</p>",
        secs(p.iteration_time_s),
        p.tokens_per_s,
        crate::estimate::flop_rate(p.model_tflops_per_gpu).0,
        crate::estimate::flop_rate(p.model_tflops_per_gpu).1,
        100.0 * p.mfu,
        100.0 * p.bubble_fraction,
        size(p.peak_memory_bytes),
        size(p.memory_capacity_bytes)
    )?;
    if r.stale {
        writeln!(
            o,
            "<p class=\"stale\">Stale plan: {}.</p>",
            r.recomputed_summary()
        )?;
    }
    writeln!(o, "<h2>Why</h2><ul>")?;
    for w in &r.why {
        writeln!(o, "<li>{}</li>", esc(w))?;
    }
    writeln!(o, "</ul>")?;
    timeline(o, r)?;
    memory(o, r)?;
    tables(o, r)?;
    writeln!(o, "</body></html>")
}

fn timeline(o: &mut String, r: &Report) -> std::fmt::Result {
    let (left, width) = (150.0, 1000.0);
    let end = r
        .slices
        .iter()
        .map(|s| s.end)
        .fold(r.predicted.iteration_time_s, f64::max)
        .max(1e-12);
    let x = |t: f64| left + width * t / end;
    let lane_h = |lane: u32| if lane == 0 { 22.0 } else { 10.0 };
    // Row layout: per stage its lanes, top to bottom.
    let mut rows = Vec::new();
    let mut y = 20.0;
    for st in &r.stages {
        let lanes = r
            .slices
            .iter()
            .filter(|s| s.stage == st.stage)
            .map(|s| s.lane)
            .max()
            .unwrap_or(0);
        let mut ys = Vec::new();
        for lane in 0..=lanes {
            ys.push(y);
            y += lane_h(lane) + 2.0;
        }
        rows.push(ys);
        y += 8.0;
    }
    let height = y + 10.0;
    writeln!(o, "<h2>Timeline</h2>")?;
    legend(
        o,
        &[
            ("forward", FORWARD),
            ("backward", BACKWARD),
            ("p2p send", SEND),
            ("DP sync", DP),
            ("optimizer", OPTIMIZER),
        ],
    )?;
    writeln!(
        o,
        "<svg id=\"timeline\" width=\"{}\" height=\"{height}\" viewBox=\"0 0 {} {height}\" role=\"img\" aria-label=\"simulated iteration timeline\">",
        left + width + 20.0,
        left + width + 20.0
    )?;
    for i in 0..=10 {
        let t = end * f64::from(i) / 10.0;
        writeln!(
            o,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"14\" y2=\"{1:.1}\" stroke=\"#eee\"/><text x=\"{0:.1}\" y=\"10\" text-anchor=\"middle\">{2}</text>",
            x(t),
            height - 10.0,
            esc(&secs(t))
        )?;
    }
    for (st, ys) in r.stages.iter().zip(&rows) {
        for (lane, &ly) in ys.iter().enumerate() {
            let label = if lane == 0 {
                format!("stage {} {}", st.stage, lane_name(0))
            } else {
                lane_name(lane as u32)
            };
            writeln!(
                o,
                "<text x=\"4\" y=\"{:.1}\">{}</text>",
                ly + lane_h(lane as u32) - 4.0,
                esc(&label)
            )?;
        }
    }
    for s in &r.slices {
        let Some(ly) = rows
            .get(s.stage as usize)
            .and_then(|ys| ys.get(s.lane as usize))
        else {
            continue;
        };
        writeln!(
            o,
            "<rect class=\"{}\" x=\"{:.2}\" y=\"{ly:.1}\" width=\"{:.2}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\" stroke-width=\"0.3\"><title>{} ({} to {})</title></rect>",
            match s.kind {
                SliceKind::Forward => "fwd",
                SliceKind::Backward => "bwd",
                SliceKind::Send => "send",
                SliceKind::DpSync => "dp",
                SliceKind::Optimizer => "opt",
            },
            x(s.start),
            (x(s.end) - x(s.start)).max(0.5),
            lane_h(s.lane),
            color(s.kind),
            esc(&format!("stage {}: {}", s.stage, s.name)),
            esc(&secs(s.start)),
            esc(&secs(s.end))
        )?;
    }
    writeln!(o, "</svg>")
}

fn memory(o: &mut String, r: &Report) -> std::fmt::Result {
    let cap = r.predicted.memory_capacity_bytes;
    let scale_max = r
        .stages
        .iter()
        .map(|s| s.peak_memory_bytes)
        .fold(cap, f64::max)
        .max(1.0);
    let (left, width, bar) = (150.0, 900.0, 22.0);
    let height = 30.0 + (bar + 8.0) * r.stages.len() as f64;
    let x = |b: f64| left + width * b / scale_max;
    writeln!(o, "<h2>Memory per GPU</h2>")?;
    legend(o, &MEMORY)?;
    writeln!(
        o,
        "<svg id=\"memory\" width=\"{}\" height=\"{height}\" viewBox=\"0 0 {} {height}\" role=\"img\" aria-label=\"memory per stage\">",
        left + width + 120.0,
        left + width + 120.0
    )?;
    for (i, st) in r.stages.iter().enumerate() {
        let y = 20.0 + (bar + 8.0) * i as f64;
        writeln!(
            o,
            "<text x=\"4\" y=\"{:.1}\">stage {}</text>",
            y + bar - 6.0,
            st.stage
        )?;
        let m = &st.memory;
        let mut at = 0.0;
        for ((name, c), v) in
            MEMORY
                .iter()
                .zip([m.weights, m.grads, m.optimizer, m.activations, m.other])
        {
            writeln!(
                o,
                "<rect class=\"mem\" x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{bar}\" fill=\"{c}\"><title>stage {} {name}: {}</title></rect>",
                x(at),
                x(at + v) - x(at),
                st.stage,
                esc(&size(v))
            )?;
            at += v;
        }
        writeln!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\">{} ({:.0} %)</text>",
            x(at) + 6.0,
            y + bar - 6.0,
            esc(&size(at)),
            100.0 * at / cap
        )?;
    }
    writeln!(
        o,
        "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"12\" y2=\"{1:.1}\" stroke=\"#b00\" stroke-dasharray=\"4 3\"/><text x=\"{0:.1}\" y=\"10\" text-anchor=\"end\">capacity {2}</text>",
        x(cap),
        height - 4.0,
        esc(&size(cap))
    )?;
    writeln!(o, "</svg>")
}

fn tables(o: &mut String, r: &Report) -> std::fmt::Result {
    writeln!(
        o,
        "<h2>Stages</h2><table><tr><th>stage</th><th class=\"l\">layers</th><th>busy</th><th>idle</th><th>tail</th><th>finish</th><th>in flight</th><th>peak memory</th></tr>"
    )?;
    for st in &r.stages {
        writeln!(
            o,
            "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            st.stage,
            esc(&layer_ranges(&st.chunks)),
            secs(st.busy_s),
            secs(st.idle_s),
            secs(st.tail_s),
            secs(st.finish_s),
            st.micro_batches_in_flight,
            size(st.peak_memory_bytes)
        )?;
    }
    writeln!(o, "</table>")?;
    writeln!(
        o,
        "<h2>Communication per GPU per iteration</h2><table><tr><th>stage</th><th class=\"l\">collective</th><th class=\"l\">link</th><th>group</th><th>calls</th><th>buffer</th><th>sent</th><th>time</th></tr>"
    )?;
    for v in &r.communication {
        for row in &v.rows {
            writeln!(
                o,
                "<tr><td>{}</td><td class=\"l\">{} {} {}</td><td class=\"l\">{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                v.stage,
                esc(&row.parallelism.to_uppercase()),
                esc(&row.collective),
                esc(&row.payload),
                esc(&row.link.name),
                esc(&row.link.level),
                row.group_size,
                row.calls,
                size(row.buffer_bytes),
                size(row.bytes_per_gpu),
                secs(row.seconds)
            )?;
        }
    }
    writeln!(o, "</table>")?;
    writeln!(
        o,
        "<h2>Alternatives</h2><table><tr><th>strategy</th><th>iteration</th><th class=\"l\">reason</th></tr>"
    )?;
    for a in &r.alternatives {
        writeln!(
            o,
            "<tr><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            esc(&a.strategy),
            secs(a.iteration_time_s),
            esc(&a.reason)
        )?;
    }
    writeln!(o, "</table>")
}
