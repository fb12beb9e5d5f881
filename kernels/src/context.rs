//! Ops on one rank's share of the sequence under context parallelism.
//!
//! Megatron-Core's load-balanced layout (Transformer Engine's context parallelism): the
//! sequence is cut into `2·size` equal chunks and member `r` of the group holds chunks `r`
//! and `2·size − 1 − r`, so every member does the same causal attention work. A rank's local
//! sequence is its two chunks in that order. What depends on where a token sits runs here:
//! rotary turns each token by its position in the whole sequence; `iota` gives those
//! positions; attention's queries are the rank's tokens and its keys and values the group's
//! local sequences all-gathered in member order (member `r`'s at `r·local`), each key visible
//! to the queries at or after its position.

use ir::OpKind;

use crate::attention::{self, Attention};
use crate::shape::operands;
use crate::{KernelError, Tensor32, rotary};

/// Where a rank sits in its context-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunks {
    /// Members of the group.
    pub size: usize,
    /// This rank's member index.
    pub index: usize,
}

impl Chunks {
    /// Whole-sequence positions of member `member`'s local sequence of `local` tokens.
    pub fn positions_of(self, member: usize, local: usize) -> Vec<usize> {
        let half = local / 2;
        let last = 2 * self.size.max(1) - 1;
        (0..local)
            .map(|i| {
                if i < half {
                    member * half + i
                } else {
                    (last - member) * half + (i - half)
                }
            })
            .collect()
    }

    /// Positions of this rank's local sequence of `local` tokens.
    pub fn positions(self, local: usize) -> Vec<usize> {
        self.positions_of(self.index, local)
    }

    /// Positions of the gathered sequence (every member's local sequence in member order).
    fn gathered_positions(self, local: usize) -> Vec<usize> {
        (0..self.size)
            .flat_map(|m| self.positions_of(m, local))
            .collect()
    }

    fn check(self, op: &'static str, local: usize) -> Result<(), KernelError> {
        if self.size == 0 || self.index >= self.size || !local.is_multiple_of(2) {
            return Err(KernelError::Attribute {
                op,
                reason: format!(
                    "member {} of {} cannot hold two equal chunks of a local sequence of {local}",
                    self.index, self.size
                ),
            });
        }
        Ok(())
    }
}

/// Runs `kind` (`attention`, `rotary`, `iota`, or the `grad` of attention or rotary) on this
/// rank's chunks: the forward's results, or the listed gradients for a `grad`.
pub fn context_forward(
    kind: &OpKind,
    inputs: &[&Tensor32],
    at: Chunks,
) -> Result<Vec<Tensor32>, KernelError> {
    match kind {
        OpKind::Iota { len } => {
            let n = len.fixed().ok_or(KernelError::Attribute {
                op: "iota",
                reason: "a symbolic length".into(),
            })? as usize;
            at.check("iota", n)?;
            let data = at.positions(n).into_iter().map(|p| p as f32).collect();
            Ok(vec![Tensor32::new(vec![n], data)?])
        }
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => {
            let [x] = operands("rotary", inputs)?;
            let pos = local_positions("rotary", x, at)?;
            Ok(vec![rotary::rotary_at(x, *heads, *theta, scaling, &pos)?])
        }
        &OpKind::Attention { sinks, .. } => {
            let (q, k, v, sinks) = attention::operands_of(inputs, sinks)?;
            let (attn, pos, order) = attention_at(kind, (q, k), sinks, at)?;
            let (k, v) = (order.to_whole(k)?, order.to_whole(v)?);
            Ok(vec![attn.forward_at(q, &k, &v, Some(&pos))?])
        }
        OpKind::Grad { of, wrt } => {
            let all = context_backward(of, inputs, at)?;
            wrt.iter()
                .map(|&i| {
                    all.get(i).cloned().ok_or(KernelError::Unsupported {
                        op: of.mnemonic(),
                        reason: format!("operand {i} has no gradient"),
                    })
                })
                .collect()
        }
        other => Err(KernelError::Unsupported {
            op: other.mnemonic(),
            reason: "no context-parallel form".into(),
        }),
    }
}

