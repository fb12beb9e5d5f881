//! Shape arithmetic shared by the kernels: element counts, strides and numpy broadcasting.

use super::KernelError;
use crate::tensor::Tensor;

/// The most elements one tensor may hold; larger requests are errors, not allocation aborts.
pub(crate) const MAX_ELEMENTS: usize = 1 << 32;

pub(crate) fn to_usize(n: u64) -> Result<usize, KernelError> {
    usize::try_from(n).map_err(|_| KernelError::new(format!("size {n} does not fit in memory")))
}

/// Element count of `shape`, refusing overflow and tensors beyond [`MAX_ELEMENTS`].
pub(crate) fn check_numel(shape: &[usize]) -> Result<usize, KernelError> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| KernelError::new(format!("a tensor of shape {shape:?} is too large")))
}

pub(crate) fn zeros(shape: &[usize]) -> Result<Tensor, KernelError> {
    let n = check_numel(shape)?;
    Ok(Tensor {
        shape: shape.to_vec(),
        data: vec![0.0; n],
    })
}

/// A tensor of `shape` with the same data, checking the element count.
pub(crate) fn with_shape(shape: Vec<usize>, data: Vec<f64>) -> Result<Tensor, KernelError> {
    if check_numel(&shape)? != data.len() {
        return Err(KernelError::new(format!(
            "{} elements do not fill shape {shape:?}",
            data.len()
        )));
    }
    Ok(Tensor { shape, data })
}

/// Splits a shape `[.., n]` into (number of rows, n); `n` must be positive.
pub(crate) fn rows(t: &Tensor, what: &str) -> Result<(usize, usize), KernelError> {
    match t.shape.last() {
        Some(&n) if n > 0 => Ok((t.data.len() / n, n)),
        Some(_) => Err(KernelError::new(format!("{what} has an empty last axis"))),
        None => Err(KernelError::new(format!("{what} is a scalar"))),
    }
}

/// Numpy broadcasting of two shapes, aligned at the end.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>, KernelError> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(KernelError::new(format!(
                "shapes {a:?} and {b:?} do not broadcast"
            ))),
        })
        .collect()
}

/// For each element of a tensor of shape `out` (row-major), the flat index of the element of a
/// tensor of shape `from` that numpy broadcasting reads there. Scatter-adding through the same
/// map is the broadcast's adjoint, which is how every broadcasting VJP reduces its gradient.
pub(crate) fn broadcast_map(from: &[usize], out: &[usize]) -> Result<Vec<usize>, KernelError> {
    let fits = from.len() <= out.len()
        && from
            .iter()
            .zip(&out[out.len() - from.len()..])
            .all(|(&f, &o)| f == o || f == 1);
    if !fits {
        return Err(KernelError::new(format!(
            "shape {from:?} does not broadcast to {out:?}"
        )));
    }
    let n = check_numel(out)?;
    let offset = out.len() - from.len();
    // Stride of each output axis in the source; zero where the source is broadcast.
    let mut src_stride = vec![0usize; out.len()];
    let mut s = 1;
    for (i, &f) in from.iter().enumerate().rev() {
        if f != 1 {
            src_stride[offset + i] = s;
        }
        s *= f;
    }
    let mut map = Vec::with_capacity(n);
    let mut coord = vec![0usize; out.len()];
    let mut idx = 0usize;
    for _ in 0..n {
        map.push(idx);
        // Odometer increment of the output coordinate, tracking the source index alongside.
        for axis in (0..out.len()).rev() {
            coord[axis] += 1;
            idx += src_stride[axis];
            if coord[axis] < out[axis] {
                break;
            }
            idx -= src_stride[axis] * coord[axis];
            coord[axis] = 0;
        }
    }
    Ok(map)
}

/// Scatter-adds `g` (laid out like the broadcast output) back onto a tensor of shape `from`.
pub(crate) fn unbroadcast(g: &[f64], map: &[usize], from: &[usize]) -> Result<Tensor, KernelError> {
    let mut out = zeros(from)?;
    for (&gi, &m) in g.iter().zip(map) {
        if let Some(slot) = out.data.get_mut(m) {
            *slot += gi;
        }
    }
    Ok(out)
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Requires two operands of one shape.
pub(crate) fn same_shape(a: &Tensor, b: &Tensor, what: &str) -> Result<(), KernelError> {
    if a.shape != b.shape {
        return Err(KernelError::new(format!(
            "{what}: shapes {:?} and {:?} differ",
            a.shape, b.shape
        )));
    }
    Ok(())
}

/// Requires that a tensor's data fills its shape exactly (the fields are public, so callers of
/// [`super::apply`] could hand in anything; kernels index on the strength of this check).
pub(crate) fn well_formed(t: &Tensor) -> Result<(), KernelError> {
    let want = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if want != Some(t.data.len()) {
        return Err(KernelError::new(format!(
            "an operand of shape {:?} holds {} elements",
            t.shape,
            t.data.len()
        )));
    }
    Ok(())
}
