//! Invariant 1, context ops: a program with context parallelism splits its data-parallel ranks
//! into whole context-parallel groups (`dp` a multiple of `cp`), and each `Context` runs over
//! the `Cp` group an op that has a context-parallel form (attention, rotary, iota, or the
//! gradient of attention or rotary) whose keys and values, for attention, are the group's
//! gathered local sequences: `cp` times the queries' length.

use ir::OpKind;

use super::{Check, Loc, Violation};
use crate::{Instr, ProgramSet, Slot, Template};

/// Checks the mesh's context-parallel split once.
pub fn check_mesh(set: &ProgramSet, out: &mut Vec<Violation>) {
    let m = &set.mesh;
    if m.cp > 1 && !m.dp.is_multiple_of(m.cp) {
        out.push(Violation {
            check: Check::WellFormed,
            rank: 0,
            at: Loc::None,
            message: format!(
                "dp {} does not split into context-parallel groups of cp {}",
                m.dp, m.cp
            ),
        });
    }
}

/// Checks `t`'s context ops as rank `rank` runs them.
pub fn check(set: &ProgramSet, t: &Template, rank: u32, out: &mut Vec<Violation>) {
    let cp = u64::from(set.mesh.cp.max(1));
    let seq_len = |b| t.buffer(b).and_then(|d| d.shape.get(1).copied());
    let sections = [(true, &t.init), (false, &t.instrs)];
    for (is_init, list) in sections {
        for (k, i) in list.iter().enumerate() {
            let Instr::Context {
                kind,
                group,
                inputs,
                ..
            } = i
            else {
                continue;
            };
            let mut bad = |message: String| {
                out.push(Violation {
                    check: Check::WellFormed,
                    rank,
                    at: if is_init { Loc::Init(k) } else { Loc::Step(k) },
                    message,
                })
            };
            if *group != Slot::Cp {
                bad(format!("a context op over the {} group", group.name()));
            }
            let attention = match kind {
                OpKind::Attention { .. } => true,
                OpKind::Grad { of, .. } => match of.as_ref() {
                    OpKind::Attention { .. } => true,
                    OpKind::Rotary { .. } => false,
                    other => {
                        bad(format!(
                            "{} has no context-parallel gradient",
                            other.mnemonic()
                        ));
                        continue;
                    }
                },
                OpKind::Rotary { .. } | OpKind::Iota { .. } => false,
                other => {
                    bad(format!("{} has no context-parallel form", other.mnemonic()));
                    continue;
                }
            };
            if let (true, Some(&q), Some(&key)) = (attention, inputs.first(), inputs.get(1))
                && let (Some(sq), Some(sk)) = (seq_len(q), seq_len(key))
                && sk != cp * sq
            {
                bad(format!(
                    "attention's keys {key} hold {sk} positions for {sq} queries over cp {cp}"
                ));
            }
        }
    }
}
