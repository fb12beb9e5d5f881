//! codegen: a plan becomes one program per rank that a runtime executes without re-planning,
//! and a static verifier proves the programs fit together (see docs/architecture.md).
//!
//! - [`lower`]: training graph + plan → programs (schedule, TP/SP, ZeRO, buckets, recompute).
//! - [`mlir`]: the programs as MLIR modules.
//! - The format itself, its files, listing and verifier live in the `program` crate (re-exported
//!   here as [`program`], [`ids`], [`io`], [`listing`] and [`verify`]), which a runtime reads
//!   without depending on the planner.

pub mod error;
pub mod lower;
pub mod mesh;
pub mod mlir;

pub use program;
pub use program::{ids, io, listing, verify};

pub use error::CodegenError;
pub use ids::{BucketId, BufferId, GroupId, ParamId, TemplateId};
pub use lower::{Options, load_graph, lower};
pub use program::{Instr, ProgramSet};
pub use verify::{Report, Violation};

/// Lowers `plan` and checks the programs with `check`. A layer lowered as the sharding
/// extraction lays it out, where that differs from the segment rules' layout, whose programs
/// break the planner's memory (the estimate prices the rules' activations, not the
/// extraction's) is lowered again by the rules where they lower it: the third value says so
/// and why.
pub fn lower_checked(
    plan: &planner::plan::Plan,
    graph: &ir::Graph,
    opts: Options,
    check: impl Fn(&ProgramSet) -> Report,
) -> Result<(ProgramSet, Report, Option<String>), CodegenError> {
    let set = lower(plan, graph, opts)?;
    let report = check(&set);
    let over = report
        .violations
        .iter()
        .find(|v| v.check == verify::Check::Memory)
        .map(|v| v.message.clone());
    let differs = !lower::rules_match_extraction(plan, graph);
    match over {
        Some(why) if differs => {
            let mut rules = plan.clone();
            rules.block_plan = None;
            rules.run_block_plans.clear();
            let Ok(set) = lower(&rules, graph, opts) else {
                // Only the extraction lowers the layer: its programs, violation and all.
                return Ok((set, report, None));
            };
            let report = check(&set);
            let note = format!(
                "the e-graph's layout breaks the planner's memory ({why}); lowered by the segment rules"
            );
            Ok((set, report, Some(note)))
        }
        _ => Ok((set, report, None)),
    }
}

/// Loads the plan's model, lowers it, and verifies the result.
pub fn generate(plan: &planner::plan::Plan) -> Result<(ProgramSet, Report), CodegenError> {
    let graph = load_graph(plan)?;
    let (set, report, note) = lower_checked(plan, &graph, Options::default(), verify)?;
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
    if let Some(first) = report.violations.first() {
        return Err(CodegenError::Verify {
            count: report.violations.len(),
            first: first.to_string(),
        });
    }
    Ok((set, report))
}
