//! Small tensor values: empty, constant-filled, reshaped, converted, sliced, padded.

use super::*;

impl Emitter<'_> {
    pub(super) fn empty(&mut self, ty: &Ty) -> Val {
        self.define(format!("tensor.empty() : {}", ty.mlir()), ty.clone())
    }

    pub(super) fn scalar(&mut self, value: f64, e: Elem) -> String {
        let c = self.fresh();
        let lit = if is_float(e) {
            float_lit(value, e)
        } else if e == Elem::U8 {
            ((value as i64) as u8 as i8).to_string()
        } else {
            (value as i64).to_string()
        };
        self.line(format!("{c} = arith.constant {lit} : {}", elem(e)));
        c
    }

    pub(super) fn fill(&mut self, target: &Val, value: f64) -> Val {
        let c = self.scalar(value, target.ty.elem);
        self.define(
            format!(
                "linalg.fill ins({c} : {}) outs({} : {}) -> {}",
                elem(target.ty.elem),
                target.name,
                target.ty.mlir(),
                target.ty.mlir()
            ),
            target.ty.clone(),
        )
    }

    pub(super) fn zeros(&mut self, ty: &Ty) -> Val {
        let e = self.empty(ty);
        self.fill(&e, 0.0)
    }

    /// Row-major reshape through a 1-D view (`collapse_shape` then `expand_shape`).
    pub(super) fn reshape(&mut self, v: &Val, shape: &[u64]) -> Res<Val> {
        if v.ty.shape == shape {
            return Ok(v.clone());
        }
        let n = v.ty.numel();
        let target = Ty::new(shape.to_vec(), v.ty.elem);
        if target.numel() != n {
            return Err(format!(
                "cannot reshape {} to {} (element counts differ)",
                v.ty.mlir(),
                target.mlir()
            ));
        }
        let flat = Ty::new(vec![n], v.ty.elem);
        let mut cur = v.clone();
        match cur.ty.shape.len() {
            1 => {}
            0 => {
                cur = self.define(
                    format!(
                        "tensor.expand_shape {} [] output_shape [1] : {} into {}",
                        cur.name,
                        cur.ty.mlir(),
                        flat.mlir()
                    ),
                    flat.clone(),
                );
            }
            k => {
                cur = self.define(
                    format!(
                        "tensor.collapse_shape {} [[{}]] : {} into {}",
                        cur.name,
                        list(0..k),
                        cur.ty.mlir(),
                        flat.mlir()
                    ),
                    flat.clone(),
                );
            }
        }
        match shape.len() {
            1 => Ok(cur),
            0 => Ok(self.define(
                format!(
                    "tensor.collapse_shape {} [] : {} into {}",
                    cur.name,
                    cur.ty.mlir(),
                    target.mlir()
                ),
                target,
            )),
            k => Ok(self.define(
                format!(
                    "tensor.expand_shape {} [[{}]] output_shape [{}] : {} into {}",
                    cur.name,
                    list(0..k),
                    list(shape),
                    cur.ty.mlir(),
                    target.mlir()
                ),
                target,
            )),
        }
    }

    pub(super) fn convert(&mut self, v: &Val, e: Elem) -> Res<Val> {
        if v.ty.elem == e {
            return Ok(v.clone());
        }
        let ty = Ty::new(v.ty.shape.clone(), e);
        self.elementwise(Ew::Identity, std::slice::from_ref(v), &ty)
    }

    /// A contiguous slice `[0, n)` of a 1-D value.
    pub(super) fn prefix(&mut self, v: &Val, n: u64) -> Val {
        let ty = Ty::new(vec![n], v.ty.elem);
        self.define(
            format!(
                "tensor.extract_slice {}[0] [{n}] [1] : {} to {}",
                v.name,
                v.ty.mlir(),
                ty.mlir()
            ),
            ty,
        )
    }

    /// A 1-D value zero-padded to `n` elements.
    pub(super) fn pad(&mut self, v: &Val, n: u64) -> Val {
        let len = v.ty.numel();
        if len == n {
            return v.clone();
        }
        let z = self.zeros(&Ty::new(vec![n], v.ty.elem));
        self.define(
            format!(
                "tensor.insert_slice {} into {}[0] [{len}] [1] : {} into {}",
                v.name,
                z.name,
                v.ty.mlir(),
                z.ty.mlir()
            ),
            z.ty,
        )
    }
}
