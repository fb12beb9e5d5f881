//! Collectives as `plait-program/1` defines them, on a [`Communicator`] (or on a group of one
//! rank, where codegen made no group): flat ones split the row-major flattening into `size`
//! pieces of ⌈n / size⌉ elements (zero-padded), axis ones into equal parts along the axis.

use program::CollectiveOp;

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
        CollectiveOp::Reshard { from } => {
            let to = axis.ok_or_else(|| bad(name, "a reshard needs its new axis".into()))?;
            reshard(g, input, in_shape, usize::from(from), usize::from(to)).map_err(
                |d| match d {
                    Reshard::Shape(d) => bad(name, d),
                    Reshard::Comm(e) => e,
                },
            )?
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

enum Reshard {
    Shape(String),
    Comm(RuntimeError),
}

/// A tensor split along `from` over the group, re-split along `to`: member `j` gets every
/// member's piece `j` along `to`, and puts member `i`'s at position `i` along `from`.
fn reshard<C: Communicator>(
    g: Members<'_, C>,
    input: &[f32],
    in_shape: &[usize],
    from: usize,
    to: usize,
) -> Result<Vec<f32>, Reshard> {
    let size = g.size();
    let mut send = Vec::with_capacity(input.len());
    for j in 0..size {
        send.extend(part(input, in_shape, to, size, j).map_err(Reshard::Shape)?);
    }
    let mut recv = vec![0.0; send.len()];
    match g {
        Members::Group(c) => c.all_to_all(&send, &mut recv).map_err(Reshard::Comm)?,
        Members::Solo => recv.copy_from_slice(&send),
    }
    let mut piece_shape = in_shape.to_vec();
    if let Some(d) = piece_shape.get_mut(to) {
        *d /= size.max(1);
    }
    let pieces: Vec<Vec<f32>> = if recv.is_empty() {
        vec![Vec::new(); size]
    } else {
        recv.chunks(recv.len() / size.max(1))
            .map(<[f32]>::to_vec)
            .collect()
    };
    concat(&pieces, &piece_shape, from).map_err(Reshard::Shape)
}

/// [`run`] of an `AllReduce` or `ReduceScatter` whose input is a partial sum carried in f64:
/// the members' values travel at full precision (each f64 as two f32s, hi and lo, exact to
/// 2⁻⁴⁸ relative), are summed in rank order in f64 and rounded once, so that the result
/// rounds as an unsplit f64 sum does. An all-reduce all-gathers the pairs (twice the bytes of
/// an f32 all-gather); a reduce-scatter sends each member only its piece (an all-to-all).
pub fn run_wide<C: Communicator>(
    g: Members<'_, C>,
    op: CollectiveOp,
    axis: Option<u8>,
    input: &[f64],
    in_shape: &[usize],
    out_len: usize,
) -> Result<Vec<f32>, RuntimeError> {
    let (size, name) = (g.size(), op.name());
    let (hi, lo): (Vec<f32>, Vec<f32>) = input.iter().map(|&v| hi_lo(v)).unzip();
    let recv = match op {
        CollectiveOp::AllReduce => {
            let pairs = interleave(&hi, &lo);
            let mut all = vec![0.0; pairs.len() * size];
            match g {
                Members::Group(c) => c.all_gather(&pairs, &mut all)?,
                Members::Solo => all.copy_from_slice(&pairs),
            }
            all
        }
        CollectiveOp::ReduceScatter => {
            let mut send = Vec::with_capacity(2 * input.len());
            for i in 0..size {
                let piece = |x: &[f32]| match axis {
                    None => Ok(flat_piece(x, size, i)),
                    Some(a) => part(x, in_shape, usize::from(a), size, i),
                };
                let (h, l) = (piece(&hi), piece(&lo));
                send.extend(interleave(
                    &h.map_err(|d| bad(name, d))?,
                    &l.map_err(|d| bad(name, d))?,
                ));
            }
            let mut recv = vec![0.0; send.len()];
            match g {
                Members::Group(c) => c.all_to_all(&send, &mut recv)?,
                Members::Solo => recv.copy_from_slice(&send),
            }
            recv
        }
        _ => return Err(bad(name, "only a reduction carries a partial sum".into())),
    };
    // `size` chunks, one per member in rank order, of (hi, lo) pairs of this rank's result.
    let mut sum = vec![0f64; recv.len() / (2 * size.max(1))];
    for member in recv.chunks(2 * sum.len().max(1)) {
        for (s, p) in sum.iter_mut().zip(member.chunks_exact(2)) {
            *s += f64::from(p[0]) + f64::from(p[1]);
        }
    }
    let out: Vec<f32> = sum.iter().map(|&v| v as f32).collect();
    if out.len() != out_len || (op == CollectiveOp::AllReduce && out.len() != input.len()) {
        return Err(RuntimeError::BadLength {
            op: name,
            what: "output",
            got: out.len(),
            want: out_len,
        });
    }
    Ok(out)
}

/// `v` as hi + lo, two f32s (lo is 0 where hi overflowed, so that ±inf stays ±inf, not NaN).
fn hi_lo(v: f64) -> (f32, f32) {
    let hi = v as f32;
    let lo = if hi.is_finite() {
        (v - f64::from(hi)) as f32
    } else {
        0.0
    };
    (hi, lo)
}

fn interleave(hi: &[f32], lo: &[f32]) -> Vec<f32> {
    hi.iter().zip(lo).flat_map(|(&h, &l)| [h, l]).collect()
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
