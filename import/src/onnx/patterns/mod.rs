//! Recognition of subgraphs as the IR's fused ops (Linear, RmsNorm, Gelu, Silu, Rotary,
//! Attention), so the planner sees the model's structure rather than its arithmetic.
//!
//! Every rewrite adds new ops computing the matched value and redirects the uses of that value;
//! the replaced ops are left for dead-code removal. A rewrite is therefore safe even when an
//! intermediate value has other users, and a subgraph that does not match stays primitive.

mod activation;
mod attention;
mod linear;
mod norm;
mod rotary;

use std::collections::{BTreeMap, HashMap};

use ir::{Graph, OpId, OpKind, ValueId};

use super::value::Const;

/// Read-only view used while matching.
#[derive(Debug, Clone, Copy)]
pub struct Matcher<'g> {
    pub g: &'g Graph,
    pub known: &'g HashMap<ValueId, Const>,
}

impl<'g> Matcher<'g> {
    /// The op defining `v`, if `v` is its only result.
    pub fn def(&self, v: ValueId) -> Option<(&'g OpKind, &'g [ValueId])> {
        let op = self.g.op(self.g.def_op(v));
        (op.results.len() == 1).then_some((&op.kind, op.inputs.as_slice()))
    }

    /// Operands of `v`'s op if it is of the kind `pred` accepts.
    pub fn args(&self, v: ValueId, pred: impl Fn(&OpKind) -> bool) -> Option<&'g [ValueId]> {
        self.def(v).filter(|(k, _)| pred(k)).map(|(_, a)| a)
    }

    pub fn unary(&self, v: ValueId, pred: impl Fn(&OpKind) -> bool) -> Option<ValueId> {
        match self.args(v, pred)? {
            [x] => Some(*x),
            _ => None,
        }
    }

    pub fn binary(&self, v: ValueId, pred: impl Fn(&OpKind) -> bool) -> Option<(ValueId, ValueId)> {
        match self.args(v, pred)? {
            [a, b] => Some((*a, *b)),
            _ => None,
        }
    }

    /// The value of a one-element constant.
    pub fn lit(&self, v: ValueId) -> Option<f64> {
        self.known.get(&v).and_then(Const::single)
    }

    pub fn is_param(&self, v: ValueId) -> bool {
        matches!(self.def(v), Some((OpKind::Param { .. }, _)))
    }

    pub fn dims(&self, v: ValueId) -> Vec<u64> {
        self.g
            .ty(v)
            .shape
            .dims()
            .iter()
            .map(|d| d.fixed().unwrap_or(0))
            .collect()
    }
}

/// Tries `f` with the operands in both orders (for commutative ops).
pub fn either<T>(a: ValueId, b: ValueId, f: impl Fn(ValueId, ValueId) -> Option<T>) -> Option<T> {
    f(a, b).or_else(|| f(b, a))
}

pub fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
}

/// A replacement: ops to add (each reading earlier values or earlier entries by index), and
/// the value whose uses move to the last added op's result.
#[derive(Debug)]
pub struct Rewrite {
    pub replaces: ValueId,
    pub ops: Vec<(OpKind, Vec<Operand>)>,
}

#[derive(Clone, Copy, Debug)]
pub enum Operand {
    Value(ValueId),
    /// The first result of the `n`th op of the same rewrite.
    New(usize),
}

/// Applies a rewrite; returns false (leaving the graph as is, up to unused new ops) when the
/// new ops do not type-check, which means the matcher accepted something it should not have.
fn apply(g: &mut Graph, rw: Rewrite) -> bool {
    let mut made: Vec<ValueId> = Vec::new();
    for (kind, operands) in rw.ops {
        let inputs: Option<Vec<ValueId>> = operands
            .iter()
            .map(|o| match *o {
                Operand::Value(v) => Some(v),
                Operand::New(i) => made.get(i).copied(),
            })
            .collect();
        let Some(inputs) = inputs else { return false };
        match g
            .push_op(kind, inputs, None)
            .ok()
            .and_then(|r| r.first().copied())
        {
            Some(v) => made.push(v),
            None => return false,
        }
    }
    match made.last() {
        Some(&last) if g.ty(last) == g.ty(rw.replaces) => {
            g.replace_uses(rw.replaces, last);
            true
        }
        _ => false,
    }
}

