//! Model importers.

pub mod error;
pub mod onnx;

pub use error::ImportError;
pub use onnx::{Imported, import_onnx};
