//! RMSNorm written out: `gamma * (x * 1/sqrt(mean(x²) + eps))` → RmsNorm{eps}(x, gamma).

use ir::{OpId, OpKind, ValueId};

use super::{Matcher, Operand, Rewrite, either};

/// `sqrt(mean(x²) + eps)` (or its `rsqrt` form, `want_rsqrt`) → `(x, eps)`.
fn rms(m: &Matcher<'_>, v: ValueId, want_rsqrt: bool) -> Option<(ValueId, f64)> {
    let root = if want_rsqrt {
        OpKind::Rsqrt
    } else {
        OpKind::Sqrt
    };
    let s = m.unary(v, |k| *k == root)?;
    let (a, b) = m.binary(s, |k| *k == OpKind::Add)?;
    either(a, b, |mean, eps| {
        let eps = m.lit(eps)?;
        let sq = m.unary(mean, |k| *k == OpKind::ReduceMean)?;
        let x = m.unary(
            sq,
            |k| matches!(k, OpKind::Pow { exponent } if *exponent == 2.0),
        )?;
        Some((x, eps))
    })
}

/// `x * r` or `x / sqrt(..)` where `r` is `1/sqrt(..)` or `rsqrt(..)` of the same `x`.
fn normalized(m: &Matcher<'_>, v: ValueId) -> Option<(ValueId, f64)> {
    if let Some((a, b)) = m.binary(v, |k| *k == OpKind::Div) {
        let (x, eps) = rms(m, b, false)?;
        return (x == a).then_some((x, eps));
    }
    let (a, b) = m.binary(v, |k| *k == OpKind::Mul)?;
    either(a, b, |x, r| {
        let (xr, eps) = rms(m, r, true).or_else(|| {
            let (one, s) = m.binary(r, |k| *k == OpKind::Div)?;
            (m.lit(one)? == 1.0).then_some(())?;
            rms(m, s, false)
        })?;
        (xr == x).then_some((x, eps))
    })
}

pub fn rms_norm(m: &Matcher<'_>, op: OpId, _uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let (OpKind::Mul, [a, b]) = (&data.kind, data.inputs.as_slice()) else {
        return None;
    };
    let (x, gamma, eps) = either(*a, *b, |gamma, y| {
        let (x, eps) = normalized(m, y)?;
        let h = *m.dims(x).last()?;
        (m.is_param(gamma) && m.dims(gamma) == [h]).then_some((x, gamma, eps))
    })?;
    Some(Rewrite {
        replaces: *data.results.first()?,
        ops: vec![(
            OpKind::RmsNorm { eps },
            vec![Operand::Value(x), Operand::Value(gamma)],
        )],
    })
}
