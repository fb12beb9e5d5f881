//! Reference interpreter: naive f64 CPU kernels for every op, forward and backward.
//! (Stub: the API below is the contract; the implementation lands with the autodiff work.)

use std::collections::BTreeMap;

use crate::graph::{Graph, ValueId};
use crate::tensor::{Tensor, Weights};
use crate::types::Binding;

/// What the interpreter reads: parameter/buffer values, fed inputs and optimizer states by name.
#[derive(Debug, Clone, Copy)]
pub struct Env<'a> {
    /// `param` and `buffer` values by name.
    pub weights: &'a Weights,
    /// `input` and `state` values by name.
    pub inputs: &'a BTreeMap<String, Tensor>,
    /// Sizes of the symbolic batch and sequence dimensions.
    pub binding: Binding,
}

/// Every value computed by one evaluation, indexed by `ValueId`.
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub values: Vec<Tensor>,
    pub outputs: Vec<(String, ValueId)>,
}

impl Evaluation {
    pub fn value(&self, v: ValueId) -> &Tensor {
        &self.values[v.index()]
    }

    pub fn output(&self, name: &str) -> Option<&Tensor> {
        self.outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| &self.values[v.index()])
    }
}

/// Why an evaluation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    #[error("{op}: no value named `{name}` was provided")]
    Missing { op: String, name: String },
    #[error("{op}: {reason}")]
    Unsupported { op: String, reason: String },
    #[error("{op}: value has shape {got:?}, the graph declares {want:?}")]
    ShapeMismatch {
        op: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
}

/// Evaluates `graph` in execution order.
pub fn evaluate(graph: &Graph, env: &Env<'_>) -> Result<Evaluation, InterpError> {
    let _ = (graph, env);
    Err(InterpError::Unsupported {
        op: "graph".into(),
        reason: "the reference interpreter is not implemented yet".into(),
    })
}
