//! Layout and indexing folds: Shape, Reshape, (Un)Squeeze, Expand, Concat, Slice, Gather,
//! GatherND, Transpose, Split, Range, ConstantOfShape, CumSum and reductions.

use super::super::node::NodeRef;
use super::super::shapes::{self, broadcast};
use super::super::value::{Const, Elem};
use super::{arg, broadcast_strides, for_each_index, ints_arg, small};
use crate::ImportError;

fn ints_const(v: Vec<i64>) -> Const {
    let len = v.len();
    Const::new(
        Elem::Int,
        vec![len],
        v.into_iter().map(|x| x as f64).collect(),
    )
}

/// Row-major strides.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        let next = s.get(i + 1).copied().unwrap_or(1) * shape.get(i + 1).copied().unwrap_or(1);
        if let Some(x) = s.get_mut(i) {
            *x = next;
        }
    }
    s
}

/// The `Shape` op's `start`/`end` window applied to a shape.
pub fn shape_window(n: &NodeRef<'_>, shape: &[usize]) -> Const {
    let r = shape.len() as i64;
    let clamp = |x: i64| (if x < 0 { x + r } else { x }).clamp(0, r) as usize;
    let start = clamp(n.attr_i("start").unwrap_or(0));
    let end = clamp(n.attr_i("end").unwrap_or(r));
    let dims = shape.get(start..end.max(start)).unwrap_or(&[]);
    ints_const(dims.iter().map(|&d| d as i64).collect())
}

