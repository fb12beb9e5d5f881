//! The MLIR text of one template (see the parent module for what is emitted and why).
//!
//! Plain string building: the text is parsed and verified by MLIR afterwards
//! ([`super::Verifier`]), and the file written is exactly the text verified, comments included.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use ir::OpKind;

use super::{MlirError, MlirModule};
use crate::ids::BufferId;
use crate::program::{CollectiveOp, Elem, Instr, Pass, Peer, ProgramSet, Role, Slot, Template};

/// A tensor type: local shape and storage element.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ty {
    shape: Vec<u64>,
    elem: Elem,
}

impl Ty {
    fn new(shape: Vec<u64>, elem: Elem) -> Ty {
        Ty { shape, elem }
    }

    fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    fn mlir(&self) -> String {
        let mut s = String::from("tensor<");
        for d in &self.shape {
            let _ = write!(s, "{d}x");
        }
        s.push_str(elem(self.elem));
        s.push('>');
        s
    }
}

fn elem(e: Elem) -> &'static str {
    match e {
        Elem::F32 => "f32",
        Elem::Bf16 => "bf16",
        Elem::F16 => "f16",
        Elem::I64 => "i64",
        // MLIR integers are signless: a byte mask is i8, converted as unsigned.
        Elem::U8 => "i8",
    }
}

fn is_float(e: Elem) -> bool {
    matches!(e, Elem::F32 | Elem::Bf16 | Elem::F16)
}

/// An MLIR float literal (always with a dot: `5.0e-01`); non-finite values in hex.
fn float_lit(v: f64, e: Elem) -> String {
    if v.is_finite() {
        let s = format!("{v:e}");
        match s.split_once('e') {
            Some((m, x)) if !m.contains('.') => format!("{m}.0e{x}"),
            _ => s,
        }
    } else {
        let (inf, ninf, nan) = match e {
            Elem::Bf16 => ("0x7F80", "0xFF80", "0x7FC0"),
            Elem::F16 => ("0x7C00", "0xFC00", "0x7E00"),
            _ => ("0x7F800000", "0xFF800000", "0x7FC00000"),
        };
        if v.is_nan() {
            nan.into()
        } else if v > 0.0 {
            inf.into()
        } else {
            ninf.into()
        }
    }
}

/// An MLIR string literal.
fn str_lit(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn list(xs: impl IntoIterator<Item = impl std::fmt::Display>) -> String {
    xs.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A symbol-safe kernel name.
fn sym(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// An SSA value and its type.
#[derive(Clone, Debug)]
struct Val {
    name: String,
    ty: Ty,
}

/// Elementwise scalar functions (computed in f32).
#[derive(Clone, Copy, Debug)]
enum Ew {
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
}

impl Ew {
    fn of(kind: &OpKind) -> Option<Ew> {
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
            OpKind::Expand { .. } => Ew::Identity,
            _ => return None,
        })
    }

    fn arity(self) -> usize {
        match self {
            Ew::Add | Ew::Sub | Ew::Mul | Ew::Div => 2,
            _ => 1,
        }
    }
}

type Res<T> = Result<T, String>;

struct Emitter<'a> {
    set: &'a ProgramSet,
    t: &'a Template,
    lines: Vec<String>,
    counter: usize,
    vals: HashMap<BufferId, Val>,
    /// Last value of each buffer, kept after `Free` (a persistent buffer's final value).
    last: HashMap<BufferId, Val>,
    /// Declared external kernels: symbol → declaration.
    externs: BTreeMap<String, String>,
    extern_syms: HashMap<(String, String), String>,
    uses_tied: bool,
}