/// [`context_forward`] with matrix products accumulating as `acc` says.
pub fn context_forward_with(
    kind: &OpKind,
    inputs: &[&Tensor32],
    at: Chunks,
    acc: crate::Accumulate,
) -> Result<Vec<Tensor32>, KernelError> {
    crate::accumulate::scoped(acc, || context_forward(kind, inputs, at))
}

/// Every operand's gradient of `of`: `inputs` are its operands then its output gradient.
fn context_backward(
    of: &OpKind,
    inputs: &[&Tensor32],
    at: Chunks,
) -> Result<Vec<Tensor32>, KernelError> {
    match of {
        OpKind::Rotary {
            heads,
            theta,
            scaling,
        } => {
            let [x, g] = operands("rotary", inputs)?;
            let pos = local_positions("rotary", x, at)?;
            Ok(vec![rotary::rotary_vjp_at(
                x, *heads, *theta, scaling, g, &pos,
            )?])
        }
        &OpKind::Attention { sinks, .. } => {
            let (g, operands) = inputs.split_last().ok_or(KernelError::Arity {
                op: "attention",
                want: 4 + usize::from(sinks),
                got: 0,
            })?;
            let (q, k, v, sinks) = attention::operands_of(operands, sinks)?;
            let (attn, pos, order) = attention_at(of, (q, k), sinks, at)?;
            let (kw, vw) = (order.to_whole(k)?, order.to_whole(v)?);
            let mut grads = attn.vjp_at(q, &kw, &vw, g, Some(&pos))?;
            // Keys and values go back to the gathered order; q's (and the sinks') are local.
            for kv in &mut grads[1..3] {
                *kv = order.to_gathered(kv)?;
            }
            Ok(grads)
        }
        other => Err(KernelError::Unsupported {
            op: other.mnemonic(),
            reason: "no context-parallel gradient".into(),
        }),
    }
}

/// Positions of the tokens of `x` (`[B, S, ..]`, S this rank's local sequence).
fn local_positions(op: &'static str, x: &Tensor32, at: Chunks) -> Result<Vec<usize>, KernelError> {
    let s = x.shape.get(1).copied().unwrap_or(0);
    at.check(op, s)?;
    Ok(at.positions(s))
}

/// The attention op, its queries' positions and the keys' reordering.
fn attention_at<'s>(
    kind: &OpKind,
    (q, k): (&Tensor32, &Tensor32),
    sinks: Option<&'s Tensor32>,
    at: Chunks,
) -> Result<(Attention<'s>, Vec<usize>, Order), KernelError> {
    let &OpKind::Attention {
        heads,
        kv_heads,
        scale,
        causal,
        softcap,
        window,
        chunk,
        ..
    } = kind
    else {
        return Err(KernelError::Unsupported {
            op: kind.mnemonic(),
            reason: "not attention".into(),
        });
    };
    let local = q.shape.get(1).copied().unwrap_or(0);
    at.check("attention", local)?;
    if k.shape.get(1) != Some(&(local * at.size)) {
        return Err(KernelError::Shape {
            op: "attention",
            what: "key",
            got: k.shape.clone(),
            want: format!(
                "the group's {} gathered local sequences of {local}",
                at.size
            ),
        });
    }
    let attn = Attention {
        heads,
        kv_heads,
        scale,
        causal,
        softcap,
        sinks,
        mask: ir::KeyMask { window, chunk },
    };
    let order = Order {
        gathered: at.gathered_positions(local),
    };
    Ok((attn, at.positions(local), order))
}

/// Rows of the gathered keys (member order) against the whole sequence's order.
struct Order {
    /// Whole-sequence position of each gathered row.
    gathered: Vec<usize>,
}

