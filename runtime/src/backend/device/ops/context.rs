//! Ops on one rank's context-parallel chunks on the device (`context.cu`; the CPU form is
//! `kernels::context`): positions computed in a kernel from the rank's place, rotary at those
//! positions, and attention of the rank's queries at their positions over the group's keys put
//! in sequence order (and their gradients put back in member order). `None` for what the
//! device does not handle (heads wider than a tile, malformed operands): the host path.

use ir::OpKind;
use kernels::Chunks;

use super::{Buf, attention, pointwise_grid, rotary, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, KernelArg};

/// The results of `kind` on the rank's chunks, or `None` for the host path.
pub(in crate::backend::device) fn run<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    at: Chunks,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    match (kind, xs) {
        (OpKind::Iota { len }, &[]) => {
            let Some(n) = len.fixed().and_then(|n| usize::try_from(n).ok()) else {
                return Ok(None);
            };
            Ok(positions(b, n, at)?.map(|p| vec![p]))
        }
        (OpKind::Rotary { .. }, &[x]) => turn(b, kind, x, 1.0, at),
        (OpKind::Attention { sinks: false, .. }, &[q, k, v]) => {
            attend(b, kind, [q, k, v], None, at)
        }
        (OpKind::Attention { sinks: true, .. }, &[q, k, v, s]) => {
            attend(b, kind, [q, k, v], Some(s), at)
        }
        (OpKind::Grad { of, wrt }, _) => {
            let all = match (of.as_ref(), xs) {
                (OpKind::Rotary { .. }, &[x, g]) if g.shape == x.shape => turn(b, of, g, -1.0, at)?,
                (OpKind::Attention { sinks: false, .. }, &[q, k, v, g]) => {
                    attend_grad(b, of, [q, k, v, g], None, at)?
                }
                (OpKind::Attention { sinks: true, .. }, &[q, k, v, s, g]) => {
                    attend_grad(b, of, [q, k, v, g], Some(s), at)?
                }
                _ => None,
            };
            Ok(all.and_then(|all| pick(b, all, wrt)))
        }
        _ => Ok(None),
    }
}

/// The listed results of `all` (the others released); `None` if one is listed twice or not
/// there.
fn pick<D: Device>(b: &DeviceBackend<D>, all: Vec<Buf<D>>, wrt: &[usize]) -> Option<Vec<Buf<D>>> {
    let mut slots: Vec<Option<Buf<D>>> = all.into_iter().map(Some).collect();
    let picked: Option<Vec<Buf<D>>> = wrt
        .iter()
        .map(|&i| slots.get_mut(i).and_then(Option::take))
        .collect();
    for rest in slots.into_iter().flatten() {
        b.device.release(rest.mem);
    }
    picked
}

/// The whole-sequence positions of the rank's `local` tokens, or `None` when the rank's place
/// cannot hold two equal chunks of them.
fn positions<D: Device>(
    b: &DeviceBackend<D>,
    local: usize,
    at: Chunks,
) -> Result<Option<Buf<D>>, RuntimeError> {
    if at.size == 0 || at.index >= at.size || !local.is_multiple_of(2) {
        return Ok(None);
    }
    let mut p = b.alloc(&[local])?;
    let block = b.device.block_size();
    b.device.launch(
        "cp_positions",
        pointwise_grid(block, local),
        block,
        &mut [
            KernelArg::Out(&mut p.mem),
            size(local),
            size(at.size),
            size(at.index),
        ],
    )?;
    Ok(Some(p))
}

/// Rotary (`sign` 1) or its gradient (−1) of `x` `[B, local, ..]` at the rank's positions.
fn turn<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    x: &Buf<D>,
    sign: f64,
    at: Chunks,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let Some(pos) = positions(b, x.shape.get(1).copied().unwrap_or(0), at)? else {
        return Ok(None);
    };
    let y = rotary::rotate(b, kind, x, sign, Some(&pos.mem));
    b.device.release(pos.mem);
    Ok(y?.map(|y| vec![y]))
}

/// `x` `[B, size·local, w]` reordered between member order and sequence order.
fn reorder<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    local: usize,
    at: Chunks,
    to_whole: bool,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[batch, s, w] = x.shape.as_slice() else {
        return Ok(None);
    };
    if s != local * at.size {
        return Ok(None);
    }
    let mut y = b.alloc(&x.shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "cp_reorder",
        pointwise_grid(block, x.len),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&x.mem),
            size(batch),
            size(local),
            size(at.size),
            size(w),
            KernelArg::I32(i32::from(to_whole)),
        ],
    )?;
    Ok(Some(y))
}

/// The rank's queries' positions and the keys and values in sequence order, or `None`.
struct Whole<D: Device> {
    pos: Buf<D>,
    k: Buf<D>,
    v: Buf<D>,
}

impl<D: Device> Whole<D> {
    fn of(
        b: &DeviceBackend<D>,
        q: &Buf<D>,
        k: &Buf<D>,
        v: &Buf<D>,
        at: Chunks,
    ) -> Result<Option<Self>, RuntimeError> {
        let local = q.shape.get(1).copied().unwrap_or(0);
        let Some(pos) = positions(b, local, at)? else {
            return Ok(None);
        };
        let (kw, vw) = (
            reorder(b, k, local, at, true)?,
            reorder(b, v, local, at, true)?,
        );
        match (kw, vw) {
            (Some(k), Some(v)) => Ok(Some(Whole { pos, k, v })),
            (kw, vw) => {
                for m in [Some(pos), kw, vw].into_iter().flatten() {
                    b.device.release(m.mem);
                }
                Ok(None)
            }
        }
    }

    fn release(self, b: &DeviceBackend<D>) {
        for m in [self.pos, self.k, self.v] {
            b.device.release(m.mem);
        }
    }
}

/// The local queries' attention over the gathered keys (with the sinks where the op has them:
/// each query row takes its head's, whichever member holds it).
fn attend<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    [q, k, v]: [&Buf<D>; 3],
    sinks: Option<&Buf<D>>,
    at: Chunks,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let Some(w) = Whole::of(b, q, k, v, at)? else {
        return Ok(None);
    };
    let xs: Vec<&Buf<D>> = [q, &w.k, &w.v].into_iter().chain(sinks).collect();
    let o = attention::forward_at(b, kind, &xs, Some(&w.pos.mem));
    w.release(b);
    Ok(o?.map(|o| vec![o]))
}

/// `[dq, dk, dv]` (and the member's part of the sinks' gradient, summed over the group as
/// every weight's is), dk and dv back in member order.
fn attend_grad<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    [q, k, v, g]: [&Buf<D>; 4],
    sinks: Option<&Buf<D>>,
    at: Chunks,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let local = q.shape.get(1).copied().unwrap_or(0);
    let Some(w) = Whole::of(b, q, k, v, at)? else {
        return Ok(None);
    };
    let xs: Vec<&Buf<D>> = [q, &w.k, &w.v].into_iter().chain(sinks).collect();
    let grads = attention::backward_at(b, kind, &xs, g, Some(&w.pos.mem));
    w.release(b);
    let Some(mut grads) = grads? else {
        return Ok(None);
    };
    for d in grads.iter_mut().skip(1).take(2) {
        let back = reorder(b, d, local, at, false)?;
        if let Some(back) = back {
            let whole = std::mem::replace(d, back);
            b.device.release(whole.mem);
        }
    }
    Ok(Some(grads))
}
