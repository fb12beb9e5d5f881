//! `Dropout{p, seed}`: inverted dropout with the interpreter's mask function
//! ([`ir::interp::dropout_keep`], a pure function of (seed, flat index)), so a kernel run, the
//! reference and any sharded re-execution drop exactly the same elements.

use ir::interp::dropout_keep;

use crate::shape::expect_shape;
use crate::{KernelError, Tensor32};

const OP: &str = "dropout";

pub(crate) fn dropout(x: &Tensor32, p: f64, seed: u64) -> Result<Tensor32, KernelError> {
    if !(0.0..1.0).contains(&p) {
        return Err(KernelError::Attribute {
            op: OP,
            reason: format!("probability {p} is not in [0, 1)"),
        });
    }
    let scale = 1.0 / (1.0 - p);
    Ok(Tensor32 {
        shape: x.shape.clone(),
        data: x
            .data
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if dropout_keep(seed, i as u64, p) {
                    (f64::from(v) * scale) as f32
                } else {
                    0.0
                }
            })
            .collect(),
    })
}

/// The same mask applied to the output gradient.
pub(crate) fn dropout_vjp(
    x: &Tensor32,
    p: f64,
    seed: u64,
    g: &Tensor32,
) -> Result<Tensor32, KernelError> {
    expect_shape(OP, "output gradient", g, &x.shape)?;
    dropout(g, p, seed)
}
