//! Lowering of data-dependent nodes to primitive IR ops (plus the fused ops ONNX already has:
//! LayerNormalization, Gelu). Attribute-like inputs (shapes, axes, exponents) must be constants.

use ir::{DType, OpKind, ValueId};

use super::build::{Importer, Val, fixed};
use super::fold::layout::shape_window;
use super::node::NodeRef;
use super::proto::NodeProto;
use super::shapes;
use super::value::{Const, Elem};
use crate::ImportError;

/// Op types that lower to IR when their inputs depend on the model input.
pub const LOWERABLE: &[&str] = &[
    "Add",
    "Cast",
    "CastLike",
    "Concat",
    "Div",
    "Dropout",
    "Exp",
    "Expand",
    "Gather",
    "Gelu",
    "Gemm",
    "Identity",
    "LayerNormalization",
    "MatMul",
    "Mul",
    "Neg",
    "Pow",
    "Reciprocal",
    "ReduceMean",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Size",
    "Slice",
    "Softmax",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Tanh",
    "Transpose",
    "Unsqueeze",
];

pub fn lowerable(node: Option<&NodeProto>) -> bool {
    node.and_then(|n| n.op_type.as_deref())
        .is_some_and(|op| LOWERABLE.contains(&op))
}

fn data(imp: &mut Importer<'_>, n: &NodeRef<'_>, slot: usize) -> Result<ValueId, ImportError> {
    let name = n
        .input(slot)
        .ok_or_else(|| n.bad(format!("missing input {slot}")))?;
    imp.materialize(n, name)
}

/// Input `slot` as a constant; an error naming `role` if it depends on the model input.
fn konst(
    imp: &Importer<'_>,
    n: &NodeRef<'_>,
    slot: usize,
    role: &str,
) -> Result<Option<Const>, ImportError> {
    let Some(name) = n.input(slot) else {
        return Ok(None);
    };
    match imp.consts.get(name) {
        Some(c) => Ok(Some(c.clone())),
        None if imp.ir.contains_key(name) => Err(n.not_constant(slot, role)),
        None => Err(ImportError::UndefinedValue {
            file: imp.file.to_path_buf(),
            node: n.name(),
            op_type: n.op().to_string(),
            value: name.to_string(),
        }),
    }
}

fn ints(
    imp: &Importer<'_>,
    n: &NodeRef<'_>,
    slot: usize,
    role: &str,
) -> Result<Option<Vec<i64>>, ImportError> {
    konst(imp, n, slot, role)?
        .map(|c| {
            c.ints()
                .ok_or_else(|| n.bad(format!("{role} must be integers")))
        })
        .transpose()
}

fn push(
    imp: &mut Importer<'_>,
    n: &NodeRef<'_>,
    kind: OpKind,
    inputs: Vec<ValueId>,
) -> Result<Vec<ValueId>, ImportError> {
    imp.graph
        .push_op(kind, inputs, None)
        .map_err(|source| ImportError::Build {
            file: imp.file.to_path_buf(),
            node: n.name(),
            op_type: n.op().to_string(),
            source,
        })
}

fn push1(
    imp: &mut Importer<'_>,
    n: &NodeRef<'_>,
    kind: OpKind,
    inputs: Vec<ValueId>,
) -> Result<ValueId, ImportError> {
    push(imp, n, kind, inputs)?
        .first()
        .copied()
        .ok_or_else(|| n.bad("op produced no result"))
}

fn reshape(
    imp: &mut Importer<'_>,
    n: &NodeRef<'_>,
    x: ValueId,
    to: &[usize],
) -> Result<ValueId, ImportError> {
    if imp.dims(x) == to {
        return Ok(x);
    }
    push1(imp, n, OpKind::Reshape { shape: fixed(to).0 }, vec![x])
}

fn one(v: ValueId) -> Result<Vec<Val>, ImportError> {
    Ok(vec![Val::Ir(v)])
}

