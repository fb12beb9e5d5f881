//! Results held at the padded row pitch their GEMM writes ([`Backend::forward_pitched`]): a
//! bf16 product whose rows are not a whole number of 16-byte words (an LM head's logits over
//! GPT-2's 50257-word vocabulary) is computed by cuBLAS at a padded pitch; where every reader
//! of it reads it where it lies ([`Backend::reads_pitched`]: the cross-entropy and its
//! gradient), it stays there, and the copy out to dense rows (`unpad_rows`: 3.3 GB of traffic
//! in a GPT-2 step, 2.3 ms on an H200) is never made. Before any other reader the executor
//! makes it dense ([`Backend::expand_stashed`]).
//!
//! The cross-entropy's gradient is made so too: as the bf16 operand (rows padded to 8 columns
//! with zeros) that the LM head's backward GEMMs read, and nothing else. The f32 gradient of
//! the logits, and `to_bf16`'s conversion of it, are never made (in a GPT-2 step, 3.3 GB of
//! traffic and 0.77 GiB at the step's peak): its values are the f32 gradient rounded once to
//! bf16 as that conversion would round them, so the step computes what it did before.
//!
//! Under tensor parallelism with the vocabulary split ([`super::vocab`]) the same holds: the
//! shard's loss statistics and gradient read the logits at their pitch, and the gradient is
//! made as the head's operand (`shard_loss_grad_words`).

use std::collections::HashSet;

use ir::OpKind;
use program::{BufferId, Elem, Instr, Role, VocabOp};

use super::Executor;
use super::made;
use crate::{Backend, Communicator, RuntimeError};

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// Per step instruction, whether its results are held at a pitch: every later reader
    /// reads them where they lie ([`Executor::results_read_only`]); f32 activations, and the
    /// loss's gradient whether the plan declares it f32 or 16-bit (an engine that casts it
    /// to the head's dtype: it is made as that dtype's operand either way), only (the plan's
    /// other bf16 values go to the stash and the words paths).
    pub(super) fn pitched_results(&self) -> Vec<bool> {
        // The gradients held so are the loss's (as the LM head's operand), not a product's.
        let loss_grads: HashSet<BufferId> = self
            .tpl
            .instrs
            .iter()
            .filter_map(|ins| match ins {
                Instr::Compute {
                    kind: OpKind::Grad { of, .. },
                    outputs,
                    ..
                } if matches!(**of, OpKind::CrossEntropy) => Some(outputs),
                Instr::Vocab {
                    op: VocabOp::LossGrad,
                    outputs,
                    ..
                } => Some(outputs),
                _ => None,
            })
            .flatten()
            .copied()
            .collect();
        self.results_read_only(computed_or_loss_grad, Self::reads_pitched_only, |e, o| {
            e.tpl.buffer(o).is_some_and(|d| {
                let f32_activation = d.role == Role::Activation && d.elem == Elem::F32;
                let loss_grad = d.role == Role::ActGrad && loss_grads.contains(&o);
                d.shape.len() >= 2 && (f32_activation || loss_grad)
            })
        })
    }

    /// Whether `ins` reads `b` only where it lies when it is held at a pitch (a computation, or
    /// the vocabulary-parallel loss reading its logits).
    pub(super) fn reads_pitched_only(&self, ins: &Instr, b: BufferId) -> bool {
        self.reads_each_position(ins, b, B::reads_pitched) || self.vocab_reads_pitched_only(ins, b)
    }

    /// Runs step instruction `k` where [`Executor::pitched_results`] chose it and the backend
    /// holds its result at a pitch; `false`: not here (it runs as usual).
    pub(super) fn run_pitched(&mut self, k: usize, ins: &Instr) -> Result<bool, RuntimeError> {
        let chosen = self.step_pitched.get(k).copied().unwrap_or(false);
        if chosen && matches!(ins, Instr::Vocab { .. }) {
            return self.run_vocab_pitched(ins);
        }
        self.run_made(
            ins,
            chosen,
            |b, kind, xs| Ok(b.forward_pitched(kind, xs)?.map(|y| vec![y])),
            |e, o| e.pitched[o.index()] = true,
        )
    }

    /// Makes each buffer `ins` reads (`reads`) that is held at a pitch dense, unless `ins`
    /// reads it where it lies.
    pub(super) fn make_dense_for(
        &mut self,
        ins: &Instr,
        reads: &[BufferId],
    ) -> Result<(), RuntimeError> {
        for &b in reads {
            if self.pitched.get(b.index()).copied().unwrap_or(false)
                && !self.reads_pitched_only(ins, b)
            {
                self.make_dense(b)?;
            }
        }
        Ok(())
    }

    /// Makes `b` dense where it is held at a pitch.
    pub(super) fn make_dense(&mut self, b: BufferId) -> Result<(), RuntimeError> {
        let i = b.index();
        if !self.pitched.get(i).copied().unwrap_or(false) {
            return Ok(());
        }
        self.pitched[i] = false;
        match self.bufs.get_mut(i).and_then(Option::as_mut) {
            Some(x) => self.backend.expand_stashed(x),
            None => Ok(()),
        }
    }
}

/// A computation's operands and results, or the vocabulary-parallel loss gradient's (made as
/// the LM head's operand as the one-device cross-entropy's is).
fn computed_or_loss_grad(ins: &Instr) -> Option<(&[BufferId], &[BufferId])> {
    match ins {
        Instr::Vocab {
            op: VocabOp::LossGrad,
            inputs,
            outputs,
            ..
        } => Some((inputs, outputs)),
        _ => made::computed(ins),
    }
}
