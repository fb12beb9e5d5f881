//! Instructions that hand a buffer on instead of computing a new one: a copy whose source is
//! freed next, and the first addition into a zeroed accumulator.

use ir::OpKind;
use program::{BufferId, Instr, Template};

use super::Executor;
use crate::{Backend, Communicator};

/// Which of `instrs` are copies `src -> dst` whose source the program frees before any other
/// instruction reads or writes it (the last copy of a gradient's fan-out to the branches of a
/// residual: `copy dx -> a; copy dx -> b; free dx`): moving the buffer does the same without
/// the copy or a second buffer alive at once.
pub(super) fn moving_copies(instrs: &[Instr]) -> Vec<bool> {
    let mut moves = vec![false; instrs.len()];
    for (i, ins) in instrs.iter().enumerate() {
        if let Instr::Copy { src, dst } = ins {
            moves[i] = src != dst && freed_before_other_use(&instrs[i + 1..], *src);
        }
    }
    moves
}

/// Per instruction, for an `add` of two distinct operands of the output's shape, the operand
/// the program frees before any other use. Where the other operand holds pending zeros when
/// it runs (a gradient accumulator's first addition in a step: `fill g 0 … g = add(g, dW);
/// free dW`), the sum is that operand: the executor moves it to the output instead of
/// zero-filling the accumulator and adding ([`Executor::zero_add_source`]).
pub(super) fn moving_adds(tpl: &Template) -> Vec<Option<usize>> {
    let instrs = &tpl.instrs;
    let shape = |b: BufferId| tpl.buffer(b).map(|d| d.shape.clone());
    let mut moves = vec![None; instrs.len()];
    for (i, ins) in instrs.iter().enumerate() {
        let Instr::Compute {
            kind: OpKind::Add,
            inputs,
            outputs,
            saves,
            ..
        } = ins
        else {
            continue;
        };
        let (&[a, b], &[o]) = (inputs.as_slice(), outputs.as_slice()) else {
            continue;
        };
        let same = shape(a).is_some() && shape(a) == shape(b) && shape(a) == shape(o);
        if a == b || !same || !saves.is_empty() {
            continue;
        }
        moves[i] = [a, b]
            .iter()
            .position(|&x| x != o && freed_before_other_use(&instrs[i + 1..], x));
    }
    moves
}

/// A copy `x -> to` that need not run: `x` moves on to `moved` next, which is only read until
/// instruction `free_at` frees it, and nothing touches `to` until then. Freeing `moved` there
/// hands its buffer (the same value) to `to` instead: one buffer and no copy, where the program
/// fans a value out to two branches (a residual gradient to the skip path and to a linear's
/// gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Deferral {
    pub moved: BufferId,
    pub to: BufferId,
    pub free_at: usize,
}

/// Per instruction, the copy it is that need not run ([`Deferral`]), given which copies are
/// moves (`moves`, [`moving_copies`]) and which additions move an operand (`adds`,
/// [`moving_adds`]).
pub(super) fn deferred_copies(
    instrs: &[Instr],
    moves: &[bool],
    adds: &[Option<usize>],
) -> Vec<Option<Deferral>> {
    let mut out = vec![None; instrs.len()];
    let mut handed = vec![false; instrs.len()];
    for (i, ins) in instrs.iter().enumerate() {
        let Instr::Copy { src, dst } = ins else {
            continue;
        };
        if moves.get(i).copied().unwrap_or(true) || src == dst {
            continue;
        }
        if let Some(d) = deferral(instrs, moves, adds, i, (*src, *dst))
            && !handed[d.free_at]
        {
            handed[d.free_at] = true;
            out[i] = Some(d);
        }
    }
    out
}

/// [`deferred_copies`]'s test for copy `i` of `x` to `to`.
fn deferral(
    instrs: &[Instr],
    moves: &[bool],
    adds: &[Option<usize>],
    i: usize,
    (x, to): (BufferId, BufferId),
) -> Option<Deferral> {
    let touches = |ins: &Instr, b: BufferId| {
        let (reads, writes) = program::verify::operands(ins);
        reads.contains(&b)
            || writes.contains(&b)
            || matches!(ins, Instr::Alloc { buf } | Instr::Free { buf } if *buf == b)
    };
    // The next instruction to touch x moves it to `moved`; `to` waits.
    let j = i + 1 + instrs[i + 1..].iter().position(|ins| touches(ins, x))?;
    let Instr::Copy { src, dst: moved } = &instrs[j] else {
        return None;
    };
    let quiet = |ins: &Instr| !touches(ins, to) && !matches!(ins, Instr::Task { .. });
    if *src != x || *moved == to || !moves[j] || !instrs[i + 1..j].iter().all(quiet) {
        return None;
    }
    // `moved` is only read (never written, moved on or handed to an addition) until its free.
    let moved = *moved;
    for (f, ins) in instrs.iter().enumerate().skip(j + 1) {
        if matches!(ins, Instr::Free { buf } if *buf == moved) {
            return Some(Deferral {
                moved,
                to,
                free_at: f,
            });
        }
        let (_, writes) = program::verify::operands(ins);
        let moves_on = match ins {
            Instr::Copy { src, .. } => *src == moved && moves[f],
            Instr::Compute { inputs, .. } => adds[f].is_some_and(|p| inputs.get(p) == Some(&moved)),
            _ => false,
        };
        let allocs = matches!(ins, Instr::Alloc { buf } if *buf == moved);
        if writes.contains(&moved) || moves_on || allocs || !quiet(ins) {
            return None;
        }
    }
    None
}

