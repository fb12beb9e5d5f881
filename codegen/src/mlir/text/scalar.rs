//! Scalar code inside `linalg.generic` regions (f32 arithmetic, element conversions).

use super::*;

/// Elementwise scalar functions (computed in f32).
#[derive(Clone, Copy, Debug)]
pub(super) enum Ew {
    Identity,
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    Exp,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Pow(f64),
    Scale(f64),
    Gelu { tanh: bool },
    Silu,
    Relu,
    Clamp(f64),
}

impl Ew {
    pub(super) fn of(kind: &OpKind) -> Option<Ew> {
        Some(match kind {
            OpKind::Add => Ew::Add,
            OpKind::Sub => Ew::Sub,
            OpKind::Mul => Ew::Mul,
            OpKind::Div => Ew::Div,
            OpKind::Neg => Ew::Neg,
            OpKind::Exp => Ew::Exp,
            OpKind::Sqrt => Ew::Sqrt,
            OpKind::Rsqrt => Ew::Rsqrt,
            OpKind::Tanh => Ew::Tanh,
            OpKind::Sigmoid => Ew::Sigmoid,
            OpKind::Pow { exponent } => Ew::Pow(*exponent),
            OpKind::Scale { factor } => Ew::Scale(*factor),
            OpKind::Gelu { tanh } => Ew::Gelu { tanh: *tanh },
            OpKind::Silu => Ew::Silu,
            OpKind::Relu => Ew::Relu,
            OpKind::Clamp { limit } => Ew::Clamp(*limit),
            OpKind::Expand { .. } => Ew::Identity,
            _ => return None,
        })
    }

    pub(super) fn arity(self) -> usize {
        match self {
            Ew::Add | Ew::Sub | Ew::Mul | Ew::Div => 2,
            _ => 1,
        }
    }
}

impl Emitter<'_> {
    pub(super) fn widen(&mut self, x: &str, e: Elem) -> String {
        let (op, from) = match e {
            Elem::F32 => return x.to_string(),
            Elem::Bf16 | Elem::F16 => ("arith.extf", elem(e)),
            Elem::I64 => ("arith.sitofp", "i64"),
            Elem::U8 => ("arith.uitofp", "i8"),
        };
        self.define_scalar(format!("{op} {x} : {from} to f32"))
    }

    pub(super) fn narrow(&mut self, x: &str, e: Elem) -> String {
        let op = match e {
            Elem::F32 => return x.to_string(),
            Elem::Bf16 | Elem::F16 => "arith.truncf",
            Elem::I64 => "arith.fptosi",
            Elem::U8 => "arith.fptoui",
        };
        self.define_scalar(format!("{op} {x} : f32 to {}", elem(e)))
    }

    pub(super) fn f32_op(&mut self, op: &str, args: &[&str]) -> String {
        self.define_scalar(format!("{op} {} : f32", args.join(", ")))
    }

    pub(super) fn f32_const(&mut self, v: f64) -> String {
        self.define_scalar(format!("arith.constant {} : f32", float_lit(v, Elem::F32)))
    }

    pub(super) fn sigmoid(&mut self, x: &str) -> String {
        let n = self.f32_op("arith.negf", &[x]);
        let e = self.f32_op("math.exp", &[&n]);
        let one = self.f32_const(1.0);
        let d = self.f32_op("arith.addf", &[&one, &e]);
        self.f32_op("arith.divf", &[&one, &d])
    }

    pub(super) fn scalar_body(&mut self, f: Ew, xs: &[String]) -> Res<String> {
        let a = xs.first().cloned().ok_or("elementwise op without input")?;
        let b = || xs.get(1).cloned().ok_or("binary op without second input");
        Ok(match f {
            Ew::Identity => a,
            Ew::Add => self.f32_op("arith.addf", &[&a, &b()?]),
            Ew::Sub => self.f32_op("arith.subf", &[&a, &b()?]),
            Ew::Mul => self.f32_op("arith.mulf", &[&a, &b()?]),
            Ew::Div => self.f32_op("arith.divf", &[&a, &b()?]),
            Ew::Neg => self.f32_op("arith.negf", &[&a]),
            Ew::Exp => self.f32_op("math.exp", &[&a]),
            Ew::Sqrt => self.f32_op("math.sqrt", &[&a]),
            Ew::Rsqrt => self.f32_op("math.rsqrt", &[&a]),
            Ew::Tanh => self.f32_op("math.tanh", &[&a]),
            Ew::Sigmoid => self.sigmoid(&a),
            Ew::Pow(p) => {
                let c = self.f32_const(p);
                self.f32_op("math.powf", &[&a, &c])
            }
            Ew::Scale(s) => {
                let c = self.f32_const(s);
                self.f32_op("arith.mulf", &[&a, &c])
            }
            Ew::Gelu { tanh } => {
                let half = self.f32_const(0.5);
                let one = self.f32_const(1.0);
                let inner = if tanh {
                    // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
                    let x2 = self.f32_op("arith.mulf", &[&a, &a]);
                    let x3 = self.f32_op("arith.mulf", &[&x2, &a]);
                    let k = self.f32_const(0.044715);
                    let kx3 = self.f32_op("arith.mulf", &[&k, &x3]);
                    let s = self.f32_op("arith.addf", &[&a, &kx3]);
                    let c = self.f32_const((2.0 / std::f64::consts::PI).sqrt());
                    let cs = self.f32_op("arith.mulf", &[&c, &s]);
                    self.f32_op("math.tanh", &[&cs])
                } else {
                    // 0.5·x·(1 + erf(x/√2))
                    let c = self.f32_const(std::f64::consts::FRAC_1_SQRT_2);
                    let s = self.f32_op("arith.mulf", &[&a, &c]);
                    self.f32_op("math.erf", &[&s])
                };
                let p = self.f32_op("arith.addf", &[&one, &inner]);
                let hx = self.f32_op("arith.mulf", &[&half, &a]);
                self.f32_op("arith.mulf", &[&hx, &p])
            }
            Ew::Silu => {
                let s = self.sigmoid(&a);
                self.f32_op("arith.mulf", &[&a, &s])
            }
            Ew::Relu => {
                let zero = self.f32_const(0.0);
                self.f32_op("arith.maximumf", &[&a, &zero])
            }
            Ew::Clamp(l) => {
                let (low, high) = (self.f32_const(-l), self.f32_const(l));
                let floored = self.f32_op("arith.maximumf", &[&a, &low]);
                self.f32_op("arith.minimumf", &[&floored, &high])
            }
        })
    }
}
