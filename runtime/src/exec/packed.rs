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
//! The gradient joins the same way: where attention's gradient (reading in place) has its
//! dq, dk and dv read only by their concatenation along the last axis (the projection's output
//! gradient), the backend writes them side by side into one buffer laid out as the projection's
//! output, and the concatenation hands that buffer on: 36 launches and 1.8 GB fewer again.
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

/// Per step instruction: the split not made ([`Split`]), whether the instruction reads the
/// parts of one in place (attention's kept forward or gradient), whether it is such a
/// gradient whose results only their concatenation reads (`joins`: written side by side),
/// and whether it is that concatenation (`joined`: it hands the buffer on).
#[derive(Clone, Debug, Default)]
pub(super) struct PackedPlan {
    pub splits: Vec<Option<Split>>,
    pub readers: Vec<bool>,
    pub joins: Vec<bool>,
    pub joined: Vec<bool>,
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
        joins: vec![false; n],
        joined: vec![false; n],
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
            if let Some(c) = joining_concat(tpl, r) {
                out.joins[r] = true;
                out.joined[c] = true;
            }
        }
    }
    out
}

/// The concatenation that is the only reader of gradient `at`'s three results (q's, k's and
/// v's, along their last axis, in that order), where nothing else touches them before their
/// frees.
fn joining_concat(tpl: &Template, at: usize) -> Option<usize> {
    let Instr::Compute {
        kind: OpKind::Grad { .. },
        outputs,
        ..
    } = tpl.instrs.get(at)?
    else {
        return None;
    };
    let grads: [BufferId; 3] = outputs.as_slice().try_into().ok()?;
    let mut join = None;
    let mut live = 3;
    for (k, ins) in tpl.instrs.iter().enumerate().skip(at + 1) {
        if let Instr::Free { buf } = ins {
            live -= usize::from(grads.contains(buf));
            if live == 0 {
                break;
            }
            continue;
        }
        let (reads, writes) = program::verify::operands(ins);
        let touches = |b: &BufferId| grads.contains(b);
        if writes.iter().any(touches) {
            return None;
        }
        if !reads.iter().any(touches) {
            continue;
        }
        let concat = matches!(
            ins,
            Instr::Compute { kind: OpKind::Concat { axis }, inputs, .. }
                if inputs.as_slice() == grads
                    && tpl.buffer(grads[0]).is_some_and(|d| d.shape.len() == axis + 1)
        );
        if !concat || join.is_some() {
            return None;
        }
        join = Some(k);
    }
    join
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
                return (!readers.is_empty()).then_some(readers);
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
    // The operand or a part outlives the step: read after it (by the next step, or from
    // outside), so it stays as the program holds it.
    None
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
    /// The split that makes the parts of it.
    split: OpKind,
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

    /// Holds `qkv` for `parts`, which `split` makes of it.
    pub fn hold(&mut self, qkv: T, split: OpKind, parts: [BufferId; 3]) {
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

    /// The entry holding part `b`, taken out: its output, the split that makes its parts, and
    /// each part where still live (in order).
    pub fn take(&mut self, b: BufferId) -> Option<(T, OpKind, [Option<BufferId>; 3])> {
        let slot = self.part_of.get(b.index()).copied().flatten()?;
        let e = self.entries.get_mut(slot)?.take()?;
        for p in e.parts {
            if let Some(s) = self.part_of.get_mut(p.index()) {
                *s = None;
            }
        }
        let live = [0, 1, 2].map(|i| e.live[i].then_some(e.parts[i]));
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
        let Some(Instr::Compute { kind, .. }) = self.tpl.instrs.get(k) else {
            return Err(self.prog(format!("packed: instruction {k} is not a split")));
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
        self.hold_parts(qkv, kind.clone(), split.parts);
        Ok(true)
    }

    /// Holds `qkv` for `parts`, which hold values now (no pending zero-fill makes them), only
    /// not apart.
    pub(super) fn hold_parts(&mut self, qkv: B::Buffer, split: OpKind, parts: [BufferId; 3]) {
        for p in parts {
            self.mark_written(p);
        }
        self.packed.hold(qkv, split, parts);
    }

    /// Runs step instruction `k` where it is a concatenation [`plan`] chose and its operands
    /// are held side by side: the buffer is handed on as its result. `false`: not here.
    pub(super) fn run_packed_join(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        if !self.packed_plan.joined.get(k).copied().unwrap_or(false) {
            return Ok(false);
        }
        let Instr::Compute {
            inputs, outputs, ..
        } = ins
        else {
            return Ok(false);
        };
        let (Some(_), &[out]) = (self.packed.packed(inputs), outputs.as_slice()) else {
            return Ok(false);
        };
        let Some((joined, _, _)) = self.packed.take(inputs[0]) else {
            return Ok(false);
        };
        let words = self.backend.holds_words_alone(&joined);
        self.put_buffer(out, joined)?;
        self.words_only[out.index()] = words;
        Ok(true)
    }

    /// The split that takes apart a buffer holding `parts` (declared) side by side.
    pub(super) fn split_of(&self, parts: &[BufferId]) -> Result<OpKind, RuntimeError> {
        let shapes = self.part_shapes(parts)?;
        let axis = shapes[0].len().saturating_sub(1);
        let sizes = shapes
            .iter()
            .map(|s| s.last().copied().unwrap_or(0) as u64)
            .collect();
        Ok(OpKind::Split { axis, sizes })
    }

    /// Makes the parts of every held output that `ins` (not a reader in place) reads, as
    /// the split would have made them.
    pub(super) fn unpack_for(&mut self, k: usize, reads: &[BufferId]) -> Result<(), RuntimeError> {
        let plan = &self.packed_plan;
        let in_place = |v: &[bool]| v.get(k).copied().unwrap_or(false);
        if in_place(&plan.readers) || in_place(&plan.joined) {
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
        let binding = ir::Binding {
            batch: self.set.mesh.micro_batch,
            seq: self.set.mesh.seq,
        };
        let results = self.backend.forward(&split, &[&qkv], binding);
        self.backend.free(qkv);
        for (t, o) in results?.into_iter().zip(live) {
            match o {
                Some(o) => self.put_buffer(o, t)?,
                None => self.backend.free(t),
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
        sinks: false,
        window: None,
        chunk: None,
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
        buffers.push(buffer(vec![1, 4, 24], Role::ActGrad));
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
        // A part live at the step's end (not freed in it).
        let mut p = program(vec![]);
        p.pop();
        assert!(chosen(p, true).0.is_empty(), "a part outlives the step");
    }

    /// The gradients joined (at which instruction the gradient, at which the concatenation)
    /// after `program(vec![])` followed by `tail`.
    fn joins(tail: Vec<Instr>) -> (Vec<usize>, Vec<usize>) {
        let mut p = program(vec![]);
        p.extend(tail);
        let tpl = template(p);
        let kept = super::super::kept::plan(&tpl);
        let plan = plan(&tpl, &kept, |_, _| true);
        let at = |v: &[bool]| (0..v.len()).filter(|&k| v[k]).collect();
        (at(&plan.joins), at(&plan.joined))
    }

    #[test]
    fn gradients_only_their_concatenation_reads_are_written_side_by_side() {
        let concat = |inputs: &[u32]| compute(OpKind::Concat { axis: 2 }, inputs, &[10], &[]);
        let frees = (5..8).map(|i| Instr::Free { buf: b(i) });
        let tail = |mut v: Vec<Instr>| {
            v.extend(frees.clone());
            v
        };
        assert_eq!(joins(tail(vec![concat(&[5, 6, 7])])), (vec![3], vec![7]));
        assert_eq!(
            joins(tail(vec![concat(&[5, 7, 6])])),
            (vec![], vec![]),
            "order"
        );
        let also = Instr::Copy {
            src: b(6),
            dst: b(3),
        };
        assert_eq!(
            joins(tail(vec![concat(&[5, 6, 7]), also])),
            (vec![], vec![]),
            "another reader"
        );
    }

    #[test]
    fn the_held_output_goes_with_its_last_part_or_when_taken_apart() {
        let split = || OpKind::Split {
            axis: 2,
            sizes: vec![8, 8, 8],
        };
        let mut held = Held::new(10);
        held.hold("qkv", split(), [b(0), b(1), b(2)]);
        assert_eq!(held.packed(&[b(0), b(1), b(2), b(4)]), Some(&"qkv"));
        assert_eq!(held.packed(&[b(1), b(0), b(2)]), None, "another order");
        assert_eq!(held.free(b(1)), None);
        assert_eq!(held.packed(&[b(0), b(1), b(2)]), None, "a part freed");
        assert_eq!(held.free(b(0)), None);
        assert_eq!(held.free(b(2)), Some("qkv"));
        held.hold("again", split(), [b(0), b(1), b(2)]);
        held.free(b(0));
        let live = [None, Some(b(1)), Some(b(2))];
        assert_eq!(held.take(b(2)), Some(("again", split(), live)));
        assert_eq!(held.free(b(1)), None, "taken: nothing held");
        assert!(held.drain().is_empty());
    }
}
