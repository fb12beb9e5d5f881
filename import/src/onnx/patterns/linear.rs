//! MatMul by a weight → Linear; a bias Add folds into it; GPT-2's Gemm on flattened rows
//! (`Reshape → Linear → Reshape`) becomes one Linear on the original rank.

use ir::{OpId, OpKind};

use super::{Matcher, Operand, Rewrite, either};

/// `MatMul(x, w)` where `w` is a rank-2 parameter or its transpose (tied embeddings).
pub fn matmul(m: &Matcher<'_>, op: OpId, _uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let (OpKind::MatMul, [x, w]) = (&data.kind, data.inputs.as_slice()) else {
        return None;
    };
    let is_weight = m.is_param(*w)
        || m.unary(
            *w,
            |k| matches!(k, OpKind::Transpose { perm } if perm == &[1, 0]),
        )
        .is_some_and(|p| m.is_param(p));
    if !is_weight || m.dims(*w).len() != 2 {
        return None;
    }
    Some(Rewrite {
        replaces: *data.results.first()?,
        ops: vec![(
            OpKind::Linear { bias: false },
            vec![Operand::Value(*x), Operand::Value(*w)],
        )],
    })
}

/// `Add(Linear(x, w), b)` with `b` a parameter of shape `[N]`, when the Linear has no other use.
pub fn bias(m: &Matcher<'_>, op: OpId, uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let (OpKind::Add, [a, b]) = (&data.kind, data.inputs.as_slice()) else {
        return None;
    };
    let (x, w, bias) = either(*a, *b, |lin, bias| {
        let args = m.args(lin, |k| matches!(k, OpKind::Linear { bias: false }))?;
        let [x, w] = args else { return None };
        let n = *m.dims(*w).get(1)?;
        let single_use = uses.get(lin.index()).copied() == Some(1);
        (single_use && m.is_param(bias) && m.dims(bias) == [n]).then_some((*x, *w, bias))
    })?;
    Some(Rewrite {
        replaces: *data.results.first()?,
        ops: vec![(
            OpKind::Linear { bias: true },
            vec![Operand::Value(x), Operand::Value(w), Operand::Value(bias)],
        )],
    })
}

/// `Reshape([.., N])(Linear(Reshape([M, K])(x)))` → `Linear(x)` when the outer reshape only
/// restores `x`'s leading dimensions.
pub fn flatten(m: &Matcher<'_>, op: OpId, uses: &[usize]) -> Option<Rewrite> {
    let data = m.g.op(op);
    let (OpKind::Reshape { .. }, [y]) = (&data.kind, data.inputs.as_slice()) else {
        return None;
    };
    let (kind, args) = m.def(*y)?;
    let OpKind::Linear { .. } = kind else {
        return None;
    };
    let (flat, rest) = args.split_first()?;
    let x = m.unary(*flat, |k| matches!(k, OpKind::Reshape { .. }))?;
    let out = *data.results.first()?;
    let (xd, od) = (m.dims(x), m.dims(out));
    let same_rows = xd.split_last().map(|(_, lead)| lead) == od.split_last().map(|(_, lead)| lead);
    let same_k = xd.last() == m.dims(*flat).last();
    if !same_rows || !same_k || uses.get(y.index()).copied() != Some(1) {
        return None;
    }
    let mut operands = vec![Operand::Value(x)];
    operands.extend(rest.iter().map(|&v| Operand::Value(v)));
    Some(Rewrite {
        replaces: out,
        ops: vec![(kind.clone(), operands)],
    })
}