impl Order {
    /// `[B, S, w]` rows from gathered order to sequence order.
    fn to_whole(&self, x: &Tensor32) -> Result<Tensor32, KernelError> {
        self.permute(x, true)
    }

    /// `[B, S, w]` rows from sequence order back to gathered order.
    fn to_gathered(&self, x: &Tensor32) -> Result<Tensor32, KernelError> {
        self.permute(x, false)
    }

    fn permute(&self, x: &Tensor32, forward: bool) -> Result<Tensor32, KernelError> {
        let [b, s, w] =
            <[usize; 3]>::try_from(x.shape.as_slice()).map_err(|_| KernelError::Shape {
                op: "attention",
                what: "key or value",
                got: x.shape.clone(),
                want: "[B, S, width]".into(),
            })?;
        let mut out = Tensor32::zeros(&x.shape)?;
        for bi in 0..b {
            for (j, &p) in self.gathered.iter().enumerate().take(s) {
                let (src, dst) = if forward { (j, p) } else { (p, j) };
                let from = (bi * s + src) * w;
                let to = (bi * s + dst) * w;
                out.data[to..to + w].copy_from_slice(&x.data[from..from + w]);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[usize], seed: u32) -> Tensor32 {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
                (x % 1000) as f32 / 500.0 - 1.0
            })
            .collect();
        Tensor32::new(shape.to_vec(), data).unwrap()
    }

    /// Rows `rows` (in order) of `[B, S, w]` `x`.
    fn rows(x: &Tensor32, rows: &[usize]) -> Tensor32 {
        let [b, s, w] = <[usize; 3]>::try_from(x.shape.as_slice()).unwrap();
        let mut data = Vec::new();
        for bi in 0..b {
            for &r in rows {
                data.extend_from_slice(&x.data[(bi * s + r) * w..(bi * s + r + 1) * w]);
            }
        }
        Tensor32::new(vec![b, rows.len(), w], data).unwrap()
    }

    #[test]
    fn members_hold_mirrored_chunks() {
        let at = Chunks { size: 2, index: 0 };
        assert_eq!(at.positions(4), vec![0, 1, 6, 7]);
        assert_eq!(Chunks { index: 1, ..at }.positions(4), vec![2, 3, 4, 5]);
        assert_eq!(at.gathered_positions(4), vec![0, 1, 6, 7, 2, 3, 4, 5]);
    }

    /// Every member's causal attention on its chunks (keys gathered in member order) equals
    /// the rows of one device's attention over the whole sequence, and the members' key and
    /// value gradients (and gpt-oss's sinks') sum to the whole one's.
    #[test]
    fn chunked_causal_attention_equals_the_whole_sequence() {
        check_chunked_attention(false, None);
        check_chunked_attention(true, None);
    }

    /// A sliding window of 3 keys under context parallelism: each query's window is counted
    /// in whole-sequence positions, across the chunks it spans.
    #[test]
    fn chunked_windowed_attention_equals_the_whole_sequence() {
        check_chunked_attention(false, Some(3));
        check_chunked_attention(true, Some(3));
    }

    /// Llama 4's chunks of 3 keys under context parallelism (chunks of 2 positions per
    /// member's piece): each query's chunk is counted in whole-sequence positions.
    #[test]
    fn context_parallel_chunked_attention_equals_the_whole_sequence() {
        let chunked = ir::KeyMask {
            window: None,
            chunk: Some(3),
        };
        check_masked_attention(false, chunked);
        check_masked_attention(true, chunked);
    }

    fn check_chunked_attention(sinks: bool, window: Option<u64>) {
        check_masked_attention(
            sinks,
            ir::KeyMask {
                window,
                chunk: None,
            },
        );
    }

