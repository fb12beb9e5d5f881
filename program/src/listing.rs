//! The readable listing of one rank's program (`plait show DIR --rank R`).

use std::fmt::Write;

use crate::ids::BufferId;
use crate::{Instr, ProgramSet, Template};

fn b(t: &Template, x: BufferId) -> String {
    t.buffer(x)
        .map_or_else(|| format!("{x}?"), |d| format!("%{}", d.name))
}

fn list(t: &Template, xs: &[BufferId]) -> String {
    xs.iter().map(|&x| b(t, x)).collect::<Vec<_>>().join(", ")
}

fn role(r: crate::Role) -> String {
    let name = format!("{r:?}");
    let head = name.split('(').next().unwrap_or("").to_lowercase();
    match r.param() {
        Some(p) => format!("{head} {p}"),
        None => head,
    }
}

/// One instruction as text.
pub fn instr(t: &Template, i: &Instr) -> String {
    match i {
        Instr::Alloc { buf } => {
            let d = t.buffer(*buf);
            format!(
                "alloc {} {}{:?} ({})",
                b(t, *buf),
                d.map_or("?", |d| d.elem.name()),
                d.map_or(vec![], |d| d.shape.clone()),
                d.map_or(String::new(), |d| if d.partial {
                    format!("{}, partial", role(d.role))
                } else {
                    role(d.role)
                })
            )
        }
        Instr::Free { buf } => format!("free {}", b(t, *buf)),
        Instr::Task {
            phase,
            chunk,
            micro_batch,
            pass,
        } => format!(
            "-- {} {:?} chunk {chunk} micro-batch {micro_batch}",
            phase.name(),
            pass
        )
        .to_lowercase(),
        Instr::InitParams { bufs } => format!("init_params {}", list(t, bufs)),
        Instr::LoadTokens {
            micro_batch,
            input_ids,
            targets,
        } => format!(
            "load_tokens micro-batch {micro_batch} -> {}",
            list(
                t,
                &input_ids.iter().chain(targets).copied().collect::<Vec<_>>()
            )
        ),
        Instr::Fill { buf, value } => format!("fill {} {value}", b(t, *buf)),
        Instr::Copy { src, dst } => format!("copy {} -> {}", b(t, *src), b(t, *dst)),
        Instr::Chunk {
            src,
            dst,
            axis,
            group,
        } => format!(
            "chunk {} -> {} axis {axis:?} over {}",
            b(t, *src),
            b(t, *dst),
            group.name()
        ),
        Instr::Vocab {
            op,
            group,
            inputs,
            outputs,
            vocab,
        } => format!(
            "{} {} -> {} over {}{}",
            op.name(),
            list(t, inputs),
            list(t, outputs),
            group.name(),
            vocab.map_or_else(String::new, |v| format!(" (vocabulary {v}, padded)"))
        ),
        Instr::Compute {
            kind,
            inputs,
            outputs,
            saves,
            ..
        } => compute_line(t, kind, inputs, outputs, saves),
        Instr::Context {
            kind,
            group,
            inputs,
            outputs,
            saves,
            ..
        } => format!(
            "{} over {}",
            compute_line(t, kind, inputs, outputs, saves),
            group.name()
        ),
        Instr::Collective {
            op,
            group,
            algorithm,
            axis,
            pairs,
            purpose,
            bucket,
        } => format!(
            "{} {} over {} {:?} axis {axis:?} {:?}{} [{}]",
            op.name(),
            format!("{purpose:?}").to_lowercase(),
            group.name(),
            algorithm,
            pairs.len(),
            bucket.map_or(String::new(), |x| format!(" {x}")),
            pairs
                .iter()
                .map(|(x, y)| if x == y {
                    b(t, *x)
                } else {
                    format!("{} -> {}", b(t, *x), b(t, *y))
                })
                .collect::<Vec<_>>()
                .join(", ")
        )
        .replace(" Ring", " ring")
        .replace(" Tree", " tree"),
        Instr::Send { buf, peer, tag } => {
            format!("send {} to {peer:?} tag {tag:#x}", b(t, *buf)).to_lowercase()
        }
        Instr::Recv { buf, peer, tag } => {
            format!("recv {} from {peer:?} tag {tag:#x}", b(t, *buf)).to_lowercase()
        }
        Instr::RecomputeBegin { layer } => format!("recompute layer {layer} {{"),
        Instr::RecomputeEnd { layer } => format!("}} recompute layer {layer}"),
        Instr::AdamW {
            param, grad, m, v, ..
        } => format!(
            "adamw {} grad {} m {} v {}",
            b(t, *param),
            b(t, *grad),
            b(t, *m),
            b(t, *v)
        ),
        Instr::Loss { buf, weight } => format!("loss {} x {weight}", b(t, *buf)),
    }
}

