//! `plait bench memory`: the planner's per-stage peak memory against what codegen's liveness
//! finds in the programs, on a fixed set of pinned plans (issue 11's acceptance set: GPT-3
//! 175B, Llama-3 8B/70B, Mixtral (also with expert parallelism), ZeRO 0-3, every recompute
//! mode, 1F1B and interleaved, cp 2).
//!
//! Each plan is compiled with every knob pinned (the search only confirms it fits), lowered
//! as `plait codegen` lowers it (`codegen::lower_checked`: by the segment rules where the
//! extraction's layout breaks the planner's memory, which the line then notes) and verified
//! as it verifies them; every template's ratio is printed, and a plan codegen cannot lower
//! says why.

use clap::Parser;

use crate::compile::compile;
use crate::strategy_args::{ClusterArgs, StrategyArgs};

/// The acceptance goal: every template within this fraction of the planner's peak.
const GOAL: f64 = 0.03;

/// The plans, as `plait compile` arguments.
const PLANS: &[&str] = &[
    "gpt3-175b --cluster dgx-a100-80gb --gpus 128 --global-batch 64 --tp 8 --pp 16 --micro-batch 1 --recompute full --schedule 1f1b",
    "gpt3-175b --cluster dgx-a100-80gb --gpus 128 --global-batch 64 --tp 8 --pp 16 --micro-batch 1 --recompute selective --schedule interleaved --virtual-stages 2",
    "gpt-1.7b --cluster dgx-a100-80gb --gpus 8 --global-batch 64 --tp 1 --pp 1 --micro-batch 8 --zero 0 --recompute none",
    "gpt-1.7b --cluster dgx-a100-80gb --gpus 8 --global-batch 64 --tp 1 --pp 1 --micro-batch 8 --zero 3 --recompute none",
    "gpt-7.5b --cluster dgx-a100-80gb --gpus 16 --global-batch 64 --tp 4 --pp 2 --micro-batch 2 --zero 1 --recompute selective --schedule 1f1b",
    "llama3-8b --cluster dgx-h100 --gpus 16 --global-batch 32 --tp 1 --pp 2 --cp 1 --micro-batch 1 --zero 0 --recompute full --schedule 1f1b",
    "llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 32 --tp 1 --pp 1 --cp 1 --micro-batch 1 --zero 1 --recompute full",
    "llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 32 --tp 1 --pp 1 --cp 1 --micro-batch 1 --zero 2 --recompute none",
    "llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 32 --tp 1 --pp 1 --cp 1 --micro-batch 1 --zero 3 --recompute none",
    "llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 32 --tp 2 --pp 1 --cp 1 --micro-batch 1 --zero 1 --recompute selective",
    "llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 32 --tp 2 --pp 1 --cp 1 --micro-batch 1 --zero 1 --recompute full",
    "llama3-8b --cluster dgx-h100 --gpus 16 --global-batch 64 --tp 8 --pp 1 --cp 1 --micro-batch 2 --zero 0 --recompute none",
    "llama3-8b --cluster dgx-h100 --gpus 16 --global-batch 64 --tp 1 --pp 4 --cp 1 --micro-batch 1 --zero 1 --recompute none --schedule 1f1b",
    "llama3-8b --cluster dgx-h100 --gpus 16 --global-batch 64 --tp 2 --pp 4 --cp 1 --micro-batch 1 --zero 1 --recompute none --schedule interleaved --virtual-stages 2",
    "llama3-8b --cluster dgx-h100 --gpus 16 --global-batch 64 --tp 2 --pp 1 --cp 2 --micro-batch 1 --zero 1 --recompute none",
    "llama3-70b --cluster dgx-h100 --gpus 64 --global-batch 128 --tp 8 --pp 4 --cp 1 --micro-batch 1 --zero 1 --recompute none --schedule 1f1b",
    "llama3-70b --cluster dgx-h100 --gpus 64 --global-batch 128 --tp 4 --pp 4 --cp 1 --micro-batch 1 --zero 1 --recompute selective --schedule interleaved --virtual-stages 5",
    "llama3-70b --cluster dgx-h100 --gpus 64 --global-batch 128 --tp 8 --pp 2 --cp 1 --micro-batch 1 --zero 1 --recompute full --schedule 1f1b",
    "mixtral-8x7b --cluster dgx-h100 --gpus 32 --global-batch 64 --tp 1 --pp 4 --cp 1 --ep 1 --micro-batch 1 --zero 1 --recompute full --schedule 1f1b",
    "mixtral-8x7b --cluster dgx-h100 --gpus 32 --global-batch 64 --tp 1 --pp 4 --cp 1 --ep 1 --micro-batch 1 --zero 3 --recompute full --schedule 1f1b",
    "mixtral-8x7b --cluster dgx-h100 --gpus 64 --global-batch 256 --tp 2 --pp 4 --cp 1 --ep 4 --micro-batch 1 --zero 1 --recompute none --sequence-parallel on --schedule interleaved --virtual-stages 8",
    "mixtral-8x7b --cluster dgx-h100 --gpus 64 --global-batch 256 --tp 1 --pp 1 --cp 1 --ep 4 --micro-batch 1 --zero 3 --recompute none",
];

