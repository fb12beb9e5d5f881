//! Model importers: Hugging Face `config.json` ([`hf`]), the built-in [`zoo`], the graph
//! builder that turns a [`spec::ModelSpec`] into an IR graph ([`build`]), and ONNX files
//! ([`onnx`]). [`load_model`] is the one entry point that resolves a MODEL argument (file or
//! zoo name) to a bound forward graph; its [`Error`] wraps every importer's error.

pub mod build;
pub mod error;
pub mod hf;
pub mod hub;
pub mod load;
pub mod onnx;
pub mod sizes;
pub mod spec;
pub mod summary;
pub mod zoo;

pub use build::build_forward;
pub use error::ImportError;
pub use hf::ConfigError;
pub use load::{DEFAULT_ONNX_SEQ, Error, LoadedModel, Source, load_model, load_model_at};
pub use onnx::{Imported, import_onnx};
pub use spec::{Family, ModelSpec};
