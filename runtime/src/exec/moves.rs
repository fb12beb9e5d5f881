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
    /// The operand step instruction `k` (an `add`) moves to its output ([`moving_adds`]):
    /// the one freed next, where the other holds pending zeros and neither has an f64 value.
    pub(super) fn zero_add_source(&self, k: usize, ins: &Instr) -> Option<(BufferId, BufferId)> {
        let p = self.step_adds.get(k).copied().flatten()?;
        let Instr::Compute {
            inputs, outputs, ..
        } = ins
        else {
            return None;
        };
        let (src, other, out) = (*inputs.get(p)?, *inputs.get(1 - p)?, *outputs.first()?);
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
