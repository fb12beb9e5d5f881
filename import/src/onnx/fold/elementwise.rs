//! Elementwise folds: unary math, broadcasting binary ops, comparisons, logic, Where, Cast.

use super::super::node::NodeRef;
use super::super::proto::data_type as dt;
use super::super::shapes::broadcast;
use super::super::value::{Const, Elem};
use super::{arg, broadcast_strides, for_each_index, small};
use crate::ImportError;

pub fn handles(op: &str) -> bool {
    unary(op).is_some()
        || binary(op).is_some()
        || matches!(op, "Max" | "Min" | "Where" | "Cast" | "CastLike" | "Mod")
}

fn unary(op: &str) -> Option<fn(f64) -> f64> {
    Some(match op {
        "Neg" => |x: f64| -x,
        "Abs" => f64::abs,
        "Sqrt" => f64::sqrt,
        "Reciprocal" => f64::recip,
        "Exp" => f64::exp,
        "Log" => f64::ln,
        "Cos" => f64::cos,
        "Sin" => f64::sin,
        "Tanh" => f64::tanh,
        "Sigmoid" => |x: f64| 1.0 / (1.0 + (-x).exp()),
        "Floor" => f64::floor,
        "Ceil" => f64::ceil,
        "Relu" => |x: f64| x.max(0.0),
        "Sign" => |x: f64| if x == 0.0 { 0.0 } else { x.signum() },
        "Not" => |x: f64| f64::from(u8::from(x == 0.0)),
        "Erf" => erf,
        _ => return None,
    })
}

type BinaryFn = fn(f64, f64) -> f64;

/// Binary ops and whether their result is boolean.
fn binary(op: &str) -> Option<(BinaryFn, bool)> {
    Some(match op {
        "Add" => (|x, y| x + y, false),
        "Sub" => (|x, y| x - y, false),
        "Mul" => (|x, y| x * y, false),
        "Div" => (|x, y| x / y, false),
        "Pow" => (f64::powf, false),
        "Equal" => (|x, y| f64::from(u8::from(x == y)), true),
        "Less" => (|x, y| f64::from(u8::from(x < y)), true),
        "LessOrEqual" => (|x, y| f64::from(u8::from(x <= y)), true),
        "Greater" => (|x, y| f64::from(u8::from(x > y)), true),
        "GreaterOrEqual" => (|x, y| f64::from(u8::from(x >= y)), true),
        "And" => (|x, y| f64::from(u8::from(x != 0.0 && y != 0.0)), true),
        "Or" => (|x, y| f64::from(u8::from(x != 0.0 || y != 0.0)), true),
        "Xor" => (|x, y| f64::from(u8::from((x != 0.0) != (y != 0.0))), true),
        _ => return None,
    })
}