    fn check_masked_attention(sinks: bool, mask: ir::KeyMask) {
        let (b, s, heads, kv, d, size) = (2, 8, 4, 2, 4, 2);
        let kind = OpKind::Attention {
            heads,
            kv_heads: kv,
            scale: 0.5,
            causal: true,
            softcap: None,
            sinks,
            window: mask.window,
            chunk: mask.chunk,
        };
        let (hw, kw) = (heads as usize * d, kv as usize * d);
        let (q, k, v) = (
            tensor(&[b, s, hw], 1),
            tensor(&[b, s, kw], 2),
            tensor(&[b, s, kw], 3),
        );
        let sink = tensor(&[heads as usize], 5);
        let tail: Vec<&Tensor32> = if sinks { vec![&sink] } else { vec![] };
        let g = tensor(&[b, s, hw], 4);
        let whole_ops: Vec<&Tensor32> = [&q, &k, &v].into_iter().chain(tail.clone()).collect();
        let whole = crate::forward(&kind, &whole_ops, ir::Binding { batch: 2, seq: 8 }).unwrap();
        let dwhole = crate::backward(&kind, &whole_ops, &[&g]).unwrap();
        let local = s / size;
        let order: Vec<usize> = Chunks { size, index: 0 }.gathered_positions(local);
        let (kg, vg) = (rows(&k, &order), rows(&v, &order));
        let mut dk_sum = vec![0f32; b * s * kw];
        let mut dsink_sum = vec![0f32; heads as usize];
        for index in 0..size {
            let at = Chunks { size, index };
            let mine = at.positions(local);
            let ql = rows(&q, &mine);
            let ops: Vec<&Tensor32> = [&ql, &kg, &vg].into_iter().chain(tail.clone()).collect();
            let out = context_forward(&kind, &ops, at).unwrap();
            let want = rows(&whole[0], &mine);
            for (x, y) in out[0].data.iter().zip(&want.data) {
                assert!((x - y).abs() < 1e-5, "{x} vs {y}");
            }
            let grad = OpKind::Grad {
                of: Box::new(kind.clone()),
                wrt: (0..ops.len()).collect(),
            };
            let gl = rows(&g, &mine);
            let with_g: Vec<&Tensor32> = ops.into_iter().chain([&gl]).collect();
            let d = context_forward(&grad, &with_g, at).unwrap();
            let dq_want = rows(dwhole[0].as_ref().unwrap(), &mine);
            for (x, y) in d[0].data.iter().zip(&dq_want.data) {
                assert!((x - y).abs() < 1e-5, "dq {x} vs {y}");
            }
            for (acc, x) in dk_sum.iter_mut().zip(&d[1].data) {
                *acc += x;
            }
            if sinks {
                for (acc, x) in dsink_sum.iter_mut().zip(&d[3].data) {
                    *acc += x;
                }
            }
        }
        let dk_want = rows(dwhole[1].as_ref().unwrap(), &order);
        for (x, y) in dk_sum.iter().zip(&dk_want.data) {
            assert!((x - y).abs() < 1e-5, "dk {x} vs {y}");
        }
        if sinks {
            let want = &dwhole[3].as_ref().unwrap().data;
            for (x, y) in dsink_sum.iter().zip(want) {
                assert!((x - y).abs() < 1e-5, "dsinks {x} vs {y}");
            }
        }
    }

    #[test]
    fn rotary_turns_tokens_by_their_whole_sequence_position() {
        let kind = OpKind::Rotary {
            heads: 2,
            theta: 10_000.0,
            scaling: Default::default(),
        };
        let x = tensor(&[1, 8, 8], 5);
        let whole = crate::forward(&kind, &[&x], ir::Binding { batch: 1, seq: 8 }).unwrap();
        let at = Chunks { size: 2, index: 1 };
        let mine = at.positions(4);
        let out = context_forward(&kind, &[&rows(&x, &mine)], at).unwrap();
        assert_eq!(out[0].data, rows(&whole[0], &mine).data);
    }
}