pub fn lower(imp: &mut Importer<'_>, n: &NodeRef<'_>) -> Result<Vec<Val>, ImportError> {
    match n.op() {
        "Identity" | "Dropout" => one(data(imp, n, 0)?),
        "Shape" => {
            let x = data(imp, n, 0)?;
            Ok(vec![Val::Const(shape_window(n, &imp.dims(x)))])
        }
        "Size" => {
            let x = data(imp, n, 0)?;
            let numel: usize = imp.dims(x).iter().product();
            Ok(vec![Val::Const(Const::scalar(Elem::Int, numel as f64))])
        }
        "Cast" | "CastLike" => {
            let x = data(imp, n, 0)?;
            let to = if n.op() == "Cast" {
                let code = n
                    .attr_i("to")
                    .and_then(|t| i32::try_from(t).ok())
                    .unwrap_or(0);
                Elem::from_onnx(code)
                    .ok_or_else(|| n.bad(format!("cannot cast to element type {code}")))?
            } else {
                let like = n.input(1).and_then(|l| imp.ir.get(l).copied());
                match like {
                    Some(l) => float_elem(imp.graph.ty(l).dtype),
                    None => {
                        konst(imp, n, 1, "target type")?.map_or(Elem::Float(DType::F32), |c| c.elem)
                    }
                }
            };
            // Float-to-float casts are kept as identity: the IR is precision-agnostic until the
            // planner assigns dtypes, and the interpreter computes in f64 either way.
            let from = imp.graph.ty(x).dtype;
            if from.is_float() == to.is_float() {
                one(x)
            } else {
                Err(n.bad("casts between integer and float data cannot be imported"))
            }
        }
        "Gather" => gather(imp, n),
        "MatMul" => {
            let (a, b) = (data(imp, n, 0)?, data(imp, n, 1)?);
            if imp.dims(a).len() < 2 || imp.dims(b).len() < 2 {
                return Err(n.bad("MatMul with a rank-1 operand cannot be imported"));
            }
            one(push1(imp, n, OpKind::MatMul, vec![a, b])?)
        }
        "Gemm" => gemm(imp, n),
        "Add" | "Sub" | "Mul" | "Div" => binary(imp, n),
        "Neg" | "Sqrt" | "Tanh" | "Sigmoid" | "Exp" | "Relu" => {
            let kind = match n.op() {
                "Neg" => OpKind::Neg,
                "Relu" => OpKind::Relu,
                "Sqrt" => OpKind::Sqrt,
                "Tanh" => OpKind::Tanh,
                "Sigmoid" => OpKind::Sigmoid,
                _ => OpKind::Exp,
            };
            let x = data(imp, n, 0)?;
            one(push1(imp, n, kind, vec![x])?)
        }
        "Reciprocal" => {
            let x = data(imp, n, 0)?;
            let lit = imp.literal(1.0, imp.graph.ty(x).dtype);
            one(push1(imp, n, OpKind::Div, vec![lit, x])?)
        }
        "Pow" => {
            let x = data(imp, n, 0)?;
            let e = konst(imp, n, 1, "exponent")?
                .and_then(|c| c.single())
                .ok_or_else(|| n.bad("the exponent must be a single number"))?;
            one(push1(imp, n, OpKind::Pow { exponent: e }, vec![x])?)
        }
        "Gelu" => {
            let x = data(imp, n, 0)?;
            let tanh = n.attr_s("approximate").as_deref() == Some("tanh");
            one(push1(imp, n, OpKind::Gelu { tanh }, vec![x])?)
        }
        "ReduceMean" | "ReduceSum" => {
            let x = data(imp, n, 0)?;
            let d = imp.dims(x);
            let axes = match ints(imp, n, 1, "axes")? {
                Some(a) => Some(a),
                None => n.attr_ints("axes").map(<[i64]>::to_vec),
            };
            let axes = n.axes(&axes.unwrap_or_default(), d.len())?;
            if axes != [d.len().saturating_sub(1)] {
                return Err(n.bad(format!(
                    "reduces over axes {axes:?} of {d:?}; plait reduces over the last axis only"
                )));
            }
            let kind = if n.op() == "ReduceMean" {
                OpKind::ReduceMean
            } else {
                OpKind::ReduceSum
            };
            let r = push1(imp, n, kind, vec![x])?;
            if n.attr_i("keepdims").unwrap_or(1) == 0 {
                let to = d.get(..d.len() - 1).unwrap_or(&[]).to_vec();
                return one(reshape(imp, n, r, &to)?);
            }
            one(r)
        }
        "Softmax" => {
            let x = data(imp, n, 0)?;
            let rank = imp.dims(x).len();
            let default = if imp.opset >= 13 { -1 } else { 1 };
            let axis = n.axis(n.attr_i("axis").unwrap_or(default), rank)?;
            if axis + 1 != rank {
                return Err(n.bad(format!(
                    "softmax over axis {axis} of rank {rank}; plait supports the last axis only"
                )));
            }
            one(push1(imp, n, OpKind::Softmax { causal: false }, vec![x])?)
        }
        "Reshape" => {
            let x = data(imp, n, 0)?;
            let spec = ints(imp, n, 1, "shape")?.ok_or_else(|| n.bad("missing shape"))?;
            let to =
                shapes::reshape_target(n, &imp.dims(x), &spec, n.attr_i("allowzero") == Some(1))?;
            one(reshape(imp, n, x, &to)?)
        }
        "Unsqueeze" | "Squeeze" => {
            let x = data(imp, n, 0)?;
            let axes = match ints(imp, n, 1, "axes")? {
                Some(a) => Some(a),
                None => n.attr_ints("axes").map(<[i64]>::to_vec),
            };
            let d = imp.dims(x);
            let to = if n.op() == "Unsqueeze" {
                shapes::unsqueeze(n, &d, axes.as_deref().unwrap_or(&[]))?
            } else {
                shapes::squeeze(n, &d, axes.as_deref())?
            };
            one(reshape(imp, n, x, &to)?)
        }
        "Transpose" => {
            let x = data(imp, n, 0)?;
            let rank = imp.dims(x).len();
            let perm: Vec<usize> = match n.attr_ints("perm") {
                Some(p) => p
                    .iter()
                    .map(|&a| n.axis(a, rank))
                    .collect::<Result<_, _>>()?,
                None => (0..rank).rev().collect(),
            };
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                return one(x);
            }
            one(push1(imp, n, OpKind::Transpose { perm }, vec![x])?)
        }
        "Expand" => {
            let x = data(imp, n, 0)?;
            let spec = ints(imp, n, 1, "shape")?.ok_or_else(|| n.bad("missing shape"))?;
            let spec: Vec<usize> = spec.iter().map(|&d| d.max(0) as usize).collect();
            let d = imp.dims(x);
            let out = shapes::broadcast(&[&d, &spec])
                .ok_or_else(|| n.bad(format!("cannot expand {d:?} to {spec:?}")))?;
            if out == d {
                return one(x);
            }
            one(push1(
                imp,
                n,
                OpKind::Expand {
                    shape: fixed(&out).0,
                },
                vec![x],
            )?)
        }
        "Concat" => {
            let mut xs = Vec::new();
            for slot in 0..n.node.input.len() {
                if n.input(slot).is_some() {
                    xs.push(data(imp, n, slot)?);
                }
            }
            let first = *xs.first().ok_or_else(|| n.bad("no inputs"))?;
            let axis = n.axis(n.attr_i("axis").unwrap_or(0), imp.dims(first).len())?;
            // Zero-length parts add nothing and the IR has no empty tensors.
            xs.retain(|&v| imp.dims(v).get(axis) != Some(&0));
            match xs.as_slice() {
                [only] => one(*only),
                _ => one(push1(imp, n, OpKind::Concat { axis }, xs)?),
            }
        }
        "Split" => {
            let x = data(imp, n, 0)?;
            let d = imp.dims(x);
            let axis = n.axis(n.attr_i("axis").unwrap_or(0), d.len())?;
            let split = match ints(imp, n, 1, "split")? {
                Some(s) => Some(s),
                None => n.attr_ints("split").map(<[i64]>::to_vec),
            };
            let sizes = shapes::split_sizes(
                n,
                d.get(axis).copied().unwrap_or(0),
                split,
                n.node.output.len(),
            )?;
            let sizes = sizes.iter().map(|&s| s as u64).collect();
            let vs = push(imp, n, OpKind::Split { axis, sizes }, vec![x])?;
            Ok(vs.into_iter().map(Val::Ir).collect())
        }
        "Slice" => slice(imp, n),
        "LayerNormalization" => layer_norm(imp, n),
        op => Err(n.bad(format!(
            "{op} cannot be computed on data that depends on the model input"
        ))),
    }
}

