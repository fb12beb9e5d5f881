//! Compute instructions: IR ops (forward and `Grad`) lowered to linalg/tensor, or calls to
//! external kernels.

use super::*;

impl Emitter<'_> {
    pub(super) fn lower_compute(
        &mut self,
        kind: &OpKind,
        ins: &[Val],
        outs: &[Ty],
    ) -> Res<Option<Vec<Val>>> {
        let one_out = if outs.len() == 1 { outs.first() } else { None };
        let all_float =
            ins.iter().all(|v| is_float(v.ty.elem)) && outs.iter().all(|t| is_float(t.elem));
        if let (Some(f), Some(out)) = (Ew::of(kind), one_out) {
            let fits = ins.len() == f.arity()
                && ins
                    .iter()
                    .all(|v| Self::broadcast_map(&v.ty.shape, &out.shape).is_some());
            if fits && all_float {
                return Ok(Some(vec![self.elementwise(f, ins, out)?]));
            }
            return Ok(None);
        }
        let Some(out) = one_out else {
            return self.lower_multi(kind, ins, outs);
        };
        match kind {
            OpKind::Linear { bias } if all_float => {
                let (Some(x), Some(w)) = (ins.first(), ins.get(1)) else {
                    return Ok(None);
                };
                let [k, n] = w.ty.shape[..] else {
                    return Ok(None);
                };
                if x.ty.shape.last() != Some(&k) || out.shape.last() != Some(&n) || k == 0 {
                    return Ok(None);
                }
                let m = x.ty.numel() / k;
                if m * n != out.numel() || ins.len() != 2 + usize::from(*bias) {
                    return Ok(None);
                }
                let x2 = self.reshape(x, &[m, k])?;
                let mut y = self.matmul("linalg.matmul", &x2, w, &Ty::new(vec![m, n], out.elem));
                if *bias {
                    let Some(bv) = ins.get(2) else {
                        return Ok(None);
                    };
                    if Self::broadcast_map(&bv.ty.shape, &y.ty.shape).is_none() {
                        return Ok(None);
                    }
                    let ty = y.ty.clone();
                    y = self.elementwise(Ew::Add, &[y, bv.clone()], &ty)?;
                }
                Ok(Some(vec![self.reshape(&y, &out.shape)?]))
            }
            OpKind::MatMul if all_float && ins.len() == 2 => {
                let (a, b) = (&ins[0], &ins[1]);
                let (ra, rb) = (a.ty.shape.len(), b.ty.shape.len());
                if ra < 2 || rb < 2 || out.shape.len() < 2 {
                    return Ok(None);
                }
                let (m, k) = (a.ty.shape[ra - 2], a.ty.shape[ra - 1]);
                let (k2, n) = (b.ty.shape[rb - 2], b.ty.shape[rb - 1]);
                if k != k2 || out.shape[out.shape.len() - 2..] != [m, n] {
                    return Ok(None);
                }
                if rb == 2 {
                    let rows = a.ty.numel() / k.max(1);
                    if rows * n != out.numel() {
                        return Ok(None);
                    }
                    let a2 = self.reshape(a, &[rows, k])?;
                    let y = self.matmul("linalg.matmul", &a2, b, &Ty::new(vec![rows, n], out.elem));
                    return Ok(Some(vec![self.reshape(&y, &out.shape)?]));
                }
                if a.ty.shape[..ra - 2] != b.ty.shape[..rb - 2]
                    || out.shape[..out.shape.len() - 2] != a.ty.shape[..ra - 2]
                {
                    return Ok(None);
                }
                let batch: u64 = a.ty.shape[..ra - 2].iter().product();
                let a3 = self.reshape(a, &[batch, m, k])?;
                let b3 = self.reshape(b, &[batch, k, n])?;
                let y = self.matmul(
                    "linalg.batch_matmul",
                    &a3,
                    &b3,
                    &Ty::new(vec![batch, m, n], out.elem),
                );
                Ok(Some(vec![self.reshape(&y, &out.shape)?]))
            }
            OpKind::ReduceSum | OpKind::ReduceMean if all_float && ins.len() == 1 => {
                let x = &ins[0];
                let rank = x.ty.shape.len();
                let mut expect = x.ty.shape.clone();
                if let Some(l) = expect.last_mut() {
                    *l = 1;
                }
                if rank == 0 || out.shape != expect {
                    return Ok(None);
                }
                let mut y = self.reduce_sum(x, &[rank - 1], out.elem)?;
                if matches!(kind, OpKind::ReduceMean) {
                    let n = x.ty.shape[rank - 1].max(1) as f64;
                    let ty = y.ty.clone();
                    y = self.elementwise(Ew::Scale(1.0 / n), &[y], &ty)?;
                }
                Ok(Some(vec![self.reshape(&y, &out.shape)?]))
            }
            OpKind::Softmax { causal: false } if ins.len() == 1 => {
                let x = &ins[0];
                if x.ty != *out || !is_float(out.elem) || out.shape.is_empty() {
                    return Ok(None);
                }
                let init = self.empty(out);
                Ok(Some(vec![self.define(
                    format!(
                        "linalg.softmax dimension({}) ins({} : {}) outs({} : {}) -> {}",
                        out.shape.len() - 1,
                        x.name,
                        x.ty.mlir(),
                        init.name,
                        out.mlir(),
                        out.mlir()
                    ),
                    out.clone(),
                )]))
            }
            OpKind::Transpose { perm } if ins.len() == 1 => {
                let x = &ins[0];
                let permuted: Option<Vec<u64>> =
                    perm.iter().map(|&p| x.ty.shape.get(p).copied()).collect();
                if permuted.as_deref() != Some(&out.shape[..])
                    || perm.len() != x.ty.shape.len()
                    || x.ty.elem != out.elem
                {
                    return Ok(None);
                }
                Ok(Some(vec![self.transpose(x, perm)]))
            }
            OpKind::Reshape { .. } if ins.len() == 1 && ins[0].ty.numel() == out.numel() => {
                let y = self.reshape(&ins[0], &out.shape)?;
                Ok(Some(vec![self.convert(&y, out.elem)?]))
            }
            OpKind::Slice { axis, start, end } if ins.len() == 1 => {
                let y = self.slice(&ins[0], *axis, *start, *end, out)?;
                Ok(y.map(|v| vec![v]))
            }
            OpKind::Concat { axis } if !ins.is_empty() => {
                let a = *axis;
                let total: Option<u64> = ins.iter().map(|v| v.ty.shape.get(a).copied()).sum();
                let same = ins.iter().all(|v| {
                    v.ty.elem == out.elem
                        && v.ty.shape.len() == out.shape.len()
                        && v.ty
                            .shape
                            .iter()
                            .enumerate()
                            .all(|(i, &d)| i == a || out.shape.get(i) == Some(&d))
                });
                if !same || total != out.shape.get(a).copied() {
                    return Ok(None);
                }
                Ok(Some(vec![self.define(
                    format!(
                        "tensor.concat dim({a}) {} : ({}) -> {}",
                        list(ins.iter().map(|v| v.name.clone())),
                        list(ins.iter().map(|v| v.ty.mlir())),
                        out.mlir()
                    ),
                    out.clone(),
                )]))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn transpose(&mut self, x: &Val, perm: &[usize]) -> Val {
        let shape: Vec<u64> = perm
            .iter()
            .map(|&p| x.ty.shape.get(p).copied().unwrap_or(1))
            .collect();
        let out = Ty::new(shape, x.ty.elem);
        let init = self.empty(&out);
        self.define(
            format!(
                "linalg.transpose ins({} : {}) outs({} : {}) permutation = [{}]",
                x.name,
                x.ty.mlir(),
                init.name,
                out.mlir(),
                list(perm)
            ),
            out,
        )
    }

    /// Backward of `Linear` and `MatMul` as matmuls: dx = dy·wᵀ, dw = xᵀ·dy, db = Σ_rows dy.
    /// Operands are the forward's inputs then dy; results follow `wrt`.
    pub(super) fn lower_grad(
        &mut self,
        of: &OpKind,
        wrt: &[usize],
        ins: &[Val],
        outs: &[Ty],
    ) -> Res<Option<Vec<Val>>> {
        let floats =
            ins.iter().all(|v| is_float(v.ty.elem)) && outs.iter().all(|t| is_float(t.elem));
        if !floats || wrt.len() != outs.len() {
            return Ok(None);
        }
        match of {
            OpKind::Linear { bias } => {
                let (Some(x), Some(w), Some(dy)) =
                    (ins.first(), ins.get(1), ins.get(2 + usize::from(*bias)))
                else {
                    return Ok(None);
                };
                let [k, n] = w.ty.shape[..] else {
                    return Ok(None);
                };
                if k == 0 || x.ty.shape.last() != Some(&k) || dy.ty.shape.last() != Some(&n) {
                    return Ok(None);
                }
                let m = x.ty.numel() / k;
                if dy.ty.numel() != m * n {
                    return Ok(None);
                }
                let expect = |i: usize| match i {
                    0 => Some(x.ty.shape.clone()),
                    1 => Some(vec![k, n]),
                    2 if *bias => Some(vec![n]),
                    _ => None,
                };
                if wrt
                    .iter()
                    .zip(outs)
                    .any(|(&i, o)| expect(i).map(|e| Ty::new(e, o.elem).numel()) != Some(o.numel()))
                {
                    return Ok(None);
                }
                let dy2 = self.reshape(dy, &[m, n])?;
                let mut vals = Vec::new();
                for (&i, o) in wrt.iter().zip(outs) {
                    let v = match i {
                        0 => {
                            let wt = self.transpose(w, &[1, 0]);
                            self.matmul("linalg.matmul", &dy2, &wt, &Ty::new(vec![m, k], o.elem))
                        }
                        1 => {
                            let x2 = self.reshape(x, &[m, k])?;
                            let xt = self.transpose(&x2, &[1, 0]);
                            self.matmul("linalg.matmul", &xt, &dy2, &Ty::new(vec![k, n], o.elem))
                        }
                        _ => self.reduce_sum(&dy2, &[0], o.elem)?,
                    };
                    vals.push(self.reshape(&v, &o.shape)?);
                }
                Ok(Some(vals))
            }
            OpKind::MatMul => {
                let (Some(a), Some(b), Some(dy)) = (ins.first(), ins.get(1), ins.get(2)) else {
                    return Ok(None);
                };
                let (ra, rb) = (a.ty.shape.len(), b.ty.shape.len());
                if ra < 2 || rb < 2 || dy.ty.shape.len() != ra {
                    return Ok(None);
                }
                let (m, k) = (a.ty.shape[ra - 2], a.ty.shape[ra - 1]);
                let n = b.ty.shape[rb - 1];
                let same_batch = a.ty.shape[..ra - 2] == b.ty.shape[..rb - 2];
                if b.ty.shape[rb - 2] != k || !(rb == 2 || same_batch) {
                    return Ok(None);
                }
                let batch: u64 = a.ty.shape[..ra - 2].iter().product();
                if dy.ty.numel() != batch * m * n
                    || wrt.iter().zip(outs).any(|(&i, o)| match i {
                        0 => o.numel() != a.ty.numel(),
                        1 => o.numel() != b.ty.numel(),
                        _ => true,
                    })
                {
                    return Ok(None);
                }
                let mut vals = Vec::new();
                for (&i, o) in wrt.iter().zip(outs) {
                    let v = if rb == 2 {
                        let dy2 = self.reshape(dy, &[batch * m, n])?;
                        if i == 0 {
                            let bt = self.transpose(b, &[1, 0]);
                            self.matmul(
                                "linalg.matmul",
                                &dy2,
                                &bt,
                                &Ty::new(vec![batch * m, k], o.elem),
                            )
                        } else {
                            let a2 = self.reshape(a, &[batch * m, k])?;
                            let at = self.transpose(&a2, &[1, 0]);
                            self.matmul("linalg.matmul", &at, &dy2, &Ty::new(vec![k, n], o.elem))
                        }
                    } else {
                        let dy3 = self.reshape(dy, &[batch, m, n])?;
                        if i == 0 {
                            let b3 = self.reshape(b, &[batch, k, n])?;
                            let bt = self.transpose(&b3, &[0, 2, 1]);
                            self.matmul(
                                "linalg.batch_matmul",
                                &dy3,
                                &bt,
                                &Ty::new(vec![batch, m, k], o.elem),
                            )
                        } else {
                            let a3 = self.reshape(a, &[batch, m, k])?;
                            let at = self.transpose(&a3, &[0, 2, 1]);
                            self.matmul(
                                "linalg.batch_matmul",
                                &at,
                                &dy3,
                                &Ty::new(vec![batch, k, n], o.elem),
                            )
                        }
                    };
                    vals.push(self.reshape(&v, &o.shape)?);
                }
                Ok(Some(vals))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn lower_multi(
        &mut self,
        kind: &OpKind,
        ins: &[Val],
        outs: &[Ty],
    ) -> Res<Option<Vec<Val>>> {
        match kind {
            OpKind::Split { axis, sizes } if ins.len() == 1 && sizes.len() == outs.len() => {
                let mut start = 0;
                let mut vals = Vec::new();
                for (out, &s) in outs.iter().zip(sizes) {
                    match self.slice(&ins[0], *axis, start, start + s, out)? {
                        Some(v) => vals.push(v),
                        None => return Ok(None),
                    }
                    start += s;
                }
                Ok(Some(vals))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn slice(
        &mut self,
        x: &Val,
        axis: usize,
        start: u64,
        end: u64,
        out: &Ty,
    ) -> Res<Option<Val>> {
        if axis >= x.ty.shape.len() || end < start || x.ty.shape.get(axis).is_none_or(|&d| end > d)
        {
            return Ok(None);
        }
        let mut sizes = x.ty.shape.clone();
        sizes[axis] = end - start;
        let ty = Ty::new(sizes.clone(), x.ty.elem);
        if ty.numel() != out.numel() {
            return Ok(None);
        }
        let offsets = (0..sizes.len()).map(|i| if i == axis { start } else { 0 });
        let r = self.define(
            format!(
                "tensor.extract_slice {}[{}] [{}] [{}] : {} to {}",
                x.name,
                list(offsets),
                list(&sizes),
                list(sizes.iter().map(|_| 1)),
                x.ty.mlir(),
                ty.mlir()
            ),
            ty,
        );
        let y = self.reshape(&r, &out.shape)?;
        Ok(Some(self.convert(&y, out.elem)?))
    }

    /// The values of `bufs`, in order.
    pub(super) fn vals(&self, bufs: &[BufferId]) -> Res<Vec<Val>> {
        bufs.iter().map(|&b| self.val(b)).collect()
    }

    /// The declared types of `bufs`, in order.
    pub(super) fn tys(&self, bufs: &[BufferId]) -> Res<Vec<Ty>> {
        bufs.iter().map(|&b| self.ty(b)).collect()
    }

    pub(super) fn compute(
        &mut self,
        kind: &OpKind,
        inputs: &[BufferId],
        outputs: &[BufferId],
        saves: &[BufferId],
        layer: Option<u32>,
    ) -> Res<()> {
        let ins = self.vals(inputs)?;
        let outs = self.tys(outputs)?;
        let lowered = match kind {
            OpKind::Grad { of, wrt } => self.lower_grad(of, wrt, &ins, &outs)?,
            _ => self.lower_compute(kind, &ins, &outs)?,
        };
        let vals = match lowered {
            Some(v) => v,
            None => {
                let save_tys = saves.iter().map(|&b| self.ty(b)).collect::<Res<Vec<_>>>()?;
                let all: Vec<Ty> = outs.iter().chain(save_tys.iter()).cloned().collect();
                let name = match kind {
                    OpKind::Grad { of, .. } => format!("grad.{}", of.mnemonic()),
                    k => k.mnemonic().to_string(),
                };
                let mut attrs = vec![format!("plait.op = {}", str_lit(&format!("{kind:?}")))];
                if let Some(l) = layer {
                    attrs.push(format!("plait.layer = {l} : i64"));
                }
                let r = self.kernel(&name, &ins, &all, &format!("{{{}}}", attrs.join(", ")));
                for (&b, v) in saves.iter().zip(r.iter().skip(outs.len())) {
                    self.set(b, v.clone());
                }
                r.into_iter().take(outs.len()).collect()
            }
        };
        for (&b, v) in outputs.iter().zip(vals) {
            self.set(b, v);
        }
        Ok(())
    }

    /// A `func.call` to the external kernel `@plait.<name>` declared with these types.
    pub(super) fn kernel(&mut self, name: &str, ins: &[Val], outs: &[Ty], attrs: &str) -> Vec<Val> {
        let in_tys = list(ins.iter().map(|v| v.ty.mlir()));
        let out_tys = list(outs.iter().map(Ty::mlir));
        let results = match outs.len() {
            1 => out_tys.clone(),
            _ => format!("({out_tys})"),
        };
        let sig = format!("({in_tys}) -> {results}");
        let base = format!("plait.{}", sym(name));
        let key = (base.clone(), sig.clone());
        let symbol = match self.extern_syms.get(&key) {
            Some(s) => s.clone(),
            None => {
                let mut s = base.clone();
                let mut k = 0;
                while self.externs.contains_key(&s) {
                    k += 1;
                    s = format!("{base}.{k}");
                }
                self.externs
                    .insert(s.clone(), format!("func.func private @{s}{sig}"));
                self.extern_syms.insert(key, s.clone());
                s
            }
        };
        let r = self.fresh();
        let lhs = match outs.len() {
            0 => String::new(),
            1 => format!("{r} = "),
            n => format!("{r}:{n} = "),
        };
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {attrs}")
        };
        self.line(format!(
            "{lhs}func.call @{symbol}({}){attrs} : {sig}",
            list(ins.iter().map(|v| v.name.clone()))
        ));
        outs.iter()
            .enumerate()
            .map(|(i, t)| Val {
                name: if outs.len() == 1 {
                    r.clone()
                } else {
                    format!("{r}#{i}")
                },
                ty: t.clone(),
            })
            .collect()
    }
}
