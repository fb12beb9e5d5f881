//! Collectives on the backend's own buffers ([`crate::backend::collectives`]): the format's
//! layouts (flat pieces zero-padded to `size` equal chunks, axis pieces in rank order) are
//! arranged with the backend's layout ops (reshape, transpose, slice, concat) around flat
//! device collectives, so that a tensor- or data-parallel reduction never leaves the device.
//! Where the backend has no device collectives, or for the ops without a device path here
//! (broadcast), the executor stages through the host as before. A
//! `Chunk` (a rank's piece, no communication) is a slice on the device on every backend.

use ir::{Binding, OpKind};
use program::{BufferId, CollectiveOp, Slot};

use super::Executor;
use crate::backend::collectives::DeviceCollective;
use crate::{Backend, Communicator, RuntimeError};

/// Layout ops are shape-only: no binding is read.
const BINDING: Binding = Binding { batch: 1, seq: 1 };

/// `[d0, .., dk]` with dimension `axis` split as `[size, d_axis / size]` (the pieces along it).
fn split_axis(shape: &[usize], axis: usize, size: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s[axis] /= size;
    s.insert(axis, size);
    s
}

/// The permutation of a rank-`rank` tensor that moves dimension `from` to position `to`.
fn moving(rank: usize, from: usize, to: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).filter(|&d| d != from).collect();
    perm.insert(to, from);
    perm
}

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Runs collective `op` of buffer `i` into `o` over the group of `slot` on the backend's
    /// buffers; `Ok(false)` (nothing done) where that is not possible here.
    pub(super) fn collective_on_device(
        &mut self,
        op: CollectiveOp,
        slot: Slot,
        axis: Option<u8>,
        i: BufferId,
        o: BufferId,
    ) -> Result<bool, RuntimeError> {
        let Some(group) = self.group_comm(slot) else {
            return Ok(false);
        };
        let (in_shape, out_shape) = (self.decl_shape(i)?, self.decl_shape(o)?);
        let axis = axis.map(usize::from);
        let x = self.get(i)?;
        let y = run(&self.backend, group, op, axis, x, &in_shape, &out_shape);
        let Some(y) = y.transpose()? else {
            return Ok(false);
        };
        self.put_buffer(o, y)?;
        Ok(true)
    }

    /// `Chunk`: this rank's piece of `src` (along `axis`, or of the zero-padded flattening) with
    /// the backend's own slice, no communication; `Ok(false)` for shapes it does not fit.
    pub(super) fn chunk_on_device(
        &mut self,
        src: BufferId,
        dst: BufferId,
        axis: Option<u8>,
        slot: Slot,
    ) -> Result<bool, RuntimeError> {
        let g = self.members(slot);
        let (size, r) = (g.size(), g.rank());
        let (in_shape, out_shape) = (self.decl_shape(src)?, self.decl_shape(dst)?);
        let n: usize = in_shape.iter().product();
        let x = self.get(src)?;
        let y = match axis.map(usize::from) {
            Some(a) => {
                let fits = in_shape.get(a).is_some_and(|&d| d.is_multiple_of(size))
                    && split_axis(&in_shape, a, size)[a + 1..] == out_shape[a..]
                    && in_shape[..a] == out_shape[..a];
                if !fits {
                    return Ok(false);
                }
                let w = in_shape[a] / size;
                let slice = OpKind::Slice {
                    axis: a,
                    start: (r * w) as u64,
                    end: ((r + 1) * w) as u64,
                };
                single(self.backend.forward(&slice, &[x], BINDING)?)?
            }
            None => {
                let per = n.div_ceil(size.max(1));
                if out_shape.iter().product::<usize>() != per {
                    return Ok(false);
                }
                let start = (per * r).min(n);
                let end = (start + per).min(n);
                flat_range(&self.backend, x, n, start..end, per)?
            }
        };
        let y = self.backend.reshape(y, &out_shape)?;
        self.put_buffer(dst, y)?;
        Ok(true)
    }

    fn group_comm(&self, slot: Slot) -> Option<&C> {
        let i = Slot::ALL.iter().position(|&x| x == slot)?;
        self.slots.get(i).and_then(Option::as_ref)
    }
}

