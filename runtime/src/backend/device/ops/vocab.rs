//! Vocabulary-parallel shard ops on the device (`vocab.cu`); `None` for operands of another
//! shape, which the host path takes (and reports).

use super::{Buf, pointwise_grid, row_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, GemmPrecision, KernelArg, bf16_gemm};
use crate::backend::vocab::VocabShard;

/// Whether `op` reads operand `operand` where it lies when held at a pitch: the loss's
/// statistics and gradient take the logits' row pitch.
pub(in crate::backend::device) fn reads_pitched(op: &VocabShard, operand: usize) -> bool {
    matches!(
        op,
        VocabShard::LossStats { .. } | VocabShard::LossGrad { .. }
    ) && operand == 0
}

/// Whether the kernels read each of `xs` as it is held: dense f32 values, or the logits at
/// their pitch ([`reads_pitched`]); otherwise the host path reads them (and reports it).
fn readable<D: Device>(op: &VocabShard, xs: &[&Buf<D>]) -> bool {
    xs.iter()
        .enumerate()
        .all(|(i, x)| !x.f32_lazy && (x.pitch.is_none() || reads_pitched(op, i)))
}

/// The results of `op` on the device, or `None` for the host path.
pub(in crate::backend::device) fn run<D: Device>(
    b: &DeviceBackend<D>,
    op: &VocabShard,
    xs: &[&Buf<D>],
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    if !readable::<D>(op, xs) {
        return Ok(None);
    }
    let one = |r: Option<Buf<D>>| r.map(|y| vec![y]);
    Ok(match (op, xs) {
        (VocabShard::Embedding { start }, &[table, ids]) => one(embedding(b, table, ids, *start)?),
        (VocabShard::EmbeddingGrad { start, table_shape }, &[ids, dy]) => {
            one(embedding_grad(b, ids, dy, table_shape, *start)?)
        }
        (VocabShard::LossStats { start, valid }, &[logits, targets]) => {
            one(loss_stats(b, logits, targets, *start, *valid)?)
        }
        (VocabShard::LossCombine, &[stats]) => loss_combine(b, stats)?,
        (VocabShard::LossGrad { start, valid }, &[logits, targets, lse, dloss]) => {
            one(loss_grad(b, [logits, targets, lse, dloss], *start, *valid)?)
        }
        _ => None,
    })
}

fn embedding<D: Device>(
    b: &DeviceBackend<D>,
    table: &Buf<D>,
    ids: &Buf<D>,
    start: usize,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[rows, h] = table.shape.as_slice() else {
        return Ok(None);
    };
    let mut shape = ids.shape.clone();
    shape.push(h);
    let mut y = b.alloc(&shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "shard_embedding",
        pointwise_grid(block, y.len),
        block,
        &mut [
            KernelArg::Out(&mut y.mem),
            KernelArg::In(&table.mem),
            KernelArg::In(&ids.mem),
            size(ids.len),
            size(h),
            size(rows),
            size(start),
        ],
    )?;
    Ok(Some(y))
}

fn embedding_grad<D: Device>(
    b: &DeviceBackend<D>,
    ids: &Buf<D>,
    dy: &Buf<D>,
    table_shape: &[usize],
    start: usize,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let &[rows, h] = table_shape else {
        return Ok(None);
    };
    if dy.len != ids.len * h || dy.shape.last() != Some(&h) {
        return Ok(None);
    }
    let mut dtable = b.alloc_zeroed(table_shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "shard_embedding_grad",
        pointwise_grid(block, dy.len),
        block,
        &mut [
            KernelArg::Out(&mut dtable.mem),
            KernelArg::In(&ids.mem),
            KernelArg::In(&dy.mem),
            size(ids.len),
            size(h),
            size(rows),
            size(start),
        ],
    )?;
    Ok(Some(dtable))
}

/// `(positions, n)` of logits `[.., n]` whose rows match the targets one to one.
fn logit_rows<D: Device>(logits: &Buf<D>, targets: &Buf<D>) -> Option<(usize, usize)> {
    let n = *logits.shape.last()?;
    (n > 0 && logits.len == targets.len * n).then_some((targets.len, n))
}