pub fn fold(n: &NodeRef<'_>, ins: &[Option<&Const>]) -> Result<Option<Vec<Const>>, ImportError> {
    let one = |c: Const| Ok(Some(vec![c]));
    match n.op() {
        "Shape" => one(shape_window(n, &arg(n, ins, 0)?.shape)),
        "Size" => one(Const::scalar(Elem::Int, arg(n, ins, 0)?.numel() as f64)),
        "Reshape" => {
            let x = arg(n, ins, 0)?;
            let spec = ints_arg(n, ins, 1)?.ok_or_else(|| n.bad("missing shape"))?;
            let to = shapes::reshape_target(n, &x.shape, &spec, n.attr_i("allowzero") == Some(1))?;
            one(Const {
                shape: to,
                ..x.clone()
            })
        }
        "Unsqueeze" | "Squeeze" => {
            let x = arg(n, ins, 0)?;
            let axes = match ints_arg(n, ins, 1)? {
                Some(a) => Some(a),
                None => n.attr_ints("axes").map(<[i64]>::to_vec),
            };
            let to = if n.op() == "Unsqueeze" {
                shapes::unsqueeze(n, &x.shape, axes.as_deref().unwrap_or(&[]))?
            } else {
                shapes::squeeze(n, &x.shape, axes.as_deref())?
            };
            one(Const {
                shape: to,
                ..x.clone()
            })
        }
        "Expand" => {
            let x = arg(n, ins, 0)?;
            let spec = ints_arg(n, ins, 1)?.ok_or_else(|| n.bad("missing shape"))?;
            let spec: Vec<usize> = spec.iter().map(|&d| d.max(0) as usize).collect();
            let out = broadcast(&[&x.shape, &spec])
                .ok_or_else(|| n.bad(format!("cannot expand {:?} to {spec:?}", x.shape)))?;
            Ok(gather_by(x, &out, |idx| Some(broadcast_offset(&x.shape, idx))).map(|c| vec![c]))
        }
        "Concat" => {
            let xs: Vec<&Const> = ins.iter().copied().flatten().collect();
            let first = xs.first().ok_or_else(|| n.bad("no inputs"))?;
            let axis = n.axis(n.attr_i("axis").unwrap_or(0), first.rank())?;
            let mut out = first.shape.clone();
            let mut total = 0;
            for x in &xs {
                let same_off_axis = x.rank() == first.rank()
                    && x.shape
                        .iter()
                        .zip(&first.shape)
                        .enumerate()
                        .all(|(i, (a, b))| i == axis || a == b);
                if !same_off_axis {
                    return Err(n.bad(format!(
                        "cannot concatenate {:?} and {:?}",
                        first.shape, x.shape
                    )));
                }
                total += x.shape.get(axis).copied().unwrap_or(0);
            }
            if let Some(d) = out.get_mut(axis) {
                *d = total;
            }
            if !small(&out) {
                return Ok(None);
            }
            let outer: usize = out.get(..axis).unwrap_or(&[]).iter().product();
            let mut data = Vec::with_capacity(out.iter().product());
            for o in 0..outer {
                for x in &xs {
                    let chunk: usize = x.shape.get(axis..).unwrap_or(&[]).iter().product();
                    data.extend_from_slice(x.data.get(o * chunk..(o + 1) * chunk).unwrap_or(&[]));
                }
            }
            one(Const::new(first.elem, out, data))
        }
        "Slice" => {
            let x = arg(n, ins, 0)?;
            let (starts, ends, axes, steps) = if ins.len() > 1 {
                (
                    ints_arg(n, ins, 1)?.ok_or_else(|| n.bad("missing starts"))?,
                    ints_arg(n, ins, 2)?.ok_or_else(|| n.bad("missing ends"))?,
                    ints_arg(n, ins, 3)?,
                    ints_arg(n, ins, 4)?,
                )
            } else {
                // Opset < 10 keeps the bounds in attributes.
                let a = |k: &str| n.attr_ints(k).map(<[i64]>::to_vec);
                (
                    a("starts").unwrap_or_default(),
                    a("ends").unwrap_or_default(),
                    a("axes"),
                    None,
                )
            };
            let sl = shapes::slices(
                n,
                &x.shape,
                &starts,
                &ends,
                axes.as_deref(),
                steps.as_deref(),
            )?;
            let mut out = x.shape.clone();
            for s in &sl {
                if let Some(d) = out.get_mut(s.axis) {
                    *d = s.len;
                }
            }
            let st = strides(&x.shape);
            Ok(gather_by(x, &out, |idx| {
                let mut off = 0usize;
                for (ax, &i) in idx.iter().enumerate() {
                    let src = match sl.iter().find(|s| s.axis == ax) {
                        Some(s) => {
                            let pos = s.step.checked_mul(i as i64)?.checked_add(s.start)?;
                            usize::try_from(pos).ok()?
                        }
                        None => i,
                    };
                    off += src * st.get(ax)?;
                }
                Some(off)
            })
            .map(|c| vec![c]))
        }
        "Gather" => {
            let (x, ids) = (arg(n, ins, 0)?, arg(n, ins, 1)?);
            let axis = n.axis(n.attr_i("axis").unwrap_or(0), x.rank())?;
            let dim = x.shape.get(axis).copied().unwrap_or(0);
            let ids = norm_indices(n, ids, dim)?;
            let mut out: Vec<usize> = x.shape.get(..axis).unwrap_or(&[]).to_vec();
            out.extend_from_slice(&ids.shape);
            out.extend_from_slice(x.shape.get(axis + 1..).unwrap_or(&[]));
            let st = strides(&x.shape);
            let k = ids.shape.len();
            Ok(gather_by(x, &out, |idx| {
                let before = idx.get(..axis)?;
                let id_idx = idx.get(axis..axis + k)?;
                let after = idx.get(axis + k..)?;
                let flat = id_idx
                    .iter()
                    .zip(strides(&ids.shape))
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
                let src = *ids.data.get(flat)?;
                let mut off = src * st.get(axis)?;
                for (i, &b) in before.iter().enumerate() {
                    off += b * st.get(i)?;
                }
                for (i, &a) in after.iter().enumerate() {
                    off += a * st.get(axis + 1 + i)?;
                }
                Some(off)
            })
            .map(|c| vec![c]))
        }
        "GatherND" => gather_nd(n, arg(n, ins, 0)?, arg(n, ins, 1)?).map(|c| c.map(|c| vec![c])),
        "Transpose" => {
            let x = arg(n, ins, 0)?;
            let perm: Vec<usize> = match n.attr_ints("perm") {
                Some(p) => p
                    .iter()
                    .map(|&a| n.axis(a, x.rank()))
                    .collect::<Result<_, _>>()?,
                None => (0..x.rank()).rev().collect(),
            };
            let mut seen = perm.clone();
            seen.sort_unstable();
            if seen != (0..x.rank()).collect::<Vec<_>>() {
                return Err(n.bad(format!(
                    "{perm:?} is not a permutation of rank {}",
                    x.rank()
                )));
            }
            let out: Vec<usize> = perm
                .iter()
                .map(|&p| x.shape.get(p).copied().unwrap_or(1))
                .collect();
            let st = strides(&x.shape);
            Ok(gather_by(x, &out, |idx| {
                idx.iter()
                    .zip(&perm)
                    .map(|(&i, &p)| st.get(p).map(|s| i * s))
                    .sum()
            })
            .map(|c| vec![c]))
        }
        "Split" => {
            let x = arg(n, ins, 0)?;
            let axis = n.axis(n.attr_i("axis").unwrap_or(0), x.rank())?;
            let split = match ints_arg(n, ins, 1)? {
                Some(s) => Some(s),
                None => n.attr_ints("split").map(<[i64]>::to_vec),
            };
            let outputs = n.node.output.len();
            let dim = x.shape.get(axis).copied().unwrap_or(0);
            let sizes = shapes::split_sizes(n, dim, split, outputs)?;
            let st = strides(&x.shape);
            let mut start = 0;
            let mut res = Vec::new();
            for s in sizes {
                let mut out = x.shape.clone();
                if let Some(d) = out.get_mut(axis) {
                    *d = s;
                }
                let c = gather_by(x, &out, |idx| {
                    idx.iter()
                        .enumerate()
                        .map(|(ax, &i)| {
                            st.get(ax)
                                .map(|s| if ax == axis { (i + start) * s } else { i * s })
                        })
                        .sum()
                });
                match c {
                    Some(c) => res.push(c),
                    None => return Ok(None),
                }
                start += s;
            }
            Ok(Some(res))
        }
        "Range" => {
            let get = |i| {
                arg(n, ins, i).and_then(|c| {
                    c.single()
                        .ok_or_else(|| n.bad("Range bounds must be scalars"))
                })
            };
            let (start, limit, delta) = (get(0)?, get(1)?, get(2)?);
            if delta == 0.0 {
                return Err(n.bad("Range with delta 0"));
            }
            let count = ((limit - start) / delta).ceil().max(0.0);
            if !count.is_finite() || count > super::MAX_FOLD_ELEMENTS as f64 {
                return Ok(None);
            }
            let elem = arg(n, ins, 0)?.elem;
            let data = (0..count as usize)
                .map(|i| start + delta * i as f64)
                .collect::<Vec<_>>();
            one(Const::new(elem, vec![data.len()], data))
        }
        "ConstantOfShape" => {
            let spec = ints_arg(n, ins, 0)?.ok_or_else(|| n.bad("missing shape"))?;
            let shape = spec
                .iter()
                .map(|&d| usize::try_from(d).map_err(|_| n.bad(format!("negative shape {spec:?}"))))
                .collect::<Result<Vec<_>, _>>()?;
            if !small(&shape) {
                return Ok(None);
            }
            // The value attribute is a one-element tensor; its payload is inline in practice.
            let (elem, value) = match n.attr_t("value") {
                Some(t) => {
                    let code = t.data_type.unwrap_or(1);
                    let elem =
                        Elem::from_onnx(code).ok_or_else(|| n.bad("unsupported value type"))?;
                    let v = t
                        .float_data
                        .first()
                        .map(|&f| f64::from(f))
                        .or_else(|| t.int64_data.first().map(|&i| i as f64))
                        .or_else(|| t.int32_data.first().map(|&i| f64::from(i)))
                        .or_else(|| t.double_data.first().copied())
                        .or_else(|| raw_scalar(t.raw_data.as_deref(), code))
                        .unwrap_or(0.0);
                    (elem, v)
                }
                None => (Elem::Float(ir::DType::F32), 0.0),
            };
            let numel = shape.iter().product();
            one(Const::new(elem, shape, vec![value; numel]))
        }
        "CumSum" => {
            let x = arg(n, ins, 0)?;
            let axis = arg(n, ins, 1)?
                .single()
                .ok_or_else(|| n.bad("axis must be a scalar"))?;
            let axis = n.axis(axis as i64, x.rank())?;
            let exclusive = n.attr_i("exclusive").unwrap_or(0) != 0;
            let reverse = n.attr_i("reverse").unwrap_or(0) != 0;
            let st = strides(&x.shape);
            let (dim, step) = (
                x.shape.get(axis).copied().unwrap_or(1),
                st.get(axis).copied().unwrap_or(1),
            );
            let mut data = vec![0.0; x.numel()];
            for base in 0..x.numel() {
                if (base / step) % dim.max(1) != 0 {
                    continue;
                }
                let mut acc = 0.0;
                let order: Box<dyn Iterator<Item = usize>> = if reverse {
                    Box::new((0..dim).rev())
                } else {
                    Box::new(0..dim)
                };
                for k in order {
                    let o = base + k * step;
                    let v = x.data.get(o).copied().unwrap_or(0.0);
                    if !exclusive {
                        acc += v;
                    }
                    if let Some(d) = data.get_mut(o) {
                        *d = acc;
                    }
                    if exclusive {
                        acc += v;
                    }
                }
            }
            one(Const::new(x.elem, x.shape.clone(), data))
        }
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" => {
            reduce(n, ins).map(|c| c.map(|c| vec![c]))
        }
        _ => Ok(None),
    }
}

