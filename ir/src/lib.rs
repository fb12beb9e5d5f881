//! plait's tensor-graph IR.
//!
//! A [`Graph`] holds typed values and ops in tables keyed by `u32` ids ([`ValueId`], [`OpId`]);
//! the execution order is a separate list. The [`op`] module defines what every op computes.
//! [`verify`] checks a graph's invariants, [`text`] prints and parses the text form, [`autodiff`]
//! builds the training graph, [`cost`] gives per-op FLOPs and bytes, [`blocks`] finds repeated
//! layers, and [`interp`] is the reference interpreter (the single-device oracle).

pub mod autodiff;
pub mod blocks;
pub mod cost;
pub mod expert;
pub mod graph;
pub mod interp;
pub mod mask;
pub mod op;
pub mod rope;
pub mod routing;
pub mod tensor;
pub mod testing;
pub mod text;
pub mod types;
pub mod verify;

pub use expert::ExpertForm;
pub use graph::{BuildError, Graph, OpData, OpId, Uses, ValueData, ValueDef, ValueId};
pub use mask::KeyMask;
pub use op::{AdamWConfig, OpClass, OpKind, infer_types};
pub use rope::RopeScaling;
pub use routing::Routing;
pub use tensor::{Tensor, Weights};
pub use types::{Binding, DType, Dim, Shape, Sym, TensorType};
