//! Host-side layout helpers: equal parts along an axis, boxes of a full tensor, flat pieces.
//! Pure index arithmetic on row-major `f32` data; every size is checked, nothing panics.

use program::Slice;

/// `(outer, dim, inner)` of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> Option<(usize, usize, usize)> {
    let dim = *shape.get(axis)?;
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    Some((outer, dim, inner))
}

/// Part `i` of `parts` equal parts of `data` (shape `shape`) along `axis`.
pub fn part(
    data: &[f32],
    shape: &[usize],
    axis: usize,
    parts: usize,
    i: usize,
) -> Result<Vec<f32>, String> {
    let (outer, dim, inner) =
        around(shape, axis).ok_or_else(|| format!("axis {axis} of a {shape:?} tensor"))?;
    if parts == 0 || !dim.is_multiple_of(parts) || i >= parts {
        return Err(format!(
            "part {i} of {parts} along axis {axis} of {shape:?}"
        ));
    }
    check(data, shape)?;
    let w = dim / parts;
    let mut out = Vec::with_capacity(outer * w * inner);
    for o in 0..outer {
        let start = (o * dim + i * w) * inner;
        out.extend_from_slice(&data[start..start + w * inner]);
    }
    Ok(out)
}

/// Concatenates `pieces` (each of shape `piece_shape`) along `axis`.
pub fn concat(pieces: &[Vec<f32>], piece_shape: &[usize], axis: usize) -> Result<Vec<f32>, String> {
    let (outer, w, inner) = around(piece_shape, axis)
        .ok_or_else(|| format!("axis {axis} of a {piece_shape:?} tensor"))?;
    for p in pieces {
        check(p, piece_shape)?;
    }
    let mut out = Vec::with_capacity(outer * w * inner * pieces.len());
    for o in 0..outer {
        for p in pieces {
            out.extend_from_slice(&p[o * w * inner..(o + 1) * w * inner]);
        }
    }
    Ok(out)
}

fn check(data: &[f32], shape: &[usize]) -> Result<(), String> {
    let n: usize = shape.iter().product();
    if data.len() == n {
        Ok(())
    } else {
        Err(format!("{} elements for shape {shape:?}", data.len()))
    }
}

/// The flat piece `i` of `size` pieces of ⌈n / size⌉ elements, zero-padded.
pub fn flat_piece(data: &[f32], size: usize, i: usize) -> Vec<f32> {
    let per = data.len().div_ceil(size.max(1));
    let mut out = vec![0.0; per];
    let start = (per * i).min(data.len());
    let end = (start + per).min(data.len());
    out[..end - start].copy_from_slice(&data[start..end]);
    out
}

/// Visits every element of the box `b` of a tensor of shape `full`: `f(flat index in full,
/// running index in the box)`.
fn visit_box(full: &[usize], b: &[(u64, u64)], mut f: impl FnMut(usize, usize)) {
    let rank = full.len();
    if rank == 0 {
        f(0, 0);
        return;
    }
    let lo: Vec<usize> = b.iter().map(|r| r.0 as usize).collect();
    let hi: Vec<usize> = b.iter().map(|r| r.1 as usize).collect();
    if lo.len() != rank || lo.iter().zip(&hi).any(|(l, h)| l >= h) {
        return;
    }
    let mut idx = lo.clone();
    let mut k = 0;
    loop {
        let mut flat = 0;
        for a in 0..rank {
            flat = flat * full[a] + idx[a];
        }
        f(flat, k);
        k += 1;
        let mut a = rank;
        loop {
            if a == 0 {
                return;
            }
            a -= 1;
            idx[a] += 1;
            if idx[a] < hi[a] {
                break;
            }
            idx[a] = lo[a];
        }
    }
}

/// The rank's tensor-parallel shard of a full tensor: its boxes concatenated along the split
/// `axis` (the local layout codegen declares), then the slice's zero padding, flattened.
pub fn extract(full: &[f32], shape: &[usize], slice: &Slice, axis: usize) -> Vec<f32> {
    let pieces: Vec<(Vec<usize>, Vec<f32>)> = slice
        .boxes
        .iter()
        .map(|b| {
            let mut v = Vec::new();
            visit_box(shape, b, |i, _| v.push(full.get(i).copied().unwrap_or(0.0)));
            (b.iter().map(|r| (r.1 - r.0) as usize).collect(), v)
        })
        .collect();
    let joined = join(&pieces, axis);
    match (slice.pad, pieces.first()) {
        (Some(p), Some((box_shape, _))) if pieces.len() == 1 => {
            pad_along(&joined, box_shape, p.axis, p.rows as usize)
        }
        _ => joined,
    }
}

/// `data` (shape `shape`) with `rows` zero rows appended along `axis`.
fn pad_along(data: &[f32], shape: &[usize], axis: usize, rows: usize) -> Vec<f32> {
    let Some((outer, dim, inner)) = around(shape, axis) else {
        return data.to_vec();
    };
    let mut out = Vec::with_capacity(outer * (dim + rows) * inner);
    for o in 0..outer {
        out.extend_from_slice(
            data.get(o * dim * inner..(o + 1) * dim * inner)
                .unwrap_or(&[]),
        );
        out.resize(out.len() + rows * inner, 0.0);
    }
    out
}