fn raw_scalar(raw: Option<&[u8]>, code: i32) -> Option<f64> {
    use super::super::proto::data_type as dt;
    let raw = raw?;
    let b8 = |n: usize| -> Option<[u8; 8]> {
        let mut b = [0u8; 8];
        b.get_mut(..n)?.copy_from_slice(raw.get(..n)?);
        Some(b)
    };
    Some(match code {
        dt::FLOAT => f64::from(f32::from_le_bytes(raw.get(..4)?.try_into().ok()?)),
        dt::DOUBLE => f64::from_le_bytes(b8(8)?),
        dt::INT64 => i64::from_le_bytes(b8(8)?) as f64,
        dt::INT32 => f64::from(i32::from_le_bytes(raw.get(..4)?.try_into().ok()?)),
        dt::BOOL | dt::UINT8 => f64::from(*raw.first()?),
        _ => return None,
    })
}

/// Index tensor with negatives resolved against `dim`; out-of-range indices are errors.
fn norm_indices(n: &NodeRef<'_>, ids: &Const, dim: usize) -> Result<IndexTensor, ImportError> {
    let d = dim as i64;
    let data = ids
        .ints()
        .ok_or_else(|| n.bad("indices must be integers"))?
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + d } else { i };
            usize::try_from(j)
                .ok()
                .filter(|&j| j < dim)
                .ok_or_else(|| n.bad(format!("index {i} is out of range for dimension {dim}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(IndexTensor {
        shape: ids.shape.clone(),
        data,
    })
}

