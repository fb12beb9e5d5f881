//! Shape arithmetic shared by the kernels: operand counts, rows, broadcasting, indices.

use crate::tensor::numel;
use crate::{KernelError, Tensor32};

/// Exactly `N` operands, or an arity error naming the op.
pub(crate) fn operands<'t, const N: usize>(
    op: &'static str,
    inputs: &[&'t Tensor32],
) -> Result<[&'t Tensor32; N], KernelError> {
    <[&Tensor32; N]>::try_from(inputs).map_err(|_| KernelError::Arity {
        op,
        want: N,
        got: inputs.len(),
    })
}

/// Splits a shape `[.., n]` into (number of rows, n); `n` must be positive.
pub(crate) fn rows(
    op: &'static str,
    what: &'static str,
    t: &Tensor32,
) -> Result<(usize, usize), KernelError> {
    match t.shape.last() {
        Some(&n) if n > 0 => Ok((t.data.len() / n, n)),
        _ => Err(KernelError::Shape {
            op,
            what,
            got: t.shape.clone(),
            want: "a non-empty last axis".into(),
        }),
    }
}

/// Requires `t` to have shape `want`.
pub(crate) fn expect_shape(
    op: &'static str,
    what: &'static str,
    t: &Tensor32,
    want: &[usize],
) -> Result<(), KernelError> {
    if t.shape != want {
        return Err(KernelError::Shape {
            op,
            what,
            got: t.shape.clone(),
            want: format!("{want:?}"),
        });
    }
    Ok(())
}

/// Numpy broadcasting of two shapes, aligned at the end.
pub(crate) fn broadcast_shape(
    op: &'static str,
    a: &[usize],
    b: &[usize],
) -> Result<Vec<usize>, KernelError> {
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
            _ => Err(KernelError::Shape {
                op,
                what: "second operand",
                got: b.to_vec(),
                want: format!("a shape that broadcasts with {a:?}"),
            }),
        })
        .collect()
}

/// How an operand of a broadcast is read at each flat output index.
#[derive(Debug)]
pub(crate) enum Reader {
    /// Same shape as the output: index i.
    Same,
    /// The operand's shape is a suffix of the output's (bias-like): index i mod n.
    Suffix(usize),
    /// Anything else: an explicit map (numpy broadcasting in full generality).
    Map(Vec<usize>),
}

impl Reader {
    pub(crate) fn new(
        op: &'static str,
        from: &[usize],
        out: &[usize],
    ) -> Result<Reader, KernelError> {
        if from == out {
            return Ok(Reader::Same);
        }
        // Leading 1s do not change the layout: [1, 1, H] reads like [H].
        let core = &from[from.iter().take_while(|&&d| d == 1).count()..];
        if core.len() <= out.len() && out[out.len() - core.len()..] == *core {
            return Ok(Reader::Suffix(core.iter().product::<usize>().max(1)));
        }
        Ok(Reader::Map(broadcast_map(op, from, out)?))
    }

    #[inline]
    pub(crate) fn at(&self, i: usize) -> usize {
        match self {
            Reader::Same => i,
            Reader::Suffix(n) => i % n,
            Reader::Map(m) => m[i],
        }
    }
}

/// For each element of a tensor of shape `out` (row-major), the flat index of the element of a
/// tensor of shape `from` that numpy broadcasting reads there.
pub(crate) fn broadcast_map(
    op: &'static str,
    from: &[usize],
    out: &[usize],
) -> Result<Vec<usize>, KernelError> {
    let fits = from.len() <= out.len()
        && from
            .iter()
            .zip(&out[out.len() - from.len()..])
            .all(|(&f, &o)| f == o || f == 1);
    if !fits {
        return Err(KernelError::Shape {
            op,
            what: "operand",
            got: from.to_vec(),
            want: format!("a shape that broadcasts to {out:?}"),
        });
    }
    let n = numel(out)?;
    let offset = out.len() - from.len();
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

/// Sums `g` (laid out like the broadcast output) back onto a tensor of shape `from`, in f64 so
/// a long broadcast axis does not lose precision.
pub(crate) fn unbroadcast(
    g: &[f64],
    reader: &Reader,
    from: &[usize],
) -> Result<Tensor32, KernelError> {
    let mut acc = vec![0f64; numel(from)?];
    for (i, &gi) in g.iter().enumerate() {
        if let Some(slot) = acc.get_mut(reader.at(i)) {
            *slot += gi;
        }
    }
    Ok(Tensor32 {
        shape: from.to_vec(),
        data: acc.into_iter().map(|x| x as f32).collect(),
    })
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// An integer stored as f32, checked to be a whole number in `0..bound`.
pub(crate) fn index_value(
    op: &'static str,
    what: &'static str,
    v: f32,
    bound: usize,
) -> Result<usize, KernelError> {
    if v.fract() == 0.0 && v >= 0.0 && (v as f64) < bound as f64 {
        Ok(v as usize)
    } else {
        Err(KernelError::BadIndex {
            op,
            what,
            value: v,
            bound,
        })
    }
}

/// A `u64` attribute as `usize`.
pub(crate) fn attr_usize(op: &'static str, n: u64) -> Result<usize, KernelError> {
    usize::try_from(n).map_err(|_| KernelError::Attribute {
        op,
        reason: format!("size {n} does not fit in memory"),
    })
}
