//! Collectives as `plait-program/1` defines them, on a [`Communicator`] (or on a group of one
//! rank, where codegen made no group): flat ones split the row-major flattening into `size`
//! pieces of ⌈n / size⌉ elements (zero-padded), axis ones into equal parts along the axis.

use codegen::program::CollectiveOp;

use super::layout::{concat, flat_piece, part};
use crate::{Communicator, RuntimeError};

/// A group of one rank or a real one.
#[derive(Debug, Clone, Copy)]
pub enum Members<'c, C> {
    Solo,
    Group(&'c C),
}

impl<C: Communicator> Members<'_, C> {
    pub fn size(&self) -> usize {
        match self {
            Members::Solo => 1,
            Members::Group(c) => c.size(),
        }
    }

    pub fn rank(&self) -> usize {
        match self {
            Members::Solo => 0,
            Members::Group(c) => c.rank(),
        }
    }
}

fn bad(op: &'static str, detail: String) -> RuntimeError {
    RuntimeError::Mismatch {
        op,
        rank: 0,
        detail,
    }
}

/// Runs one collective on `input` (shape `in_shape`); the result has `out_len` elements.
pub fn run<C: Communicator>(
    g: Members<'_, C>,
    op: CollectiveOp,
    axis: Option<u8>,
    input: &[f32],
    in_shape: &[usize],
    out_len: usize,
) -> Result<Vec<f32>, RuntimeError> {
    let size = g.size();
    let name = op.name();
    let out = match op {
        CollectiveOp::AllReduce => {
            let mut buf = input.to_vec();
            if let Members::Group(c) = g {
                c.all_reduce_sum(&mut buf)?;
            }
            buf
        }
        CollectiveOp::AllGather => {
            let mut all = vec![0.0; input.len() * size];
            match g {
                Members::Group(c) => c.all_gather(input, &mut all)?,
                Members::Solo => all.copy_from_slice(input),
            }
            match axis {
                None => {
                    all.truncate(out_len);
                    all
                }
                Some(a) => {
                    let pieces: Vec<Vec<f32>> = all
                        .chunks(input.len().max(1))
                        .map(<[f32]>::to_vec)
                        .collect();
                    let pieces = if input.is_empty() {
                        vec![Vec::new(); size]
                    } else {
                        pieces
                    };
                    concat(&pieces, in_shape, usize::from(a)).map_err(|d| bad(name, d))?
                }
            }
        }
        CollectiveOp::ReduceScatter => {
            let send: Vec<f32> = match axis {
                None => {
                    let per = input.len().div_ceil(size.max(1));
                    let mut s = input.to_vec();
                    s.resize(per * size, 0.0);
                    s
                }
                Some(a) => {
                    let mut s = Vec::with_capacity(input.len());
                    for i in 0..size {
                        s.extend(
                            part(input, in_shape, usize::from(a), size, i)
                                .map_err(|d| bad(name, d))?,
                        );
                    }
                    s
                }
            };
            let mut recv = vec![0.0; send.len() / size.max(1)];
            match g {
                Members::Group(c) => c.reduce_scatter_sum(&send, &mut recv)?,
                Members::Solo => recv.copy_from_slice(&send),
            }
            recv
        }
        CollectiveOp::Broadcast { root } => {
            let mut buf = input.to_vec();
            if let Members::Group(c) = g {
                c.broadcast(&mut buf, root as usize)?;
            }
            buf
        }
        CollectiveOp::AllToAll => {
            let mut recv = vec![0.0; input.len()];
            match g {
                Members::Group(c) => c.all_to_all(input, &mut recv)?,
                Members::Solo => recv.copy_from_slice(input),
            }
            recv
        }
    };
    if out.len() != out_len {
        return Err(RuntimeError::BadLength {
            op: name,
            what: "output",
            got: out.len(),
            want: out_len,
        });
    }
    Ok(out)
}

/// [`run`] of an `AllReduce` or `ReduceScatter` whose input is a partial sum carried in f64:
/// every member's value is gathered at full precision (each f64 sent as two f32s, hi and lo,
/// exact to 2⁻⁴⁸ relative), summed in rank order in f64 and rounded once, so that the result
/// rounds as one device's unsplit sum does. Costs an all-gather of twice the input.
pub fn run_wide<C: Communicator>(
    g: Members<'_, C>,
    op: CollectiveOp,
    axis: Option<u8>,
    input: &[f64],
    in_shape: &[usize],
    out_len: usize,
) -> Result<Vec<f32>, RuntimeError> {
    let (size, rank, name) = (g.size(), g.rank(), op.name());
    let pairs: Vec<f32> = input
        .iter()
        .flat_map(|&v| {
            let hi = v as f32;
            [hi, (v - f64::from(hi)) as f32]
        })
        .collect();
    let mut all = vec![0.0; pairs.len() * size];
    match g {
        Members::Group(c) => c.all_gather(&pairs, &mut all)?,
        Members::Solo => all.copy_from_slice(&pairs),
    }
    let mut sum = vec![0f64; input.len()];
    for member in all.chunks(pairs.len().max(1)) {
        for (s, p) in sum.iter_mut().zip(member.chunks_exact(2)) {
            *s += f64::from(p[0]) + f64::from(p[1]);
        }
    }
    let full: Vec<f32> = sum.iter().map(|&v| v as f32).collect();
    let out = match (op, axis) {
        (CollectiveOp::AllReduce, _) => full,
        (CollectiveOp::ReduceScatter, None) => flat_piece(&full, size, rank),
        (CollectiveOp::ReduceScatter, Some(a)) => {
            part(&full, in_shape, usize::from(a), size, rank).map_err(|d| bad(name, d))?
        }
        _ => return Err(bad(name, "only a reduction carries a partial sum".into())),
    };
    if out.len() != out_len {
        return Err(RuntimeError::BadLength {
            op: name,
            what: "output",
            got: out.len(),
            want: out_len,
        });
    }
    Ok(out)
}

/// `Chunk`: this rank's piece of `src` without communication.
pub fn chunk(
    src: &[f32],
    shape: &[usize],
    axis: Option<u8>,
    size: usize,
    rank: usize,
) -> Result<Vec<f32>, String> {
    match axis {
        None => Ok(flat_piece(src, size, rank)),
        Some(a) => part(src, shape, usize::from(a), size, rank),
    }
}