/// Writes a local shard (as [`extract`] lays it out) back into `full`; `owned` limits it to
/// the flat range of the local shard the caller holds.
pub fn insert(
    full: &mut [f32],
    shape: &[usize],
    slice: &Slice,
    axis: usize,
    local: &[f32],
    owned: (usize, usize),
) {
    // Local index of each box element, in the box's own order.
    let mut local_index = Vec::new();
    let mut offset_along = 0;
    let widths: Vec<usize> = slice
        .boxes
        .iter()
        .map(|b| b.get(axis).map_or(1, |r| (r.1 - r.0) as usize))
        .collect();
    // The local shard's length along the axis: the boxes', then the zero padding.
    let total_w: usize = widths.iter().sum::<usize>() + slice.pad.map_or(0, |p| p.rows as usize);
    for (b, &w) in slice.boxes.iter().zip(&widths) {
        let bshape: Vec<usize> = b.iter().map(|r| (r.1 - r.0) as usize).collect();
        let inner: usize = bshape.get(axis + 1..).map_or(1, |s| s.iter().product());
        let mut idx = Vec::new();
        visit_box(shape, b, |g, k| {
            // k = (outer · w + j) · inner + r in the box; local = (outer · W + off + j) · inner + r.
            let r = k % inner.max(1);
            let oj = k / inner.max(1);
            let (o, j) = (oj / w.max(1), oj % w.max(1));
            idx.push((g, (o * total_w + offset_along + j) * inner + r));
        });
        local_index.extend(idx);
        offset_along += w;
    }
    for (g, l) in local_index {
        if l >= owned.0
            && l < owned.1
            && let (Some(dst), Some(&src)) = (full.get_mut(g), local.get(l - owned.0))
        {
            *dst = src;
        }
    }
}

fn join(pieces: &[(Vec<usize>, Vec<f32>)], axis: usize) -> Vec<f32> {
    match pieces {
        [] => Vec::new(),
        [(_, one)] => one.clone(),
        _ => {
            let shape = &pieces[0].0;
            let datas: Vec<Vec<f32>> = pieces.iter().map(|p| p.1.clone()).collect();
            concat(&datas, shape, axis).unwrap_or_else(|_| datas.concat())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use program::{ParamShard, TpSplit};

    #[test]
    fn parts_concat_back() {
        let shape = [2, 6, 3];
        let data: Vec<f32> = (0..36).map(|x| x as f32).collect();
        let ps: Vec<Vec<f32>> = (0..3)
            .map(|i| part(&data, &shape, 1, 3, i).unwrap())
            .collect();
        assert_eq!(concat(&ps, &[2, 2, 3], 1).unwrap(), data);
    }

    #[test]
    fn fused_blocks_extract_and_insert() {
        let shape = [4usize, 6];
        let full: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let sh = ParamShard {
            param: program::ParamId(0),
            tp: Some(TpSplit {
                axis: 1,
                blocks: 3,
                part: None,
                padded: false,
            }),
            zero: false,
            expert: false,
            init: program::BufferId(0),
        };
        let mut back = vec![0.0; 24];
        for r in 0..2 {
            let s = sh.slice(&[4, 6], 2, r, 1, 0);
            let local = extract(&full, &shape, &s, 1);
            assert_eq!(local.len(), 12);
            // Row 0 of rank 1: columns 1, 3, 5.
            if r == 1 {
                assert_eq!(&local[..3], &[1.0, 3.0, 5.0]);
            }
            insert(&mut back, &shape, &s, 1, &local, (0, 12));
        }
        assert_eq!(back, full);
    }

    /// A vocabulary of 5 rows over 4 ranks: pieces of 2 rows, the last ones zero-padded
    /// (rank 3 holds only padding); the pieces write back to the whole table.
    #[test]
    fn padded_rows_extract_and_insert() {
        let shape = [5usize, 3];
        let full: Vec<f32> = (1..=15).map(|x| x as f32).collect();
        let sh = ParamShard {
            param: program::ParamId(0),
            tp: Some(TpSplit {
                axis: 0,
                blocks: 1,
                part: None,
                padded: true,
            }),
            zero: false,
            expert: false,
            init: program::BufferId(0),
        };
        let mut back = vec![0.0; 15];
        let mut pieces = Vec::new();
        for r in 0..4 {
            let s = sh.slice(&[5, 3], 4, r, 1, 0);
            assert_eq!(s.len(), 6, "rank {r}");
            let local = extract(&full, &shape, &s, 0);
            assert_eq!(local.len(), 6);
            insert(&mut back, &shape, &s, 0, &local, (0, 6));
            pieces.push(local);
        }
        assert_eq!(pieces[2], [13.0, 14.0, 15.0, 0.0, 0.0, 0.0]);
        assert_eq!(pieces[3], [0.0; 6]);
        assert_eq!(back, full);
    }

    /// Padding along a later axis (a head weight [hidden, vocab] split by columns).
    #[test]
    fn padded_columns_extract() {
        let shape = [2usize, 3];
        let full: Vec<f32> = (1..=6).map(|x| x as f32).collect();
        let split = TpSplit {
            axis: 1,
            blocks: 1,
            part: None,
            padded: true,
        };
        let sh = ParamShard {
            param: program::ParamId(0),
            tp: Some(split),
            zero: true,
            expert: false,
            init: program::BufferId(0),
        };
        let s = sh.slice(&[2, 3], 2, 1, 2, 1);
        assert_eq!(extract(&full, &shape, &s, 1), [3.0, 0.0, 6.0, 0.0]);
        // ZeRO's slices cover the padded shard: 4 elements over 2 ranks.
        assert_eq!(s.owned, (2, 4));
    }
}
