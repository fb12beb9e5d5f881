//! Stashed buffers brought back as their bf16 words only ([`crate::exec::stash`]): where the
//! instruction that next uses a stashed buffer reads it only as bf16 words (a bf16 GEMM's
//! operand: a linear's weight and input in the backward), the executor brings it back without
//! expanding its f32 values ([`Backend::unstash_bf16_words`]), and expands them only if a
//! later instruction reads them ([`Backend::expand_stashed`]). A GPT-2 step otherwise expands
//! every weight and every linear's input once in the backward only for the GEMM to read the
//! words it was expanded from.

//!
//! Results are made so too ([`Executor::word_results`], [`Backend::forward_words`]): a
//! computation's result that the plan stores in bf16 and that every later reader reads only
//! as words (a norm's or a GELU's output a linear multiplies next, attention's q, k and v out of
//! their fused projection, attention's output the projection after it multiplies: the kept
//! forward, [`super::kept`], makes it so) is written as words alone, and neither its f32 values nor a
//! conversion of them are ever made.

use program::{BufferId, Elem, Instr, Role};

use super::Executor;
use super::made::{self, MadeBy};
use crate::{Backend, Communicator, RuntimeError};

/// What the readers of a buffer's value, from some point to the value's end, ask of it.
#[derive(Clone, Copy)]
struct Readers {
    /// Every one reads it only as words (or in the form asked about).
    words: bool,
    count: usize,
}

