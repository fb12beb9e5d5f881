//! The report as text: summary, why, stages, memory, communication, alternatives.

use std::fmt::Write;

use planner::report::why::{plural, secs, size};
use planner::report::{Report, layer_ranges};

/// Stages whose communication is listed in full (all of them for short pipelines).
fn shown_stages(pp: usize) -> Vec<usize> {
    if pp <= 4 {
        (0..pp).collect()
    } else {
        vec![0, pp - 1]
    }
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = write_report(&mut o, r);
    o
}

fn write_report(o: &mut String, r: &Report) -> std::fmt::Result {
    let s = &r.strategy;
    let p = &r.predicted;
    let nodes = r.gpus.div_ceil(u64::from(r.gpus_per_node));
    writeln!(
        o,
        "{} ({} parameters, {} layers) on {} x {} ({}, {} node{} of {})",
        r.model.name,
        crate::models::human(r.model.params),
        r.model.layers,
        r.gpus,
        r.gpu,
        r.cluster,
        nodes,
        if nodes == 1 { "" } else { "s" },
        r.gpus_per_node
    )?;
    writeln!(o, "plan        {}", r.strategy_summary)?;
    if let Some(t) = r.target {
        writeln!(
            o,
            "target      {t}: the search kept to what {t} runs (`compile --target`)"
        )?;
    }
    writeln!(
        o,
        "            global batch {} x seq {}, {} per pipeline, {}, {} attention, {} kernels",
        s.global_batch,
        s.seq,
        plural(s.micro_batches(), "micro-batch", "micro-batches"),
        s.precision,
        format!("{:?}", s.attention).to_lowercase(),
        s.kernels
    )?;
    writeln!(
        o,
        "predicted   {} per iteration, {:.0} tokens/s",
        secs(p.iteration_time_s),
        p.tokens_per_s
    )?;
    let ((model, unit), (hardware, _)) = (
        crate::estimate::flop_rate(p.model_tflops_per_gpu),
        crate::estimate::flop_rate(p.hardware_tflops_per_gpu),
    );
    writeln!(
        o,
        "            {model:.1} model {unit} per GPU ({hardware:.1} with recompute), MFU {:.1} %",
        100.0 * p.mfu
    )?;
    if let Some(t) = &p.training {
        writeln!(o, "{}", crate::estimate::training_line(t))?;
    }
    writeln!(
        o,
        "            bubble {:.1} % of the iteration; peak memory {} of {}",
        100.0 * p.bubble_fraction,
        size(p.peak_memory_bytes),
        size(p.memory_capacity_bytes)
    )?;
    let t = &p.time;
    writeln!(
        o,
        "            critical stage: compute {}, TP {}, PP {}, DP {}, bubble {}, optimizer {}",
        secs(t.compute),
        secs(t.tp_comm),
        secs(t.pp_comm),
        secs(t.dp_comm),
        secs(t.bubble),
        secs(t.optimizer)
    )?;
    if t.ep_comm > 0.0 {
        writeln!(o, "            expert dispatch (EP) {}", secs(t.ep_comm))?;
    }
    if r.stale {
        writeln!(
            o,
            "STALE       {}; re-run plait compile",
            r.recomputed_summary()
        )?;
    }

    writeln!(o, "\nwhy")?;
    for w in &r.why {
        writeln!(o, "  - {w}")?;
    }

    writeln!(
        o,
        "\nstages      busy = forward/backward with TP; idle = pipeline bubble and waits; tail = exposed DP sync + optimizer"
    )?;
    writeln!(
        o,
        "  {:<5} {:<40} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "stage", "layers", "busy", "idle", "tail", "finish", "in flight"
    )?;
    for st in &r.stages {
        writeln!(
            o,
            "  {:<5} {:<40} {:>9} {:>9} {:>9} {:>9} {:>9}",
            st.stage,
            layer_ranges(&st.chunks),
            secs(st.busy_s),
            secs(st.idle_s),
            secs(st.tail_s),
            secs(st.finish_s),
            st.micro_batches_in_flight
        )?;
    }

    writeln!(o, "\nmemory per GPU (of {})", size(p.memory_capacity_bytes))?;
    writeln!(
        o,
        "  {:<5} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>6}",
        "stage", "weights", "grads", "optimizer", "activations", "other", "total", "used"
    )?;
    for st in &r.stages {
        let m = &st.memory;
        writeln!(
            o,
            "  {:<5} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>5.1}%",
            st.stage,
            size(m.weights),
            size(m.grads),
            size(m.optimizer),
            size(m.activations),
            size(m.other),
            size(st.peak_memory_bytes),
            100.0 * st.peak_memory_bytes / p.memory_capacity_bytes
        )?;
    }

    writeln!(
        o,
        "\ncommunication per GPU per iteration (bytes sent; time before overlap with compute)"
    )?;
    let shown = shown_stages(r.communication.len());
    for &d in &shown {
        let Some(v) = r.communication.get(d) else {
            continue;
        };
        let label = |row: &planner::report::volume::VolumeRow| {
            let p = row.parallelism.to_uppercase();
            format!("{p} {} {}", row.collective, row.payload)
        };
        // As wide as the longest label ("TP reduce-scatter activation gradients" is 38).
        let width = v
            .rows
            .iter()
            .map(|r| label(r).len())
            .max()
            .unwrap_or(0)
            .max(36);
        writeln!(
            o,
            "  stage {:<3} {:<width$} {:<22} {:>5} {:>6} {:>10} {:>10} {:>9}",
            v.stage, "collective", "link", "group", "calls", "buffer", "sent", "time"
        )?;
        if v.rows.is_empty() {
            writeln!(o, "            none")?;
        }
        for row in &v.rows {
            writeln!(
                o,
                "            {:<width$} {:<22} {:>5} {:>6} {:>10} {:>10} {:>9}",
                label(row),
                format!("{} ({})", row.link.name, row.link.level),
                row.group_size,
                row.calls,
                size(row.buffer_bytes),
                size(row.bytes_per_gpu),
                secs(row.seconds)
            )?;
        }
        let by = v
            .by_link()
            .iter()
            .map(|(l, b)| format!("{} over {}", size(*b), l.name))
            .collect::<Vec<_>>();
        if !by.is_empty() {
            writeln!(o, "            total {}", by.join(", "))?;
        }
    }
    if shown.len() < r.communication.len() {
        writeln!(
            o,
            "  (stages 1-{} omitted; `plait report --json` lists every stage)",
            r.communication.len() - 2
        )?;
    }

    writeln!(o, "\nalternatives")?;
    if r.alternatives.is_empty() {
        writeln!(o, "  none kept")?;
    }
    for a in &r.alternatives {
        writeln!(
            o,
            "  {:<62} {:>9}  {}",
            a.strategy,
            secs(a.iteration_time_s),
            a.reason
        )?;
    }
    Ok(())
}
