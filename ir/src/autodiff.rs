//! Reverse-mode autodiff on the graph: appends `Grad` ops (vector-Jacobian products) for the
//! backward pass, and builds the full training step with AdamW.

use crate::graph::{BuildError, Graph, ValueId};
use crate::op::{AdamWConfig, OpKind};
use crate::types::{DType, Shape, TensorType};

/// Why a backward or training graph could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AutodiffError {
    #[error("loss {loss} is not a value of graph `{graph}`")]
    UnknownLoss { graph: String, loss: ValueId },
    #[error("loss {loss} must be a float scalar, got {ty}")]
    NotScalar { loss: ValueId, ty: TensorType },
    #[error("graph `{graph}` has no output named `loss`")]
    NoLossOutput { graph: String },
    #[error("the training graph needs the name `{name}`, which graph `{graph}` already uses")]
    NameClash { graph: String, name: String },
    #[error("graph `{graph}`: {op} refers to {value}, which is not a value of the graph")]
    DanglingValue {
        graph: String,
        op: crate::graph::OpId,
        value: ValueId,
    },
    #[error("building the backward graph: {0}")]
    Build(#[from] BuildError),
}

/// A parameter and the value holding d(loss)/d(parameter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamGrad {
    pub name: String,
    pub param: ValueId,
    /// `None` when the loss does not depend on the parameter.
    pub grad: Option<ValueId>,
}

/// The forward graph extended with its backward pass.
#[derive(Debug, Clone)]
pub struct Gradients {
    /// The forward ops (same ids) followed by the backward ops.
    pub graph: Graph,
    pub loss: ValueId,
    /// One entry per parameter, in [`Graph::params`] order.
    pub params: Vec<ParamGrad>,
    /// Per forward value, the value holding the loss's gradient with respect to it.
    grads: Vec<Option<ValueId>>,
}

impl Gradients {
    /// The gradient of the loss with respect to forward value `v`, if the backward pass has one.
    pub fn grad(&self, v: ValueId) -> Option<ValueId> {
        self.grads.get(v.index()).copied().flatten()
    }
}

/// Operand indices a gradient flows through, for an op with `n` operands. Concat's operand
/// count varies, so `OpKind::differentiable_inputs` cannot list them.
fn grad_operands(kind: &OpKind, n: usize) -> Vec<usize> {
    match kind {
        OpKind::Concat { .. } => (0..n).collect(),
        k => k.differentiable_inputs(),
    }
}

/// Pushes a single-result op and returns its result.
fn push1(
    g: &mut Graph,
    kind: OpKind,
    inputs: Vec<ValueId>,
    layer: Option<u32>,
) -> Result<ValueId, AutodiffError> {
    let mnemonic = kind.mnemonic();
    g.push_op(kind, inputs, layer)?
        .first()
        .copied()
        .ok_or_else(|| {
            AutodiffError::Build(BuildError {
                op: mnemonic.into(),
                reason: "the op defined no result".into(),
            })
        })
}

/// Appends a scalar literal of element type `dtype`: `Scalar` infers f32, and an output
/// gradient must match its forward result's type exactly.
fn scalar(g: &mut Graph, value: f64, dtype: DType, layer: Option<u32>) -> ValueId {
    g.push_source(
        OpKind::Scalar { value },
        TensorType::new(dtype, Shape::scalar()),
        layer,
    )
}

