//! linalg builders: broadcasts, elementwise maps, reductions, matmuls, transposes.

use super::*;

impl Emitter<'_> {
    /// The indexing map of an input broadcast (numpy rules) to an output of rank `rank`.
    pub(super) fn broadcast_map(inp: &[u64], out: &[u64]) -> Option<String> {
        let rank = out.len();
        if inp.len() > rank {
            return None;
        }
        let offset = rank - inp.len();
        let mut results = Vec::new();
        for (i, &d) in inp.iter().enumerate() {
            let j = offset + i;
            let o = *out.get(j)?;
            if d == o {
                results.push(format!("d{j}"));
            } else if d == 1 {
                results.push("0".into());
            } else {
                return None;
            }
        }
        Some(format!(
            "affine_map<({}) -> ({})>",
            list((0..rank).map(|j| format!("d{j}"))),
            results.join(", ")
        ))
    }

    pub(super) fn identity_map(rank: usize) -> String {
        let d = list((0..rank).map(|j| format!("d{j}")));
        format!("affine_map<({d}) -> ({d})>")
    }

    /// `linalg.generic` computing `f` elementwise in f32, inputs broadcast to `out`.
    pub(super) fn elementwise(&mut self, f: Ew, ins: &[Val], out: &Ty) -> Res<Val> {
        let mut maps = Vec::new();
        for v in ins {
            maps.push(
                Self::broadcast_map(&v.ty.shape, &out.shape).ok_or_else(|| {
                    format!("{} does not broadcast to {}", v.ty.mlir(), out.mlir())
                })?,
            );
        }
        maps.push(Self::identity_map(out.shape.len()));
        let init = self.empty(out);
        let r = self.fresh();
        let iters = list(out.shape.iter().map(|_| "\"parallel\""));
        self.line(format!(
            "{r} = linalg.generic {{indexing_maps = [{}], iterator_types = [{iters}]}} ins({} : {}) outs({} : {}) {{",
            maps.join(", "),
            list(ins.iter().map(|v| v.name.clone())),
            list(ins.iter().map(|v| v.ty.mlir())),
            init.name,
            out.mlir()
        ));
        let args: Vec<String> = ins.iter().map(|_| self.fresh()).collect();
        let acc = self.fresh();
        let mut block: Vec<String> = args
            .iter()
            .zip(ins)
            .map(|(a, v)| format!("{a}: {}", elem(v.ty.elem)))
            .collect();
        block.push(format!("{acc}: {}", elem(out.elem)));
        self.line(format!("^bb0({}):", block.join(", ")));
        let xs: Vec<String> = args
            .iter()
            .zip(ins)
            .map(|(a, v)| self.widen(a, v.ty.elem))
            .collect();
        let y = self.scalar_body(f, &xs)?;
        let y = self.narrow(&y, out.elem);
        self.line(format!("  linalg.yield {y} : {}", elem(out.elem)));
        self.line(format!("}} -> {}", out.mlir()));
        Ok(Val {
            name: r,
            ty: out.clone(),
        })
    }

    /// Sum over `axes` with a `linalg.generic` reduction; the result drops those axes.
    pub(super) fn reduce_sum(&mut self, x: &Val, axes: &[usize], out_elem: Elem) -> Res<Val> {
        let rank = x.ty.shape.len();
        let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
        let out = Ty::new(kept.iter().map(|&a| x.ty.shape[a]).collect(), out_elem);
        let init = self.zeros(&out);
        let omap = format!(
            "affine_map<({}) -> ({})>",
            list((0..rank).map(|j| format!("d{j}"))),
            list(kept.iter().map(|j| format!("d{j}")))
        );
        let iters = list((0..rank).map(|a| {
            if axes.contains(&a) {
                "\"reduction\""
            } else {
                "\"parallel\""
            }
        }));
        let r = self.fresh();
        self.line(format!(
            "{r} = linalg.generic {{indexing_maps = [{}, {omap}], iterator_types = [{iters}]}} ins({} : {}) outs({} : {}) {{",
            Self::identity_map(rank),
            x.name,
            x.ty.mlir(),
            init.name,
            out.mlir()
        ));
        let a = self.fresh();
        let acc = self.fresh();
        self.line(format!(
            "^bb0({a}: {}, {acc}: {}):",
            elem(x.ty.elem),
            elem(out_elem)
        ));
        let xa = self.widen(&a, x.ty.elem);
        let xacc = self.widen(&acc, out_elem);
        let s = self.f32_op("arith.addf", &[&xa, &xacc]);
        let s = self.narrow(&s, out_elem);
        self.line(format!("  linalg.yield {s} : {}", elem(out_elem)));
        self.line(format!("}} -> {}", out.mlir()));
        Ok(Val { name: r, ty: out })
    }

    pub(super) fn matmul(&mut self, op: &str, a: &Val, b: &Val, out: &Ty) -> Val {
        let init = self.zeros(out);
        self.define(
            format!(
                "{op} ins({}, {} : {}, {}) outs({} : {}) -> {}",
                a.name,
                b.name,
                a.ty.mlir(),
                b.ty.mlir(),
                init.name,
                out.mlir(),
                out.mlir()
            ),
            out.clone(),
        )
    }
}
