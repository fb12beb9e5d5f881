//! Rotate-half rotary embedding: `t * cos + concat(-t[.., d/2:], t[.., :d/2]) * sin` with
//! constant tables that equal RoPE's for some base θ (checked numerically) → Rotary{heads, θ}.

use ir::{OpId, OpKind, ValueId};

use super::super::value::Const;
use super::{Matcher, Operand, Rewrite, either, split_heads};

/// Largest table error accepted (tables come from f32 `inv_freq`).
const TOL: f64 = 1e-4;

/// `concat(-t[.., h:], t[.., :h])` along the last axis of a rank-4 `t` → `t`.
fn rotate_half(m: &Matcher<'_>, v: ValueId) -> Option<ValueId> {
    let args = m.args(v, |k| matches!(k, OpKind::Concat { axis: 3 }))?;
    let [neg, lo] = args else { return None };
    let hi = m.unary(*neg, |k| *k == OpKind::Neg)?;
    let d = *m.dims(v).get(3)?;
    let h = d / 2;
    let t_hi = m.unary(
        hi,
        |k| matches!(k, OpKind::Slice { axis: 3, start, end } if *start == h && *end == d),
    )?;
    let t_lo = m.unary(
        *lo,
        |k| matches!(k, OpKind::Slice { axis: 3, start: 0, end } if *end == h),
    )?;
    (t_hi == t_lo && d % 2 == 0).then_some(t_hi)
}

/// `Mul(t, table)` with a known table → the table.
fn times_table<'k>(m: &Matcher<'k>, v: ValueId, t: ValueId) -> Option<&'k Const> {
    let (a, b) = m.binary(v, |k| *k == OpKind::Mul)?;
    either(a, b, |x, c| if x == t { m.known.get(&c) } else { None })
}

/// θ such that `cos`/`sin` are RoPE tables of head size `d` over positions `0..seq`.
fn rope_theta(cos: &Const, sin: &Const, seq: usize, d: usize) -> Option<f64> {
    let h = d / 2;
    let fits = |c: &Const| c.shape.iter().rev().nth(1) == Some(&seq) && c.shape.last() == Some(&d);
    if seq < 2 || h == 0 || !fits(cos) || !fits(sin) {
        return None;
    }
    // Position 1's angles are the inverse frequencies themselves (all below π for RoPE).
    let at = |c: &Const, s: usize, i: usize| c.data.get(s * d + i).copied();
    let theta = if h >= 2 {
        let f1 = at(sin, 1, 1)?.atan2(at(cos, 1, 1)?);
        let t = (-f1.ln() * d as f64 / 2.0).exp();
        // Bases are round numbers; snap when the table's f32 noise is all that separates them.
        if (t - t.round()).abs() <= 1e-4 * t {
            t.round()
        } else {
            t
        }
    } else {
        10_000.0
    };
    if !theta.is_finite() || theta <= 1.0 {
        return None;
    }
    for (table, f) in [(cos, f64::cos as fn(f64) -> f64), (sin, f64::sin)] {
        // Leading (broadcast) dimensions must repeat the same [seq, d] table.
        for (k, &got) in table.data.iter().enumerate() {
            let (s, i) = ((k / d) % seq, k % d);
            let inv = theta.powf(-2.0 * (i % h) as f64 / d as f64);
            if (got - f(s as f64 * inv)).abs() > TOL {
                return None;
            }
        }
    }
    Some(theta)
}

pub fn rotary(m: &Matcher<'_>, op: OpId, _uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let (OpKind::Add, [a, b]) = (&data.kind, data.inputs.as_slice()) else {
        return None;
    };
    let (t, cos, sin) = either(*a, *b, |p, q| {
        let (qa, qb) = m.binary(q, |k| *k == OpKind::Mul)?;
        let (t, sin) = either(qa, qb, |r, s| Some((rotate_half(m, r)?, m.known.get(&s)?)))?;
        Some((t, times_table(m, p, t)?, sin))
    })?;
    let (x, heads, d) = split_heads(m, t)?;
    let seq = *m.dims(x).get(1)? as usize;
    let theta = rope_theta(cos, sin, seq, d as usize)?;
    let td = m.dims(t);
    let split = td.as_slice();
    let [bsz, n, s, hd] = split else { return None };
    Some(Rewrite {
        replaces: *data.results.first()?,
        ops: vec![
            (
                OpKind::Rotary {
                    heads,
                    theta,
                    scaling: ir::RopeScaling::None,
                },
                vec![Operand::Value(x)],
            ),
            (
                OpKind::Reshape {
                    shape: [*bsz, *s, *n, *hd].map(ir::Dim::Fixed).to_vec(),
                },
                vec![Operand::New(0)],
            ),
            (
                OpKind::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                vec![Operand::New(1)],
            ),
        ],
    })
}
