//! Errors from reading a Hugging Face `config.json`: each names the file and the field.

use std::path::PathBuf;

/// Why a `config.json` could not be turned into a model.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not valid JSON at line {line}, column {column}: {message}", file.display())]
    Json {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: expected a JSON object at the top level, found {found}", file.display())]
    NotAnObject { file: PathBuf, found: &'static str },
    #[error("{}: field `model_type` is missing; set it to one of: {supported}", file.display())]
    MissingModelType { file: PathBuf, supported: String },
    #[error("{}: model_type \"{model_type}\" is not supported{}; supported model types: {supported}", file.display(), lacking.map(|l| format!(" (plait does not build {l} yet)")).unwrap_or_default())]
    UnsupportedModelType {
        file: PathBuf,
        model_type: String,
        /// What plait lacks for it, where it is a family people train.
        lacking: Option<&'static str>,
        supported: String,
    },
    #[error("{}: required field `{field}` is missing ({model_type} configs need {required})", file.display())]
    MissingField {
        file: PathBuf,
        field: &'static str,
        model_type: &'static str,
        required: String,
    },
    #[error("{}: field `{field}` must be {expected}, got {got}", file.display())]
    WrongType {
        file: PathBuf,
        field: &'static str,
        expected: &'static str,
        got: String,
    },
    #[error("{}: {reason}", file.display())]
    Inconsistent { file: PathBuf, reason: String },
}
