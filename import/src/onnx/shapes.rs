//! Shape arithmetic shared by the folder and the lowering (both must agree on ONNX's rules).

use super::node::NodeRef;
use super::value::checked_numel;
use crate::ImportError;

/// Numpy broadcasting of several shapes.
pub fn broadcast(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let pad = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = out.get_mut(pad + i)?;
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// The target of `Reshape`: `0` copies the input dimension (unless `allowzero`), `-1` is inferred.
pub fn reshape_target(
    n: &NodeRef<'_>,
    input: &[usize],
    spec: &[i64],
    allowzero: bool,
) -> Result<Vec<usize>, ImportError> {
    let too_big = || n.bad(format!("reshape of {input:?} to {spec:?} overflows"));
    let numel = checked_numel(input).ok_or_else(too_big)?;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        out.push(match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            0 if !allowzero => *input.get(i).ok_or_else(|| {
                n.bad(format!("shape {spec:?} copies dimension {i} of {input:?}"))
            })?,
            s if s >= 0 => s as usize,
            _ => return Err(n.bad(format!("invalid reshape target {spec:?}"))),
        });
    }
    let known = checked_numel(&out).ok_or_else(too_big)?;
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(n.bad(format!("cannot reshape {input:?} to {spec:?}")));
        }
        if let Some(d) = out.get_mut(i) {
            *d = numel / known;
        }
    } else if known != numel {
        return Err(n.bad(format!("cannot reshape {input:?} to {spec:?}")));
    }
    Ok(out)
}

/// Output shape of `Unsqueeze` (axes index the output).
pub fn unsqueeze(
    n: &NodeRef<'_>,
    input: &[usize],
    axes: &[i64],
) -> Result<Vec<usize>, ImportError> {
    let rank = input.len() + axes.len();
    let axes = n.axes(axes, rank)?;
    let mut rest = input.iter();
    Ok((0..rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                rest.next().copied().unwrap_or(1)
            }
        })
        .collect())
}

/// Output shape of `Squeeze`; without axes every size-1 dimension goes.
pub fn squeeze(
    n: &NodeRef<'_>,
    input: &[usize],
    axes: Option<&[i64]>,
) -> Result<Vec<usize>, ImportError> {
    match axes {
        None => Ok(input.iter().copied().filter(|&d| d != 1).collect()),
        Some(axes) => {
            let axes = n.axes(axes, input.len())?;
            if let Some(&a) = axes.iter().find(|&&a| input.get(a) != Some(&1)) {
                return Err(n.bad(format!("cannot squeeze axis {a} of {input:?}")));
            }
            Ok(input
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect())
        }
    }
}

/// One axis of an ONNX `Slice`, clamped the way the spec says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisSlice {
    pub axis: usize,
    pub start: i64,
    pub step: i64,
    pub len: usize,
}

/// Resolves `Slice` inputs (starts, ends, axes, steps) against `shape`.
pub fn slices(
    n: &NodeRef<'_>,
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Vec<AxisSlice>, ImportError> {
    if starts.len() != ends.len() {
        return Err(n.bad("starts and ends differ in length"));
    }
    let default_axes: Vec<i64> = (0..starts.len() as i64).collect();
    let axes = axes.unwrap_or(&default_axes);
    let mut out = Vec::new();
    for (i, (&s, &e)) in starts.iter().zip(ends).enumerate() {
        let axis = n.axis(
            *axes.get(i).ok_or_else(|| n.bad("fewer axes than starts"))?,
            shape.len(),
        )?;
        let step = steps.and_then(|st| st.get(i).copied()).unwrap_or(1);
        if step == 0 {
            return Err(n.bad("slice step 0"));
        }
        let dim = shape.get(axis).copied().unwrap_or(0) as i64;
        let norm = |x: i64| if x < 0 { x.saturating_add(dim) } else { x };
        let (start, end) = if step > 0 {
            (norm(s).clamp(0, dim), norm(e).clamp(0, dim))
        } else {
            (norm(s).clamp(-1, dim - 1), norm(e).clamp(-1, dim - 1))
        };
        let (span, stride) = if step > 0 {
            (end - start, step)
        } else {
            let stride = step
                .checked_neg()
                .ok_or_else(|| n.bad("slice step out of range"))?;
            (start - end, stride)
        };
        let len = if span > 0 { (span - 1) / stride + 1 } else { 0 };
        out.push(AxisSlice {
            axis,
            start,
            step,
            len: len as usize,
        });
    }
    Ok(out)
}

/// Part sizes of `Split` along a dimension of size `dim` into `outputs` parts.
pub fn split_sizes(
    n: &NodeRef<'_>,
    dim: usize,
    split: Option<Vec<i64>>,
    outputs: usize,
) -> Result<Vec<usize>, ImportError> {
    if let Some(split) = split {
        let sizes = split
            .iter()
            .map(|&s| usize::try_from(s).map_err(|_| n.bad(format!("negative split {split:?}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(dim) || sizes.len() != outputs {
            return Err(n.bad(format!(
                "split {split:?} does not cover dimension {dim} in {outputs} parts"
            )));
        }
        return Ok(sizes);
    }
    if outputs == 0 {
        return Err(n.bad("split has no outputs"));
    }
    // Equal parts, the last one smaller when the dimension does not divide (opset 18).
    let part = dim.div_ceil(outputs);
    Ok((0..outputs)
        .map(|i| part.min(dim.saturating_sub(i * part)))
        .collect())
}
