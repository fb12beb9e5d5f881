//! Activations written out elementwise: `x * sigmoid(x)` → Silu, and GPT-2's
//! `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` → Gelu{tanh}.

use ir::{OpId, OpKind, ValueId};

use super::{Matcher, Operand, Rewrite, close, either};

const TOL: f64 = 1e-4;

pub fn silu(m: &Matcher<'_>, op: OpId, _uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let (OpKind::Mul, [a, b]) = (&data.kind, data.inputs.as_slice()) else {
        return None;
    };
    let x = either(*a, *b, |x, s| {
        (m.unary(s, |k| *k == OpKind::Sigmoid)? == x).then_some(x)
    })?;
    Some(Rewrite {
        replaces: *data.results.first()?,
        ops: vec![(OpKind::Silu, vec![Operand::Value(x)])],
    })
}

fn scale_of(m: &Matcher<'_>, v: ValueId) -> Option<(f64, ValueId)> {
    match m.def(v)? {
        (OpKind::Scale { factor }, [x]) => Some((*factor, *x)),
        _ => None,
    }
}

/// `1 + tanh(√(2/π) (x + 0.044715 x³))` → `x`.
fn one_plus_tanh(m: &Matcher<'_>, v: ValueId) -> Option<ValueId> {
    let (a, b) = m.binary(v, |k| *k == OpKind::Add)?;
    let t = either(a, b, |t, one| (m.lit(one)? == 1.0).then_some(t))?;
    let u = m.unary(t, |k| *k == OpKind::Tanh)?;
    let (c1, inner) = scale_of(m, u)?;
    if !close(c1, (2.0 / std::f64::consts::PI).sqrt(), TOL) {
        return None;
    }
    let (p, q) = m.binary(inner, |k| *k == OpKind::Add)?;
    either(p, q, |x, cubic| {
        let (c2, pow) = scale_of(m, cubic)?;
        let base = m.unary(
            pow,
            |k| matches!(k, OpKind::Pow { exponent } if *exponent == 3.0),
        )?;
        (close(c2, 0.044715, TOL) && base == x).then_some(x)
    })
}

/// Roots: `Mul(Scale{0.5}(x), 1 + tanh(..))` or `Scale{0.5}(Mul(x, 1 + tanh(..)))`.
pub fn gelu_tanh(m: &Matcher<'_>, op: OpId, _uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let x = match (&data.kind, data.inputs.as_slice()) {
        (OpKind::Mul, [a, b]) => either(*a, *b, |half, rest| {
            let (f, x) = scale_of(m, half)?;
            (close(f, 0.5, TOL) && one_plus_tanh(m, rest)? == x).then_some(x)
        }),
        (OpKind::Scale { factor }, [y]) if close(*factor, 0.5, TOL) => {
            let (a, b) = m.binary(*y, |k| *k == OpKind::Mul)?;
            either(a, b, |x, rest| (one_plus_tanh(m, rest)? == x).then_some(x))
        }
        _ => None,
    }?;
    Some(Rewrite {
        replaces: *data.results.first()?,
        ops: vec![(OpKind::Gelu { tanh: true }, vec![Operand::Value(x)])],
    })
}
