//! Finite-difference checking of `Grad` ops and whole-graph gradients.

#![allow(dead_code)]

use std::collections::BTreeMap;

use ir::interp::{Env, evaluate};
use ir::testing::Rng;
use ir::{Binding, DType, Graph, OpKind, Shape, Tensor, TensorType, ValueId, Weights};

pub const BIND: Binding = Binding { batch: 1, seq: 1 };

/// Central-difference step.
pub const H: f64 = 1e-5;

/// Tolerance on [`rel_err`].
pub const TOL: f64 = 1e-6;

/// max|a − n| / max(max|n|, max|a|, 1e-3): a tensor-wise relative error whose absolute floor
/// keeps gradients that are legitimately ~0 (masked, dropped) from dividing by noise.
pub fn rel_err(analytic: &[f64], numeric: &[f64]) -> f64 {
    assert_eq!(analytic.len(), numeric.len());
    let diff = analytic
        .iter()
        .zip(numeric)
        .map(|(a, n)| (a - n).abs())
        .fold(0.0, f64::max);
    let scale = analytic
        .iter()
        .chain(numeric)
        .map(|v| v.abs())
        .fold(1e-3, f64::max);
    diff / scale
}

/// One operand of the op under test.
#[derive(Clone)]
pub struct Operand {
    pub value: Tensor,
    /// Integer operands (ids, targets) are fed as i64 inputs and never perturbed.
    pub int: bool,
}

pub fn float(value: Tensor) -> Operand {
    Operand { value, int: false }
}

pub fn int(value: Tensor) -> Operand {
    Operand { value, int: true }
}

fn ty(t: &Tensor, dtype: DType) -> TensorType {
    let dims: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    TensorType::new(dtype, Shape::fixed(&dims))
}

/// Checks the `Grad` op of `kind` against central differences of f = Σₖ sum(outₖ ⊙ rₖ) for
/// random projections rₖ, with respect to every differentiable operand; returns the worst
/// relative error (and asserts it is within [`TOL`]).
pub fn check_op(name: &str, kind: OpKind, operands: Vec<Operand>, rng: &mut Rng) -> f64 {
    let mut g = Graph::new(name);
    let mut weights = Weights::new();
    let mut inputs = BTreeMap::new();
    let mut srcs = Vec::new();
    for (i, op) in operands.iter().enumerate() {
        let n = format!("x{i}");
        let v = if op.int {
            inputs.insert(n.clone(), op.value.clone());
            g.push_source(OpKind::Input { name: n }, ty(&op.value, DType::I64), None)
        } else {
            weights.insert(n.clone(), op.value.clone());
            g.push_source(OpKind::Param { name: n }, ty(&op.value, DType::F32), None)
        };
        srcs.push(v);
    }
    let outs = g
        .push_op(kind.clone(), srcs.clone(), None)
        .expect("op builds");
    let mut rs = Vec::new();
    for (k, &o) in outs.iter().enumerate() {
        let shape: Vec<usize> = g
            .ty(o)
            .shape
            .eval(BIND)
            .iter()
            .map(|&d| d as usize)
            .collect();
        let rname = format!("r{k}");
        weights.insert(rname.clone(), rng.tensor(&shape, 1.0));
        rs.push(g.push_source(OpKind::Param { name: rname }, g.ty(o).clone(), None));
    }
    let wrt: Vec<usize> = match kind {
        OpKind::Concat { .. } => (0..operands.len()).collect(),
        _ => kind.differentiable_inputs(),
    };
    let mut grad_inputs = srcs.clone();
    grad_inputs.extend(&rs);
    let grads = g
        .push_op(
            OpKind::Grad {
                of: Box::new(kind.clone()),
                wrt: wrt.clone(),
            },
            grad_inputs,
            None,
        )
        .expect("grad builds");

    let run = |w: &Weights| {
        let env = Env {
            weights: w,
            inputs: &inputs,
            binding: BIND,
        };
        evaluate(&g, &env).expect("evaluates")
    };
    let objective = |w: &Weights| -> f64 {
        let e = run(w);
        outs.iter()
            .zip(&rs)
            .map(|(&o, &r)| {
                let (o, r) = (e.value(o), e.value(r));
                o.data.iter().zip(&r.data).map(|(a, b)| a * b).sum::<f64>()
            })
            .sum()
    };
    let analytic = run(&weights);
    let mut worst: f64 = 0.0;
    for (&i, &gv) in wrt.iter().zip(&grads) {
        let xname = format!("x{i}");
        let a = analytic.value(gv).data.clone();
        let numeric = fd(&weights, &xname, &objective);
        let e = rel_err(&a, &numeric);
        assert!(
            e <= TOL,
            "{name}: operand {i} relative error {e:e}\nanalytic {a:?}\nnumeric {numeric:?}"
        );
        worst = worst.max(e);
    }
    eprintln!("FD {name}: worst relative error {worst:.3e}");
    worst
}

/// Central differences of `f` with respect to every element of weight `name`.
pub fn fd(weights: &Weights, name: &str, f: &dyn Fn(&Weights) -> f64) -> Vec<f64> {
    let mut w = weights.clone();
    let n = w[name].data.len();
    (0..n)
        .map(|j| {
            let x0 = weights[name].data[j];
            w.get_mut(name).expect("weight").data[j] = x0 + H;
            let up = f(&w);
            w.get_mut(name).expect("weight").data[j] = x0 - H;
            let down = f(&w);
            w.get_mut(name).expect("weight").data[j] = x0;
            (up - down) / (2.0 * H)
        })
        .collect()
}

/// Finds the value of an output by name.
pub fn output(g: &Graph, name: &str) -> ValueId {
    g.output(name).expect("output exists")
}
