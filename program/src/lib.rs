//! program: the per-rank program format (`plait-program/1`) that codegen writes and a runtime
//! executes, with what both sides need to read it and nothing that plans.
//!
//! - [`format`] (re-exported here): the data (mesh, groups, parameter table, templates of
//!   instructions over local buffers, one [`RankInfo`] per rank) and its execution semantics.
//! - [`ids`]: the typed `u32` ids of buffers, parameters, groups, templates and buckets.
//! - [`io`]: the program directory (`index.json` + `template-K.json`).
//! - [`listing`]: the readable text form (`plait show`).
//! - [`verify`]: the static verifier (collective order and shapes, send/recv pairing, deadlock
//!   freedom, gradients reduced and applied once, shard coverage, peak memory), and the operand
//!   sets a runtime uses to know what an instruction reads and writes.
//!
//! A runtime depends on this crate, `ir` and `kernels` only: never on the planner, its solvers or
//! the importers (checked by `tests/tests/architecture.rs`).

pub mod error;
pub mod format;
pub mod ids;
pub mod io;
pub mod listing;
pub mod verify;

pub use error::ProgramError;
pub use format::*;
pub use ids::{BucketId, BufferId, GroupId, ParamId, TemplateId};
pub use verify::{Report, Violation, verify};
