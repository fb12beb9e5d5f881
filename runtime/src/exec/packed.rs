//! q, k and v read in place in their fused projection's output: GPT-2's attention takes q, k
//! and v as the three column blocks of one `[batch, seq, 3·hidden]` product (`c_attn`), which
//! the program splits (`split[h, h, h]`) before attention reads them. Where the only readers
//! of the three blocks are attention's kept forward and its gradient ([`super::kept`]), and the
//! backend reads them in place ([`Backend::reads_packed_qkv`]: the tensor-core kernels, whose
//! operand rows take a stride and a column offset), the executor never makes the split: it
//! holds the projection's output under the blocks' names until the last of them is freed
//! (the same bytes the three blocks would hold). In a GPT-2 step that is 36 launches and 1.8 GB
//! of copies fewer.
//!
//! Any other reader of a block (none in the programs codegen writes today) gets the blocks
//! made first, as the split would have made them ([`Executor::unpack`]).

use ir::OpKind;
use program::{BufferId, Instr, Template};

use super::Executor;
use super::kept::KeptPlan;
use crate::{Backend, Communicator, RuntimeError};

/// A split whose three results attention reads in place: its operand and its results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Split {
    pub input: BufferId,
    pub parts: [BufferId; 3],
}

/// Per step instruction: the split not made ([`Split`]), and whether the instruction reads
/// the parts of one in place (attention's kept forward or gradient).
#[derive(Clone, Debug, Default)]
pub(super) struct PackedPlan {
    pub splits: Vec<Option<Split>>,
    pub readers: Vec<bool>,
}

/// The splits of `tpl`'s step that `can_read` (the backend, asked with the attention's kind
/// and its q, k, v shapes) lets attention read in place: a three-way split along the last
/// axis whose operand nothing reads after it, whose results nothing writes before their
/// frees, and whose results only attention's kept forward and gradient read, each as its q, k
/// and v in that order.
pub(super) fn plan(
    tpl: &Template,
    kept: &KeptPlan,
    can_read: impl Fn(&OpKind, [&[usize]; 3]) -> bool,
) -> PackedPlan {
    let n = tpl.instrs.len();
    let mut out = PackedPlan {
        splits: vec![None; n],
        readers: vec![false; n],
    };
    for (k, ins) in tpl.instrs.iter().enumerate() {
        let Some(split) = three_way_split(tpl, ins) else {
            continue;
        };
        let Some(readers) = attention_readers(tpl, kept, k, split, &can_read) else {
            continue;
        };
        out.splits[k] = Some(split);
        for r in readers {
            out.readers[r] = true;
        }
    }
    out
}

/// `ins` as a split of one operand into three along its last axis.
fn three_way_split(tpl: &Template, ins: &Instr) -> Option<Split> {
    let Instr::Compute {
        kind: OpKind::Split { axis, .. },
        inputs,
        outputs,
        ..
    } = ins
    else {
        return None;
    };
    let (&[input], &[q, k, v]) = (inputs.as_slice(), outputs.as_slice()) else {
        return None;
    };
    let rank = tpl.buffer(input)?.shape.len();
    (rank >= 1 && *axis == rank - 1).then_some(Split {
        input,
        parts: [q, k, v],
    })
}

/// The instructions after split `at` that read its parts, where every one is attention's
/// kept forward or gradient reading them as its q, k and v (the backend able to), nothing
/// writes them before they are freed, and nothing reads the split's operand after it.
fn attention_readers(
    tpl: &Template,
    kept: &KeptPlan,
    at: usize,
    split: Split,
    can_read: &impl Fn(&OpKind, [&[usize]; 3]) -> bool,
) -> Option<Vec<usize>> {
    let shapes: Vec<Vec<usize>> = split
        .parts
        .iter()
        .map(|&p| Some(tpl.buffer(p)?.shape.iter().map(|&d| d as usize).collect()))
        .collect::<Option<_>>()?;
    let parts = [&shapes[0][..], &shapes[1][..], &shapes[2][..]];
    let mut live = [true; 3];
    let mut input_live = true;
    let mut readers = Vec::new();
    for (k, ins) in tpl.instrs.iter().enumerate().skip(at + 1) {
        if let Instr::Free { buf } = ins {
            if *buf == split.input {
                input_live = false;
            }
            if let Some(i) = split.parts.iter().position(|p| p == buf) {
                live[i] = false;
            }
            if !input_live && live == [false; 3] {
                break;
            }
            continue;
        }
        let (reads, writes) = program::verify::operands(ins);
        let touches = |b: &BufferId| split.parts.contains(b);
        if (input_live && reads.contains(&split.input)) || writes.iter().any(touches) {
            return None;
        }
        if !reads.iter().any(touches) {
            continue;
        }
        let attention = reads_in_place(ins, split.parts)?;
        let in_kept = kept.forward.get(k).is_some_and(Option::is_some)
            || kept.grad.get(k).is_some_and(Option::is_some);
        if !in_kept || !can_read(attention, parts) {
            return None;
        }
        readers.push(k);
    }
    (!readers.is_empty()).then_some(readers)
}

