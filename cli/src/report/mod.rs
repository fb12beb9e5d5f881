//! `plait report plan.json`: the plan explained (text or `--json`), its simulated iteration as a
//! Chrome/Perfetto trace (`--trace`), and a self-contained HTML page (`--html`).

mod html;
mod text;

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use planner::ModelInfo;
use planner::estimate::estimate_traced;
use planner::plan::Plan;
use planner::report::{self, Report};

use crate::model;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A plan written by `plait compile -o plan.json`.
    plan: PathBuf,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Write the simulated iteration as Chrome/Perfetto trace-event JSON to this file.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write a self-contained HTML page (timeline and memory bars) to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

/// Reads a plan file and explains it.
pub fn load(path: &std::path::Path) -> anyhow::Result<Report> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {file}"))?;
    let plan = Plan::from_json(&text, &file)?;
    let s = &plan.strategy;
    let m = model::load(&plan.model.reference, s.micro_batch, Some(s.seq))
        .with_context(|| format!("{file}: cannot load its model `{}`", plan.model.reference))?;
    let info = ModelInfo::new(&m.graph).with_context(|| format!("{file}: model"))?;
    let traced = estimate_traced(&info, &plan.cluster, plan.gpus, s)
        .with_context(|| format!("{file}: cannot re-estimate its strategy"))?;
    Ok(report::build(&plan, &info, &traced))
}

pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let r = load(&args.plan)?;
    if r.stale {
        eprintln!(
            "warning: {} is stale: it predicts {:.6} s per iteration, the current cost model {:.6} s; \
             re-run `plait compile` to refresh it",
            args.plan.display(),
            r.predicted.iteration_time_s,
            r.recomputed_iteration_time_s
        );
    }
    if let Some(path) = &args.trace {
        let t = report::trace::trace(&r.slices, &report::stage_names(&r));
        let json = serde_json::to_string(&t)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.html {
        std::fs::write(path, html::render(&r))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", text::render(&r));
    }
    Ok(())
}
