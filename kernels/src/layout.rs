//! Layout ops that move elements without arithmetic, and their adjoints (reshape back,
//! transpose by the inverse permutation, sum over broadcast axes, pad with zeros).

use ir::{Binding, Dim};

use crate::shape::{Reader, attr_usize, broadcast_shape, strides, unbroadcast};
use crate::tensor::numel;
use crate::{KernelError, Tensor32};

/// Concrete sizes of an attribute shape under the binding.
pub(crate) fn eval_dims(
    op: &'static str,
    dims: &[Dim],
    binding: Binding,
) -> Result<Vec<usize>, KernelError> {
    dims.iter()
        .map(|d| attr_usize(op, d.eval(binding)))
        .collect()
}

pub(crate) fn reshape(x: &Tensor32, shape: Vec<usize>) -> Result<Tensor32, KernelError> {
    if numel(&shape)? != x.data.len() {
        return Err(KernelError::Shape {
            op: "reshape",
            what: "operand",
            got: x.shape.clone(),
            want: format!("{} elements to fill {shape:?}", numel(&shape)?),
        });
    }
    Ok(Tensor32 {
        shape,
        data: x.data.clone(),
    })
}

/// numpy `broadcast_to`.
pub(crate) fn expand(x: &Tensor32, shape: &[usize]) -> Result<Tensor32, KernelError> {
    const OP: &str = "expand";
    if broadcast_shape(OP, &x.shape, shape)? != shape {
        return Err(KernelError::Shape {
            op: OP,
            what: "operand",
            got: x.shape.clone(),
            want: format!("a shape that broadcasts to {shape:?}"),
        });
    }
    let reader = Reader::new(OP, &x.shape, shape)?;
    let n = numel(shape)?;
    Ok(Tensor32 {
        shape: shape.to_vec(),
        data: (0..n).map(|i| x.data[reader.at(i)]).collect(),
    })
}

pub(crate) fn expand_vjp(x: &Tensor32, g: &Tensor32) -> Result<Tensor32, KernelError> {
    let reader = Reader::new("expand", &x.shape, &g.shape)?;
    let wide: Vec<f64> = g.data.iter().map(|&v| f64::from(v)).collect();
    unbroadcast(&wide, &reader, &x.shape)
}

fn check_perm(perm: &[usize], rank: usize) -> Result<(), KernelError> {
    let mut seen = vec![false; rank];
    let ok = perm.len() == rank
        && perm.iter().all(|&p| match seen.get_mut(p) {
            Some(s) if !*s => {
                *s = true;
                true
            }
            _ => false,
        });
    if !ok {
        return Err(KernelError::Attribute {
            op: "transpose",
            reason: format!("{perm:?} is not a permutation of {rank} axes"),
        });
    }
    Ok(())
}

/// Output axis `a` is input axis `perm[a]`. The innermost output axis is copied in a tight
/// strided loop; the outer axes advance by an odometer.
pub(crate) fn transpose(x: &Tensor32, perm: &[usize]) -> Result<Tensor32, KernelError> {
    check_perm(perm, x.shape.len())?;
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let in_strides = strides(&x.shape);
    let src: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let n = numel(&shape)?;
    let mut data = Vec::with_capacity(n);
    let Some((&inner, outer_shape)) = shape.split_last() else {
        return Ok(Tensor32 {
            shape,
            data: x.data.clone(),
        });
    };
    let inner_stride = src[shape.len() - 1];
    if inner == 0 || n == 0 {
        return Ok(Tensor32 { shape, data });
    }
    let mut coord = vec![0usize; outer_shape.len()];
    let mut base = 0usize;
    for _ in 0..n / inner {
        data.extend((0..inner).map(|j| x.data[base + j * inner_stride]));
        for axis in (0..outer_shape.len()).rev() {
            coord[axis] += 1;
            base += src[axis];
            if coord[axis] < outer_shape[axis] {
                break;
            }
            base -= src[axis] * coord[axis];
            coord[axis] = 0;
        }
    }
    Ok(Tensor32 { shape, data })
}

pub(crate) fn transpose_vjp(perm: &[usize], g: &Tensor32) -> Result<Tensor32, KernelError> {
    check_perm(perm, g.shape.len())?;
    let mut inverse = vec![0usize; perm.len()];
    for (a, &p) in perm.iter().enumerate() {
        inverse[p] = a;
    }
    transpose(g, &inverse)
}

/// Views a shape as (outer, axis length, inner) around `axis`.
fn around(
    op: &'static str,
    shape: &[usize],
    axis: usize,
) -> Result<(usize, usize, usize), KernelError> {
    if axis >= shape.len() {
        return Err(KernelError::Attribute {
            op,
            reason: format!("axis {axis} out of range for {shape:?}"),
        });
    }
    Ok((
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    ))
}