/// `op` of `x` over `group`'s members on `b`'s buffers, arranged as the format's layouts say
/// (`axis`, the declared shapes); `None` where `b` has no device collectives or the layout is
/// not one arranged here (the caller stages through the host).
pub fn run<B: Backend, C: Communicator>(
    b: &B,
    group: &C,
    op: CollectiveOp,
    axis: Option<usize>,
    x: &B::Buffer,
    in_shape: &[usize],
    out_shape: &[usize],
) -> Option<Result<B::Buffer, RuntimeError>> {
    if !device_layout(op, axis, in_shape, out_shape, group.size()) {
        return None;
    }
    let y = match op {
        CollectiveOp::AllReduce => b.device_collective(group, DeviceCollective::AllReduce, x),
        CollectiveOp::AllGather => gather(b, group, x, in_shape, out_shape, axis),
        CollectiveOp::ReduceScatter => scatter(b, group, x, in_shape, axis),
        CollectiveOp::AllToAll => b.device_collective(group, DeviceCollective::AllToAll, x),
        CollectiveOp::Reshard { from } => {
            reshard(b, group, x, in_shape, usize::from(from), axis.unwrap_or(0))
        }
        CollectiveOp::Broadcast { .. } => None,
    }?;
    Some(y.and_then(|y| b.reshape(y, out_shape)))
}

/// Whether the shapes are those of a layout arranged here: an all-reduce of equal shapes,
/// a flat gather or scatter of ⌈n / size⌉-element pieces, or equal pieces along an axis.
fn device_layout(
    op: CollectiveOp,
    axis: Option<usize>,
    in_shape: &[usize],
    out_shape: &[usize],
    size: usize,
) -> bool {
    let (n, m) = (
        in_shape.iter().product::<usize>(),
        out_shape.iter().product::<usize>(),
    );
    let along = |small: &[usize], big: &[usize], a: usize| {
        small.len() == big.len()
            && a < small.len()
            && (0..small.len()).all(|d| big[d] == if d == a { small[d] * size } else { small[d] })
    };
    match (op, axis) {
        (CollectiveOp::AllReduce, _) => n == m,
        (CollectiveOp::AllGather, None) => m <= n * size && m > n * (size - 1),
        (CollectiveOp::ReduceScatter, None) => m == n.div_ceil(size),
        (CollectiveOp::AllGather, Some(a)) => along(in_shape, out_shape, a),
        (CollectiveOp::ReduceScatter, Some(a)) => along(out_shape, in_shape, a),
        (CollectiveOp::AllToAll, None) => n == m && n.is_multiple_of(size),
        (CollectiveOp::Reshard { from }, Some(to)) => {
            let from = usize::from(from);
            let rank = in_shape.len();
            from < rank
                && to < rank
                && from != to
                && in_shape[to].is_multiple_of(size)
                && out_shape.len() == rank
                && (0..rank).all(|d| {
                    out_shape[d]
                        == match d {
                            _ if d == to => in_shape[d] / size,
                            _ if d == from => in_shape[d] * size,
                            _ => in_shape[d],
                        }
                })
        }
        _ => false,
    }
}

/// Every member's `x` concatenated along `axis` (flat: the first `out` elements of the
/// rank-order concatenation).
fn gather<B: Backend, C: Communicator>(
    b: &B,
    group: &C,
    x: &B::Buffer,
    in_shape: &[usize],
    out_shape: &[usize],
    axis: Option<usize>,
) -> Option<Result<B::Buffer, RuntimeError>> {
    let all = b.device_collective(group, DeviceCollective::AllGather, x)?;
    Some(all.and_then(|all| {
        let size = group.size();
        match axis {
            None => {
                let m: usize = out_shape.iter().product();
                let n = in_shape.iter().product::<usize>() * size;
                if m == n {
                    return Ok(all);
                }
                let slice = OpKind::Slice {
                    axis: 0,
                    start: 0,
                    end: m as u64,
                };
                replace(b, all, |be, t| be.forward(&slice, &[t], BINDING))
            }
            // [size, d0, .., dk] → [d0, .., size, d_axis, .., dk]: member r's piece at r.
            Some(0) => Ok(all),
            Some(a) => {
                let mut stacked = vec![size];
                stacked.extend_from_slice(in_shape);
                let all = b.reshape(all, &stacked)?;
                let perm = moving(stacked.len(), 0, a);
                replace(b, all, |b, t| {
                    b.forward(&OpKind::Transpose { perm }, &[t], BINDING)
                })
            }
        }
    }))
}