/// The MLIR module of one template (unverified; see [`super::export`]).
pub fn emit_template(set: &ProgramSet, t: &Template) -> Result<MlirModule, MlirError> {
    let err = |message: String| MlirError::Emit {
        template: t.id,
        message,
    };
    let mut e = Emitter {
        set,
        t,
        lines: Vec::new(),
        counter: 0,
        vals: HashMap::new(),
        last: HashMap::new(),
        externs: BTreeMap::new(),
        extern_syms: HashMap::new(),
        uses_tied: false,
    };
    let state = live_ins(&t.instrs);
    let init = e
        .function("init", &t.init, &live_ins(&t.init), &state)
        .map_err(err)?;
    let step = e.function("step", &t.instrs, &state, &state).map_err(err)?;

    let ranks: Vec<u32> = set
        .ranks
        .iter()
        .filter(|r| r.template == t.id)
        .map(|r| r.rank)
        .collect();
    let m = &set.mesh;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "// {} as MLIR: template {} (pipeline stage {}, chunks {:?}), run by ranks {:?}",
        set.format, t.id, t.stage, t.chunks, ranks
    );
    let _ = writeln!(
        out,
        "// model {}; mesh pp {} x dp {} x tp {}; schedule {}, {} micro-batch(es); grid axes: 0 = pp, 1 = dp, 2 = tp",
        set.model, m.pp, m.dp, m.tp, m.schedule, m.micro_batches
    );
    let _ = writeln!(
        out,
        "module attributes {{plait.format = {}, plait.model = {}, plait.template = {} : i64, plait.stage = {} : i64, plait.ranks = array<i64{}>}} {{",
        str_lit(&set.format),
        str_lit(&set.model),
        t.id.0,
        t.stage,
        if ranks.is_empty() {
            String::new()
        } else {
            format!(": {}", list(&ranks))
        }
    );
    let _ = writeln!(
        out,
        "  shard.grid @mesh(shape = {}x{}x{})",
        m.pp, m.dp, m.tp
    );
    if e.uses_tied {
        let _ = writeln!(
            out,
            "  // first and last pipeline stage (tied embedding gradients)\n  shard.grid @tied(shape = 2x{}x{})",
            m.dp, m.tp
        );
    }
    for decl in e.externs.values() {
        let _ = writeln!(out, "  {decl}");
    }
    out.push_str(&init);
    out.push_str(&step);
    out.push_str("}\n");
    Ok(MlirModule {
        name: format!("template-{}", t.id.0),
        template: t.id,
        ranks,
        text: out,
    })
}

/// Buffers an instruction list uses before allocating them, in order of first use.
fn live_ins(instrs: &[Instr]) -> Vec<BufferId> {
    let mut defined = HashSet::new();
    let mut out = Vec::new();
    for i in instrs {
        if let Instr::Alloc { buf } = i {
            defined.insert(*buf);
            continue;
        }
        for b in refs(i) {
            if defined.insert(b) {
                out.push(b);
            }
        }
    }
    out
}

/// Every buffer an instruction reads or writes (not `Alloc`/`Free`).
fn refs(i: &Instr) -> Vec<BufferId> {
    match i {
        Instr::Alloc { .. } | Instr::Free { .. } => vec![],
        Instr::Task { .. } | Instr::RecomputeBegin { .. } | Instr::RecomputeEnd { .. } => vec![],
        Instr::InitParams { bufs } => bufs.clone(),
        Instr::LoadTokens {
            input_ids, targets, ..
        } => input_ids.iter().chain(targets.iter()).copied().collect(),
        Instr::Fill { buf, .. } => vec![*buf],
        Instr::Copy { src, dst } => vec![*src, *dst],
        Instr::Compute {
            inputs,
            outputs,
            saves,
            ..
        } => inputs
            .iter()
            .chain(outputs.iter())
            .chain(saves.iter())
            .copied()
            .collect(),
        Instr::Collective { pairs, .. } => pairs.iter().flat_map(|&(a, b)| [a, b]).collect(),
        Instr::Chunk { src, dst, .. } => vec![*src, *dst],
        Instr::Send { buf, .. } | Instr::Recv { buf, .. } => vec![*buf],
        Instr::AdamW {
            param, grad, m, v, ..
        } => vec![*param, *grad, *m, *v],
        Instr::Loss { buf, .. } => vec![*buf],
    }
}