fn float_elem(d: DType) -> Elem {
    if d.is_float() {
        Elem::Float(d)
    } else {
        Elem::Int
    }
}

fn gather(imp: &mut Importer<'_>, n: &NodeRef<'_>) -> Result<Vec<Val>, ImportError> {
    let table = data(imp, n, 0)?;
    let td = imp.dims(table);
    let axis = n.axis(n.attr_i("axis").unwrap_or(0), td.len())?;
    if td.len() == 2 && axis == 0 {
        let ids = data(imp, n, 1)?;
        if imp.graph.ty(ids).dtype != DType::I64 {
            return Err(n.bad("indices must be integers"));
        }
        return one(push1(imp, n, OpKind::Embedding, vec![table, ids])?);
    }
    // Any other gather is supported for one constant index (picking a slice).
    let idx = konst(imp, n, 1, "indices")?.ok_or_else(|| n.bad("missing indices"))?;
    let (Some(i), Some(&dim)) = (idx.single(), td.get(axis)) else {
        return Err(
            n.bad("gathers several indices on data; plait supports embeddings and single indices")
        );
    };
    let i = if i < 0.0 { i + dim as f64 } else { i };
    if !(0.0..dim as f64).contains(&i) {
        return Err(n.bad(format!("index {i} is out of range for dimension {dim}")));
    }
    let s = push1(
        imp,
        n,
        OpKind::Slice {
            axis,
            start: i as u64,
            end: i as u64 + 1,
        },
        vec![table],
    )?;
    let mut to = td.clone();
    if idx.rank() == 0 {
        to.remove(axis);
    }
    one(reshape(imp, n, s, &to)?)
}