/// Whether `buf` holds pending zeros after `before` (the instructions ahead of some point):
/// the last of them to touch it allocated it or filled it with zeros, which the executor
/// defers to its first read ([`Executor::zero_add_source`] then moves the addend in).
pub(super) fn zeroed_when_reached(before: &[Instr], buf: BufferId) -> bool {
    for ins in before.iter().rev() {
        match ins {
            Instr::Alloc { buf: b } if *b == buf => return true,
            Instr::Fill { buf: b, value } if *b == buf => return *value == 0.0,
            _ => {
                let (reads, writes) = program::verify::operands(ins);
                if reads.contains(&buf) || writes.contains(&buf) {
                    return false;
                }
            }
        }
    }
    false
}

/// Whether `rest`, the instructions after a use of `src`, free it before reading or writing
/// it again (and before it is allocated anew or a pipeline task ends).
fn freed_before_other_use(rest: &[Instr], src: BufferId) -> bool {
    for next in rest {
        if let Instr::Free { buf } = next
            && *buf == src
        {
            return true;
        }
        let (reads, writes) = program::verify::operands(next);
        let touches = reads.contains(&src) || writes.contains(&src);
        let boundary = matches!(next, Instr::Alloc { buf } if *buf == src)
            || matches!(next, Instr::Task { .. });
        if touches || boundary {
            return false;
        }
    }
    false
}

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// [`deferred_copies`] of the step, less those whose buffers the stash plan stashes or
    /// expands in between (a stash takes the buffer the free would hand on).
    pub(super) fn deferred_copies(&self) -> Vec<Option<Deferral>> {
        let instrs = &self.tpl.instrs;
        let mut all = deferred_copies(instrs, &self.step_moves, &self.step_adds);
        let plan = &self.stash_plan;
        for (i, slot) in all.iter_mut().enumerate() {
            let (Some(d), Instr::Copy { src, .. }) = (*slot, &instrs[i]) else {
                continue;
            };
            let bufs = [*src, d.moved, d.to];
            let stashed = |lists: &Vec<Vec<BufferId>>| {
                lists
                    .get(i..=d.free_at)
                    .is_some_and(|ls| ls.iter().flatten().any(|b| bufs.contains(b)))
            };
            if stashed(&plan.after) || stashed(&plan.before) {
                *slot = None;
            }
        }
        all
    }

    /// Whether step instruction `k`, a copy of `src`, is skipped ([`Deferral`]): where the
    /// plan defers it and `src` holds its own written values (no pending zeros, no f64 copy),
    /// noting the free that hands the buffer on.
    pub(super) fn defers(&mut self, k: usize, src: BufferId) -> bool {
        let Some(d) = self.step_deferred.get(k).copied().flatten() else {
            return false;
        };
        let pending = self.zero_on_read.get(src.index()).copied().unwrap_or(true);
        let wide = self.wide.get(src.index()).is_some_and(Option::is_some);
        let held = self.bufs.get(src.index()).is_some_and(Option::is_some);
        if pending || wide || !held {
            return false;
        }
        self.handing_on.insert(d.free_at, (d.moved, d.to));
        true
    }

    /// `(the operand it may move, the other, its output)` where step instruction `k` is an
    /// addition [`moving_adds`] found.
    pub(super) fn add_parts(
        &self,
        k: usize,
        ins: &Instr,
    ) -> Option<(BufferId, BufferId, BufferId)> {
        let p = self.step_adds.get(k).copied().flatten()?;
        let Instr::Compute {
            inputs, outputs, ..
        } = ins
        else {
            return None;
        };
        Some((*inputs.get(p)?, *inputs.get(1 - p)?, *outputs.first()?))
    }

    /// The operand step instruction `k` (an `add`) moves to its output ([`moving_adds`]):
    /// the one freed next, where the other holds pending zeros and neither has an f64 value.
    pub(super) fn zero_add_source(&self, k: usize, ins: &Instr) -> Option<(BufferId, BufferId)> {
        let (src, other, out) = self.add_parts(k, ins)?;
        let pending = |b: BufferId| self.zero_on_read.get(b.index()).copied().unwrap_or(false);
        let wide = |b: BufferId| self.wide.get(b.index()).is_some_and(Option::is_some);
        (pending(other) && !pending(src) && !wide(src) && !wide(other)).then_some((src, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(i: u32) -> BufferId {
        BufferId(i)
    }

    #[test]
    fn only_a_copy_whose_source_is_freed_before_any_other_use_moves() {
        let add = |x: u32, y: u32| Instr::Compute {
            kind: ir::OpKind::Add,
            inputs: vec![b(x), b(x)],
            outputs: vec![b(y)],
            saves: vec![],
            layer: None,
        };
        let program = [
            Instr::Copy {
                src: b(0),
                dst: b(1),
            }, // 0: b0 is copied again next: stays a copy
            Instr::Alloc { buf: b(2) },
            Instr::Copy {
                src: b(0),
                dst: b(2),
            }, // 2: b0 freed next: a move
            Instr::Free { buf: b(0) },
            Instr::Copy {
                src: b(1),
                dst: b(3),
            }, // 4: b1 read before its free: a copy
            add(1, 4),
            Instr::Free { buf: b(1) },
            Instr::Copy {
                src: b(3),
                dst: b(5),
            }, // 7: never freed: a copy
        ];
        assert_eq!(
            moving_copies(&program),
            vec![false, false, true, false, false, false, false, false]
        );
    }

    #[test]
    fn a_fan_out_copy_waits_for_the_moved_copy_to_be_freed() {
        let read = |x: u32, out: u32| Instr::Compute {
            kind: ir::OpKind::Gelu { tanh: true },
            inputs: vec![b(x)],
            outputs: vec![b(out)],
            saves: vec![],
            layer: None,
        };
        let copy = |src: u32, dst: u32| Instr::Copy {
            src: b(src),
            dst: b(dst),
        };
        // copy x -> a; copy x -> d (a move); d read; free d; a used later.
        let fan_out = |between: Vec<Instr>| {
            let mut v = vec![copy(0, 1), copy(0, 2), Instr::Free { buf: b(0) }];
            v.push(read(2, 3));
            v.extend(between);
            v.push(Instr::Free { buf: b(2) });
            v.push(read(1, 4));
            v
        };
        let deferred = |instrs: &[Instr]| {
            let moves = moving_copies(instrs);
            deferred_copies(instrs, &moves, &vec![None; instrs.len()])
        };
        let plain = fan_out(vec![]);
        let d = deferred(&plain);
        assert_eq!(
            d[0],
            Some(Deferral {
                moved: b(2),
                to: b(1),
                free_at: 4
            }),
            "{d:?}"
        );
        assert!(d[1..].iter().all(Option::is_none));
        // Not where the receiver is touched before the free, or the moved copy is written.
        assert_eq!(deferred(&fan_out(vec![read(1, 5)]))[0], None, "a read");
        assert_eq!(deferred(&fan_out(vec![read(3, 2)]))[0], None, "d written");
        assert_eq!(
            deferred(&fan_out(vec![Instr::Alloc { buf: b(1) }]))[0],
            None,
            "a allocated"
        );
        // Nor where the second copy is not a move (x read again after it).
        let mut read_again = plain.clone();
        read_again.insert(2, read(0, 6));
        assert_eq!(deferred(&read_again)[0], None, "no move");
    }

    #[test]
    fn an_add_moves_only_an_operand_freed_next_and_never_into_itself() {
        let add = |x: u32, y: u32, out: u32| Instr::Compute {
            kind: ir::OpKind::Add,
            inputs: vec![b(x), b(y)],
            outputs: vec![b(out)],
            saves: vec![],
            layer: None,
        };
        let buffer = |shape: Vec<u64>| program::BufferDecl {
            name: String::new(),
            elem: program::Elem::F32,
            shape,
            role: program::Role::Activation,
            partial: false,
        };
        let mut buffers: Vec<_> = (0..4).map(|_| buffer(vec![2, 3])).collect();
        buffers.push(buffer(vec![3]));
        let instrs = vec![
            add(0, 1, 0), // 0: g = add(g, d); free d: d moves
            Instr::Free { buf: b(1) },
            add(0, 2, 0), // 2: d2 read again before its free: no move
            add(2, 2, 3),
            Instr::Free { buf: b(2) },
            add(3, 0, 3), // 5: g never freed, the output is the other operand: no move
            add(0, 4, 0), // 6: shapes differ (broadcast): no move
            Instr::Free { buf: b(4) },
        ];
        let tpl = Template {
            id: program::TemplateId(0),
            stage: 0,
            chunks: vec![0],
            buffers,
            shards: vec![],
            init: vec![],
            instrs,
        };
        assert_eq!(
            moving_adds(&tpl),
            vec![Some(1), None, None, None, None, None, None, None]
        );
    }
}
