//! Invariant 5: gradient contributions are reduced across the data-parallel group exactly once
//! and applied exactly once. A dataflow walk over one iteration: a compute writing a
//! `grad_part` buffer (one backward's gradient of a parameter) makes a contribution; adds, copies and non-data-parallel collectives carry
//! it along; a data-parallel gradient reduction marks every contribution it carries reduced
//! (one that carries none is a second reduction); the optimizer must see only reduced ones.
//! A routed expert's gradient reduces over the ranks that hold the same experts (`edp`),
//! every other over the data-parallel group (`dp`).

use std::collections::HashMap;

use super::{Check, Loc, Violation};
use crate::ids::ParamId;
use crate::{Instr, ProgramSet, Purpose, Role, Slot, Template};

#[derive(Clone, Copy, Debug, Default)]
struct Taint {
    param: Option<ParamId>,
    unreduced: u32,
    reduced: u32,
    /// Where the last unreduced contribution came from.
    origin: usize,
}

fn merge(a: Option<Taint>, b: Option<Taint>) -> Option<Taint> {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(a), Some(b)) => Some(Taint {
            param: a.param.or(b.param),
            unreduced: a.unreduced + b.unreduced,
            reduced: a.reduced + b.reduced,
            origin: if b.unreduced > 0 { b.origin } else { a.origin },
        }),
    }
}

/// A new, unreduced contribution where instruction `k` writes a `grad_part` buffer.
fn contribution(role: Option<Role>, k: usize) -> Option<Taint> {
    match role {
        Some(Role::GradPart(p)) => Some(Taint {
            param: Some(p),
            unreduced: 1,
            reduced: 0,
            origin: k,
        }),
        _ => None,
    }
}

pub fn check(set: &ProgramSet, t: &Template, rank: u32, out: &mut Vec<Violation>) {
    let expert: HashMap<ParamId, bool> = t.shards.iter().map(|s| (s.param, s.expert)).collect();
    let slot_of = |p: Option<ParamId>| {
        if p.is_some_and(|p| expert.get(&p).copied().unwrap_or(false)) {
            Slot::Edp
        } else {
            Slot::Dp
        }
    };
    let has = |s: Slot| set.rank(rank).and_then(|r| r.group(s)).is_some();
    let name = |p: ParamId| set.params.get(p.index()).map_or("?", |i| i.name.as_str());
    let mut taint: Vec<Option<Taint>> = vec![None; t.buffers.len()];
    let mut applied: HashMap<ParamId, usize> = HashMap::new();
    let role = |b: crate::ids::BufferId| t.buffer(b).map(|d| d.role);
    let mut v = |at: usize, message: String| {
        out.push(Violation {
            check: Check::Gradient,
            rank,
            at: Loc::Step(at),
            message,
        })
    };
    for (k, i) in t.instrs.iter().enumerate() {
        match i {
            Instr::Compute {
                kind,
                inputs,
                outputs,
                ..
            } => {
                let new: Vec<Option<Taint>> = match kind {
                    _ if outputs
                        .iter()
                        .any(|&b| matches!(role(b), Some(Role::GradPart(_)))) =>
                    {
                        outputs.iter().map(|&b| contribution(role(b), k)).collect()
                    }
                    ir::OpKind::Add => {
                        let get = |j: usize| {
                            inputs
                                .get(j)
                                .and_then(|b| taint.get(b.index()).copied().flatten())
                        };
                        vec![merge(get(0), get(1))]
                    }
                    _ => vec![None; outputs.len()],
                };
                for (b, t2) in outputs.iter().zip(new) {
                    if let Some(x) = taint.get_mut(b.index()) {
                        *x = t2;
                    }
                }
            }
            Instr::Vocab { outputs, .. } | Instr::Context { outputs, .. } => {
                // The embedding's gradient on this rank's rows is a contribution like a
                // compute's; the loss ops carry none.
                for &b in outputs {
                    if let Some(x) = taint.get_mut(b.index()) {
                        *x = contribution(role(b), k);
                    }
                }
            }
            Instr::Fill { buf, .. } => {
                if let Some(x) = taint.get_mut(buf.index()) {
                    *x = None;
                }
            }
            Instr::Copy { src, dst } | Instr::Chunk { src, dst, .. } => {
                let s = taint.get(src.index()).copied().flatten();
                if let Some(x) = taint.get_mut(dst.index()) {
                    *x = s;
                }
            }
            Instr::Collective {
                pairs,
                purpose,
                group,
                ..
            } => {
                for &(x, y) in pairs {
                    let mut s = taint.get(x.index()).copied().flatten();
                    if *purpose == Purpose::GradReduce
                        && let Some(tt) = s
                        && slot_of(tt.param) != *group
                    {
                        v(
                            k,
                            format!(
                                "reduces the gradient of {} over the {} group; it belongs to {}",
                                tt.param.map_or("?", name),
                                group.name(),
                                slot_of(tt.param).name()
                            ),
                        );
                    }
                    if *purpose == Purpose::GradReduce {
                        match s {
                            Some(ref mut tt) if tt.unreduced > 0 => {
                                tt.reduced += tt.unreduced;
                                tt.unreduced = 0;
                            }
                            Some(tt) => v(
                                k,
                                format!(
                                    "reduces the gradient of {} again: it carries no new contribution since its last data-parallel reduction",
                                    tt.param.map_or("?", name)
                                ),
                            ),
                            None => {}
                        }
                    }
                    if let Some(d) = taint.get_mut(y.index()) {
                        *d = s;
                    }
                }
            }
            Instr::AdamW { param, grad, .. } => {
                let p = role(*param).and_then(|r| r.param());
                let g = taint.get(grad.index()).copied().flatten();
                let Some(p) = p else {
                    v(
                        k,
                        format!("adamw updates {param}, which holds no parameter"),
                    );
                    continue;
                };
                *applied.entry(p).or_default() += 1;
                let dp = has(slot_of(Some(p)));
                match g {
                    None => {
                        let pending = taint
                            .iter()
                            .flatten()
                            .find(|t2| t2.param == Some(p) && t2.unreduced > 0)
                            .copied();
                        match pending {
                            Some(t2) if dp => v(
                                k,
                                format!(
                                    "adamw reads a gradient of {} that no data-parallel reduction wrote: {} contribution(s) were never reduced (the last made at step #{})",
                                    name(p),
                                    t2.unreduced,
                                    t2.origin
                                ),
                            ),
                            _ => v(
                                k,
                                format!("adamw applies no gradient contribution to {}", name(p)),
                            ),
                        }
                    }
                    Some(g) if g.param != Some(p) => v(
                        k,
                        format!(
                            "adamw applies the gradient of {} to {}",
                            g.param.map_or("?", name),
                            name(p)
                        ),
                    ),
                    Some(g) if dp && g.unreduced > 0 => v(
                        k,
                        format!(
                            "adamw applies {} gradient contribution(s) of {} never reduced across the data-parallel group (the last made at step #{})",
                            g.unreduced,
                            name(p),
                            g.origin
                        ),
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    for s in &t.shards {
        let n = applied.get(&s.param).copied().unwrap_or(0);
        if n != 1 {
            v(
                t.instrs.len(),
                format!(
                    "{} is applied {n} time(s) per iteration, expected once",
                    name(s.param)
                ),
            );
        }
    }
}