impl Emitter<'_> {
    fn fresh(&mut self) -> String {
        self.counter += 1;
        format!("%v{}", self.counter)
    }

    fn line(&mut self, s: String) {
        self.lines.push(s);
    }

    /// `%vN = rhs`: a new value of type `ty`.
    fn define(&mut self, rhs: String, ty: Ty) -> Val {
        let name = self.fresh();
        self.line(format!("{name} = {rhs}"));
        Val { name, ty }
    }

    /// `  %vN = rhs` inside a region: a new scalar's name.
    fn define_scalar(&mut self, rhs: String) -> String {
        let name = self.fresh();
        self.line(format!("  {name} = {rhs}"));
        name
    }

    fn ty(&self, b: BufferId) -> Res<Ty> {
        self.t
            .buffer(b)
            .map(|d| Ty::new(d.shape.clone(), d.elem))
            .ok_or_else(|| format!("buffer {b} is not declared"))
    }

    fn val(&self, b: BufferId) -> Res<Val> {
        self.vals
            .get(&b)
            .or_else(|| self.last.get(&b))
            .cloned()
            .ok_or_else(|| format!("buffer {b} is used before it has a value"))
    }

    /// The buffer's value, or a fresh `tensor.empty` when it has none (a receive target).
    fn val_or_empty(&mut self, b: BufferId) -> Res<Val> {
        match self.vals.get(&b) {
            Some(v) => Ok(v.clone()),
            None => {
                let ty = self.ty(b)?;
                Ok(self.empty(&ty))
            }
        }
    }

    fn set(&mut self, b: BufferId, v: Val) {
        self.last.insert(b, v.clone());
        self.vals.insert(b, v);
    }

    fn function(
        &mut self,
        name: &str,
        instrs: &[Instr],
        args: &[BufferId],
        results: &[BufferId],
    ) -> Res<String> {
        self.lines.clear();
        self.vals.clear();
        self.last.clear();
        let mut params = Vec::new();
        for &b in args {
            let ty = self.ty(b)?;
            let decl = self.t.buffer(b).map(|d| d.name.clone()).unwrap_or_default();
            params.push(format!(
                "%b{}: {} {{plait.buffer = {}}}",
                b.0,
                ty.mlir(),
                str_lit(&decl)
            ));
            self.set(
                b,
                Val {
                    name: format!("%b{}", b.0),
                    ty,
                },
            );
        }
        for i in instrs {
            self.instr(i)?;
        }
        let mut rets = Vec::new();
        for &b in results {
            let v = match self.last.get(&b) {
                Some(v) => v.clone(),
                None => {
                    let ty = self.ty(b)?;
                    self.empty(&ty)
                }
            };
            rets.push(v);
        }
        let rtys = list(rets.iter().map(|v| v.ty.mlir()));
        let mut out = String::new();
        let _ = write!(out, "  func.func @{name}({})", params.join(", "));
        if !rets.is_empty() {
            let _ = write!(out, " -> ({rtys})");
        }
        out.push_str(" {\n");
        for l in &self.lines {
            let _ = writeln!(out, "    {l}");
        }
        if rets.is_empty() {
            out.push_str("    return\n");
        } else {
            let _ = writeln!(
                out,
                "    return {} : {rtys}",
                list(rets.iter().map(|v| v.name.clone()))
            );
        }
        out.push_str("  }\n");
        Ok(out)
    }

    fn instr(&mut self, i: &Instr) -> Res<()> {
        match i {
            Instr::Alloc { buf } => {
                let ty = self.ty(*buf)?;
                let v = self.empty(&ty);
                self.set(*buf, v);
            }
            Instr::Free { buf } => {
                self.vals.remove(buf);
            }
            Instr::Task {
                phase,
                chunk,
                micro_batch,
                pass,
            } => {
                let p = match pass {
                    Pass::Forward => "forward",
                    Pass::Backward => "backward",
                };
                self.line(format!(
                    "// {}: chunk {chunk}, micro-batch {micro_batch}, {p}",
                    phase.name()
                ));
            }
            Instr::RecomputeBegin { layer } => {
                self.line(format!("// recompute layer {layer}"));
            }
            Instr::RecomputeEnd { layer } => {
                self.line(format!("// end of recompute of layer {layer}"));
            }
            Instr::InitParams { bufs } => {
                for &b in bufs {
                    let ty = self.ty(b)?;
                    let param = self.param_name(b);
                    let attrs = format!("{{plait.param = {}}}", str_lit(&param));
                    let r = self.kernel("init_param", &[], &[ty], &attrs);
                    if let Some(v) = r.into_iter().next() {
                        self.set(b, v);
                    }
                }
            }
            Instr::LoadTokens {
                micro_batch,
                input_ids,
                targets,
            } => {
                let bufs: Vec<BufferId> = input_ids.iter().chain(targets.iter()).copied().collect();
                let tys = bufs.iter().map(|&b| self.ty(b)).collect::<Res<Vec<_>>>()?;
                let what = match (input_ids, targets) {
                    (Some(_), Some(_)) => "load_tokens",
                    (Some(_), None) => "load_input_ids",
                    _ => "load_targets",
                };
                let attrs = format!("{{plait.micro_batch = {micro_batch} : i64}}");
                let r = self.kernel(what, &[], &tys, &attrs);
                for (b, v) in bufs.into_iter().zip(r) {
                    self.set(b, v);
                }
            }
            Instr::Fill { buf, value } => {
                let target = self.val_or_empty(*buf)?;
                let v = self.fill(&target, *value);
                self.set(*buf, v);
            }
            Instr::Copy { src, dst } => {
                let s = self.val(*src)?;
                let ty = self.ty(*dst)?;
                let v = self.reshape(&s, &ty.shape)?;
                let v = self.convert(&v, ty.elem)?;
                self.set(*dst, v);
            }
            Instr::Compute {
                kind,
                inputs,
                outputs,
                saves,
                layer,
            } => self.compute(kind, inputs, outputs, saves, *layer)?,
            Instr::Collective {
                op,
                group,
                axis,
                pairs,
                purpose,
                bucket,
                ..
            } => {
                let mut attrs = vec![format!(
                    "plait.purpose = {}",
                    serde_json::to_string(purpose).unwrap_or_else(|_| "\"\"".into())
                )];
                if let Some(b) = bucket {
                    attrs.push(format!("plait.bucket = {} : i64", b.0));
                }
                let attrs = format!("{{{}}}", attrs.join(", "));
                for &(i, o) in pairs {
                    let x = self.val(i)?;
                    let ty = self.ty(o)?;
                    let v = self.collective(*op, *group, *axis, &x, &ty, &attrs)?;
                    self.set(o, v);
                }
            }
            Instr::Chunk {
                src,
                dst,
                axis,
                group,
            } => {
                let x = self.val(*src)?;
                let ty = self.ty(*dst)?;
                let v = self.scatter_like("all_slice", *group, *axis, &x, &ty, "")?;
                self.set(*dst, v);
            }
            Instr::Send { buf, peer, tag } => {
                let x = self.val(*buf)?;
                let stage = self.peer_stage(*peer);
                let r = self.fresh();
                self.line(format!(
                    "{r} = shard.send {} on @mesh grid_axes = [0] destination = [{stage}] {{plait.tag = {tag} : i64}} : ({}) -> {}",
                    x.name,
                    x.ty.mlir(),
                    x.ty.mlir()
                ));
            }
            Instr::Recv { buf, peer, tag } => {
                let x = self.val_or_empty(*buf)?;
                let stage = self.peer_stage(*peer);
                let r = self.define(format!(
                    "shard.recv {} on @mesh grid_axes = [0] source = [{stage}] {{plait.tag = {tag} : i64}} : ({}) -> {}",
                    x.name,
                    x.ty.mlir(),
                    x.ty.mlir()
                ), x.ty);
                self.set(*buf, r);
            }
            Instr::AdamW {
                config,
                param,
                grad,
                m,
                v,
            } => {
                let ins = [*param, *grad, *m, *v]
                    .iter()
                    .map(|&b| self.val(b))
                    .collect::<Res<Vec<_>>>()?;
                let outs = [*param, *m, *v]
                    .iter()
                    .map(|&b| self.ty(b))
                    .collect::<Res<Vec<_>>>()?;
                let attrs = format!("{{plait.op = {}}}", str_lit(&format!("{config:?}")));
                let r = self.kernel("adamw", &ins, &outs, &attrs);
                for (b, val) in [*param, *m, *v].into_iter().zip(r) {
                    self.set(b, val);
                }
            }
            Instr::Loss { buf, weight } => {
                let x = self.val(*buf)?;
                let attrs = format!("{{plait.weight = {} : f64}}", float_lit(*weight, Elem::F32));
                self.kernel("loss", &[x], &[], &attrs);
            }
        }
        Ok(())
    }

    fn param_name(&self, b: BufferId) -> String {
        let from_role = self.t.buffer(b).and_then(|d| d.role.param());
        let p = from_role.or_else(|| self.t.shards.iter().find(|s| s.init == b).map(|s| s.param));
        match p.and_then(|p| self.set.params.get(p.index())) {
            Some(info) => info.name.clone(),
            None => match self.t.buffer(b) {
                Some(d) if matches!(d.role, Role::Param(_)) => d.name.clone(),
                Some(d) => d.name.clone(),
                None => String::new(),
            },
        }
    }

    fn peer_stage(&self, p: Peer) -> u32 {
        let pp = self.set.mesh.pp.max(1);
        let s = self.t.stage % pp;
        match p {
            Peer::Prev => (s + pp - 1) % pp,
            Peer::Next => (s + 1) % pp,
        }
    }

    /// The grid, axis and group size of a communicator slot.
    fn grid(&mut self, slot: Slot) -> (&'static str, u8, u64) {
        let m = &self.set.mesh;
        match slot {
            Slot::Tp => ("mesh", 2, u64::from(m.tp.max(1))),
            Slot::Dp => ("mesh", 1, u64::from(m.dp.max(1))),
            Slot::Tied if m.pp <= 2 => ("mesh", 0, u64::from(m.pp.max(1))),
            Slot::Tied => {
                self.uses_tied = true;
                ("tied", 0, 2)
            }
        }
    }

    // ---- small tensor helpers ----

    fn empty(&mut self, ty: &Ty) -> Val {
        self.define(format!("tensor.empty() : {}", ty.mlir()), ty.clone())
    }

    fn scalar(&mut self, value: f64, e: Elem) -> String {
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

    fn fill(&mut self, target: &Val, value: f64) -> Val {
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

    fn zeros(&mut self, ty: &Ty) -> Val {
        let e = self.empty(ty);
        self.fill(&e, 0.0)
    }

    /// Row-major reshape through a 1-D view (`collapse_shape` then `expand_shape`).
    fn reshape(&mut self, v: &Val, shape: &[u64]) -> Res<Val> {
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

    fn convert(&mut self, v: &Val, e: Elem) -> Res<Val> {
        if v.ty.elem == e {
            return Ok(v.clone());
        }
        let ty = Ty::new(v.ty.shape.clone(), e);
        self.elementwise(Ew::Identity, std::slice::from_ref(v), &ty)
    }

    /// A contiguous slice `[0, n)` of a 1-D value.
    fn prefix(&mut self, v: &Val, n: u64) -> Val {
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
    fn pad(&mut self, v: &Val, n: u64) -> Val {
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

    // ---- scalar code inside linalg regions ----

    fn widen(&mut self, x: &str, e: Elem) -> String {
        let (op, from) = match e {
            Elem::F32 => return x.to_string(),
            Elem::Bf16 | Elem::F16 => ("arith.extf", elem(e)),
            Elem::I64 => ("arith.sitofp", "i64"),
            Elem::U8 => ("arith.uitofp", "i8"),
        };
        self.define_scalar(format!("{op} {x} : {from} to f32"))
    }

    fn narrow(&mut self, x: &str, e: Elem) -> String {
        let op = match e {
            Elem::F32 => return x.to_string(),
            Elem::Bf16 | Elem::F16 => "arith.truncf",
            Elem::I64 => "arith.fptosi",
            Elem::U8 => "arith.fptoui",
        };
        self.define_scalar(format!("{op} {x} : f32 to {}", elem(e)))
    }

    fn f32_op(&mut self, op: &str, args: &[&str]) -> String {
        self.define_scalar(format!("{op} {} : f32", args.join(", ")))
    }

    fn f32_const(&mut self, v: f64) -> String {
        self.define_scalar(format!("arith.constant {} : f32", float_lit(v, Elem::F32)))
    }

    fn sigmoid(&mut self, x: &str) -> String {
        let n = self.f32_op("arith.negf", &[x]);
        let e = self.f32_op("math.exp", &[&n]);
        let one = self.f32_const(1.0);
        let d = self.f32_op("arith.addf", &[&one, &e]);
        self.f32_op("arith.divf", &[&one, &d])
    }

    fn scalar_body(&mut self, f: Ew, xs: &[String]) -> Res<String> {
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
        })
    }

    // ---- linalg ----

    /// The indexing map of an input broadcast (numpy rules) to an output of rank `rank`.
    fn broadcast_map(inp: &[u64], out: &[u64]) -> Option<String> {
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

    fn identity_map(rank: usize) -> String {
        let d = list((0..rank).map(|j| format!("d{j}")));
        format!("affine_map<({d}) -> ({d})>")
    }

    /// `linalg.generic` computing `f` elementwise in f32, inputs broadcast to `out`.
    fn elementwise(&mut self, f: Ew, ins: &[Val], out: &Ty) -> Res<Val> {
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
    fn reduce_sum(&mut self, x: &Val, axes: &[usize], out_elem: Elem) -> Res<Val> {
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

    fn matmul(&mut self, op: &str, a: &Val, b: &Val, out: &Ty) -> Val {
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

    /// Lowers a compute op to linalg/tensor ops; `None` when it has no such form here.
    fn lower_compute(&mut self, kind: &OpKind, ins: &[Val], outs: &[Ty]) -> Res<Option<Vec<Val>>> {
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

    fn transpose(&mut self, x: &Val, perm: &[usize]) -> Val {
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
    fn lower_grad(
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

    fn lower_multi(&mut self, kind: &OpKind, ins: &[Val], outs: &[Ty]) -> Res<Option<Vec<Val>>> {
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

    fn slice(&mut self, x: &Val, axis: usize, start: u64, end: u64, out: &Ty) -> Res<Option<Val>> {
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

    fn compute(
        &mut self,
        kind: &OpKind,
        inputs: &[BufferId],
        outputs: &[BufferId],
        saves: &[BufferId],
        layer: Option<u32>,
    ) -> Res<()> {
        let ins = inputs
            .iter()
            .map(|&b| self.val(b))
            .collect::<Res<Vec<_>>>()?;
        let outs = outputs
            .iter()
            .map(|&b| self.ty(b))
            .collect::<Res<Vec<_>>>()?;
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
    fn kernel(&mut self, name: &str, ins: &[Val], outs: &[Ty], attrs: &str) -> Vec<Val> {
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

    // ---- collectives ----

    fn collective(
        &mut self,
        op: CollectiveOp,
        slot: Slot,
        axis: Option<u8>,
        x: &Val,
        out: &Ty,
        attrs: &str,
    ) -> Res<Val> {
        let (grid, gaxis, size) = self.grid(slot);
        let on = format!("on @{grid} grid_axes = [{gaxis}]");
        match op {
            CollectiveOp::AllReduce => {
                let x = self.reshape(x, &out.shape)?;
                Ok(self.define(
                    format!(
                        "shard.all_reduce {} {on} reduction = sum {attrs} : {} -> {}",
                        x.name,
                        x.ty.mlir(),
                        out.mlir()
                    ),
                    out.clone(),
                ))
            }
            CollectiveOp::AllGather => {
                let x = self.convert(x, out.elem)?;
                let (x, a) = match axis {
                    Some(a) if usize::from(a) < x.ty.shape.len() => (x, usize::from(a)),
                    Some(a) => return Err(format!("all-gather axis {a} of {}", x.ty.mlir())),
                    None => {
                        let n = x.ty.numel();
                        (self.reshape(&x, &[n])?, 0)
                    }
                };
                let mut shape = x.ty.shape.clone();
                shape[a] *= size;
                let ty = Ty::new(shape, out.elem);
                let mut y = self.define(
                    format!(
                        "shard.all_gather {} {on} gather_axis = {a} {attrs} : {} -> {}",
                        x.name,
                        x.ty.mlir(),
                        ty.mlir()
                    ),
                    ty,
                );
                if axis.is_none() && y.ty.numel() > out.numel() {
                    y = self.prefix(&y, out.numel());
                }
                self.reshape(&y, &out.shape)
            }
            CollectiveOp::ReduceScatter => {
                self.scatter_like("reduce_scatter", slot, axis, x, out, attrs)
            }
            CollectiveOp::AllToAll => {
                let x = self.convert(x, out.elem)?;
                let (x, a) = match axis {
                    Some(a) if usize::from(a) < x.ty.shape.len() => (x, usize::from(a)),
                    _ => {
                        let n = x.ty.numel();
                        (self.reshape(&x, &[n])?, 0)
                    }
                };
                if x.ty.shape[a] % size != 0 {
                    return Err(format!("all-to-all of {} over {size} ranks", x.ty.mlir()));
                }
                let y = self.define(format!(
                    "shard.all_to_all {} {on} split_axis = {a} concat_axis = {a} {attrs} : {} -> {}",
                    x.name,
                    x.ty.mlir(),
                    x.ty.mlir()
                ), x.ty);
                self.reshape(&y, &out.shape)
            }
            CollectiveOp::Broadcast { root } => {
                let x = self.convert(x, out.elem)?;
                let x = self.reshape(&x, &out.shape)?;
                Ok(self.define(
                    format!(
                        "shard.broadcast {} {on} root = [{root}] {attrs} : ({}) -> {}",
                        x.name,
                        x.ty.mlir(),
                        out.mlir()
                    ),
                    out.clone(),
                ))
            }
        }
    }

    /// `reduce_scatter` or `all_slice`: this rank's piece along `axis`, or of the flattening
    /// (zero-padded to a multiple of the group size).
    fn scatter_like(
        &mut self,
        op: &str,
        slot: Slot,
        axis: Option<u8>,
        x: &Val,
        out: &Ty,
        attrs: &str,
    ) -> Res<Val> {
        let (grid, gaxis, size) = self.grid(slot);
        // all_slice keeps the element type; reduce_scatter converts to the result's.
        let x = if op == "all_slice" {
            self.convert(x, out.elem)?
        } else {
            x.clone()
        };
        let (x, a) = match axis {
            Some(a) if usize::from(a) < x.ty.shape.len() => (x, usize::from(a)),
            Some(a) => return Err(format!("{op} axis {a} of {}", x.ty.mlir())),
            None => {
                let n = x.ty.numel();
                let piece = n.div_ceil(size.max(1));
                let flat = self.reshape(&x, &[n])?;
                (self.pad(&flat, piece * size), 0)
            }
        };
        if x.ty.shape[a] % size != 0 {
            return Err(format!(
                "{op} of {} along axis {a} over {size} ranks",
                x.ty.mlir()
            ));
        }
        let mut shape = x.ty.shape.clone();
        shape[a] /= size;
        let ty = Ty::new(shape, out.elem);
        let what = if op == "all_slice" {
            "slice_axis"
        } else {
            "scatter_axis"
        };
        let r = self.define(
            format!(
                "shard.{op} {} on @{grid} grid_axes = [{gaxis}] {what} = {a} {attrs} : {} -> {}",
                x.name,
                x.ty.mlir(),
                ty.mlir()
            ),
            ty,
        );
        self.reshape(&r, &out.shape)
    }
}