/// Concatenates along `axis`; all operands agree off that axis.
pub(crate) fn concat(parts: &[&Tensor32], axis: usize) -> Result<Tensor32, KernelError> {
    const OP: &str = "concat";
    let first = parts.first().ok_or(KernelError::Arity {
        op: OP,
        want: 1,
        got: 0,
    })?;
    let (outer, _, inner) = around(OP, &first.shape, axis)?;
    let mut total = 0;
    for p in parts {
        let same_off_axis = p.shape.len() == first.shape.len()
            && p.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !same_off_axis {
            return Err(KernelError::Shape {
                op: OP,
                what: "operand",
                got: p.shape.clone(),
                want: format!("{:?} off axis {axis}", first.shape),
            });
        }
        total += p.shape[axis];
    }
    let mut shape = first.shape.clone();
    shape[axis] = total;
    let mut data = Vec::with_capacity(numel(&shape)?);
    for o in 0..outer {
        for p in parts {
            let chunk = p.shape[axis] * inner;
            data.extend_from_slice(&p.data[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(Tensor32 { shape, data })
}

/// Elements `start..end` along `axis`.
pub(crate) fn slice(
    x: &Tensor32,
    axis: usize,
    start: usize,
    end: usize,
) -> Result<Tensor32, KernelError> {
    const OP: &str = "slice";
    let (outer, len, inner) = around(OP, &x.shape, axis)?;
    if start > end || end > len {
        return Err(KernelError::Attribute {
            op: OP,
            reason: format!("slice {start}..{end} out of range for length {len}"),
        });
    }
    let mut shape = x.shape.clone();
    shape[axis] = end - start;
    let mut data = Vec::with_capacity(numel(&shape)?);
    for o in 0..outer {
        let row = &x.data[o * len * inner..(o + 1) * len * inner];
        data.extend_from_slice(&row[start * inner..end * inner]);
    }
    Ok(Tensor32 { shape, data })
}

/// Pads the gradient of the slice with zeros back to the operand's shape.
pub(crate) fn slice_vjp(
    x: &Tensor32,
    axis: usize,
    start: usize,
    end: usize,
    g: &Tensor32,
) -> Result<Tensor32, KernelError> {
    const OP: &str = "slice";
    let (outer, len, inner) = around(OP, &x.shape, axis)?;
    let width = end.saturating_sub(start);
    if start > end || end > len || g.data.len() != outer * width * inner {
        return Err(KernelError::Shape {
            op: OP,
            what: "output gradient",
            got: g.shape.clone(),
            want: format!("slice {start}..{end} of {:?}", x.shape),
        });
    }
    let mut dx = Tensor32::zeros(&x.shape)?;
    for o in 0..outer {
        let dst = &mut dx.data[o * len * inner..(o + 1) * len * inner];
        dst[start * inner..end * inner]
            .copy_from_slice(&g.data[o * width * inner..(o + 1) * width * inner]);
    }
    Ok(dx)
}

/// Consecutive slices of the given sizes along `axis`.
pub(crate) fn split(
    x: &Tensor32,
    axis: usize,
    sizes: &[u64],
) -> Result<Vec<Tensor32>, KernelError> {
    const OP: &str = "split";
    let (_, len, _) = around(OP, &x.shape, axis)?;
    let mut start = 0usize;
    let mut parts = Vec::with_capacity(sizes.len());
    for &s in sizes {
        let end = start
            .checked_add(attr_usize(OP, s)?)
            .filter(|&e| e <= len)
            .ok_or_else(|| KernelError::Attribute {
                op: OP,
                reason: format!("sizes {sizes:?} exceed dimension {len}"),
            })?;
        parts.push(slice(x, axis, start, end)?);
        start = end;
    }
    if start != len {
        return Err(KernelError::Attribute {
            op: OP,
            reason: format!("sizes {sizes:?} do not sum to dimension {len}"),
        });
    }
    Ok(parts)
}

/// The gradient of a concatenation is the output gradient cut back into the operands' extents.
pub(crate) fn concat_vjp(
    parts: &[&Tensor32],
    axis: usize,
    g: &Tensor32,
) -> Result<Vec<Tensor32>, KernelError> {
    let mut start = 0usize;
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let len = p.shape.get(axis).copied().unwrap_or(0);
        let piece = slice(g, axis, start, start + len)?;
        if piece.shape != p.shape {
            return Err(KernelError::Shape {
                op: "concat",
                what: "output gradient",
                got: g.shape.clone(),
                want: format!("a piece shaped like operand {:?}", p.shape),
            });
        }
        out.push(piece);
        start += len;
    }
    Ok(out)
}
