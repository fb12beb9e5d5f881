//! Why programs could not be generated, read or written.

/// A codegen error, with the plan field, op or file it is about.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("plan: {field}: {message}")]
    Plan { field: String, message: String },
    #[error("plan: model.ir: the model's graph does not parse: {source}")]
    ModelIr {
        #[source]
        source: ir::text::ParseError,
    },
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
    #[error(transparent)]
    Program(#[from] program::ProgramError),
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
