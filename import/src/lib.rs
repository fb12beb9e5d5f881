//! Model importers: Hugging Face `config.json` ([`hf`]), the built-in [`zoo`], and the graph
//! builder that turns a [`spec::ModelSpec`] into an IR graph ([`build`]).

pub mod build;
pub mod hf;
pub mod spec;
pub mod summary;
pub mod zoo;

pub use build::build_forward;
pub use spec::{Family, ModelSpec};
