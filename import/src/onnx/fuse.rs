//! ONNX-level fusion for subgraphs whose primitive ops have no IR counterpart: the exact
//! (erf) GELU `0.5 · x · (1 + erf(x / √2))`, as exported from `nn.GELU()` / BERT / GPT-J.
//! Erf alone cannot be lowered, so this runs before lowering instead of among the IR patterns.

use std::collections::HashMap;

use super::build::Importer;
use super::proto::NodeProto;

const TOL: f64 = 1e-4;

fn op(n: &NodeProto) -> &str {
    n.op_type.as_deref().unwrap_or("")
}

/// The nodes of a recognized erf-GELU: its input `x`, its output, and every node it replaces.
#[derive(Debug)]
pub struct ErfGelu {
    pub x: String,
    pub output: String,
    pub nodes: Vec<usize>,
}

fn only_consumer(consumers: &HashMap<&str, Vec<usize>>, value: &str) -> Option<usize> {
    match consumers.get(value).map(Vec::as_slice) {
        Some([one]) => Some(*one),
        _ => None,
    }
}

/// Matches `Erf` node `e` as the middle of an erf-GELU; intermediate values must have no other
/// readers (graph outputs count as readers, so they are never swallowed).
pub fn erf_gelu(
    imp: &Importer<'_>,
    e: usize,
    consumers: &HashMap<&str, Vec<usize>>,
) -> Option<ErfGelu> {
    let nodes = imp.nodes;
    let node = |i: usize| nodes.get(i);
    let lit = |name: &str| {
        (!imp.weight_dep.contains(name))
            .then(|| imp.consts.get(name).and_then(|c| c.single()))
            .flatten()
    };
    let out0 = |n: &NodeProto| n.output.first().cloned();
    // Other operand of a binary node, given one of them.
    let other = |n: &NodeProto, this: &str| match n.input.as_slice() {
        [a, b] if a == this => Some(b.clone()),
        [a, b] if b == this => Some(a.clone()),
        _ => None,
    };

    let erf = node(e)?;
    let u = erf.input.first()?;
    let scaled = node(*imp.producer.get(u.as_str())?)?;
    let [x, c] = scaled.input.as_slice() else {
        return None;
    };
    let c = lit(c)?;
    let sqrt2 = std::f64::consts::SQRT_2;
    let ok = match op(scaled) {
        "Div" => (c - sqrt2).abs() < TOL,
        "Mul" => (c - 1.0 / sqrt2).abs() < TOL,
        _ => false,
    };
    let erf_out = out0(erf)?;
    let add_i = only_consumer(consumers, &erf_out)?;
    let add = node(add_i)?;
    if !ok || op(add) != "Add" || lit(&other(add, &erf_out)?)? != 1.0 {
        return None;
    }
    let add_out = out0(add)?;
    let mul_i = only_consumer(consumers, &add_out)?;
    let mul = node(mul_i)?;
    if op(mul) != "Mul" {
        return None;
    }
    let partner = other(mul, &add_out)?;
    let mul_out = out0(mul)?;
    // Either (0.5·x)·(1+erf) or x·(1+erf) followed by ·0.5.
    let halved = imp
        .producer
        .get(partner.as_str())
        .and_then(|&i| node(i))
        .filter(|h| {
            op(h) == "Mul"
                && other(h, x)
                    .and_then(|c| lit(&c))
                    .is_some_and(|c| (c - 0.5).abs() < TOL)
        });
    let mut replaced = vec![e, add_i, mul_i];
    let output = if halved.is_some() {
        mul_out
    } else if &partner == x {
        let half_i = only_consumer(consumers, &mul_out)?;
        let half = node(half_i)?;
        let c = lit(&other(half, &mul_out)?)?;
        if op(half) != "Mul" || (c - 0.5).abs() >= TOL {
            return None;
        }
        replaced.push(half_i);
        out0(half)?
    } else {
        return None;
    };
    Some(ErfGelu {
        x: x.clone(),
        output,
        nodes: replaced,
    })
}
