//! `ReduceSum` and `ReduceMean` over the last axis (kept with size 1), summed in f64.

use crate::shape::rows;
use crate::{KernelError, Tensor32};

fn name(mean: bool) -> &'static str {
    if mean { "reduce_mean" } else { "reduce_sum" }
}

pub(crate) fn reduce(x: &Tensor32, mean: bool) -> Result<Tensor32, KernelError> {
    let (_, n) = rows(name(mean), "operand", x)?;
    let div = if mean { n as f64 } else { 1.0 };
    let mut shape = x.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = 1;
    }
    Ok(Tensor32 {
        shape,
        data: x
            .data
            .chunks_exact(n)
            .map(|row| (row.iter().map(|&v| f64::from(v)).sum::<f64>() / div) as f32)
            .collect(),
    })
}

/// Every element of a row receives the row's output gradient (divided by n for the mean).
pub(crate) fn reduce_vjp(x: &Tensor32, g: &Tensor32, mean: bool) -> Result<Tensor32, KernelError> {
    let (r, n) = rows(name(mean), "operand", x)?;
    if g.data.len() != r {
        return Err(KernelError::Shape {
            op: name(mean),
            what: "output gradient",
            got: g.shape.clone(),
            want: format!("{r} elements"),
        });
    }
    let div = if mean { n as f64 } else { 1.0 };
    Ok(Tensor32 {
        shape: x.shape.clone(),
        data: g
            .data
            .iter()
            .flat_map(|&gi| std::iter::repeat_n((f64::from(gi) / div) as f32, n))
            .collect(),
    })
}