fn gemm(imp: &mut Importer<'_>, n: &NodeRef<'_>) -> Result<Vec<Val>, ImportError> {
    let mut a = data(imp, n, 0)?;
    let mut b = data(imp, n, 1)?;
    if imp.dims(a).len() != 2 || imp.dims(b).len() != 2 {
        return Err(n.bad("Gemm operands must be matrices"));
    }
    if n.attr_i("transA").unwrap_or(0) != 0 {
        a = push1(imp, n, OpKind::Transpose { perm: vec![1, 0] }, vec![a])?;
    }
    if n.attr_i("transB").unwrap_or(0) != 0 {
        b = push1(imp, n, OpKind::Transpose { perm: vec![1, 0] }, vec![b])?;
    }
    let mut y = push1(imp, n, OpKind::MatMul, vec![a, b])?;
    let alpha = n.attr_f("alpha").unwrap_or(1.0);
    if alpha != 1.0 {
        y = push1(imp, n, OpKind::Scale { factor: alpha }, vec![y])?;
    }
    if n.input(2).is_some() {
        let mut c = data(imp, n, 2)?;
        let beta = n.attr_f("beta").unwrap_or(1.0);
        if beta != 1.0 {
            c = push1(imp, n, OpKind::Scale { factor: beta }, vec![c])?;
        }
        y = push1(imp, n, OpKind::Add, vec![y, c])?;
    }
    one(y)
}

/// A one-element constant that is a literal rather than a weight (weights stay parameters).
fn literal_operand(imp: &Importer<'_>, n: &NodeRef<'_>, slot: usize) -> Option<f64> {
    let name = n.input(slot)?;
    if imp.weight_dep.contains(name) {
        return None;
    }
    imp.consts
        .get(name)
        .filter(|c| c.elem.is_float())
        .and_then(Const::single)
}

