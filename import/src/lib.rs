//! Model importers: Hugging Face `config.json` ([`hf`]), the built-in [`zoo`], the graph
//! builder that turns a [`spec::ModelSpec`] into an IR graph ([`build`]), and ONNX files
//! ([`onnx`]).

pub mod build;
pub mod error;
pub mod hf;
pub mod onnx;
pub mod spec;
pub mod summary;
pub mod zoo;

pub use build::build_forward;
pub use error::ImportError;
pub use onnx::{Imported, import_onnx};
pub use spec::{Family, ModelSpec};