fn loss_stats<D: Device>(
    b: &DeviceBackend<D>,
    logits: &Buf<D>,
    targets: &Buf<D>,
    start: usize,
    valid: usize,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some((positions, n)) = logit_rows::<D>(logits, targets) else {
        return Ok(None);
    };
    let mut stats = b.alloc(&[1, positions, 3])?;
    b.device.launch(
        "shard_loss_stats",
        row_grid(positions),
        b.device.block_size(),
        &mut [
            KernelArg::Out(&mut stats.mem),
            KernelArg::In(&logits.mem),
            KernelArg::In(&targets.mem),
            size(positions),
            size(n),
            size(logits.pitch.unwrap_or(n)),
            size(start),
            size(valid.min(n)),
        ],
    )?;
    Ok(Some(stats))
}

fn loss_combine<D: Device>(
    b: &DeviceBackend<D>,
    stats: &Buf<D>,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let &[shards, positions, 3] = stats.shape.as_slice() else {
        return Ok(None);
    };
    if shards == 0 || positions == 0 {
        return Ok(None);
    }
    let (mut loss, mut lse) = (b.alloc(&[])?, b.alloc(&[positions])?);
    b.device.launch(
        "shard_loss_combine",
        1,
        b.device.block_size(),
        &mut [
            KernelArg::Out(&mut loss.mem),
            KernelArg::Out(&mut lse.mem),
            KernelArg::In(&stats.mem),
            size(shards),
            size(positions),
        ],
    )?;
    Ok(Some(vec![loss, lse]))
}

fn loss_grad<D: Device>(
    b: &DeviceBackend<D>,
    [logits, targets, lse, dloss]: [&Buf<D>; 4],
    start: usize,
    valid: usize,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some((positions, n)) = logit_rows::<D>(logits, targets) else {
        return Ok(None);
    };
    if lse.len != positions || dloss.len != 1 {
        return Ok(None);
    }
    let mut d = b.alloc(&logits.shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "shard_loss_grad",
        pointwise_grid(block, d.len),
        block,
        &mut [
            KernelArg::Out(&mut d.mem),
            KernelArg::In(&logits.mem),
            KernelArg::In(&targets.mem),
            KernelArg::In(&lse.mem),
            KernelArg::In(&dloss.mem),
            size(positions),
            size(n),
            size(logits.pitch.unwrap_or(n)),
            size(start),
            size(valid.min(n)),
        ],
    )?;
    Ok(Some(d))
}

/// The loss's gradient on a shard made as the bf16 operand the LM head's backward GEMMs read
/// (`to_bf16`'s copy: rows padded to a multiple of 8 columns with zeros,
/// [`bf16_gemm::copy_layout`]) and nothing else, held at that pitch as words alone
/// ([`DeviceBackend::alloc_operand`]); each value is `shard_loss_grad`'s rounded once to
/// nearest even, as `to_bf16` would round it. `None` outside a bf16 plan (no GEMM reads
/// bf16), for another op, or where the host path takes the operands.
pub(in crate::backend::device) fn loss_grad_operand<D: Device>(
    b: &DeviceBackend<D>,
    op: &VocabShard,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let (&VocabShard::LossGrad { start, valid }, &[logits, targets, lse, dloss]) = (op, xs) else {
        return Ok(None);
    };
    let Some((positions, n)) = logit_rows::<D>(logits, targets) else {
        return Ok(None);
    };
    let usable = b.gemm_precision == GemmPrecision::Bf16 && readable::<D>(op, xs);
    if !usable || lse.len != positions || dloss.len != 1 {
        return Ok(None);
    }
    let (operand, _) = bf16_gemm::copy_layout(1, (positions, n), positions * n);
    let mut d = b.alloc_operand(&logits.shape, operand.pitch)?;
    let words = d.bf16.get_mut().ok_or_else(|| RuntimeError::DeviceLaunch {
        kernel: "shard_loss_grad_words",
        message: "an operand-form buffer without its words".into(),
    })?;
    let block = b.device.block_size();
    b.device.launch(
        "shard_loss_grad_words",
        pointwise_grid(block, positions * operand.pitch / 2),
        block,
        &mut [
            KernelArg::Out(words),
            KernelArg::In(&logits.mem),
            KernelArg::In(&targets.mem),
            KernelArg::In(&lse.mem),
            KernelArg::In(&dloss.mem),
            size(positions),
            size(logits.pitch.unwrap_or(n)),
            size(start),
            size(valid.min(n)),
            size(operand.pitch),
        ],
    )?;
    Ok(Some(d))
}