fn binary(imp: &mut Importer<'_>, n: &NodeRef<'_>) -> Result<Vec<Val>, ImportError> {
    let op = n.op();
    let shape_of = |imp: &mut Importer<'_>, slot: usize| -> Result<Vec<usize>, ImportError> {
        let name = n
            .input(slot)
            .ok_or_else(|| n.bad(format!("missing input {slot}")))?;
        match imp.consts.get(name) {
            Some(c) if !imp.ir.contains_key(name) => Ok(c.shape.clone()),
            _ => data(imp, n, slot).map(|v| imp.dims(v)),
        }
    };
    let (sa, sb) = (shape_of(imp, 0)?, shape_of(imp, 1)?);
    let out = shapes::broadcast(&[&sa, &sb])
        .ok_or_else(|| n.bad(format!("shapes {sa:?} and {sb:?} do not broadcast")))?;
    let (ca, cb) = (literal_operand(imp, n, 0), literal_operand(imp, n, 1));
    // A literal operand becomes an attribute (Scale) or a scalar, so patterns see through it.
    let y = match (op, ca, cb) {
        ("Mul", Some(c), None) | ("Mul", None, Some(c)) => {
            let x = data(imp, n, if ca.is_some() { 1 } else { 0 })?;
            push1(imp, n, OpKind::Scale { factor: c }, vec![x])?
        }
        ("Div", None, Some(c)) => {
            let x = data(imp, n, 0)?;
            push1(imp, n, OpKind::Scale { factor: 1.0 / c }, vec![x])?
        }
        ("Add", Some(c), None) | ("Add", None, Some(c)) | ("Sub", None, Some(c)) => {
            let x = data(imp, n, if ca.is_some() { 1 } else { 0 })?;
            let c = if op == "Sub" { -c } else { c };
            let lit = imp.literal(c, imp.graph.ty(x).dtype);
            push1(imp, n, OpKind::Add, vec![x, lit])?
        }
        _ => {
            let (a, b) = (data(imp, n, 0)?, data(imp, n, 1)?);
            for v in [a, b] {
                if !imp.graph.ty(v).dtype.is_float() {
                    return Err(n.bad("integer arithmetic on data that depends on the model input cannot be imported"));
                }
            }
            let kind = match op {
                "Add" => OpKind::Add,
                "Sub" => OpKind::Sub,
                "Mul" => OpKind::Mul,
                _ => OpKind::Div,
            };
            push1(imp, n, kind, vec![a, b])?
        }
    };
    one(reshape(imp, n, y, &out)?)
}

fn slice(imp: &mut Importer<'_>, n: &NodeRef<'_>) -> Result<Vec<Val>, ImportError> {
    let mut x = data(imp, n, 0)?;
    let d = imp.dims(x);
    let (starts, ends, axes, steps) = if n.node.input.len() > 1 {
        (
            ints(imp, n, 1, "starts")?.ok_or_else(|| n.bad("missing starts"))?,
            ints(imp, n, 2, "ends")?.ok_or_else(|| n.bad("missing ends"))?,
            ints(imp, n, 3, "axes")?,
            ints(imp, n, 4, "steps")?,
        )
    } else {
        let a = |k: &str| n.attr_ints(k).map(<[i64]>::to_vec);
        (
            a("starts").unwrap_or_default(),
            a("ends").unwrap_or_default(),
            a("axes"),
            None,
        )
    };
    for s in shapes::slices(n, &d, &starts, &ends, axes.as_deref(), steps.as_deref())? {
        let dim = d.get(s.axis).copied().unwrap_or(0);
        if s.step != 1 {
            return Err(n.bad(format!(
                "slice step {} on data; plait supports step 1",
                s.step
            )));
        }
        if s.len == 0 {
            return Err(n.bad("an empty slice of data cannot be imported"));
        }
        if s.start == 0 && s.len == dim {
            continue;
        }
        let start = s.start as u64;
        x = push1(
            imp,
            n,
            OpKind::Slice {
                axis: s.axis,
                start,
                end: start + s.len as u64,
            },
            vec![x],
        )?;
    }
    one(x)
}

fn layer_norm(imp: &mut Importer<'_>, n: &NodeRef<'_>) -> Result<Vec<Val>, ImportError> {
    if n.node.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(n.bad("the mean and inverse-deviation outputs cannot be imported"));
    }
    let x = data(imp, n, 0)?;
    let d = imp.dims(x);
    let axis = n.axis(n.attr_i("axis").unwrap_or(-1), d.len())?;
    if axis + 1 != d.len() {
        return Err(n.bad(format!(
            "normalizes from axis {axis} of rank {}; plait normalizes the last axis only",
            d.len()
        )));
    }
    let eps = n.attr_f("epsilon").unwrap_or(1e-5);
    let gamma = data(imp, n, 1)?;
    let beta = match n.input(2) {
        Some(_) => data(imp, n, 2)?,
        None => {
            let h = d.last().copied().unwrap_or(0);
            let zeros = Const::new(float_elem(imp.graph.ty(x).dtype), vec![h], vec![0.0; h]);
            imp.constant(&format!("{}.zero_bias", n.name()), &zeros)
        }
    };
    one(push1(
        imp,
        n,
        OpKind::LayerNorm { eps, bias: true },
        vec![x, gamma, beta],
    )?)
}