pub fn fold(n: &NodeRef<'_>, ins: &[Option<&Const>]) -> Result<Option<Const>, ImportError> {
    let op = n.op();
    if let Some(f) = unary(op) {
        let x = arg(n, ins, 0)?;
        let elem = if op == "Not" { Elem::Bool } else { x.elem };
        return Ok(zip(&[x], elem, |v| v.first().map_or(0.0, |&a| f(a))));
    }
    if let Some((f, boolean)) = binary(op) {
        let (a, b) = (arg(n, ins, 0)?, arg(n, ins, 1)?);
        let elem = if boolean { Elem::Bool } else { a.elem };
        // Integer division truncates toward zero, as in C and onnxruntime.
        let int_div = op == "Div" && a.elem == Elem::Int;
        return Ok(zip(&[a, b], elem, |v| match v {
            [x, y] if int_div => {
                if *y == 0.0 {
                    0.0
                } else {
                    (x / y).trunc()
                }
            }
            [x, y] => f(*x, *y),
            _ => 0.0,
        }));
    }
    match op {
        "Max" | "Min" => {
            let xs: Vec<&Const> = ins.iter().copied().flatten().collect();
            let first = xs.first().ok_or_else(|| n.bad("no inputs"))?;
            let max = op == "Max";
            Ok(zip(&xs, first.elem, |v| {
                v.iter().copied().fold(
                    if max {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    },
                    |a, b| {
                        if max { a.max(b) } else { a.min(b) }
                    },
                )
            }))
        }
        "Mod" => {
            let (a, b) = (arg(n, ins, 0)?, arg(n, ins, 1)?);
            let fmod = n.attr_i("fmod").unwrap_or(0) != 0;
            Ok(zip(&[a, b], a.elem, |v| match v {
                [_, y] if *y == 0.0 => 0.0,
                [x, y] if fmod => x % y,
                // Integer Mod takes the divisor's sign (Python semantics).
                [x, y] => x - y * (x / y).floor(),
                _ => 0.0,
            }))
        }
        "Where" => {
            let (c, x, y) = (arg(n, ins, 0)?, arg(n, ins, 1)?, arg(n, ins, 2)?);
            Ok(zip(&[c, x, y], x.elem, |v| match v {
                [c, x, y] => {
                    if *c != 0.0 {
                        *x
                    } else {
                        *y
                    }
                }
                _ => 0.0,
            }))
        }
        "Cast" => {
            let x = arg(n, ins, 0)?;
            let to = n.attr_i("to").ok_or_else(|| n.bad("Cast without 'to'"))?;
            let elem = i32::try_from(to)
                .ok()
                .and_then(Elem::from_onnx)
                .ok_or_else(|| n.bad(format!("cannot cast to element type {to}")))?;
            Ok(Some(cast(x, elem, to)))
        }
        "CastLike" => {
            let (x, like) = (arg(n, ins, 0)?, arg(n, ins, 1)?);
            Ok(Some(cast(x, like.elem, -1)))
        }
        _ => Ok(None),
    }
}

fn cast(x: &Const, elem: Elem, code: i64) -> Const {
    let data = x.data.iter().map(|&v| {
        let v = elem.cast(v);
        // Float32 results are rounded so later comparisons see what onnxruntime sees.
        if code == i64::from(dt::FLOAT) {
            f64::from(v as f32)
        } else {
            v
        }
    });
    Const::new(elem, x.shape.clone(), data.collect())
}

/// Applies `f` elementwise over the broadcast of `xs`; `None` if they do not broadcast or the
/// result is too large to fold.
pub fn zip(xs: &[&Const], elem: Elem, f: impl Fn(&[f64]) -> f64) -> Option<Const> {
    let shapes: Vec<&[usize]> = xs.iter().map(|c| c.shape.as_slice()).collect();
    let out = broadcast(&shapes)?;
    if !small(&out) {
        return None;
    }
    let strides: Vec<Vec<usize>> = shapes.iter().map(|s| broadcast_strides(s, &out)).collect();
    let mut data = Vec::with_capacity(out.iter().product());
    let mut args = vec![0.0; xs.len()];
    for_each_index(&out, &strides, |offs| {
        for ((a, x), &o) in args.iter_mut().zip(xs).zip(offs) {
            *a = x.data.get(o).copied().unwrap_or(0.0);
        }
        data.push(f(&args));
    });
    Some(Const::new(elem, out, data))
}

/// The error function: Maclaurin series near zero, Lentz-free continued fraction for the tails
/// (both accurate to ~1e-14, far below what f32 models can tell apart).
pub fn erf(x: f64) -> f64 {
    if x.abs() < 2.5 {
        // Maclaurin series: erf x = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)).
        let mut term = x;
        let mut sum = x;
        for n in 1..80 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // Continued fraction for erfc, evaluated bottom-up.
        let z = x.abs();
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (z + f);
        }
        let erfc = (-z * z).exp() / (z + f) / std::f64::consts::PI.sqrt();
        (1.0 - erfc).copysign(x)
    }
}

#[cfg(test)]
mod tests {
    use super::erf;

    #[test]
    fn erf_matches_reference_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (3.0, 0.999_977_909_503_001_4),
            (-2.0, -0.995_322_265_018_952_7),
        ] {
            assert!((erf(x) - want).abs() < 1e-12, "erf({x}) = {}", erf(x));
        }
    }
}
