//! Stashed buffers brought back as their bf16 words only ([`crate::exec::stash`]): where the
//! instruction that next uses a stashed buffer reads it only as bf16 words (a bf16 GEMM's
//! operand: a linear's weight and input in the backward), the executor brings it back without
//! expanding its f32 values ([`Backend::unstash_bf16_words`]), and expands them only if a
//! later instruction reads them ([`Backend::expand_stashed`]). A GPT-2 step otherwise expands
//! every weight and every linear's input once in the backward only for the GEMM to read the
//! words it was expanded from.

use program::{BufferId, Instr};

use super::Executor;
use crate::{Backend, Communicator, RuntimeError};

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Whether `ins` reads `b` only as bf16 words: a computation each of whose operands that
    /// is `b` the backend reads so ([`Backend::reads_stashed_words`]).
    pub(super) fn reads_words_only(&self, ins: &Instr, b: BufferId) -> bool {
        let Instr::Compute { kind, inputs, .. } = ins else {
            return false;
        };
        let Ok(shapes) = inputs
            .iter()
            .map(|&i| self.decl_shape(i))
            .collect::<Result<Vec<_>, _>>()
        else {
            return false;
        };
        let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        let mut positions = inputs.iter().enumerate().filter(|(_, i)| **i == b);
        positions.all(|(p, _)| self.backend.reads_stashed_words(kind, &shapes, p))
    }

    /// Expands the f32 values of each buffer `ins` reads (`reads`) that is held as words only,
    /// unless `ins` reads it only as words.
    pub(super) fn expand_words_for(
        &mut self,
        ins: &Instr,
        reads: &[BufferId],
    ) -> Result<(), RuntimeError> {
        for &b in reads {
            if self.words_only.get(b.index()).copied().unwrap_or(false)
                && !self.reads_words_only(ins, b)
            {
                self.expand_words(b)?;
            }
        }
        Ok(())
    }

    /// Expands every buffer still held as words only (a step's end: state read between steps
    /// is f32).
    pub(super) fn expand_all_words(&mut self) -> Result<(), RuntimeError> {
        for i in 0..self.words_only.len() {
            if self.words_only[i] {
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
