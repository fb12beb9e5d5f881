//! Vocabulary-parallel embedding and cross-entropy (Megatron-LM's `VocabParallelEmbedding` and
//! `vocab_parallel_cross_entropy`): a rank holds table rows (logit columns) `start .. start + n`.
//! A token outside them contributes zeros to the lookup, so the group's sum of the outputs is
//! the whole table's; the loss combines each shard's (max, sum of exponentials, target logit).

use crate::tensor::numel;
use crate::{KernelError, Tensor32};

const OP: &str = "vocab_embedding";

fn table_rows(table_shape: &[usize]) -> Result<(usize, usize), KernelError> {
    match table_shape {
        &[n, h] => Ok((n, h)),
        s => Err(KernelError::Shape {
            op: OP,
            what: "table shard",
            got: s.to_vec(),
            want: "[rows, hidden]".into(),
        }),
    }
}

/// The local row of token `id`, if the shard `start .. start + n` holds it.
fn local_row(id: f32, start: usize, n: usize) -> Option<usize> {
    let id = id as i64 - start as i64;
    (0..n as i64).contains(&id).then_some(id as usize)
}

/// Rows of the tokens in the shard; zeros for the others.
pub fn shard_embedding(
    table: &Tensor32,
    ids: &Tensor32,
    start: usize,
) -> Result<Tensor32, KernelError> {
    let (n, h) = table_rows(&table.shape)?;
    let mut shape = ids.shape.clone();
    shape.push(h);
    let mut data = vec![0f32; numel(&shape)?];
    for (out, &id) in data.chunks_exact_mut(h.max(1)).zip(&ids.data) {
        if let Some(r) = local_row(id, start, n) {
            out.copy_from_slice(&table.data[r * h..(r + 1) * h]);
        }
    }
    Ok(Tensor32 { shape, data })
}

/// The shard's gradient: `dy`'s rows summed into the rows of their tokens (in f64, as the
/// whole-table adjoint does), zero for rows no token hit.
pub fn shard_embedding_grad(
    ids: &Tensor32,
    dy: &Tensor32,
    table_shape: &[usize],
    start: usize,
) -> Result<Tensor32, KernelError> {
    let (n, h) = table_rows(table_shape)?;
    if dy.data.len() != ids.data.len() * h || dy.shape.last() != Some(&h) {
        return Err(KernelError::Shape {
            op: OP,
            what: "output gradient",
            got: dy.shape.clone(),
            want: format!("{:?} + [{h}]", ids.shape),
        });
    }
    let mut acc = vec![0f64; n * h];
    for (&id, g) in ids.data.iter().zip(dy.data.chunks_exact(h.max(1))) {
        if let Some(r) = local_row(id, start, n) {
            for (d, &gv) in acc[r * h..(r + 1) * h].iter_mut().zip(g) {
                *d += f64::from(gv);
            }
        }
    }
    Ok(Tensor32 {
        shape: table_shape.to_vec(),
        data: acc.into_iter().map(|x| x as f32).collect(),
    })
}

fn logit_rows(logits: &Tensor32, targets: &Tensor32) -> Result<(usize, usize), KernelError> {
    let n = logits.shape.last().copied().unwrap_or(0);
    let rows = targets.data.len();
    if n == 0 || logits.data.len() != rows * n {
        return Err(KernelError::Shape {
            op: "vocab_loss",
            what: "logits",
            got: logits.shape.clone(),
            want: format!("{:?} + [vocabulary shard]", targets.shape),
        });
    }
    Ok((rows, n))
}

/// Per position: the shard's max logit, Σ exp(logit − max), and the target's logit if the
/// shard holds the target (else 0), as `[1, rows, 3]`, over the shard's first `valid` columns
/// (those past it pad a vocabulary that does not divide by the group; a shard of padding
/// only gives max −∞ and sum 0, which the combination weighs as nothing).
pub fn shard_loss_stats(
    logits: &Tensor32,
    targets: &Tensor32,
    start: usize,
    valid: usize,
) -> Result<Tensor32, KernelError> {
    let (rows, n) = logit_rows(logits, targets)?;
    let valid = valid.min(n);
    let mut data = Vec::with_capacity(rows * 3);
    for (row, &t) in logits.data.chunks_exact(n).zip(&targets.data) {
        let row = &row[..valid];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row
            .iter()
            .map(|&z| (f64::from(z) - f64::from(max)).exp())
            .sum();
        let target = local_row(t, start, valid).map_or(0.0, |c| row[c]);
        data.extend([max, sum as f32, target]);
    }
    Ok(Tensor32 {
        shape: vec![1, rows, 3],
        data,
    })
}

/// The mean loss `[]` and each position's log-sum-exp `[rows]` from the gathered
/// `[shards, rows, 3]` statistics (accumulated in f64).
pub fn shard_loss_combine(stats: &Tensor32) -> Result<(Tensor32, Tensor32), KernelError> {
    let (shards, rows) = match stats.shape.as_slice() {
        &[s, r, 3] if s > 0 && r > 0 => (s, r),
        s => {
            return Err(KernelError::Shape {
                op: "vocab_loss_combine",
                what: "statistics",
                got: s.to_vec(),
                want: "[shards, positions, 3]".into(),
            });
        }
    };
    let at = |s: usize, r: usize, k: usize| f64::from(stats.data[(s * rows + r) * 3 + k]);
    let mut lse = Vec::with_capacity(rows);
    let mut total = 0f64;
    for r in 0..rows {
        let max = (0..shards)
            .map(|s| at(s, r, 0))
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = (0..shards)
            .filter(|&s| at(s, r, 1) > 0.0)
            .map(|s| at(s, r, 1) * (at(s, r, 0) - max).exp())
            .sum();
        let l = max + sum.ln();
        let target: f64 = (0..shards).map(|s| at(s, r, 2)).sum();
        total += l - target;
        lse.push(l as f32);
    }
    Ok((
        Tensor32::scalar((total / rows as f64) as f32),
        Tensor32 {
            shape: vec![rows],
            data: lse,
        },
    ))
}