/// The attention `ins` is (its forward's kind, also for its gradient), where it reads
/// `parts` as its q, k and v and at no other operand.
fn reads_in_place(ins: &Instr, parts: [BufferId; 3]) -> Option<&OpKind> {
    let Instr::Compute { kind, inputs, .. } = ins else {
        return None;
    };
    let attention = match kind {
        OpKind::Attention { .. } => kind,
        OpKind::Grad { of, .. } if matches!(**of, OpKind::Attention { .. }) => &**of,
        _ => return None,
    };
    let (qkv, rest) = inputs.split_at(inputs.len().min(3));
    (qkv == parts && !rest.iter().any(|b| parts.contains(b))).then_some(attention)
}

/// The projection outputs held for their parts at run time.
#[derive(Debug)]
pub(super) struct Held<T> {
    /// Per buffer: the entry that holds it, where it is a part read in place.
    part_of: Vec<Option<usize>>,
    entries: Vec<Option<Entry<T>>>,
}

#[derive(Debug)]
struct Entry<T> {
    qkv: T,
    split: usize,
    parts: [BufferId; 3],
    live: [bool; 3],
}

impl<T> Held<T> {
    pub fn new(buffers: usize) -> Held<T> {
        Held {
            part_of: (0..buffers).map(|_| None).collect(),
            entries: Vec::new(),
        }
    }

    /// Holds `qkv` for the parts of split instruction `split`.
    pub fn hold(&mut self, qkv: T, split: usize, parts: [BufferId; 3]) {
        let slot = self.entries.len();
        self.entries.push(Some(Entry {
            qkv,
            split,
            parts,
            live: [true; 3],
        }));
        for p in parts {
            if let Some(s) = self.part_of.get_mut(p.index()) {
                *s = Some(slot);
            }
        }
    }

    /// The held output whose parts are `qkv` (q, k, v in order, all live).
    pub fn packed(&self, qkv: &[BufferId]) -> Option<&T> {
        let e = self.entry_of(*qkv.first()?)?;
        (qkv.get(..3) == Some(&e.parts[..]) && e.live == [true; 3]).then_some(&e.qkv)
    }

    fn entry_of(&self, b: BufferId) -> Option<&Entry<T>> {
        let slot = self.part_of.get(b.index()).copied().flatten()?;
        self.entries.get(slot)?.as_ref()
    }

    /// Part `b` freed: the held output once its last part is.
    pub fn free(&mut self, b: BufferId) -> Option<T> {
        let slot = self.part_of.get_mut(b.index())?.take()?;
        let e = self.entries.get_mut(slot)?.as_mut()?;
        if let Some(i) = e.parts.iter().position(|&p| p == b) {
            e.live[i] = false;
        }
        if e.live == [false; 3] {
            return self.entries[slot].take().map(|e| e.qkv);
        }
        None
    }

    /// The entry holding part `b`, taken out: its output, split instruction and live parts.
    pub fn take(&mut self, b: BufferId) -> Option<(T, usize, Vec<BufferId>)> {
        let slot = self.part_of.get(b.index()).copied().flatten()?;
        let e = self.entries.get_mut(slot)?.take()?;
        for p in e.parts {
            if let Some(s) = self.part_of.get_mut(p.index()) {
                *s = None;
            }
        }
        let live = (0..3).filter(|&i| e.live[i]).map(|i| e.parts[i]).collect();
        Some((e.qkv, e.split, live))
    }

