//! Layout ops as strided copies (`layout.cu`): transpose, split, concat, slice and expand, and
//! their gradients (the inverse copies; an expand's gradient is a broadcast sum).

use kernels::device::{Broadcast, Strided, contiguous_strides};

use super::{Buf, pointwise, pointwise_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, KernelArg};

/// layout.cu's STRIDED_ROW_MIN: boxes with rows this long are copied a row per block.
const STRIDED_ROW_MIN: usize = 64;

/// Copies the box `dims` of `src` (its strides and first element) into `dst` (likewise).
fn copy_box<D: Device>(
    b: &DeviceBackend<D>,
    dst: &mut Buf<D>,
    src: &Buf<D>,
    dims: &[usize],
    from: (&[usize], usize),
    to: (&[usize], usize),
) -> Result<bool, RuntimeError> {
    let Some(s) = Strided::new(dims, from, to) else {
        return Ok(false);
    };
    let n: usize = dims.iter().product();
    if n == 0 {
        return Ok(true);
    }
    let block = b.device.block_size();
    // Long rows go a row per block (layout.cu's STRIDED_ROW_MIN): one block per row.
    let inner = dims.last().copied().unwrap_or(1);
    let grid = if inner >= STRIDED_ROW_MIN {
        super::row_grid(n / inner)
    } else {
        pointwise_grid(block, n)
    };
    b.device.launch(
        "strided_copy",
        grid,
        block,
        &mut [
            KernelArg::Out(&mut dst.mem),
            KernelArg::In(&src.mem),
            KernelArg::Strided(s),
            size(n),
        ],
    )?;
    Ok(true)
}

/// `x` with its axes in the order `perm`; `None` for a bad permutation.
pub(super) fn transpose<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    perm: &[usize],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let rank = x.shape.len();
    let mut seen = vec![false; rank];
    if perm.len() != rank
        || perm
            .iter()
            .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
    {
        return Ok(None);
    }
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let in_strides = contiguous_strides(&x.shape);
    let src: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let mut y = b.alloc(&shape)?;
    let ok = copy_box(
        b,
        &mut y,
        x,
        &shape,
        (&src, 0),
        (&contiguous_strides(&shape), 0),
    )?;
    finish(b, y, ok)
}

/// The inverse of `perm`.
pub(super) fn inverse(perm: &[usize]) -> Option<Vec<usize>> {
    let mut inv = vec![usize::MAX; perm.len()];
    for (a, &p) in perm.iter().enumerate() {
        *inv.get_mut(p)? = a;
    }
    inv.iter().all(|&a| a != usize::MAX).then_some(inv)
}

/// Part `[start, start + len)` of `x` along `axis`, as a new tensor.
pub(super) fn slice<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    axis: usize,
    start: usize,
    len: usize,
) -> Result<Option<Buf<D>>, RuntimeError> {
    if axis >= x.shape.len() || start.checked_add(len).is_none_or(|e| e > x.shape[axis]) {
        return Ok(None);
    }
    let mut shape = x.shape.clone();
    shape[axis] = len;
    let strides = contiguous_strides(&x.shape);
    let mut y = b.alloc(&shape)?;
    let ok = copy_box(
        b,
        &mut y,
        x,
        &shape,
        (&strides, start * strides[axis]),
        (&contiguous_strides(&shape), 0),
    )?;
    finish(b, y, ok)
}

/// `x` split along `axis` into parts of `sizes` (which must add up to the axis).
pub(super) fn split<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    axis: usize,
    sizes: &[usize],
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    if x.shape.get(axis) != Some(&sizes.iter().sum()) {
        return Ok(None);
    }
    let mut parts = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for &len in sizes {
        match slice(b, x, axis, start, len)? {
            Some(p) => parts.push(p),
            None => {
                parts
                    .into_iter()
                    .for_each(|p: Buf<D>| b.device.release(p.mem));
                return Ok(None);
            }
        }
        start += len;
    }
    Ok(Some(parts))
}

/// `parts` joined along `axis` (equal in every other dim).
pub(super) fn concat<D: Device>(
    b: &DeviceBackend<D>,
    parts: &[&Buf<D>],
    axis: usize,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    let same = |p: &&Buf<D>| {
        p.shape.len() == first.shape.len()
            && axis < p.shape.len()
            && p.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(d, (a, c))| d == axis || a == c)
    };
    if !parts.iter().all(same) {
        return Ok(None);
    }
    let mut shape = first.shape.clone();
    shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
    let out_strides = contiguous_strides(&shape);
    let mut y = b.alloc(&shape)?;
    let mut start = 0;
    for p in parts {
        let ok = copy_box(
            b,
            &mut y,
            p,
            &p.shape,
            (&contiguous_strides(&p.shape), 0),
            (&out_strides, start * out_strides[axis]),
        )?;
        if !ok {
            return finish(b, y, false);
        }
        start += p.shape[axis];
    }
    Ok(Some(y))
}

/// `x` broadcast to `shape` (numpy rules).
pub(super) fn expand<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    shape: &[usize],
) -> Result<Option<Buf<D>>, RuntimeError> {
    if kernels::device::broadcast_shape(&x.shape, shape).as_deref() != Some(shape) {
        return Ok(None);
    }
    let Some(bc) = Broadcast::new(shape, &x.shape, &x.shape) else {
        return Ok(None);
    };
    let rank = shape.len();
    let src: Vec<usize> = bc.stride_a[..rank].iter().map(|&s| s as usize).collect();
    let mut y = b.alloc(shape)?;
    let ok = copy_box(
        b,
        &mut y,
        x,
        shape,
        (&src, 0),
        (&contiguous_strides(shape), 0),
    )?;
    finish(b, y, ok)
}

/// An expand's gradient: `g` summed back to `x`'s shape.
pub(super) fn expand_backward<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    g: &Buf<D>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    if kernels::device::broadcast_shape(&x.shape, &g.shape).as_deref() != Some(&g.shape[..]) {
        return Ok(None);
    }
    let mut full = b.alloc(&g.shape)?;
    if g.len > 0 {
        b.device.copy(&g.mem, &mut full.mem, g.len)?;
    }
    pointwise::sum_to(b, full, &x.shape).map(Some)
}

/// A slice's gradient: zeros of `x`'s shape with `g` at `[start, ..)` along `axis`.
pub(super) fn slice_backward<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    axis: usize,
    start: usize,
    g: &Buf<D>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let fits = axis < x.shape.len()
        && g.shape.len() == x.shape.len()
        && g.shape.iter().zip(&x.shape).enumerate().all(|(d, (a, c))| {
            if d == axis { start + a <= *c } else { a == c }
        });
    if !fits {
        return Ok(None);
    }
    let strides = contiguous_strides(&x.shape);
    let mut dx = b.alloc_zeroed(&x.shape)?;
    let ok = copy_box(
        b,
        &mut dx,
        g,
        &g.shape,
        (&contiguous_strides(&g.shape), 0),
        (&strides, start * strides[axis]),
    )?;
    finish(b, dx, ok)
}

/// `y` if its copy was described, else released and `None` (the host path).
fn finish<D: Device>(
    b: &DeviceBackend<D>,
    y: Buf<D>,
    ok: bool,
) -> Result<Option<Buf<D>>, RuntimeError> {
    if ok {
        Ok(Some(y))
    } else {
        b.device.release(y.mem);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_row_threshold_is_layout_cus() {
        let define = format!("#define STRIDED_ROW_MIN {}", super::STRIDED_ROW_MIN);
        assert!(
            kernels::device::CUDA_SOURCE.contains(&define),
            "layout.cu: {define}"
        );
    }
}
