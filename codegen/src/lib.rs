//! codegen: a plan becomes one program per rank that a runtime executes without re-planning,
//! and a static verifier proves the programs fit together (see docs/architecture.md).
//!
//! - [`program`]: the `plait-program/1` format (templates shared by ranks that differ only in
//!   coordinates, instructions over local buffers).
//! - [`lower`]: training graph + plan → programs (schedule, TP/SP, ZeRO, buckets, recompute).
//! - [`verify`]: collective order and shapes, send/recv pairing, deadlock freedom, gradients
//!   reduced and applied once, shard coverage, peak memory against the planner.
//! - [`listing`]: the readable text form (`plait show`); [`io`]: the directory of files.

pub mod error;
pub mod ids;
pub mod io;
pub mod listing;
pub mod lower;
pub mod mesh;
pub mod mlir;
pub mod program;
pub mod verify;

pub use error::CodegenError;
pub use ids::{BucketId, BufferId, GroupId, ParamId, TemplateId};
pub use lower::{Options, load_graph, lower};
pub use program::{Instr, ProgramSet};
pub use verify::{Report, Violation, verify};

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
