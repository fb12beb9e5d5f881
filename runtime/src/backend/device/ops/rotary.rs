//! Rotary position embedding (`rotary.cu`) and its gradient (the opposite turn), with the
//! frequency table computed once per (θ, head width, scaling) by `ir::RopeScaling` in f64.

use ir::{OpKind, RopeScaling};

use super::{Buf, pointwise_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, KernelArg};

/// `(batch, seq, heads, d)` of a rotary operand `[B, S, heads·d]` with an even `d`.
fn dims(shape: &[usize], heads: u64) -> Option<(usize, usize, usize, usize)> {
    let heads = usize::try_from(heads).ok()?;
    let &[b, s, w] = shape else { return None };
    (heads > 0 && w % heads == 0 && (w / heads) % 2 == 0).then(|| (b, s, heads, w / heads))
}

/// Each inverse frequency as two floats whose sum is it to ~48 bits (the kernel adds them in
/// f64), so long sequences' angles match the CPU kernel's f64 ones.
fn split_frequencies(scaling: &RopeScaling, theta: f64, d: usize) -> Vec<f32> {
    scaling
        .inv_freq(theta, d)
        .into_iter()
        .flat_map(|f| {
            let hi = f as f32;
            [hi, (f - f64::from(hi)) as f32]
        })
        .collect()
}

/// `x` turned by its positions' angles (`sign` 1), or back (`sign` −1: the gradient of `x`
/// for output gradient `x`); the positions are the tokens' indices, or `pos` (one per token of
/// the sequence) where given.
pub(super) fn rotate<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    x: &Buf<D>,
    sign: f64,
    pos: Option<&D::Mem>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let OpKind::Rotary {
        heads,
        theta,
        scaling,
    } = kind
    else {
        return Ok(None);
    };
    let Some((batch, seq, heads, d)) = dims(&x.shape, *heads) else {
        return Ok(None);
    };
    let mut y = b.alloc(&x.shape)?;
    let n = batch * seq * heads * (d / 2);
    if n == 0 {
        return Ok(Some(y));
    }
    let key = format!("rotary/{theta:?}/{d}/{scaling:?}");
    let block = b.device.block_size();
    b.with_table(
        key,
        || split_frequencies(scaling, *theta, d),
        |freq| {
            b.device.launch(
                "rotary",
                pointwise_grid(block, n),
                block,
                &mut [
                    KernelArg::Out(&mut y.mem),
                    KernelArg::In(&x.mem),
                    KernelArg::In(freq),
                    pos.map_or(KernelArg::Null, KernelArg::In),
                    size(batch),
                    size(seq),
                    size(heads),
                    size(d),
                    KernelArg::F64(scaling.attention_factor()),
                    KernelArg::F64(scaling.temperature().0),
                    KernelArg::F64(scaling.temperature().1),
                    KernelArg::F64(sign),
                ],
            )
        },
    )?;
    Ok(Some(y))
}
