//! Eager attention: heads split, optional grouped-query repeat, `softmax(q kᵀ · scale + mask) v`,
//! heads merged → Attention{heads, kv_heads, scale, causal}. The additive mask must be a folded
//! constant that is exactly causal (0 on and below the diagonal, very negative above) or zero.

use ir::{OpId, OpKind, ValueId};

use super::super::value::Const;
use super::{Matcher, Operand, Rewrite, either, split_heads};

/// Mask entries at or below this count as "masked out" (HF uses the dtype's minimum).
const MASKED: f64 = -1e4;

/// A key/value operand in `[B, heads, S, d]` form → `(x [B,S,kv*d], kv, d)`, seeing through
/// `repeat_kv` (`Reshape[B,H,S,d](Expand[B,kv,r,S,d](Unsqueeze(k)))`).
fn kv_heads(m: &Matcher<'_>, v: ValueId) -> Option<(ValueId, u64, u64)> {
    if let Some(found) = split_heads(m, v) {
        return Some(found);
    }
    let e = m.unary(v, |k| matches!(k, OpKind::Reshape { .. }))?;
    let u = m.unary(e, |k| matches!(k, OpKind::Expand { .. }))?;
    let kh = m.unary(u, |k| matches!(k, OpKind::Reshape { .. }))?;
    let (x, kv, d) = split_heads(m, kh)?;
    let (vd, ed, ud, khd) = (m.dims(v), m.dims(e), m.dims(u), m.dims(kh));
    match (vd.as_slice(), ed.as_slice(), ud.as_slice(), khd.as_slice()) {
        ([b, h, s, dd], [b2, kv2, r, s2, d2], [b3, kv3, 1, s3, d3], [b4, kv4, s4, d4])
            if b == b2
                && b == b3
                && b == b4
                && *kv2 == kv
                && *kv3 == kv
                && *kv4 == kv
                && s == s2
                && s == s3
                && s == s4
                && *dd == d
                && *d2 == d
                && *d3 == d
                && *d4 == d
                && kv * r == *h =>
        {
            Some((x, kv, d))
        }
        _ => None,
    }
}

/// `kᵀ` as `[B, kv, d, S]`: `Transpose[0,1,3,2]` of the head form, or GPT-2's fused
/// `Transpose[0,2,3,1](Reshape[B,S,n,d](k))`.
fn keys_transposed(m: &Matcher<'_>, v: ValueId) -> Option<(ValueId, u64, u64)> {
    let (kind, args) = m.def(v)?;
    let (OpKind::Transpose { perm }, [src]) = (kind, args) else {
        return None;
    };
    match perm.as_slice() {
        [0, 1, 3, 2] => kv_heads(m, *src),
        [0, 2, 3, 1] => {
            let x = m.unary(*src, |k| matches!(k, OpKind::Reshape { .. }))?;
            let (rd, xd) = (m.dims(*src), m.dims(x));
            match (rd.as_slice(), xd.as_slice()) {
                ([b, s, n, d], [xb, xs, w]) if b == xb && s == xs && n * d == *w => {
                    Some((x, *n, *d))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether an additive mask is causal (`Some(true)`), all zero (`Some(false)`), or neither.
fn mask_kind(mask: &Const, seq: usize) -> Option<bool> {
    let fits = mask.shape.iter().rev().nth(1) == Some(&seq) && mask.shape.last() == Some(&seq);
    if !fits || seq == 0 {
        return None;
    }
    let mut any_masked = false;
    for (k, &x) in mask.data.iter().enumerate() {
        let (i, j) = ((k / seq) % seq, k % seq);
        if j > i && x <= MASKED {
            any_masked = true;
        } else if x != 0.0 {
            return None;
        }
    }
    // A causal mask masks every entry above the diagonal; a partial one is something else.
    let above = seq * (seq - 1) / 2 * (mask.numel() / (seq * seq).max(1));
    let masked = mask.data.iter().filter(|&&x| x <= MASKED).count();
    match (any_masked, masked == above) {
        (true, true) => Some(true),
        (false, _) => Some(false),
        _ => None,
    }
}

/// Root: the Reshape that merges heads back, `Reshape[B,S,H*d](Transpose[0,2,1,3](P v))`
/// (or to `[B*S, H*d]`).
pub fn attention(m: &Matcher<'_>, op: OpId, _uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let (OpKind::Reshape { .. }, [merged]) = (&data.kind, data.inputs.as_slice()) else {
        return None;
    };
    let out = *data.results.first()?;
    let pv = m.unary(
        *merged,
        |k| matches!(k, OpKind::Transpose { perm } if perm == &[0, 2, 1, 3]),
    )?;
    let (p, vh) = m.binary(pv, |k| *k == OpKind::MatMul)?;
    let z = m.unary(p, |k| matches!(k, OpKind::Softmax { causal: false }))?;
    // The additive mask is optional.
    let (scores, mask) = match m.binary(z, |k| *k == OpKind::Add) {
        Some((a, b)) => either(a, b, |s, c| m.known.get(&c).map(|c| (s, Some(c))))?,
        None => (z, None),
    };
    let (scale, qk) = match m.def(scores)? {
        (OpKind::Scale { factor }, [x]) => (*factor, *x),
        _ => (1.0, scores),
    };
    let (qh, kt) = m.binary(qk, |k| *k == OpKind::MatMul)?;
    let (q, heads, d) = split_heads(m, qh)?;
    let (k, kv, dk) = keys_transposed(m, kt)?;
    let (v, kv_v, dv) = kv_heads(m, vh)?;
    let qd = m.dims(q);
    let seq = *qd.get(1)? as usize;
    let causal = match mask {
        Some(c) => mask_kind(c, seq)?,
        None => false,
    };
    let od = m.dims(out);
    let consistent = kv == kv_v
        && d == dk
        && d == dv
        && kv > 0
        && heads % kv == 0
        && m.dims(k) == m.dims(v)
        && od.iter().product::<u64>() == qd.iter().product::<u64>()
        && od.last() == qd.last();
    if !consistent {
        return None;
    }
    let mut ops = vec![(
        OpKind::Attention {
            heads,
            kv_heads: kv,
            scale,
            causal,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        },
        vec![Operand::Value(q), Operand::Value(k), Operand::Value(v)],
    )];
    // Heads may be merged straight into flattened rows ([B*S, H*d], GPT-2's Gemm input).
    if od != qd {
        ops.push((
            OpKind::Reshape {
                shape: od.into_iter().map(ir::Dim::Fixed).collect(),
            },
            vec![Operand::New(0)],
        ));
    }
    Some(Rewrite { replaces: out, ops })
}
