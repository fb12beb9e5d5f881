//! Verifier errors: where (an op, a value, an output, the graph) and what is wrong.

use std::fmt;

use crate::graph::{OpId, ValueId};
use crate::types::TensorType;

/// Where an error was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// An op, with its text-form head (`%12 = linear`) as the printer numbers values.
    Op { op: OpId, head: String },
    /// A value table entry that no op defines.
    Value { value: ValueId },
    /// A named graph output.
    Output { name: String },
    /// The graph as a whole.
    Graph,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Op { op, head } => write!(f, "{op}: {head}"),
            Location::Value { value } => write!(f, "value #{}", value.0),
            Location::Output { name } => write!(f, "output {name:?}"),
            Location::Graph => f.write_str("graph"),
        }
    }
}

/// What is wrong. Value names (`%5`) follow the printer's numbering; `#n` is a raw value id
/// that has no text name.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ErrorKind {
    #[error("position {position} of the execution order names {op}, which does not exist")]
    UnknownOpInOrder { position: usize, op: OpId },
    #[error("not in the execution order")]
    MissingFromOrder,
    #[error("appears {times} times in the execution order")]
    RepeatedInOrder { times: usize },
    #[error("has {found} result(s), {mnemonic} defines {expected}")]
    ResultCount {
        mnemonic: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("result {index} is value #{}, which does not exist", value.0)]
    UnknownResult { index: usize, value: ValueId },
    #[error("result {index} ({value}) records its definition as result {def_index} of {def_op}")]
    DefMismatch {
        index: usize,
        value: String,
        def_op: OpId,
        def_index: u32,
    },
    #[error("records its definition as result {def_index} of {def_op}, which does not list it")]
    OrphanValue { def_op: OpId, def_index: u32 },
    #[error("operand {index} is value #{}, which does not exist", value.0)]
    UndefinedOperand { index: usize, value: ValueId },
    #[error("operand {index} ({value}) is used before its definition by {def}")]
    UseBeforeDef {
        index: usize,
        value: String,
        def: String,
    },
    #[error(
        "operand {index} ({value}) is defined by {def_op}, which is not in the execution order"
    )]
    UnorderedOperand {
        index: usize,
        value: String,
        def_op: OpId,
    },
    #[error("a source op takes no operands, got {count}")]
    SourceOperands { count: usize },
    /// The type-inference error, verbatim.
    #[error("{message}")]
    Inference { message: String },
    #[error("result {index} is declared {declared} but {mnemonic} gives {inferred}")]
    ResultType {
        index: usize,
        mnemonic: &'static str,
        declared: TensorType,
        inferred: TensorType,
    },
    #[error("duplicate {kind} name {name:?} (first defined by {first})")]
    DuplicateSourceName {
        kind: &'static str,
        name: String,
        first: String,
    },
    #[error("refers to value #{}, which does not exist", value.0)]
    OutputUndefined { value: ValueId },
    #[error("output name is used more than once")]
    DuplicateOutput,
    #[error("{tagged} op(s) are tagged with layers but the graph has no block name")]
    LayersWithoutBlock { tagged: usize },
    #[error("block name {block:?} is set but no op is tagged with a layer")]
    BlockWithoutLayers { block: String },
    #[error("layer {layer} has no compute ops (layer tags must be dense, 0..{layers})")]
    EmptyLayer { layer: u32, layers: u64 },
    #[error("layer {layer} differs from layer {reference}: {detail}")]
    LayerStructure {
        layer: u32,
        reference: u32,
        detail: String,
    },
    #[error(
        "kind_starts {starts:?} must be ascending layers from 1 to {layers} - 1 (each the first \
         layer of a run of identical layers)"
    )]
    KindStarts { starts: Vec<u32>, layers: u64 },
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{location}: {kind}")]
pub struct VerifyError {
    pub location: Location,
    pub kind: ErrorKind,
}

/// Every broken invariant of a graph, in check order.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyErrors {
    pub errors: Vec<VerifyError>,
}

impl fmt::Display for VerifyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} verifier error(s)", self.errors.len())?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for VerifyErrors {}
