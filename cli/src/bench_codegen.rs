//! `plait bench codegen`: how long `plait codegen` and `plait verify` take on the largest plans
//! people ask for (GPT-3 175B on 1,024 A100s: the plan the search finds and the SC'21
//! interleaved configuration), phase by phase, against the goal of 10 s for lowering,
//! verifying, writing and verifying again from disk.
//!
//! The phases are timed as the commands run them: `codegen::lower_checked` with the verifier
//! and the memory tolerance of `plait codegen`, the program files written to a scratch
//! directory, read back and verified as `plait verify` does. Compiling the plan is not timed
//! (`plait bench search` times the search).

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

use crate::bench_memory::PlanLine;
use crate::compile::compile;

/// The goal, in seconds, for one plan's codegen and verify together.
const GOAL_S: f64 = 10.0;

/// The plans, as `plait compile` arguments.
const PLANS: &[&str] = &[
    "gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --global-batch 1536",
    "gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --global-batch 1536 --tp 8 --pp 16 --dp 8 \
     --micro-batch 1 --recompute full --schedule interleaved --virtual-stages 2",
];

/// Seconds spent in each phase of one plan's codegen and verify.
struct Phases {
    ranks: usize,
    templates: usize,
    lower_and_verify: f64,
    write: f64,
    read: f64,
    verify: f64,
}

impl Phases {
    fn total(&self) -> f64 {
        self.lower_and_verify + self.write + self.read + self.verify
    }
}

fn verify(set: &codegen::ProgramSet) -> codegen::verify::Report {
    let opts = codegen::verify::Options {
        memory_tolerance: Some(crate::codegen::MEMORY_TOLERANCE),
    };
    codegen::verify::verify_with(set, opts)
}

fn measure(line: &str, scratch: &std::path::Path) -> anyhow::Result<Phases> {
    let p = PlanLine::try_parse_from(line.split_whitespace())?;
    let compiled = compile(&p.model, &p.cluster, &p.pins, 0, None)?;
    let t0 = Instant::now();
    let graph = codegen::load_graph(&compiled.plan)?;
    let (set, report, _) =
        codegen::lower_checked(&compiled.plan, &graph, codegen::Options::default(), verify)?;
    anyhow::ensure!(
        report.violations.is_empty(),
        "the programs fail the verifier: {}",
        report.violations[0]
    );
    let t1 = Instant::now();
    codegen::io::write(&set, scratch)?;
    let t2 = Instant::now();
    let back = codegen::io::read(scratch)?;
    let t3 = Instant::now();
    let again = verify(&back);
    anyhow::ensure!(
        again.violations.is_empty(),
        "the programs read back fail the verifier: {}",
        again.violations[0]
    );
    let t4 = Instant::now();
    Ok(Phases {
        ranks: set.ranks.len(),
        templates: set.templates.len(),
        lower_and_verify: (t1 - t0).as_secs_f64(),
        write: (t2 - t1).as_secs_f64(),
        read: (t3 - t2).as_secs_f64(),
        verify: (t4 - t3).as_secs_f64(),
    })
}

/// A scratch directory of this process's own, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: a leftover directory under the temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run() -> anyhow::Result<()> {
    let scratch =
        Scratch(std::env::temp_dir().join(format!("plait-bench-codegen-{}", std::process::id())));
    println!(
        "plan                                          ranks  templates  lower+verify   write    read  verify   total"
    );
    let mut met = 0;
    for line in PLANS {
        let short: String = line
            .split_whitespace()
            .filter(|w| !w.starts_with("--cluster") && !w.starts_with("dgx"))
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ");
        let _ = std::fs::remove_dir_all(&scratch.0);
        match measure(line, &scratch.0) {
            Ok(p) => {
                met += usize::from(p.total() <= GOAL_S);
                println!(
                    "{short:45} {:5}  {:9}  {:10.2} s  {:5.2} s {:5.2} s {:5.2} s {:5.2} s",
                    p.ranks,
                    p.templates,
                    p.lower_and_verify,
                    p.write,
                    p.read,
                    p.verify,
                    p.total()
                );
            }
            Err(e) => println!("{short}\n    failed: {e:#}"),
        }
    }
    println!(
        "\n{met}/{} plans lowered, written, read and verified within {GOAL_S:.0} s",
        PLANS.len()
    );
    Ok(())
}
