//! Why programs could not be generated, read or written.

use std::path::PathBuf;

/// A codegen error, with the plan field, op or file it is about.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("plan: {field}: {message}")]
    Plan { field: String, message: String },
    #[error("cannot load the plan's model `{reference}`: {message}")]
    Model { reference: String, message: String },
    #[error("layer {}, op {op} ({mnemonic}): {message}", layer.map_or("-".to_string(), |l| l.to_string()))]
    Unsupported {
        layer: Option<u32>,
        op: u32,
        mnemonic: String,
        message: String,
    },
    #[error("op {op} ({mnemonic}): local types do not check: {message}")]
    LocalType {
        op: u32,
        mnemonic: String,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Io { path: PathBuf, message: String },
    #[error("{}: not a valid program file: {message}", path.display())]
    Format { path: PathBuf, message: String },
    #[error("the programs do not verify ({count} violation(s)); first: {first}")]
    Verify { count: usize, first: String },
}

impl CodegenError {
    pub fn plan(field: &str, message: impl Into<String>) -> CodegenError {
        CodegenError::Plan {
            field: field.into(),
            message: message.into(),
        }
    }
}