/// `x` split along `to` over the members, re-split along `from`: member `j` gets every
/// member's piece `j` along `to` and stacks member `i`'s at position `i` along `from`.
fn reshard<B: Backend, C: Communicator>(
    b: &B,
    group: &C,
    x: &B::Buffer,
    in_shape: &[usize],
    from: usize,
    to: usize,
) -> Option<Result<B::Buffer, RuntimeError>> {
    let size = group.size();
    // [.., size, piece, ..] → [size, .., piece, ..]: the pieces for each member, rank-major.
    let split = split_axis(in_shape, to, size);
    let send = b.duplicate(x).and_then(|t| {
        let t = b.reshape(t, &split)?;
        let perm = moving(split.len(), to, 0);
        replace(b, t, |be, t| {
            be.forward(&OpKind::Transpose { perm }, &[t], BINDING)
        })
    });
    let send = match send {
        Ok(t) => t,
        Err(e) => return Some(Err(e)),
    };
    let got = b.device_collective(group, DeviceCollective::AllToAll, &send);
    b.free(send);
    // [size, piece shape] → the members' pieces stacked along `from`.
    Some(got?.and_then(|all| {
        let mut stacked = vec![size];
        stacked.extend(
            split
                .iter()
                .enumerate()
                .filter(|&(d, _)| d != to)
                .map(|(_, &n)| n),
        );
        let all = b.reshape(all, &stacked)?;
        if from == 0 {
            return Ok(all);
        }
        let perm = moving(stacked.len(), 0, from);
        replace(b, all, |be, t| {
            be.forward(&OpKind::Transpose { perm }, &[t], BINDING)
        })
    }))
}

/// Piece `rank` (along `axis`, or of the zero-padded flattening) of the members' sum.
fn scatter<B: Backend, C: Communicator>(
    b: &B,
    group: &C,
    x: &B::Buffer,
    in_shape: &[usize],
    axis: Option<usize>,
) -> Option<Result<B::Buffer, RuntimeError>> {
    let size = group.size();
    let n: usize = in_shape.iter().product();
    let arranged = match axis {
        None if n.is_multiple_of(size) => None,
        None => Some(flat_range(b, x, n, 0..n, n.div_ceil(size) * size)),
        Some(0) => None,
        // [d0, .., size, piece, .., dk] → [size, d0, .., piece, .., dk]: pieces rank-major.
        Some(a) => Some(b.duplicate(x).and_then(|t| {
            let split = split_axis(in_shape, a, size);
            let t = b.reshape(t, &split)?;
            let perm = moving(split.len(), a, 0);
            replace(b, t, |b, t| {
                b.forward(&OpKind::Transpose { perm }, &[t], BINDING)
            })
        })),
    };
    match arranged {
        None => b.device_collective(group, DeviceCollective::ReduceScatter, x),
        Some(Err(e)) => Some(Err(e)),
        Some(Ok(t)) => {
            let y = b.device_collective(group, DeviceCollective::ReduceScatter, &t);
            b.free(t);
            y
        }
    }
}

/// The one result of `f` on `t`, which is freed.
fn replace<B: Backend>(
    b: &B,
    t: B::Buffer,
    f: impl FnOnce(&B, &B::Buffer) -> Result<Vec<B::Buffer>, RuntimeError>,
) -> Result<B::Buffer, RuntimeError> {
    let y = f(b, &t);
    b.free(t);
    single(y?)
}

/// Elements `range` of `x`'s `n`, flat, zero-padded to `len`.
fn flat_range<B: Backend>(
    b: &B,
    x: &B::Buffer,
    n: usize,
    range: std::ops::Range<usize>,
    len: usize,
) -> Result<B::Buffer, RuntimeError> {
    if range.is_empty() {
        return b.zeros(&[len]);
    }
    let flat = b.reshape(b.duplicate(x)?, &[n])?;
    let piece = if range.len() == n {
        flat
    } else {
        let slice = OpKind::Slice {
            axis: 0,
            start: range.start as u64,
            end: range.end as u64,
        };
        replace(b, flat, |be, t| be.forward(&slice, &[t], BINDING))?
    };
    if range.len() == len {
        return Ok(piece);
    }
    let zeros = b.zeros(&[len - range.len()])?;
    let y = b.forward(&OpKind::Concat { axis: 0 }, &[&piece, &zeros], BINDING);
    b.free(piece);
    b.free(zeros);
    single(y?)
}

fn single<T>(mut v: Vec<T>) -> Result<T, RuntimeError> {
    match (v.pop(), v.is_empty()) {
        (Some(t), true) => Ok(t),
        _ => Err(RuntimeError::Mismatch {
            op: "device collective",
            rank: 0,
            detail: "a layout op gave other than one result".into(),
        }),
    }
}
