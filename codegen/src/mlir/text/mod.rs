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
use scalar::Ew;

mod collective;
mod linalg;
mod ops;
mod scalar;
mod tensor;

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
    /// Whether a collective runs over the expert-parallel or expert-data-parallel ranks.
    uses_experts: bool,
    /// Whether a context-parallel op or collective was written (the `@context` grid).
    uses_context: bool,
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
        uses_experts: false,
        uses_context: false,
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
    if e.uses_experts {
        let ep = m.ep.max(1);
        let _ = writeln!(
            out,
            "  // the data-parallel axis split into (expert data parallel, expert parallel)\n  shard.grid @experts(shape = {}x{}x{}x{})",
            m.pp,
            m.dp / ep,
            ep,
            m.tp
        );
    }
    if e.uses_context {
        let cp = m.cp.max(1);
        let _ = writeln!(
            out,
            "  // the data-parallel axis split into (data parallel, context parallel)\n  shard.grid @context(shape = {}x{}x{}x{})",
            m.pp,
            m.dp / cp,
            cp,
            m.tp
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
        }
        | Instr::Context {
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
        Instr::Vocab {
            inputs, outputs, ..
        } => inputs.iter().chain(outputs).copied().collect(),
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
            Instr::Context {
                kind,
                group,
                inputs,
                outputs,
                ..
            } => {
                // The positions of the rank's chunks come from its place in the group at run
                // time: an external kernel, told which group.
                let name = match kind {
                    ir::OpKind::Grad { of, .. } => format!("context_grad_{}", of.mnemonic()),
                    k => format!("context_{}", k.mnemonic()),
                };
                let ins = self.vals(inputs)?;
                let outs = self.tys(outputs)?;
                let attrs = format!("{{plait.group = {}}}", str_lit(group.name()));
                let r = self.kernel(&name, &ins, &outs, &attrs);
                for (&b, v) in outputs.iter().zip(r) {
                    self.set(b, v);
                }
                let _ = self.grid(*group);
            }
            Instr::Vocab {
                op,
                group,
                inputs,
                outputs,
                vocab,
            } => {
                // The rank's row block comes from its position in the group at run time: an
                // external kernel, told which group.
                let ins = self.vals(inputs)?;
                let outs = self.tys(outputs)?;
                let attrs = match vocab {
                    Some(v) => format!(
                        "{{plait.group = {}, plait.vocabulary = {v} : i64}}",
                        str_lit(group.name())
                    ),
                    None => format!("{{plait.group = {}}}", str_lit(group.name())),
                };
                let r = self.kernel(op.name(), &ins, &outs, &attrs);
                for (&b, v) in outputs.iter().zip(r) {
                    self.set(b, v);
                }
            }
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
            Slot::Ep => {
                self.uses_experts = true;
                ("experts", 2, u64::from(m.ep.max(1)))
            }
            Slot::Edp => {
                self.uses_experts = true;
                ("experts", 1, u64::from(m.dp / m.ep.max(1)))
            }
            Slot::Cp => {
                self.uses_context = true;
                ("context", 2, u64::from(m.cp.max(1)))
            }
        }
    }
}