type Finder = fn(&Matcher<'_>, OpId, &[usize]) -> Option<Rewrite>;

/// Runs every recognizer over the graph, in dependency order: rotary before attention (which
/// expects the head-split form rotary rewrites produce), attention before the Linear flattening
/// (GPT-2 merges heads straight into the flattened rows its Gemm reads). Returns how often each
/// recognizer fired.
pub fn recognize(g: &mut Graph, known: &HashMap<ValueId, Const>) -> BTreeMap<&'static str, usize> {
    let passes: [(&'static str, Finder); 8] = [
        ("silu", activation::silu),
        ("gelu", activation::gelu_tanh),
        ("rmsnorm", norm::rms_norm),
        ("rotary", rotary::rotary),
        ("attention", attention::attention),
        ("linear", linear::matmul),
        ("linear_bias", linear::bias),
        ("linear_flatten", linear::flatten),
    ];
    let mut fired = BTreeMap::new();
    for (name, find) in passes {
        let order = g.order().to_vec();
        let uses: Vec<usize> = g.uses().iter().map(<[_]>::len).collect();
        let mut count = 0;
        for op in order {
            let rw = find(&Matcher { g, known }, op, &uses);
            if let Some(rw) = rw
                && apply(g, rw)
            {
                count += 1;
            }
        }
        fired.insert(name, count);
    }
    topo_sort(g);
    fired
}

/// Restores a valid execution order after rewrites appended ops at the end: a depth-first
/// post-order that keeps the original order wherever dependencies allow.
pub fn topo_sort(g: &mut Graph) {
    let mut done = vec![false; g.num_ops()];
    // Guards against a cycle a faulty rewrite could create: better a bad order than a hang.
    let mut visiting = vec![false; g.num_ops()];
    let mut out = Vec::with_capacity(g.num_ops());
    for root in g.order().to_vec() {
        let mut stack: Vec<(OpId, usize)> = vec![(root, 0)];
        while let Some(&mut (o, ref mut next)) = stack.last_mut() {
            if done.get(o.index()).copied().unwrap_or(true) {
                stack.pop();
                continue;
            }
            match g.op(o).inputs.get(*next) {
                Some(&v) => {
                    *next += 1;
                    let d = g.def_op(v);
                    let open = !done.get(d.index()).copied().unwrap_or(true)
                        && !visiting.get(d.index()).copied().unwrap_or(true);
                    if open {
                        if let Some(f) = visiting.get_mut(d.index()) {
                            *f = true;
                        }
                        stack.push((d, 0));
                    }
                }
                None => {
                    if let Some(flag) = done.get_mut(o.index()) {
                        *flag = true;
                    }
                    out.push(o);
                    stack.pop();
                }
            }
        }
    }
    g.set_order(out);
}

/// `Transpose[0,2,1,3](Reshape[B,S,n,d](x))` with `x: [B,S,n*d]` → `(x, n, d)`: the head split
/// every attention implementation starts with.
pub fn split_heads(m: &Matcher<'_>, t: ValueId) -> Option<(ValueId, u64, u64)> {
    let r = m.unary(
        t,
        |k| matches!(k, OpKind::Transpose { perm } if perm == &[0, 2, 1, 3]),
    )?;
    let x = m.unary(r, |k| matches!(k, OpKind::Reshape { .. }))?;
    let (rd, xd) = (m.dims(r), m.dims(x));
    match (rd.as_slice(), xd.as_slice()) {
        ([b, s, n, d], [xb, xs, w]) if b == xb && s == xs && n * d == *w => Some((x, *n, *d)),
        _ => None,
    }
}