/// A value no instruction reads yet, which ends (is freed or written again).
const ENDS_UNREAD: Readers = Readers {
    words: true,
    count: 0,
};

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Whether `ins` reads `b` only as bf16 words: a computation each of whose operands that
    /// is `b` the backend reads so ([`Backend::reads_stashed_words`]).
    pub(super) fn reads_words_only(&self, ins: &Instr, b: BufferId) -> bool {
        if let Instr::AdamW {
            grad, param, m, v, ..
        } = ins
        {
            return *grad == b
                && ![*param, *m, *v].contains(&b)
                && self.backend.adamw_reads_grad_words();
        }
        self.reads_each_position(ins, b, B::reads_stashed_words)
    }

    /// Per step instruction, whether its results are made as words only: a computation each
    /// result of which the plan stores in bf16 (an activation or its gradient, a matrix,
    /// written whole, not in place) and every later reader of which reads it only as words,
    /// until it is freed or written again (a value still live at the step's end is read
    /// after it: not so). One pass from the last instruction back.
    pub(super) fn word_results(&self) -> Vec<bool> {
        self.results_read_only(made::computed, Self::reads_words_only, Self::stored_bf16)
    }

    /// Per step instruction, per result, whether the plan stores it in bf16 and every later
    /// reader of it reads only as words (a linear's input gradient, beside its weight's and its
    /// bias's): the backend may make those alone as words ([`Backend::forward_some_words`])
    /// where it makes none of the op's results so whole ([`Executor::word_results`]). Empty
    /// where none is.
    pub(super) fn some_word_results(&self) -> Vec<Vec<bool>> {
        self.results_read_each(made::computed, Self::reads_words_only, Self::stored_bf16)
            .into_iter()
            // All of them too: where the backend makes no result of the op as words alone
            // (`forward_words`: a bias-free linear's gradient), it may make them one by one.
            .map(|each| {
                if each.contains(&true) {
                    each
                } else {
                    Vec::new()
                }
            })
            .collect()
    }

    /// Runs step instruction `k` where [`Executor::some_word_results`] marked some of its
    /// results and the backend makes them as words only (the others as usual); `false`: not
    /// here (it runs as usual).
    pub(super) fn run_some_words(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        let Some(mask) = self
            .step_some_words
            .get(k)
            .filter(|m| !m.is_empty())
            .cloned()
        else {
            return Ok(false);
        };
        let Some((kind, inputs, outputs)) = super::made::compute_parts(ins) else {
            return Ok(false);
        };
        self.zero_pending(inputs)?;
        let results = self
            .backend
            .forward_some_words(kind, &self.buffers(inputs)?, &mask)?;
        let Some(results) = results.filter(|r| r.len() == outputs.len()) else {
            return Ok(false);
        };
        for ((t, as_words), &o) in results.into_iter().zip(outputs) {
            self.put_buffer(o, t)?;
            self.words_only[o.index()] = as_words;
        }
        Ok(true)
    }

    /// Per step instruction, whether it is one `made_by` names (a computation, say) each result
    /// of which `keep` accepts
    /// and every later reader of which, until it is freed or written again, reads it only as
    /// `reads_so` says (a value still live at the step's end is read after it: not so), and
    /// not an operand of its own. One pass from the last instruction back.
    pub(super) fn results_read_only(
        &self,
        made_by: MadeBy,
        reads_so: impl Fn(&Self, &Instr, BufferId) -> bool,
        keep: impl Fn(&Self, BufferId) -> bool,
    ) -> Vec<bool> {
        self.results_read_each(made_by, reads_so, keep)
            .into_iter()
            .map(|each| !each.is_empty() && each.iter().all(|&r| r))
            .collect()
    }

    /// [`Executor::results_read_only`] per result of each instruction `made_by` names (empty
    /// for other instructions).
    fn results_read_each(
        &self,
        made_by: MadeBy,
        reads_so: impl Fn(&Self, &Instr, BufferId) -> bool,
        keep: impl Fn(&Self, BufferId) -> bool,
    ) -> Vec<Vec<bool>> {
        let instrs = &self.tpl.instrs;
        // A value live at the step's end is read after it (not so), but for a gradient
        // accumulator: only the program reads it, and the next step fills it first.
        let mut ahead: Vec<Readers> = self
            .tpl
            .buffers
            .iter()
            .map(|d| match d.role {
                Role::Grad(_) => ENDS_UNREAD,
                _ => Readers {
                    words: false,
                    count: 0,
                },
            })
            .collect();
        let mut out = vec![Vec::new(); instrs.len()];
        for (k, ins) in instrs.iter().enumerate().rev() {
            // The first addition into a zeroed accumulator hands its operand on (moves.rs): it
            // is read as the accumulator's later readers read it.
            let moved = self.moved_by_add(k, ins).map(|(src, out)| {
                let r = ahead.get(out.index()).copied().unwrap_or(ENDS_UNREAD);
                (src, r.words && r.count > 0)
            });
            if let Some((inputs, outputs)) = made_by(ins) {
                out[k] = outputs
                    .iter()
                    .map(|&o| {
                        let r = ahead.get(o.index()).copied().unwrap_or(ENDS_UNREAD);
                        r.words && r.count > 0 && !inputs.contains(&o) && keep(self, o)
                    })
                    .collect();
            }
            let (reads, writes) = program::verify::operands(ins);
            let ended = match ins {
                Instr::Alloc { buf } | Instr::Free { buf } => vec![*buf],
                _ => writes,
            };
            for b in ended {
                if let Some(r) = ahead.get_mut(b.index()) {
                    *r = ENDS_UNREAD;
                }
            }
            for b in reads {
                let words = match moved {
                    Some((src, as_read)) if src == b => as_read,
                    _ => reads_so(self, ins, b),
                };
                if let Some(r) = ahead.get_mut(b.index()) {
                    r.words &= words;
                    r.count += 1;
                }
            }
        }
        out
    }

    /// Whether the plan stores `b` in bf16 as a matrix of activations, their gradients or a
    /// weight's gradient from one micro-batch.
    fn stored_bf16(&self, b: BufferId) -> bool {
        self.tpl.buffer(b).is_some_and(|d| {
            d.elem == Elem::Bf16
                && d.shape.len() >= 2
                && !d.partial
                && matches!(d.role, Role::Activation | Role::ActGrad | Role::GradPart(_))
        })
    }

    /// The operand step instruction `k` moves to its output where it is an addition to an
    /// accumulator that holds zeros then ([`super::moves::moving_adds`], where the program
    /// filled the other operand since its last write): `(operand, output)`.
    fn moved_by_add(&self, k: usize, ins: &Instr) -> Option<(BufferId, BufferId)> {
        // As `zero_add_source` decides at run time: the other operand holds pending zeros.
        let (src, other, out) = self.add_parts(k, ins)?;
        let before = self.tpl.instrs.get(..k)?;
        super::moves::zeroed_when_reached(before, other).then_some((src, out))
    }

    /// Runs step instruction `k` where [`Executor::word_results`] chose it and the backend
    /// makes its results as words only; `false`: not here (it runs as usual).
    pub(super) fn run_words(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        let chosen = self.step_words.get(k).copied().unwrap_or(false);
        self.run_made(
            ins,
            chosen,
            |b, kind, xs| b.forward_words(kind, xs),
            |e, o| e.words_only[o.index()] = true,
        )
    }

    /// Expands the f32 values of each buffer `ins` reads (`reads`) that is held as words only,
    /// unless `ins` reads it only as words or moves it (`moved`: the first addition into a
    /// zeroed accumulator hands it on as it is held).
    pub(super) fn expand_words_for(
        &mut self,
        ins: &Instr,
        reads: &[BufferId],
        moved: Option<BufferId>,
    ) -> Result<(), RuntimeError> {
        for &b in reads {
            if self.words_only.get(b.index()).copied().unwrap_or(false)
                && Some(b) != moved
                && !self.reads_words_only(ins, b)
            {
                self.expand_words(b)?;
            }
        }
        Ok(())
    }

    /// Expands every buffer still held as words only that is state read between steps
    /// (parameters and optimizer state: f32 from outside). Gradients stay as words: only the
    /// program reads them, and each of its reads expands them first or reads the words.
    pub(super) fn expand_all_words(&mut self) -> Result<(), RuntimeError> {
        for i in 0..self.pitched.len() {
            self.make_dense(BufferId(i as u32))?;
        }
        for i in 0..self.words_only.len() {
            let gradient = self.tpl.buffer(BufferId(i as u32)).is_some_and(|d| {
                matches!(
                    d.role,
                    Role::Grad(_) | Role::GradSlice(_) | Role::GradPart(_)
                )
            });
            if self.words_only[i] && !gradient {
                self.expand_words(BufferId(i as u32))?;
            }
        }
        Ok(())
    }

    fn expand_words(&mut self, b: BufferId) -> Result<(), RuntimeError> {
        let i = b.index();
        self.words_only[i] = false;
        match self.bufs.get_mut(i).and_then(Option::as_mut) {
            Some(x) => self.backend.expand_stashed(x),
            None => Ok(()),
        }
    }
}
