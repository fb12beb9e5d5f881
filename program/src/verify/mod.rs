//! The static verifier: checks all ranks' programs together and reports every violation with
//! its rank and instruction (no short-circuit).
//!
//! Invariants:
//! 1. **Well-formed** (per template): buffer ids exist; a buffer is allocated before use, not
//!    allocated twice while live, freed only while live; a step leaves allocated exactly what it
//!    found (no leak across iterations); every collective's slot names a group of the rank and
//!    every pair's input and output exist; each collective's and chunk's output has the
//!    element count its op makes of the input over the group (an all-gather n pieces, a
//!    reduce-scatter or chunk one; axis-less ones padded to a multiple of n); every context op
//!    runs over the `Cp` group an op with a context-parallel form, attention's keys cp times
//!    its queries long, and dp splits into whole context-parallel groups.
//! 2. **Collectives match**: the members of each group issue the same sequence of collectives
//!    on it, with the same op, axis, purpose, bucket and per-pair element counts and types.
//! 3. **Point to point**: every send has its recv (same peer pair, order, tag and bytes) and
//!    every recv its send.
//! 4. **No deadlock**: simulating every rank with blocking collectives and receives (buffered
//!    sends) runs every program to its end.
//! 5. **Gradients**: on every rank, each parameter's gradient contributions are reduced across
//!    its data-parallel group exactly once (none twice, none missing) before the optimizer
//!    applies them, and each parameter the rank holds is applied exactly once per iteration.
//! 6. **Shards**: for every data-parallel replica and every pipeline stage that holds a copy
//!    of a parameter (a tied embedding has two), the tensor-parallel shards tile the full tensor
//!    exactly once; for each such shard the ZeRO slices over the data-parallel group tile its
//!    elements exactly once; every parameter is held somewhere.
//! 7. **Memory**: the peak live bytes of each program (counted from its allocations) is
//!    reported next to the planner's `peak_memory_bytes` for its stage; with a tolerance set,
//!    a difference beyond it is a violation.
//!
//! Ranks that share a template share invariants 1, 5 and 7; when every tensor- and
//! data-parallel group's members share a template, their collectives on those groups match by
//! construction (2) and one rank per stage is simulated (3, 4) with those collectives
//! completing at once — sound because all members run the same instruction list.

mod context;
mod grads;
mod memory;
mod shards;
mod sim;
mod sizes;

use std::fmt;

use crate::{Instr, ProgramSet};

/// Where an instruction sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    Init(usize),
    Step(usize),
    /// A parameter shard declaration of the rank's template.
    Shard(usize),
    None,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Init(i) => write!(f, "init #{i}"),
            Loc::Step(i) => write!(f, "step #{i}"),
            Loc::Shard(i) => write!(f, "shard #{i}"),
            Loc::None => f.write_str("-"),
        }
    }
}

/// Which invariant a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    WellFormed,
    Collective,
    PointToPoint,
    Deadlock,
    Gradient,
    Shard,
    Memory,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub check: Check,
    pub rank: u32,
    pub at: Loc,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}, {}: {}", self.rank, self.at, self.message)
    }
}

/// Peak memory of one template against the planner.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryRow {
    pub template: u32,
    pub stage: u32,
    pub ranks: usize,
    pub program_peak_bytes: u64,
    /// What the program holds at its peak, by buffer role.
    pub program_peak_by_role: std::collections::BTreeMap<&'static str, u64>,
    pub predicted_peak_bytes: f64,
}

impl MemoryRow {
    pub fn ratio(&self) -> f64 {
        self.program_peak_bytes as f64 / self.predicted_peak_bytes
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub memory: Vec<MemoryRow>,
    /// Ranks the deadlock simulation ran (one per stage when symmetric).
    pub simulated_ranks: usize,
}

/// Verifier settings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Options {
    /// Relative difference between program and planner peak memory beyond which it is a
    /// violation (`None`: only reported).
    pub memory_tolerance: Option<f64>,
}

/// Verifies with default options.
pub fn verify(set: &ProgramSet) -> Report {
    verify_with(set, Options::default())
}

