//! The constant evaluator: computes nodes whose inputs are all known. Once batch and seq are
//! bound every shape is known, so the causal mask and the rotary tables fold away completely.
//!
//! `fold` answers `Ok(None)` for what it does not evaluate (unknown ops, results too large to be
//! worth holding); the caller then lowers the node to IR instead.

mod elementwise;
pub mod layout;

use super::node::NodeRef;
use super::value::{Const, checked_numel};
use crate::ImportError;

/// Results above this many elements are lowered rather than folded (they would be weights).
pub const MAX_FOLD_ELEMENTS: usize = 1 << 24;

/// Op types the folder evaluates.
pub const FOLDABLE: &[&str] = &[
    "Abs",
    "Add",
    "And",
    "Cast",
    "CastLike",
    "Ceil",
    "Concat",
    "ConstantOfShape",
    "Cos",
    "CumSum",
    "Div",
    "Dropout",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Floor",
    "Gather",
    "GatherND",
    "Greater",
    "GreaterOrEqual",
    "Identity",
    "Less",
    "LessOrEqual",
    "Log",
    "Max",
    "Min",
    "Mod",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "Pow",
    "Range",
    "Reciprocal",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Sign",
    "Sin",
    "Size",
    "Slice",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Tanh",
    "Transpose",
    "Unsqueeze",
    "Where",
    "Xor",
];

/// Evaluates node `n` on constant inputs (`None` for omitted optional inputs).
pub fn fold(n: &NodeRef<'_>, ins: &[Option<&Const>]) -> Result<Option<Vec<Const>>, ImportError> {
    let out = match n.op() {
        "Identity" | "Dropout" => vec![arg(n, ins, 0)?.clone()],
        op if elementwise::handles(op) => match elementwise::fold(n, ins)? {
            Some(c) => vec![c],
            None => return Ok(None),
        },
        _ => match layout::fold(n, ins)? {
            Some(v) => v,
            None => return Ok(None),
        },
    };
    // Dropout's optional mask output is never read by exported inference graphs.
    if out.len() < n.node.output.iter().filter(|o| !o.is_empty()).count() && n.op() != "Dropout" {
        return Err(n.bad(format!(
            "expected {} outputs, computed {}",
            n.node.output.len(),
            out.len()
        )));
    }
    Ok(Some(out))
}

/// Required input `i`.
pub fn arg<'c>(
    n: &NodeRef<'_>,
    ins: &[Option<&'c Const>],
    i: usize,
) -> Result<&'c Const, ImportError> {
    ins.get(i)
        .copied()
        .flatten()
        .ok_or_else(|| n.bad(format!("missing input {i}")))
}

/// Optional input `i` read as integers (shapes, axes).
pub fn ints_arg(
    n: &NodeRef<'_>,
    ins: &[Option<&Const>],
    i: usize,
) -> Result<Option<Vec<i64>>, ImportError> {
    ins.get(i)
        .copied()
        .flatten()
        .map(|c| {
            c.ints()
                .ok_or_else(|| n.bad(format!("input {i} must hold integers")))
        })
        .transpose()
}

/// Row-major strides of `shape` viewed in a broadcast `out` shape (0 along broadcast axes).
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let pad = out.len() - shape.len().min(out.len());
    let mut strides = vec![0; out.len()];
    let mut acc = 1;
    for i in (0..shape.len().min(out.len())).rev() {
        let d = shape.get(i).copied().unwrap_or(1);
        if let Some(s) = strides.get_mut(pad + i) {
            *s = if d == 1 { 0 } else { acc };
        }
        acc *= d;
    }
    strides
}

/// Calls `f` with the source offsets of every output element, in row-major order.
pub fn for_each_index(out: &[usize], strides: &[Vec<usize>], mut f: impl FnMut(&[usize])) {
    let total: usize = out.iter().product();
    let mut idx = vec![0usize; out.len()];
    let mut offs = vec![0usize; strides.len()];
    for _ in 0..total {
        f(&offs);
        // Odometer increment, updating offsets incrementally.
        for ax in (0..out.len()).rev() {
            let d = out.get(ax).copied().unwrap_or(1);
            let i = idx.get_mut(ax);
            let Some(i) = i else { break };
            *i += 1;
            for (o, s) in offs.iter_mut().zip(strides) {
                *o += s.get(ax).copied().unwrap_or(0);
            }
            if *i < d {
                break;
            }
            for (o, s) in offs.iter_mut().zip(strides) {
                *o -= s.get(ax).copied().unwrap_or(0) * d;
            }
            *i = 0;
        }
    }
}

/// Whether a result of this shape may be folded.
pub fn small(shape: &[usize]) -> bool {
    checked_numel(shape).is_some_and(|n| n <= MAX_FOLD_ELEMENTS)
}
