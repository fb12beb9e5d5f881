//! Errors of the sharding planner, each naming what to fix.

/// Why a block could not be planned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShardError {
    #[error("tensor-parallel degree must be at least 1, got {tp}")]
    InvalidTp { tp: u32 },
    #[error("the op list to plan is empty")]
    EmptyBlock,
    #[error("op {op} is not in the graph (it has {ops} ops)")]
    UnknownOp { op: u32, ops: usize },
    #[error("op {op} ({mnemonic}) cannot be planned: {reason}")]
    Unsupported {
        op: u32,
        mnemonic: String,
        reason: String,
    },
    #[error("rewrite rule `{rule}`: {reason}")]
    Rule { rule: String, reason: String },
    #[error(
        "the e-graph merged classes of different shapes or layouts ({count} conflicts), first: {first}"
    )]
    Inconsistent { count: usize, first: String },
    #[error("no sharded program computes output value %{value} in its required layout")]
    NoProgram { value: u32 },
    #[error(
        "no program fits in {limit_bytes} bytes per rank (the smallest needs {needed_bytes} bytes)"
    )]
    OutOfMemory { limit_bytes: f64, needed_bytes: f64 },
    #[error("the {solver} solver failed: {message}")]
    Solver { solver: String, message: String },
}
