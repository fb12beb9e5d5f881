//! A whole-graph executor on the kernels: walks `graph.order()` as `ir::interp::evaluate` does,
//! so a forward or training graph can be run in f32 and compared with the reference. The
//! runtime runs per-rank programs instead; this is for tests, examples and single-device runs.

use std::collections::BTreeMap;

use ir::{Binding, Graph, OpId, OpKind, ValueId};

use crate::{KernelError, Tensor32, forward};

/// What the executor reads: parameter/buffer values, fed inputs and optimizer states by name.
#[derive(Debug, Clone, Copy)]
pub struct Env<'a> {
    /// `param` and `buffer` values by name.
    pub weights: &'a BTreeMap<String, Tensor32>,
    /// `input` and `state` values by name.
    pub inputs: &'a BTreeMap<String, Tensor32>,
    /// Sizes of the symbolic batch and sequence dimensions.
    pub binding: Binding,
}

/// Why a graph could not be executed; `op` names the op as `op12 (attention)`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    #[error("{op}: no value named `{name}` was provided")]
    Missing { op: String, name: String },
    #[error("{op}: value {value} is not defined at this point")]
    Undefined { op: String, value: ValueId },
    #[error("{op}: value has shape {got:?}, the graph declares {want:?}")]
    ShapeMismatch {
        op: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("{op}: computed {got} results, the graph declares {want}")]
    ResultCount { op: String, got: usize, want: usize },
    #[error("{op}: {source}")]
    Kernel {
        op: String,
        #[source]
        source: KernelError,
    },
}

/// Every value computed by one execution, indexed by `ValueId` (`None` for ops left out of
/// the order).
#[derive(Debug, Clone)]
pub struct Evaluation {
    pub values: Vec<Option<Tensor32>>,
    pub outputs: Vec<(String, ValueId)>,
}

impl Evaluation {
    pub fn value(&self, v: ValueId) -> Option<&Tensor32> {
        self.values.get(v.index()).and_then(Option::as_ref)
    }

    pub fn output(&self, name: &str) -> Option<&Tensor32> {
        let &(_, v) = self.outputs.iter().find(|(n, _)| n == name)?;
        self.value(v)
    }
}

fn label(graph: &Graph, o: OpId) -> String {
    format!("{o} ({})", graph.op(o).kind.mnemonic())
}

/// Executes `graph` in its execution order with the kernels.
pub fn evaluate(graph: &Graph, env: &Env<'_>) -> Result<Evaluation, ExecError> {
    let mut values: Vec<Option<Tensor32>> = vec![None; graph.num_values()];
    for &o in graph.order() {
        if o.index() >= graph.num_ops() {
            return Err(ExecError::Undefined {
                op: o.to_string(),
                value: ValueId(u32::MAX),
            });
        }
        let data = graph.op(o);
        let results = if data.kind.is_source() {
            vec![source(&data.kind, env).map_err(|e| e.at(label(graph, o)))?]
        } else {
            let mut operands = Vec::with_capacity(data.inputs.len());
            for &v in &data.inputs {
                match values.get(v.index()).and_then(Option::as_ref) {
                    Some(t) => operands.push(t),
                    None => {
                        return Err(ExecError::Undefined {
                            op: label(graph, o),
                            value: v,
                        });
                    }
                }
            }
            forward(&data.kind, &operands, env.binding).map_err(|source| ExecError::Kernel {
                op: label(graph, o),
                source,
            })?
        };
        if results.len() != data.results.len() {
            return Err(ExecError::ResultCount {
                op: label(graph, o),
                got: results.len(),
                want: data.results.len(),
            });
        }
        for (t, &v) in results.into_iter().zip(&data.results) {
            if v.index() >= values.len() {
                return Err(ExecError::Undefined {
                    op: label(graph, o),
                    value: v,
                });
            }
            let want: Vec<usize> = graph
                .ty(v)
                .shape
                .eval(env.binding)
                .into_iter()
                .map(|d| d as usize)
                .collect();
            if t.shape != want {
                return Err(ExecError::ShapeMismatch {
                    op: label(graph, o),
                    got: t.shape,
                    want,
                });
            }
            values[v.index()] = Some(t);
        }
    }
    Ok(Evaluation {
        values,
        outputs: graph.outputs.clone(),
    })
}

/// A source op's failure, before its location is known.
enum SourceError {
    Missing(String),
    Kernel(KernelError),
}

impl SourceError {
    fn at(self, op: String) -> ExecError {
        match self {
            SourceError::Missing(name) => ExecError::Missing { op, name },
            SourceError::Kernel(source) => ExecError::Kernel { op, source },
        }
    }
}

fn source(kind: &OpKind, env: &Env<'_>) -> Result<Tensor32, SourceError> {
    let named = |map: &BTreeMap<String, Tensor32>, name: &str| {
        let t = map
            .get(name)
            .ok_or_else(|| SourceError::Missing(name.to_string()))?;
        t.check().map_err(SourceError::Kernel)?;
        Ok(t.clone())
    };
    match kind {
        OpKind::Param { name } | OpKind::Buffer { name } => named(env.weights, name),
        OpKind::Input { name } | OpKind::State { name } => named(env.inputs, name),
        OpKind::Scalar { value } => Ok(Tensor32::scalar(*value as f32)),
        OpKind::Iota { len } => {
            let n = crate::shape::attr_usize("iota", len.eval(env.binding))
                .map_err(SourceError::Kernel)?;
            // Positions are stored as exact f32 integers (see `Tensor32`).
            Tensor32::new(vec![n], (0..n).map(|i| i as f32).collect()).map_err(SourceError::Kernel)
        }
        other => Err(SourceError::Kernel(KernelError::Unsupported {
            op: other.mnemonic(),
            reason: "not a source op".into(),
        })),
    }
}
