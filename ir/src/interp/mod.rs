//! Reference interpreter: naive f64 CPU kernels for every op, forward and backward.
//!
//! This is the single-device oracle every parallel run is compared with, so each kernel is
//! written for clarity, computes in f64 whatever the declared element type, and stores integers
//! (token ids, positions, the optimizer step) exactly as f64. Every result's shape is checked
//! against the graph's declared type under the binding, so a kernel bug or an ill-typed graph
//! surfaces as an error rather than as silently wrong numbers.
//!
//! Conventions the op set leaves open:
//! - `Softmax{causal}`/`Attention{causal}`: a row whose every key is masked (only possible when
//!   there are more queries than keys) is all zeros rather than NaN.
//! - `Dropout{p, seed}`: see [`dropout_keep`]; the mask depends only on (seed, flat index).
//! - `TopKRouter`: ties between equal logits go to the lower expert index.
//! - `AdamW`: torch.optim.AdamW's update, see [`optim`].

mod attention;
mod dropout;
mod elementwise;
mod embedding;
mod forward;
mod grad;
mod index;
mod layout;
mod loss;
mod matmul;
mod moe;
mod norm;
mod optim;
mod reduce;
mod rotary;
mod softmax;
mod special;

use std::collections::BTreeMap;

use crate::graph::{Graph, OpId, ValueId};
use crate::op::OpKind;
use crate::tensor::{Tensor, Weights};
use crate::types::Binding;

pub use dropout::dropout_keep;
pub use forward::apply;
pub use grad::vjp;
pub use special::erf;

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

/// Why an evaluation failed. `op` names the op as `op12 (attention)`.
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
    /// The operand values do not fit the op (an id out of range, inconsistent shapes...).
    #[error("{op}: {reason}")]
    Invalid { op: String, reason: String },
    /// The graph refers to a value no earlier op in the execution order defined.
    #[error("{op}: operand {value} is used before it is defined")]
    Undefined { op: String, value: ValueId },
    /// A provided tensor's data length disagrees with its own shape.
    #[error("`{name}`: shape {shape:?} holds {want} elements, the data has {got}")]
    Malformed {
        name: String,
        shape: Vec<usize>,
        want: usize,
        got: usize,
    },
}

/// Why one kernel rejected its operands; [`evaluate`] attaches the op's location.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct KernelError {
    pub reason: String,
}

impl KernelError {
    pub(crate) fn new(reason: impl Into<String>) -> KernelError {
        KernelError {
            reason: reason.into(),
        }
    }
}

/// Evaluates `graph` in execution order.
pub fn evaluate(graph: &Graph, env: &Env<'_>) -> Result<Evaluation, InterpError> {
    let mut values: Vec<Option<Tensor>> = vec![None; graph.num_values()];
    for &o in graph.order() {
        let data = graph.op(o);
        let label = || op_label(graph, o);
        let results = if data.kind.is_source() {
            vec![source(&data.kind, env).map_err(|e| e.at(label()))?]
        } else {
            let mut operands = Vec::with_capacity(data.inputs.len());
            for &v in &data.inputs {
                match values.get(v.index()).and_then(Option::as_ref) {
                    Some(t) => operands.push(t),
                    None => {
                        return Err(InterpError::Undefined {
                            op: label(),
                            value: v,
                        });
                    }
                }
            }
            apply(&data.kind, &operands, env.binding).map_err(|e| InterpError::Invalid {
                op: label(),
                reason: e.reason,
            })?
        };
        if results.len() != data.results.len() {
            return Err(InterpError::Invalid {
                op: label(),
                reason: format!(
                    "computed {} results, the graph declares {}",
                    results.len(),
                    data.results.len()
                ),
            });
        }
        for (t, &v) in results.into_iter().zip(&data.results) {
            let want = graph.ty(v).shape.eval(env.binding);
            let want: Vec<usize> = want.into_iter().map(|d| d as usize).collect();
            if t.shape != want {
                return Err(InterpError::ShapeMismatch {
                    op: label(),
                    got: t.shape,
                    want,
                });
            }
            values[v.index()] = Some(t);
        }
    }
    // Ops missing from the execution order leave holes; an empty tensor keeps ids dense.
    let values = values
        .into_iter()
        .map(|t| {
            t.unwrap_or(Tensor {
                shape: vec![0],
                data: vec![],
            })
        })
        .collect();
    Ok(Evaluation {
        values,
        outputs: graph.outputs.clone(),
    })
}

fn op_label(graph: &Graph, o: OpId) -> String {
    format!("{o} ({})", graph.op(o).kind.mnemonic())
}

/// A source op's failure, before its location is known.
enum SourceError {
    Missing(String),
    Kernel(KernelError),
    Malformed(InterpError),
}

impl SourceError {
    fn at(self, op: String) -> InterpError {
        match self {
            SourceError::Missing(name) => InterpError::Missing { op, name },
            SourceError::Kernel(e) => InterpError::Invalid {
                op,
                reason: e.reason,
            },
            SourceError::Malformed(e) => e,
        }
    }
}

fn source(kind: &OpKind, env: &Env<'_>) -> Result<Tensor, SourceError> {
    let named = |map: &BTreeMap<String, Tensor>, name: &str| {
        let t = map
            .get(name)
            .ok_or_else(|| SourceError::Missing(name.to_string()))?;
        let want = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if want != Some(t.data.len()) {
            return Err(SourceError::Malformed(InterpError::Malformed {
                name: name.to_string(),
                shape: t.shape.clone(),
                want: want.unwrap_or(usize::MAX),
                got: t.data.len(),
            }));
        }
        Ok(t.clone())
    };
    match kind {
        OpKind::Param { name } | OpKind::Buffer { name } => named(env.weights, name),
        OpKind::Input { name } | OpKind::State { name } => named(env.inputs, name),
        OpKind::Scalar { value } => Ok(Tensor::scalar(*value)),
        OpKind::Iota { len } => {
            let n = index::to_usize(len.eval(env.binding)).map_err(SourceError::Kernel)?;
            index::check_numel(&[n]).map_err(SourceError::Kernel)?;
            Ok(Tensor {
                shape: vec![n],
                data: (0..n).map(|i| i as f64).collect(),
            })
        }
        other => Err(SourceError::Kernel(KernelError::new(format!(
            "{} is not a source op",
            other.mnemonic()
        )))),
    }
}