pub fn verify_with(set: &ProgramSet, opts: Options) -> Report {
    let mut r = Report::default();
    // The first rank of each template reports the template's own violations.
    let mut first_rank = vec![None; set.templates.len()];
    for info in &set.ranks {
        if let Some(f) = first_rank.get_mut(info.template.index())
            && f.is_none()
        {
            *f = Some(info.rank);
        }
    }
    if set.templates.is_empty() || set.ranks.is_empty() {
        r.violations.push(Violation {
            check: Check::WellFormed,
            rank: 0,
            at: Loc::None,
            message: "no ranks or no templates".into(),
        });
        return r;
    }
    for info in &set.ranks {
        if set.template(info.template).is_none() {
            r.violations.push(Violation {
                check: Check::WellFormed,
                rank: info.rank,
                at: Loc::None,
                message: format!("names template {}, which does not exist", info.template),
            });
        }
    }
    for (t, rank) in set.templates.iter().zip(&first_rank) {
        let Some(rank) = *rank else { continue };
        let peak = memory::check(t, rank, &mut r.violations);
        grads::check(set, t, rank, &mut r.violations);
        sizes::check(set, t, rank, &mut r.violations);
        context::check(set, t, rank, &mut r.violations);
        let stage_rank = set.rank(rank);
        let predicted = set
            .predicted
            .iter()
            .find(|p| Some(p.stage) == stage_rank.map(|i| i.coords.pp))
            .map_or(f64::NAN, |p| p.peak_memory_bytes);
        let row = MemoryRow {
            template: t.id.0,
            stage: t.stage,
            ranks: set.ranks.iter().filter(|i| i.template == t.id).count(),
            program_peak_bytes: peak.bytes,
            program_peak_by_role: peak.by_role,
            predicted_peak_bytes: predicted,
        };
        if let Some(tol) = opts.memory_tolerance
            && (row.ratio() - 1.0).abs() > tol
        {
            r.violations.push(Violation {
                check: Check::Memory,
                rank,
                at: Loc::None,
                message: format!(
                    "peak live bytes {} differ from the planner's {:.0} by {:+.1} % (tolerance {:.0} %)",
                    row.program_peak_bytes,
                    row.predicted_peak_bytes,
                    (row.ratio() - 1.0) * 100.0,
                    tol * 100.0
                ),
            });
        }
        r.memory.push(row);
    }
    shards::check(set, &mut r.violations);
    context::check_mesh(set, &mut r.violations);
    r.simulated_ranks = sim::check(set, &mut r.violations);
    r
}

/// Buffers an instruction reads and writes.
pub fn operands(i: &Instr) -> (Vec<crate::ids::BufferId>, Vec<crate::ids::BufferId>) {
    match i {
        Instr::Alloc { .. } | Instr::Free { .. } | Instr::Task { .. } => (vec![], vec![]),
        Instr::RecomputeBegin { .. } | Instr::RecomputeEnd { .. } => (vec![], vec![]),
        Instr::InitParams { bufs } => (vec![], bufs.clone()),
        Instr::LoadTokens {
            input_ids, targets, ..
        } => (vec![], input_ids.iter().chain(targets).copied().collect()),
        Instr::Fill { buf, .. } => (vec![], vec![*buf]),
        Instr::Copy { src, dst } | Instr::Chunk { src, dst, .. } => (vec![*src], vec![*dst]),
        Instr::Vocab {
            inputs, outputs, ..
        } => (inputs.clone(), outputs.clone()),
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
        } => (
            inputs.clone(),
            outputs.iter().chain(saves).copied().collect(),
        ),
        Instr::Collective { pairs, .. } => (
            pairs.iter().map(|p| p.0).collect(),
            pairs.iter().map(|p| p.1).collect(),
        ),
        Instr::Send { buf, .. } | Instr::Loss { buf, .. } => (vec![*buf], vec![]),
        Instr::Recv { buf, .. } => (vec![], vec![*buf]),
        Instr::AdamW {
            param, grad, m, v, ..
        } => (vec![*param, *grad, *m, *v], vec![*param, *m, *v]),
    }
}
