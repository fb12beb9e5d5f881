//! The crate's error type. Every variant names the file it is about; variants about one node
//! also name the node and its op type, so a user can find the spot in Netron and fix the export.

use std::path::PathBuf;

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{}: file not found; check the path", file.display())]
    FileNotFound { file: PathBuf },

    #[error("{}: cannot read the file: {source}", file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "{}: not a valid ONNX model (protobuf decoding failed: {source}); the file may be truncated or not an ONNX file",
        file.display()
    )]
    Decode {
        file: PathBuf,
        #[source]
        source: prost::DecodeError,
    },

    #[error("{}: the model has no graph; export the model again", file.display())]
    NoGraph { file: PathBuf },

    #[error(
        "{}: node '{node}' has op type '{op_type}'{}, which plait cannot import (supported: {supported})",
        file.display(),
        if domain.is_empty() { String::new() } else { format!(" in domain '{domain}'") }
    )]
    UnsupportedOp {
        file: PathBuf,
        node: String,
        op_type: String,
        domain: String,
        supported: String,
    },

    #[error(
        "{}: node '{node}' ({op_type}) needs its input '{input}' ({role}) to be a constant once batch and seq are fixed, but it depends on the model input; export with static shapes or simplify the graph",
        file.display()
    )]
    NotConstant {
        file: PathBuf,
        node: String,
        op_type: String,
        input: String,
        role: String,
    },

    #[error("{}: node '{node}' ({op_type}): {reason}", file.display())]
    BadNode {
        file: PathBuf,
        node: String,
        op_type: String,
        reason: String,
    },

    #[error("{}: node '{node}' ({op_type}) reads '{value}', which no node, initializer or graph input defines", file.display())]
    UndefinedValue {
        file: PathBuf,
        node: String,
        op_type: String,
        value: String,
    },

    #[error("{}: tensor '{tensor}': {reason}", file.display())]
    BadTensor {
        file: PathBuf,
        tensor: String,
        reason: String,
    },

    #[error(
        "{}: tensor '{tensor}' keeps its data in '{}', {reason}",
        file.display(),
        data_file.display()
    )]
    ExternalData {
        file: PathBuf,
        data_file: PathBuf,
        tensor: String,
        reason: String,
    },

    #[error("{}: graph {what} '{name}': {reason}", file.display())]
    BadGraphIo {
        file: PathBuf,
        what: &'static str,
        name: String,
        reason: String,
    },

    #[error("{}: batch and seq must be at least 1 (got batch {batch}, seq {seq})", file.display())]
    BadBinding { file: PathBuf, batch: u64, seq: u64 },

    #[error("{}: node '{node}' ({op_type}) lowers to an ill-typed IR op: {source}", file.display())]
    Build {
        file: PathBuf,
        node: String,
        op_type: String,
        #[source]
        source: ir::BuildError,
    },
}