/// Appends the backward pass of `forward` for the scalar `loss`.
///
/// Walking the forward ops in reverse execution order, every op with a result the loss depends
/// on and an operand that depends on a parameter gets one `Grad` op, which inherits the op's
/// layer tag and differentiates only with respect to such operands. d(loss) is seeded with
/// `Scalar{1.0}`; results of a multi-result op with no gradient get zeros (a broadcast scalar);
/// gradients of values used more than once are summed with `Add`.
pub fn backward(forward: &Graph, loss: ValueId) -> Result<Gradients, AutodiffError> {
    if loss.index() >= forward.num_values() {
        return Err(AutodiffError::UnknownLoss {
            graph: forward.name.clone(),
            loss,
        });
    }
    for o in forward.op_ids() {
        let op = forward.op(o);
        if let Some(&value) = op
            .inputs
            .iter()
            .chain(&op.results)
            .find(|v| v.index() >= forward.num_values())
        {
            return Err(AutodiffError::DanglingValue {
                graph: forward.name.clone(),
                op: o,
                value,
            });
        }
    }
    let loss_ty = forward.ty(loss).clone();
    if loss_ty.shape.rank() != 0 || !loss_ty.dtype.is_float() {
        return Err(AutodiffError::NotScalar { loss, ty: loss_ty });
    }

    // Which values depend on a parameter through differentiable operands.
    let mut needs = vec![false; forward.num_values()];
    for &o in forward.order() {
        let op = forward.op(o);
        let depends = matches!(op.kind, OpKind::Param { .. })
            || grad_operands(&op.kind, op.inputs.len())
                .iter()
                .any(|&i| op.inputs.get(i).is_some_and(|v| needs[v.index()]));
        for &r in &op.results {
            needs[r.index()] = depends;
        }
    }

    let mut g = forward.clone();
    let mut grads: Vec<Option<ValueId>> = vec![None; forward.num_values()];
    let seed_layer = forward.op(forward.def_op(loss)).layer;
    grads[loss.index()] = Some(scalar(&mut g, 1.0, loss_ty.dtype, seed_layer));

    for &o in forward.order().iter().rev() {
        let op = forward.op(o);
        if !op.results.iter().any(|r| grads[r.index()].is_some()) {
            continue;
        }
        let wrt: Vec<usize> = grad_operands(&op.kind, op.inputs.len())
            .into_iter()
            .filter(|&i| op.inputs.get(i).is_some_and(|v| needs[v.index()]))
            .collect();
        if wrt.is_empty() {
            continue;
        }
        let mut inputs = op.inputs.clone();
        for &r in &op.results {
            let dy = match grads[r.index()] {
                Some(dy) => dy,
                None => {
                    let ty = forward.ty(r).clone();
                    let zero = scalar(&mut g, 0.0, ty.dtype, op.layer);
                    let shape = ty.shape.0.clone();
                    push1(&mut g, OpKind::Expand { shape }, vec![zero], op.layer)?
                }
            };
            inputs.push(dy);
        }
        let kind = OpKind::Grad {
            of: Box::new(op.kind.clone()),
            wrt: wrt.clone(),
        };
        let dxs = g.push_op(kind, inputs, op.layer)?;
        for (&i, dx) in wrt.iter().zip(dxs) {
            let v = op.inputs[i];
            grads[v.index()] = Some(match grads[v.index()] {
                None => dx,
                Some(prev) => push1(&mut g, OpKind::Add, vec![prev, dx], op.layer)?,
            });
        }
    }

    let params = forward
        .params()
        .into_iter()
        .map(|(name, param)| ParamGrad {
            name,
            param,
            grad: grads[param.index()],
        })
        .collect();
    Ok(Gradients {
        graph: g,
        loss,
        params,
        grads,
    })
}

/// Builds one training step from a forward graph with an output named `loss`: the backward
/// pass, then per parameter NAME the optimizer states `state m.NAME` and `state v.NAME` (typed
/// like the parameter) and one `AdamW` op reading the shared `input step` (i64[], 1-based).
/// Outputs are `loss` and, per parameter, `param.NAME`, `m.NAME`, `v.NAME`. Each AdamW op and
/// state inherits its parameter's layer tag. A parameter the loss does not depend on passes
/// through unchanged with its states, as torch.optim skips parameters without a gradient.
pub fn training_graph(forward: &Graph, cfg: AdamWConfig) -> Result<Graph, AutodiffError> {
    let loss = forward
        .output("loss")
        .ok_or_else(|| AutodiffError::NoLossOutput {
            graph: forward.name.clone(),
        })?;
    let Gradients {
        graph: mut g,
        params,
        ..
    } = backward(forward, loss)?;

    // Fed names must be unique: `step`, and the states of every parameter.
    let mut fed: Vec<String> = forward
        .order()
        .iter()
        .filter_map(|&o| match &forward.op(o).kind {
            OpKind::Input { name } | OpKind::State { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let clash = |fed: &mut Vec<String>, name: String| {
        if fed.contains(&name) {
            return Err(AutodiffError::NameClash {
                graph: forward.name.clone(),
                name,
            });
        }
        fed.push(name);
        Ok(())
    };
    clash(&mut fed, "step".into())?;
    for p in &params {
        clash(&mut fed, format!("m.{}", p.name))?;
        clash(&mut fed, format!("v.{}", p.name))?;
    }

    let step = g.push_source(
        OpKind::Input {
            name: "step".into(),
        },
        TensorType::new(DType::I64, Shape::scalar()),
        None,
    );
    let mut outputs = vec![("loss".to_string(), loss)];
    for p in &params {
        let ty = g.ty(p.param).clone();
        let layer = g.op(g.def_op(p.param)).layer;
        let state = |g: &mut Graph, prefix: &str| {
            g.push_source(
                OpKind::State {
                    name: format!("{prefix}.{}", p.name),
                },
                ty.clone(),
                layer,
            )
        };
        let (m, v) = (state(&mut g, "m"), state(&mut g, "v"));
        let new = match p.grad {
            Some(grad) => {
                let r = g.push_op(OpKind::AdamW(cfg), vec![p.param, grad, m, v, step], layer)?;
                <[ValueId; 3]>::try_from(r.as_slice()).map_err(|_| {
                    AutodiffError::Build(BuildError {
                        op: "adamw".into(),
                        reason: format!("expected 3 results, got {}", r.len()),
                    })
                })?
            }
            None => [p.param, m, v],
        };
        for (prefix, value) in ["param", "m", "v"].into_iter().zip(new) {
            outputs.push((format!("{prefix}.{}", p.name), value));
        }
    }
    g.outputs = outputs;
    g.name = format!("{}.train", forward.name);
    Ok(g)
}