    /// Every held output, with the first part it stands for.
    pub fn iter(&self) -> impl Iterator<Item = (BufferId, &T)> {
        self.entries.iter().flatten().map(|e| (e.parts[0], &e.qkv))
    }

    /// Every held output, taken out (the step's end).
    pub fn drain(&mut self) -> Vec<T> {
        self.part_of.iter_mut().for_each(|s| *s = None);
        self.entries.drain(..).flatten().map(|e| e.qkv).collect()
    }
}

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Runs step instruction `k` where it is a split [`plan`] chose: its operand is held for
    /// its parts, and no copy is made. `false`: not here.
    pub(super) fn run_packed_split(&mut self, k: usize) -> Result<bool, RuntimeError> {
        let Some(split) = self.packed_plan.splits.get(k).copied().flatten() else {
            return Ok(false);
        };
        self.zero_if_pending(split.input)?;
        let Some(qkv) = self
            .bufs
            .get_mut(split.input.index())
            .and_then(Option::take)
        else {
            return Ok(false);
        };
        self.words_only[split.input.index()] = false;
        // The parts hold values now (no pending zero-fill makes them), only not apart.
        for p in split.parts {
            self.mark_written(p);
        }
        self.packed.hold(qkv, k, split.parts);
        Ok(true)
    }

    /// Makes the parts of every held output that `ins` (not a reader in place) reads, as
    /// the split would have made them.
    pub(super) fn unpack_for(&mut self, k: usize, reads: &[BufferId]) -> Result<(), RuntimeError> {
        if self.packed_plan.readers.get(k).copied().unwrap_or(false) {
            return Ok(());
        }
        for &b in reads {
            self.unpack(b)?;
        }
        Ok(())
    }

    /// Makes the parts `ins` reads, where it did not read them in place (its kept path
    /// declined): always `false`, so that the instruction then runs as usual.
    pub(super) fn unpack_reads(&mut self, ins: &Instr) -> Result<bool, RuntimeError> {
        let (reads, _) = program::verify::operands(ins);
        for b in reads {
            self.unpack(b)?;
        }
        Ok(false)
    }

    /// The shapes of q, k and v, `parts`, as declared.
    pub(super) fn part_shapes(&self, parts: &[BufferId]) -> Result<Vec<Vec<usize>>, RuntimeError> {
        parts.iter().take(3).map(|&p| self.decl_shape(p)).collect()
    }

    /// Makes the parts of the held output that holds `b` (if any): the split run now, its
    /// live results put in place, the output freed.
    pub(super) fn unpack(&mut self, b: BufferId) -> Result<(), RuntimeError> {
        let Some((qkv, split, live)) = self.packed.take(b) else {
            return Ok(());
        };
        let Some(Instr::Compute { kind, outputs, .. }) = self.tpl.instrs.get(split) else {
            return Err(self.prog(format!("packed: instruction {split} is not a split")));
        };
        let binding = ir::Binding {
            batch: self.set.mesh.micro_batch,
            seq: self.set.mesh.seq,
        };
        let results = self.backend.forward(kind, &[&qkv], binding);
        self.backend.free(qkv);
        for (t, &o) in results?.into_iter().zip(outputs) {
            if live.contains(&o) {
                self.put_buffer(o, t)?;
            } else {
                self.backend.free(t);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use program::{BufferDecl, Elem, Role, TemplateId};

    fn b(i: u32) -> BufferId {
        BufferId(i)
    }

    const ATTENTION: OpKind = OpKind::Attention {
        heads: 2,
        kv_heads: 2,
        scale: 0.5,
        causal: true,
        softcap: None,
    };

    fn compute(kind: OpKind, inputs: &[u32], outputs: &[u32], saves: &[u32]) -> Instr {
        Instr::Compute {
            kind,
            inputs: inputs.iter().map(|&i| b(i)).collect(),
            outputs: outputs.iter().map(|&i| b(i)).collect(),
            saves: saves.iter().map(|&i| b(i)).collect(),
            layer: Some(0),
        }
    }

    /// The projection output (9) split into q, k, v (0, 1, 2), attention (output 3, row
    /// statistic 8) and its gradient (dO 4, gradients 5, 6, 7), `between` after the forward.
    fn program(between: Vec<Instr>) -> Vec<Instr> {
        let split = OpKind::Split {
            axis: 2,
            sizes: vec![8, 8, 8],
        };
        let grad = OpKind::Grad {
            of: Box::new(ATTENTION),
            wrt: vec![0, 1, 2],
        };
        let mut p = vec![
            compute(split, &[9], &[0, 1, 2], &[]),
            Instr::Free { buf: b(9) },
            compute(ATTENTION, &[0, 1, 2], &[3], &[8]),
        ];
        p.extend(between);
        p.push(compute(grad, &[0, 1, 2, 4], &[5, 6, 7], &[]));
        p.extend((0..3).map(|i| Instr::Free { buf: b(i) }));
        p
    }

    fn template(instrs: Vec<Instr>) -> Template {
        let buffer = |shape: Vec<u64>, role| BufferDecl {
            name: String::new(),
            elem: Elem::Bf16,
            shape,
            role,
            partial: false,
        };
        let mut buffers: Vec<_> = (0..8)
            .map(|_| buffer(vec![1, 4, 8], Role::Activation))
            .collect();
        buffers.push(buffer(vec![1, 2, 4], Role::Saved));
        buffers.push(buffer(vec![1, 4, 24], Role::Activation));
        Template {
            id: TemplateId(0),
            stage: 0,
            chunks: vec![0],
            buffers,
            shards: vec![],
            init: vec![],
            instrs,
        }
    }

    /// The split instructions chosen and the readers in place, where the backend reads
    /// attention's operands packed iff `can`.
    fn chosen(instrs: Vec<Instr>, can: bool) -> (Vec<usize>, Vec<usize>) {
        let tpl = template(instrs);
        let kept = super::super::kept::plan(&tpl);
        let p = plan(&tpl, &kept, |kind, parts| {
            assert_eq!(kind, &ATTENTION, "asked with the forward's kind");
            assert_eq!(parts, [&[1, 4, 8][..]; 3]);
            can
        });
        let at = |v: Vec<bool>| (0..v.len()).filter(|&k| v[k]).collect();
        let splits = p.splits.iter().map(Option::is_some).collect();
        (at(splits), at(p.readers))
    }

    #[test]
    fn a_split_read_only_by_attention_is_not_made() {
        assert_eq!(chosen(program(vec![]), true), (vec![0], vec![2, 3]));
        assert_eq!(chosen(program(vec![]), false), (vec![], vec![]), "backend");
    }

    #[test]
    fn a_split_is_made_where_anything_else_touches_its_parts_or_operand() {
        let others = [
            Instr::Copy {
                src: b(1),
                dst: b(3),
            },
            Instr::Fill {
                buf: b(2),
                value: 0.0,
            },
        ];
        for other in others {
            let what = format!("{other:?}");
            assert!(chosen(program(vec![other]), true).0.is_empty(), "{what}");
        }
        // The operand read after the split (its free moved past a reader).
        let mut p = program(vec![Instr::Copy {
            src: b(9),
            dst: b(3),
        }]);
        p.remove(1);
        assert!(chosen(p, true).0.is_empty(), "the operand read after");
    }

    #[test]
    fn the_held_output_goes_with_its_last_part_or_when_taken_apart() {
        let mut held = Held::new(10);
        held.hold("qkv", 0, [b(0), b(1), b(2)]);
        assert_eq!(held.packed(&[b(0), b(1), b(2), b(4)]), Some(&"qkv"));
        assert_eq!(held.packed(&[b(1), b(0), b(2)]), None, "another order");
        assert_eq!(held.free(b(1)), None);
        assert_eq!(held.packed(&[b(0), b(1), b(2)]), None, "a part freed");
        assert_eq!(held.free(b(0)), None);
        assert_eq!(held.free(b(2)), Some("qkv"));
        held.hold("again", 5, [b(0), b(1), b(2)]);
        held.free(b(0));
        assert_eq!(held.take(b(2)), Some(("again", 5, vec![b(1), b(2)])));
        assert_eq!(held.free(b(1)), None, "taken: nothing held");
        assert!(held.drain().is_empty());
    }
}
