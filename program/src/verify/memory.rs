//! Invariant 1 (well-formed buffers) and 7 (peak live bytes) of one template.

use std::collections::BTreeMap;

use super::{Check, Loc, Violation, operands};
use crate::{Instr, Template};

/// The most bytes live at once in a template, and what held them at that moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    pub bytes: u64,
    /// Live bytes at the peak by buffer role ([`crate::Role::class`]).
    pub by_role: BTreeMap<&'static str, u64>,
}

/// Checks buffer lifetimes and returns the peak live bytes (init, then one iteration).
pub fn check(t: &Template, rank: u32, out: &mut Vec<Violation>) -> Peak {
    let n = t.buffers.len();
    let mut live = vec![false; n];
    let mut bytes = 0u64;
    let mut peak = Peak::default();
    let mut by_role: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut at_step_start = Vec::new();
    let mut v = |at: Loc, message: String| {
        out.push(Violation {
            check: Check::WellFormed,
            rank,
            at,
            message,
        })
    };
    let sections = [(true, &t.init), (false, &t.instrs)];
    for (is_init, list) in sections {
        if !is_init {
            at_step_start = live.clone();
        }
        for (k, i) in list.iter().enumerate() {
            let at = if is_init { Loc::Init(k) } else { Loc::Step(k) };
            match i {
                Instr::Alloc { buf } => match t.buffer(*buf) {
                    None => v(at, format!("allocates {buf}, which is not declared")),
                    Some(d) => {
                        if live[buf.index()] {
                            v(at, format!("allocates {buf} ({}) while it is live", d.name));
                        } else {
                            live[buf.index()] = true;
                            bytes += d.bytes();
                            *by_role.entry(d.role.class()).or_default() += d.bytes();
                            if bytes > peak.bytes {
                                peak.bytes = bytes;
                                peak.by_role.clone_from(&by_role);
                            }
                        }
                    }
                },
                Instr::Free { buf } => match t.buffer(*buf) {
                    None => v(at, format!("frees {buf}, which is not declared")),
                    Some(d) => {
                        if live[buf.index()] {
                            live[buf.index()] = false;
                            bytes -= d.bytes();
                            *by_role.entry(d.role.class()).or_default() -= d.bytes();
                        } else {
                            v(at, format!("frees {buf} ({}), which is not live", d.name));
                        }
                    }
                },
                other => {
                    let (r, w) = operands(other);
                    for b in r.iter().chain(&w) {
                        match t.buffer(*b) {
                            None => v(at, format!("uses {b}, which is not declared")),
                            Some(d) if !live[b.index()] => v(
                                at,
                                format!("uses {b} ({}) while it is not allocated", d.name),
                            ),
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    for (b, (now, before)) in live.iter().zip(&at_step_start).enumerate() {
        if now != before {
            let name = t.buffers.get(b).map_or("?", |d| d.name.as_str());
            v(
                Loc::Step(t.instrs.len()),
                format!(
                    "b{b} ({name}) is {} at the end of the iteration but not at its start",
                    if *now { "live" } else { "freed" }
                ),
            );
        }
    }
    peak
}