/// The listing of rank `r`: header, shards, then init and step instructions, numbered.
pub fn show(set: &ProgramSet, r: u32) -> Option<String> {
    let info = set.rank(r)?;
    let t = set.template(info.template)?;
    let mut s = String::new();
    let m = &set.mesh;
    let _ = writeln!(
        s,
        "rank {r} of {} ({}), template {}, {} {}",
        set.ranks.len(),
        info.coords,
        t.id,
        set.model,
        set.format
    );
    let _ = writeln!(
        s,
        "mesh tp {} dp {}{} pp {} v {}, {} micro-batches of {} x {}, {} ZeRO-{} recompute {}{} {}",
        m.tp,
        m.batch_replicas(),
        if m.cp > 1 {
            format!(" cp {}", m.cp)
        } else {
            String::new()
        },
        m.pp,
        m.virtual_stages,
        m.micro_batches,
        m.micro_batch,
        m.seq,
        m.schedule,
        m.zero,
        m.recompute,
        if m.sequence_parallel { " SP" } else { "" },
        m.precision
    );
    let groups: Vec<String> = crate::Slot::ALL
        .iter()
        .filter_map(|&sl| {
            let g = info.group(sl)?;
            Some(format!("{} {g} {:?}", sl.name(), set.group(g)?.ranks))
        })
        .collect();
    let _ = writeln!(
        s,
        "groups {}; prev {} next {}; chunks {:?}",
        groups.join(", "),
        info.prev,
        info.next,
        t.chunks
    );
    for (k, sh) in t.shards.iter().enumerate() {
        let p = set.params.get(sh.param.index());
        let full = p.map_or(vec![], |p| p.shape.clone());
        let sl = sh.slice_at(&full, crate::ShardAt::of(m, info.coords));
        let _ = writeln!(
            s,
            "shard #{k} {} {:?}: {:?}{} -> {}",
            p.map_or("?", |p| p.name.as_str()),
            full,
            sl.boxes,
            if sh.zero {
                format!(", owns flat [{}, {})", sl.owned.0, sl.owned.1)
            } else {
                String::new()
            },
            b(t, sh.init)
        );
    }
    for (k, i) in t.init.iter().enumerate() {
        let _ = writeln!(s, "init {k:>5}  {}", instr(t, i));
    }
    for (k, i) in t.instrs.iter().enumerate() {
        let _ = writeln!(s, "step {k:>5}  {}", instr(t, i));
    }
    Some(s)
}

/// `outs = op{attrs}(ins) saves ..` of a compute.
fn compute_line(
    t: &Template,
    kind: &ir::OpKind,
    inputs: &[BufferId],
    outputs: &[BufferId],
    saves: &[BufferId],
) -> String {
    let name = match kind {
        ir::OpKind::Grad { of, wrt } => format!("grad.{}{wrt:?}", of.mnemonic()),
        k => k.mnemonic().to_string(),
    };
    let attrs = match kind {
        ir::OpKind::Attention {
            heads, kv_heads, ..
        } => format!("{{heads {heads}, kv {kv_heads}}}"),
        ir::OpKind::Split { sizes, .. } => format!("{sizes:?}"),
        _ => String::new(),
    };
    let saves = if saves.is_empty() {
        String::new()
    } else {
        format!(" saves {}", list(t, saves))
    };
    format!(
        "{} = {name}{attrs}({}){saves}",
        list(t, outputs),
        list(t, inputs)
    )
}
