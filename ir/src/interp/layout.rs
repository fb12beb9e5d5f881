//! Layout ops that move elements without arithmetic, and their adjoints (which move gradients
//! back: reshape back, transpose by the inverse permutation, sum over broadcast axes, pad).

use super::KernelError;
use super::index::{broadcast_map, check_numel, strides, to_usize, unbroadcast, with_shape, zeros};
use crate::tensor::Tensor;
use crate::types::{Binding, Dim};

/// Concrete sizes of an attribute shape under the binding.
pub(crate) fn eval_dims(dims: &[Dim], binding: Binding) -> Result<Vec<usize>, KernelError> {
    dims.iter().map(|d| to_usize(d.eval(binding))).collect()
}

pub(crate) fn reshape(x: &Tensor, shape: Vec<usize>) -> Result<Tensor, KernelError> {
    with_shape(shape, x.data.clone())
}

/// numpy `broadcast_to`.
pub(crate) fn expand(x: &Tensor, shape: &[usize]) -> Result<Tensor, KernelError> {
    let map = broadcast_map(&x.shape, shape)?;
    Ok(Tensor {
        shape: shape.to_vec(),
        data: map.iter().map(|&i| x.data[i]).collect(),
    })
}

pub(crate) fn expand_vjp(x: &Tensor, g: &Tensor) -> Result<Tensor, KernelError> {
    let map = broadcast_map(&x.shape, &g.shape)?;
    unbroadcast(&g.data, &map, &x.shape)
}

fn check_perm(perm: &[usize], rank: usize) -> Result<(), KernelError> {
    let mut seen = vec![false; rank];
    for &p in perm {
        match seen.get_mut(p) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(KernelError::new(format!(
                    "{perm:?} is not a permutation of {rank} axes"
                )));
            }
        }
    }
    if perm.len() != rank {
        return Err(KernelError::new(format!(
            "{perm:?} is not a permutation of {rank} axes"
        )));
    }
    Ok(())
}

/// Output axis `a` is input axis `perm[a]`.
pub(crate) fn transpose(x: &Tensor, perm: &[usize]) -> Result<Tensor, KernelError> {
    check_perm(perm, x.shape.len())?;
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let in_strides = strides(&x.shape);
    let src_strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let n = check_numel(&shape)?;
    let mut data = Vec::with_capacity(n);
    let mut coord = vec![0usize; shape.len()];
    for _ in 0..n {
        let src: usize = coord.iter().zip(&src_strides).map(|(c, s)| c * s).sum();
        data.push(x.data[src]);
        for axis in (0..shape.len()).rev() {
            coord[axis] += 1;
            if coord[axis] < shape[axis] {
                break;
            }
            coord[axis] = 0;
        }
    }
    Ok(Tensor { shape, data })
}

pub(crate) fn transpose_vjp(perm: &[usize], g: &Tensor) -> Result<Tensor, KernelError> {
    check_perm(perm, g.shape.len())?;
    let mut inverse = vec![0usize; perm.len()];
    for (a, &p) in perm.iter().enumerate() {
        inverse[p] = a;
    }
    transpose(g, &inverse)
}

/// Views a shape as (outer, axis length, inner) around `axis`.
fn around(shape: &[usize], axis: usize) -> Result<(usize, usize, usize), KernelError> {
    if axis >= shape.len() {
        return Err(KernelError::new(format!(
            "axis {axis} out of range for {shape:?}"
        )));
    }
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    Ok((outer, shape[axis], inner))
}

/// Concatenates along `axis`; all operands agree off that axis.
pub(crate) fn concat(parts: &[&Tensor], axis: usize) -> Result<Tensor, KernelError> {
    let first = parts
        .first()
        .ok_or_else(|| KernelError::new("concat needs at least one operand"))?;
    let (outer, _, inner) = around(&first.shape, axis)?;
    let mut total = 0;
    for p in parts {
        let same_off_axis = p.shape.len() == first.shape.len()
            && p.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !same_off_axis {
            return Err(KernelError::new(format!(
                "concat operands {:?} and {:?} differ off axis {axis}",
                first.shape, p.shape
            )));
        }
        total += p.shape[axis];
    }
    let mut shape = first.shape.clone();
    shape[axis] = total;
    let mut data = Vec::with_capacity(check_numel(&shape)?);
    for o in 0..outer {
        for p in parts {
            let chunk = p.shape[axis] * inner;
            data.extend_from_slice(&p.data[o * chunk..(o + 1) * chunk]);
        }
    }
    with_shape(shape, data)
}

/// Elements `start..end` along `axis`.
pub(crate) fn slice(
    x: &Tensor,
    axis: usize,
    start: usize,
    end: usize,
) -> Result<Tensor, KernelError> {
    let (outer, len, inner) = around(&x.shape, axis)?;
    if start > end || end > len {
        return Err(KernelError::new(format!(
            "slice {start}..{end} out of range for length {len}"
        )));
    }
    let mut shape = x.shape.clone();
    shape[axis] = end - start;
    let mut data = Vec::with_capacity(check_numel(&shape)?);
    for o in 0..outer {
        let row = &x.data[o * len * inner..(o + 1) * len * inner];
        data.extend_from_slice(&row[start * inner..end * inner]);
    }
    with_shape(shape, data)
}

/// Pads the gradient of the slice with zeros back to the operand's shape.
pub(crate) fn slice_vjp(
    x: &Tensor,
    axis: usize,
    start: usize,
    end: usize,
    g: &Tensor,
) -> Result<Tensor, KernelError> {
    let (outer, len, inner) = around(&x.shape, axis)?;
    let width = end.saturating_sub(start);
    if end > len || g.data.len() != outer * width * inner {
        return Err(KernelError::new(format!(
            "output gradient {:?} does not match slice {start}..{end} of {:?}",
            g.shape, x.shape
        )));
    }
    let mut dx = zeros(&x.shape)?;
    for o in 0..outer {
        let dst = &mut dx.data[o * len * inner..(o + 1) * len * inner];
        dst[start * inner..end * inner]
            .copy_from_slice(&g.data[o * width * inner..(o + 1) * width * inner]);
    }
    Ok(dx)
}

/// Consecutive slices of the given sizes along `axis`.
pub(crate) fn split(x: &Tensor, axis: usize, sizes: &[u64]) -> Result<Vec<Tensor>, KernelError> {
    let (_, len, _) = around(&x.shape, axis)?;
    let mut start = 0usize;
    let mut parts = Vec::with_capacity(sizes.len());
    for &s in sizes {
        let end = start
            .checked_add(to_usize(s)?)
            .ok_or_else(|| KernelError::new("split sizes overflow"))?;
        parts.push(slice(x, axis, start, end)?);
        start = end;
    }
    if start != len {
        return Err(KernelError::new(format!(
            "split sizes {sizes:?} do not sum to dimension {len}"
        )));
    }
    Ok(parts)
}

/// The gradient of a concatenation is the output gradient cut back into the operands' extents.
pub(crate) fn concat_vjp(
    parts: &[&Tensor],
    axis: usize,
    g: &Tensor,
) -> Result<Vec<Tensor>, KernelError> {
    let mut start = 0usize;
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let len = p.shape.get(axis).copied().unwrap_or(0);
        let piece = slice(g, axis, start, start + len)?;
        if piece.shape != p.shape {
            return Err(KernelError::new(format!(
                "output gradient {:?} does not match concat operand {:?}",
                g.shape, p.shape
            )));
        }
        out.push(piece);
        start += len;
    }
    Ok(out)
}