/// One plan line parsed as `plait compile` parses its arguments.
#[derive(Parser, Debug)]
#[command(no_binary_name = true)]
pub(crate) struct PlanLine {
    pub(crate) model: String,
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
    #[command(flatten)]
    pub(crate) pins: StrategyArgs,
}

/// What became of one plan.
enum Outcome {
    /// Per template: (stage, program / planner - 1), the verifier's violations, and why the
    /// layers were lowered by the segment rules rather than as extracted, where they were.
    Lowered(Vec<(u32, f64)>, usize, Option<String>),
    Refused(String),
}

fn measure(line: &str) -> anyhow::Result<Outcome> {
    let p = PlanLine::try_parse_from(line.split_whitespace())?;
    let compiled = compile(&p.model, &p.cluster, &p.pins, 0, None)?;
    let graph = codegen::load_graph(&compiled.plan)?;
    // As `plait codegen` lowers it: the extraction's layout, or the segment rules' where that
    // layout breaks the planner's memory (the note says so).
    let check = |set: &codegen::ProgramSet| {
        let tolerance = Some(crate::codegen::MEMORY_TOLERANCE);
        let opts = codegen::verify::Options {
            memory_tolerance: tolerance,
        };
        codegen::verify::verify_with(set, opts)
    };
    let lowered =
        codegen::lower_checked(&compiled.plan, &graph, codegen::Options::default(), check);
    let (_, report, note) = match lowered {
        Ok(done) => done,
        Err(e) => return Ok(Outcome::Refused(e.to_string())),
    };
    let gaps = report
        .memory
        .iter()
        .map(|m| (m.stage, m.ratio() - 1.0))
        .collect();
    Ok(Outcome::Lowered(gaps, report.violations.len(), note))
}

pub fn run() -> anyhow::Result<()> {
    let (mut lowered, mut within, mut worst) = (0, 0, 0.0f64);
    for line in PLANS {
        let short: String = line
            .split_whitespace()
            .filter(|w| !w.starts_with("--cluster") && !w.starts_with("dgx"))
            .collect::<Vec<_>>()
            .join(" ");
        match measure(line) {
            Ok(Outcome::Lowered(gaps, violations, note)) => {
                lowered += 1;
                let max = gaps.iter().map(|g| g.1.abs()).fold(0.0, f64::max);
                worst = worst.max(max);
                within += usize::from(max <= GOAL && violations == 0);
                let cells: Vec<String> = gaps
                    .iter()
                    .map(|(s, g)| format!("s{s} {:+.1}%", 100.0 * g))
                    .collect();
                println!("{short}\n    {}  violations {violations}", cells.join("  "));
                if let Some(note) = note {
                    println!("    {note}");
                }
            }
            Ok(Outcome::Refused(why)) => println!("{short}\n    not lowered: {why}"),
            Err(e) => println!("{short}\n    not compiled: {e:#}"),
        }
    }
    println!(
        "\n{within}/{} plans lowered with every template within ±{:.0} % of the planner's peak; \
         {lowered} lowered, worst {:.1} %",
        PLANS.len(),
        100.0 * GOAL,
        100.0 * worst
    );
    Ok(())
}