struct IndexTensor {
    shape: Vec<usize>,
    data: Vec<usize>,
}

fn gather_nd(n: &NodeRef<'_>, x: &Const, ids: &Const) -> Result<Option<Const>, ImportError> {
    if n.attr_i("batch_dims").unwrap_or(0) != 0 {
        return Ok(None);
    }
    let (lead, k) = match ids.shape.split_last() {
        Some((&k, lead)) if k >= 1 && k <= x.rank() => (lead.to_vec(), k),
        _ => {
            return Err(n.bad(format!(
                "indices {:?} do not fit data {:?}",
                ids.shape, x.shape
            )));
        }
    };
    let raw = ids
        .ints()
        .ok_or_else(|| n.bad("indices must be integers"))?;
    let st = strides(&x.shape);
    let mut out = lead.clone();
    out.extend_from_slice(x.shape.get(k..).unwrap_or(&[]));
    let inner: usize = x.shape.get(k..).unwrap_or(&[]).iter().product();
    if !small(&out) {
        return Ok(None);
    }
    let mut data = Vec::new();
    for tuple in raw.chunks(k) {
        let mut off = 0usize;
        for (ax, &i) in tuple.iter().enumerate() {
            let dim = x.shape.get(ax).copied().unwrap_or(0) as i64;
            let j = if i < 0 { i + dim } else { i };
            if !(0..dim).contains(&j) {
                return Err(n.bad(format!("index {i} is out of range for dimension {dim}")));
            }
            off += j as usize * st.get(ax).copied().unwrap_or(0);
        }
        data.extend_from_slice(x.data.get(off..off + inner).unwrap_or(&[]));
    }
    Ok(Some(Const::new(x.elem, out, data)))
}

