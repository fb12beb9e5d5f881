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
    /// Tokens to train on (e.g. 300e9): days, GPU-hours, energy and cost of the run at this
    /// plan's speed (replaces the plan's own `--train-tokens`).
    #[arg(long, value_parser = crate::strategy_args::parse_tokens)]
    train_tokens: Option<f64>,
}

/// Reads a plan file and explains it; `train_tokens` replaces the plan's training run.
pub fn load(path: &std::path::Path, train_tokens: Option<f64>) -> anyhow::Result<Report> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {file}"))?;
    let plan = Plan::from_json(&text, &file)?;
    let s = &plan.strategy;
    let m = model::load(&plan.model.reference, s.micro_batch, Some(s.seq))
        .with_context(|| format!("{file}: cannot load its model `{}`", plan.model.reference))?;
    let info = ModelInfo::new(&m.graph).with_context(|| format!("{file}: model"))?;
    // As `codegen`, `run` and `export` read it: a split edited by hand is not explained as
    // if it were the plan's.
    plan.check_chunks(info.layers)
        .with_context(|| format!("{file}: its pipeline split (the `chunks` field) is not valid"))?;
    let traced = estimate_traced(&info, &plan.cluster, plan.gpus, s, plan.tp_pricing())
        .with_context(|| format!("{file}: cannot re-estimate its strategy"))?;
    let mut r = report::build(&plan, &info, &traced);
    if let Some(tokens) = train_tokens {
        let p = &r.predicted;
        r.predicted.training = Some(planner::training::training_run(
            &plan.cluster,
            plan.gpus,
            p.tokens_per_s,
            p.iteration_time_s,
            tokens,
        ));
    }
    Ok(r)
}

pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    for out in [&args.trace, &args.html].into_iter().flatten() {
        crate::outputs::not_an_input(out, &[("plan", &args.plan)])?;
    }
    let r = load(&args.plan, args.train_tokens)?;
    if r.stale {
        eprintln!(
            "warning: {} is stale: it predicts {:.6} s per iteration and a peak of {:.2} GiB, {}; \
             re-run `plait compile` to refresh it",
            args.plan.display(),
            r.predicted.iteration_time_s,
            r.predicted.peak_memory_bytes / (1u64 << 30) as f64,
            r.recomputed_summary()
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
