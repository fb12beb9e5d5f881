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

/// Loads the plan's model, lowers it, and verifies the result.
pub fn generate(plan: &planner::plan::Plan) -> Result<(ProgramSet, Report), CodegenError> {
    let graph = load_graph(plan)?;
    let set = lower(plan, &graph, Options::default())?;
    let report = verify(&set);
    if let Some(first) = report.violations.first() {
        return Err(CodegenError::Verify {
            count: report.violations.len(),
            first: first.to_string(),
        });
    }
    Ok((set, report))
}