fn reduce(n: &NodeRef<'_>, ins: &[Option<&Const>]) -> Result<Option<Const>, ImportError> {
    let x = arg(n, ins, 0)?;
    let axes = match ints_arg(n, ins, 1)? {
        Some(a) => Some(a),
        None => n.attr_ints("axes").map(<[i64]>::to_vec),
    };
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => n.axes(&a, x.rank())?,
        _ if n.attr_i("noop_with_empty_axes").unwrap_or(0) != 0 => return Ok(Some(x.clone())),
        _ => (0..x.rank()).collect(),
    };
    let keep = n.attr_i("keepdims").unwrap_or(1) != 0;
    let kept: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let count: usize = axes
        .iter()
        .map(|&a| x.shape.get(a).copied().unwrap_or(1))
        .product();
    let (init, f): (f64, fn(f64, f64) -> f64) = match n.op() {
        "ReduceMax" => (f64::NEG_INFINITY, f64::max),
        "ReduceMin" => (f64::INFINITY, f64::min),
        "ReduceProd" => (1.0, |a, b| a * b),
        _ => (0.0, |a, b| a + b),
    };
    let mut acc = vec![init; kept.iter().product()];
    let out_st = broadcast_strides(&kept, &x.shape);
    for_each_index(&x.shape, &[strides(&x.shape), out_st], |offs| {
        if let (Some(&i), Some(&o)) = (offs.first(), offs.get(1))
            && let (Some(a), Some(&v)) = (acc.get_mut(o), x.data.get(i))
        {
            *a = f(*a, v);
        }
    });
    if n.op() == "ReduceMean" && count > 0 {
        acc.iter_mut().for_each(|a| *a /= count as f64);
    }
    let shape = if keep {
        kept
    } else {
        x.shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    Ok(Some(Const::new(x.elem, shape, acc)))
}

/// Offset in `shape` of output index `idx` under numpy broadcasting.
fn broadcast_offset(shape: &[usize], idx: &[usize]) -> usize {
    let pad = idx.len().saturating_sub(shape.len());
    let st = strides(shape);
    shape
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if d == 1 {
                0
            } else {
                idx.get(pad + i).copied().unwrap_or(0) * st.get(i).copied().unwrap_or(0)
            }
        })
        .sum()
}

/// Builds a tensor of shape `out` whose element at each index is `x.data[src(index)]`;
/// `None` when the result is too large or an index falls outside `x`.
fn gather_by(x: &Const, out: &[usize], src: impl Fn(&[usize]) -> Option<usize>) -> Option<Const> {
    if !small(out) {
        return None;
    }
    let total: usize = out.iter().product();
    let mut idx = vec![0usize; out.len()];
    let mut data = Vec::with_capacity(total);
    for _ in 0..total {
        data.push(*x.data.get(src(&idx)?)?);
        for ax in (0..out.len()).rev() {
            let (Some(i), Some(&d)) = (idx.get_mut(ax), out.get(ax)) else {
                break;
            };
            *i += 1;
            if *i < d {
                break;
            }
            *i = 0;
        }
    }
    Some(Const::new(x.elem, out.to_vec(), data))
}