/// d loss / d logits on the shard: dloss/N · (exp(logit − lse) − onehot(target)) on its first
/// `valid` columns, zero on the padding past them.
pub fn shard_loss_grad(
    logits: &Tensor32,
    targets: &Tensor32,
    lse: &Tensor32,
    dloss: &Tensor32,
    start: usize,
    valid: usize,
) -> Result<Tensor32, KernelError> {
    let (rows, n) = logit_rows(logits, targets)?;
    let g = match (dloss.data.as_slice(), lse.data.len() == rows) {
        (&[g], true) => f64::from(g) / rows as f64,
        _ => {
            return Err(KernelError::Shape {
                op: "vocab_loss_grad",
                what: "log-sum-exp and loss gradient",
                got: lse.shape.clone(),
                want: format!("[{rows}] and a scalar"),
            });
        }
    };
    let mut data = Vec::with_capacity(rows * n);
    for ((row, &t), &l) in logits
        .data
        .chunks_exact(n)
        .zip(&targets.data)
        .zip(&lse.data)
    {
        let hit = local_row(t, start, valid);
        for (c, &z) in row.iter().enumerate() {
            if c >= valid {
                data.push(0.0);
                continue;
            }
            let p = (f64::from(z) - f64::from(l)).exp();
            let y = if hit == Some(c) { 1.0 } else { 0.0 };
            data.push((g * (p - y)) as f32);
        }
    }
    Ok(Tensor32 {
        shape: logits.shape.clone(),
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], data: Vec<f32>) -> Tensor32 {
        Tensor32 {
            shape: shape.to_vec(),
            data,
        }
    }

    /// The shards' outputs sum to the whole table's lookup, and their gradients are the
    /// whole table's gradient cut into row blocks.
    #[test]
    fn shards_sum_to_the_whole_lookup() {
        let (v, h) = (6usize, 3usize);
        let table: Vec<f32> = (0..v * h).map(|i| i as f32 * 0.5 - 2.0).collect();
        let ids = t(&[2, 3], vec![0.0, 5.0, 2.0, 2.0, 3.0, 1.0]);
        let dy = t(&[2, 3, 3], (0..18).map(|i| (i as f32).sin()).collect());
        let whole = crate::embedding::embedding(&t(&[v, h], table.clone()), &ids).unwrap();
        let whole_grad =
            crate::embedding::embedding_vjp(&t(&[v, h], table.clone()), &ids, &dy).unwrap();
        let mut sum = vec![0f32; whole.data.len()];
        for r in 0..2 {
            let shard = t(&[3, h], table[r * 3 * h..(r + 1) * 3 * h].to_vec());
            let out = shard_embedding(&shard, &ids, r * 3).unwrap();
            for (s, o) in sum.iter_mut().zip(&out.data) {
                *s += o;
            }
            let g = shard_embedding_grad(&ids, &dy, &[3, h], r * 3).unwrap();
            assert_eq!(g.data, whole_grad.data[r * 3 * h..(r + 1) * 3 * h]);
        }
        assert_eq!(sum, whole.data);
    }

    /// Shards' combined loss and gradients equal the whole cross-entropy's: an even split
    /// (6 over 2) and padded ones (5 over 3: the last shard has one real column; 5 over 4:
    /// the last shard is all padding, filled with logits that must not count).
    #[test]
    fn sharded_cross_entropy_equals_the_whole() {
        for (v, tp) in [(6usize, 2usize), (5, 3), (5, 4)] {
            let rows = 4usize;
            let logits: Vec<f32> = (0..rows * v)
                .map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0)
                .collect();
            let targets = t(&[rows], vec![0.0, 4.0, 3.0, 2.0]);
            let whole = t(&[rows, v], logits.clone());
            let loss = crate::loss::cross_entropy(&whole, &targets).unwrap();
            let one = Tensor32::scalar(1.0);
            let grad = crate::loss::cross_entropy_vjp(&whole, &targets, &one).unwrap();
            let c = v.div_ceil(tp);
            let valid = |r: usize| v.saturating_sub(r * c).min(c);
            // A padded column holds 9.0, larger than every real logit.
            let shard = |r: usize| {
                let data = (0..rows)
                    .flat_map(|i| (0..c).map(move |k| (i, r * c + k)))
                    .map(|(i, col)| if col < v { logits[i * v + col] } else { 9.0 })
                    .collect();
                t(&[rows, c], data)
            };
            let mut stats = Vec::new();
            for r in 0..tp {
                let st = shard_loss_stats(&shard(r), &targets, r * c, valid(r)).unwrap();
                stats.extend(st.data);
            }
            let (l, lse) = shard_loss_combine(&t(&[tp, rows, 3], stats)).unwrap();
            let tol = 1e-6 * loss.data[0].abs().max(1.0);
            assert!((l.data[0] - loss.data[0]).abs() <= tol, "{v} over {tp}");
            for r in 0..tp {
                let g = shard_loss_grad(&shard(r), &targets, &lse, &one, r * c, valid(r)).unwrap();
                for i in 0..rows {
                    for k in 0..c {
                        let col = r * c + k;
                        let want = if col < v { grad.data[i * v + col] } else { 0.0 };
                        assert!(
                            (g.data[i * c + k] - want).abs() <= 1e-6,
                            "{v}/{tp}: {i} {col}"
                        );
                    }
                }
            }
        }
    }
}
