//! `plait codegen PLAN -o DIR`, `plait show DIR --rank R`, `plait verify DIR`: per-rank
//! programs from a plan, their listing, and the static verifier.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use codegen::verify::{Options, Report, verify_with};

/// Relative difference between the programs' and the planner's peak memory that `codegen` and
/// `verify` accept: the goal of one memory model, met by the 19 plans of `plait bench
/// memory` that lower (worst 2.5 %).
pub(crate) const MEMORY_TOLERANCE: f64 = 0.03;

#[derive(Args, Debug)]
pub struct CodegenArgs {
    /// A plan written by `plait compile -o` (plait-plan/1).
    plan: PathBuf,
    /// Directory for index.json and the program templates.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Also write each template as an MLIR module (`template-N.mlir`: func/linalg/tensor and
    /// the `shard` dialect), checked by MLIR's verifier; needs a build with `--features mlir`.
    #[arg(long)]
    mlir: bool,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// A directory written by `plait codegen`.
    dir: PathBuf,
    /// The global rank whose program to print (0 to gpus − 1; ranks of one pipeline stage
    /// share a template and differ only in their groups and shards)
    #[arg(long)]
    rank: u32,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// A directory written by `plait codegen`.
    dir: PathBuf,
}

fn print_report(r: &Report) {
    for m in &r.memory {
        println!(
            "memory      template {} (stage {}, {} ranks): peak {:.2} GiB from the program, {:.2} GiB predicted ({:+.1} %)",
            m.template,
            m.stage,
            m.ranks,
            m.program_peak_bytes as f64 / (1u64 << 30) as f64,
            m.predicted_peak_bytes / (1u64 << 30) as f64,
            (m.ratio() - 1.0) * 100.0
        );
        println!("            at the peak: {}", peak_roles(m));
    }
}

/// The program's live bytes at its peak by buffer role, largest first (GiB, two decimals;
/// roles under 0.01 GiB left out).
fn peak_roles(m: &codegen::verify::MemoryRow) -> String {
    let gib = (1u64 << 30) as f64;
    let mut roles: Vec<(&str, u64)> = m
        .program_peak_by_role
        .iter()
        .map(|(r, b)| (*r, *b))
        .filter(|(_, b)| *b as f64 >= 0.01 * gib)
        .collect();
    roles.sort_by_key(|r| std::cmp::Reverse(r.1));
    roles
        .iter()
        .map(|(r, b)| format!("{r} {:.2}", *b as f64 / gib))
        .collect::<Vec<_>>()
        .join(", ")
        + " GiB"
}

fn check(r: &Report) -> anyhow::Result<()> {
    if r.violations.is_empty() {
        return Ok(());
    }
    for v in &r.violations {
        eprintln!("violation: {v}");
    }
    anyhow::bail!(
        "{} violation(s); first: {}",
        r.violations.len(),
        r.violations[0]
    )
}

/// [`check`], printing the memory rows first when it fails, so a memory violation shows what
/// the program holds at its peak.
fn check_showing_memory(r: &Report) -> anyhow::Result<()> {
    if r.violations.is_empty() {
        return Ok(());
    }
    print_report(r);
    check(r)
}

/// Refuses programs whose peak is over the GPU's memory: the verifier accepts a program within
/// 3 % of the planner's peak, and a plan that fits with less than that to spare can lower to
/// one that does not (it would run out of memory on its first step).
fn fits_the_gpu(r: &Report, cluster: &planner::Cluster) -> anyhow::Result<()> {
    let capacity = cluster.memory_bytes();
    let gib = (1u64 << 30) as f64;
    for m in &r.memory {
        if m.program_peak_bytes as f64 > capacity {
            print_report(r);
            anyhow::bail!(
                "template {} (stage {}) peaks at {:.2} GiB, over the {:.2} GiB of a {} (the plan \
                 predicted {:.2} GiB): compile it again with more GPUs, more recomputation or a \
                 higher ZeRO stage, or pin a smaller --micro-batch",
                m.template,
                m.stage,
                m.program_peak_bytes as f64 / gib,
                capacity / gib,
                cluster.gpu.name,
                m.predicted_peak_bytes / gib
            );
        }
    }
    Ok(())
}

pub fn run_codegen(args: &CodegenArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let plan = crate::plan_file::read(&args.plan)?;
    let graph = codegen::load_graph(&plan)?;
    let (set, report, note) =
        codegen::lower_checked(&plan, &graph, codegen::Options::default(), |set| {
            verify_with(
                set,
                Options {
                    memory_tolerance: Some(MEMORY_TOLERANCE),
                },
            )
        })?;
    if let Some(note) = note {
        println!("note        {note}");
    }
    check_showing_memory(&report)?;
    fits_the_gpu(&report, &plan.cluster)?;
    // Exported (and verified) before anything is written, so a build without MLIR fails early.
    let modules = if args.mlir {
        Some(codegen::mlir::export(&set)?)
    } else {
        None
    };
    codegen::io::write(&set, &args.output)?;
    if let Some(modules) = &modules {
        let paths = codegen::mlir::write_modules(modules, &args.output)?;
        println!(
            "mlir        {} module(s) verified by MLIR {} (template-N.mlir)",
            paths.len(),
            codegen::mlir::MLIR_VERSION
        );
    }
    let instrs: usize = set.templates.iter().map(|t| t.instrs.len()).sum();
    println!(
        "programs    {} ranks, {} template(s), {} instructions per iteration in all, verified ({} rank(s) simulated), {:.2} s",
        set.ranks.len(),
        set.templates.len(),
        instrs,
        report.simulated_ranks,
        started.elapsed().as_secs_f64()
    );
    print_report(&report);
    println!("written to {}", args.output.display());
    Ok(())
}

pub fn run_show(args: &ShowArgs) -> anyhow::Result<()> {
    let set = codegen::io::read(&args.dir)?;
    let text = codegen::listing::show(&set, args.rank).with_context(|| {
        format!(
            "rank {} does not exist (the programs have {} ranks)",
            args.rank,
            set.ranks.len()
        )
    })?;
    use std::io::Write;
    // A closed pipe (e.g. `| head`) ends the listing quietly.
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(())
}

/// A program directory `plait run` was handed, refused unless the static verifier passes it
/// (as `plait verify` checks it): a program edited or damaged after `plait codegen` wrote it
/// would otherwise run (a missing reduction trains the ranks apart, a wrong mesh hangs).
pub fn verified_for_run(set: &codegen::ProgramSet, dir: &std::path::Path) -> anyhow::Result<()> {
    let report = verify_with(
        set,
        Options {
            memory_tolerance: Some(MEMORY_TOLERANCE),
        },
    );
    if let Some(first) = report.violations.first() {
        anyhow::bail!(
            "{} does not pass the verifier ({} violation(s); first: {first}); see them all with \
             `plait verify {}`, or write the programs again with `plait codegen`",
            dir.display(),
            report.violations.len(),
            dir.display()
        );
    }
    Ok(())
}

pub fn run_verify(args: &VerifyArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let set = codegen::io::read(&args.dir)?;
    let report = verify_with(
        &set,
        Options {
            memory_tolerance: Some(MEMORY_TOLERANCE),
        },
    );
    print_report(&report);
    check(&report)?;
    println!(
        "verified    {} ranks, {} template(s), no violations ({:.2} s)",
        set.ranks.len(),
        set.templates.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
