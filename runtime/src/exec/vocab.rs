//! Vocabulary-parallel shard ops ([`Instr::Vocab`]: Megatron-LM's vocabulary-parallel
//! embedding and cross-entropy) on this rank's block of the vocabulary; the loss's gradient is
//! made as the LM head's bf16 operand where every reader reads it so, as the one-device
//! cross-entropy's is ([`super::pitched`]), and the loss reads the logits where the head's GEMM
//! wrote them, at its pitch.

use program::{BufferId, Instr, Slot, VocabOp};

use super::Executor;
use crate::backend::vocab::VocabShard;
use crate::{Backend, Communicator, RuntimeError};

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    /// The backend's shard op for vocabulary-parallel instruction `ins` on this rank's block of
    /// the vocabulary: the block of member `i` of its group starts at row (logit column)
    /// `i · n`, `n` the local block size. `None` for another instruction.
    fn vocab_shard_of(&self, ins: &Instr) -> Option<Result<VocabShard, RuntimeError>> {
        let Instr::Vocab {
            op,
            group,
            inputs,
            outputs,
            vocab,
        } = ins
        else {
            return None;
        };
        Some(self.shard_of(*op, *group, inputs, outputs, *vocab))
    }

    fn shard_of(
        &self,
        op: VocabOp,
        group: Slot,
        inputs: &[BufferId],
        outputs: &[BufferId],
        vocab: Option<u64>,
    ) -> Result<VocabShard, RuntimeError> {
        let pos = self.members(group).rank();
        // The shard's real columns: all of them, or those before a padded vocabulary's end.
        let valid =
            |start: usize, n: usize| vocab.map_or(n, |v| (v as usize).saturating_sub(start).min(n));
        let shape = |s: &Self, i: usize| match inputs.get(i) {
            Some(&b) => s.decl_shape(b),
            None => Err(s.prog(format!("{}: too few inputs", op.name()))),
        };
        let shard = match op {
            VocabOp::Embedding => VocabShard::Embedding {
                start: pos * shape(self, 0)?.first().copied().unwrap_or(0),
            },
            VocabOp::EmbeddingGrad => {
                let table_shape = match outputs.first() {
                    Some(&o) => self.decl_shape(o)?,
                    None => Vec::new(),
                };
                VocabShard::EmbeddingGrad {
                    start: pos * table_shape.first().copied().unwrap_or(0),
                    table_shape,
                }
            }
            VocabOp::LossStats | VocabOp::LossGrad => {
                let n = shape(self, 0)?.last().copied().unwrap_or(0);
                let (start, valid) = (pos * n, valid(pos * n, n));
                match op {
                    VocabOp::LossStats => VocabShard::LossStats { start, valid },
                    _ => VocabShard::LossGrad { start, valid },
                }
            }
            VocabOp::LossCombine => VocabShard::LossCombine,
        };
        let n_out = if op == VocabOp::LossCombine { 2 } else { 1 };
        if inputs.len() != shard.arity() || outputs.len() != n_out {
            return Err(self.prog(format!(
                "{}: expects {} input(s) and {n_out} output(s)",
                op.name(),
                shard.arity()
            )));
        }
        Ok(shard)
    }

    /// Runs vocabulary-parallel instruction `ins`; `false` for another instruction.
    pub(super) fn vocab(&mut self, ins: &Instr) -> Result<bool, RuntimeError> {
        let Some(shard) = self.vocab_shard_of(ins) else {
            return Ok(false);
        };
        let shard = shard?;
        let (inputs, outputs) = vocab_parts(ins);
        let xs = inputs
            .iter()
            .map(|&b| self.get(b))
            .collect::<Result<Vec<_>, _>>()?;
        let ys = self.backend.vocab_shard(&shard, &xs)?;
        for (&o, y) in outputs.iter().zip(ys) {
            self.put_buffer(o, y)?;
        }
        Ok(true)
    }

    /// Whether `ins` is a shard op that reads `b` where it lies, at each position it takes it,
    /// when `b` is held at a pitch ([`Backend::vocab_reads_pitched`]).
    pub(super) fn vocab_reads_pitched_only(&self, ins: &Instr, b: BufferId) -> bool {
        let Some(Ok(shard)) = self.vocab_shard_of(ins) else {
            return false;
        };
        let (inputs, _) = vocab_parts(ins);
        let mut positions = inputs.iter().enumerate().filter(|(_, i)| **i == b);
        positions.all(|(p, _)| self.backend.vocab_reads_pitched(&shard, p))
    }

    /// Runs shard op `ins` where [`Executor::pitched_results`] chose it and the backend holds
    /// its result at a pitch ([`Backend::vocab_shard_pitched`]); `false`: not here (it runs as
    /// usual).
    pub(super) fn run_vocab_pitched(&mut self, ins: &Instr) -> Result<bool, RuntimeError> {
        let Some(shard) = self.vocab_shard_of(ins) else {
            return Ok(false);
        };
        let shard = shard?;
        let (inputs, outputs) = vocab_parts(ins);
        let &[out] = outputs else {
            return Ok(false);
        };
        self.zero_pending(inputs)?;
        let Some(y) = self
            .backend
            .vocab_shard_pitched(&shard, &self.buffers(inputs)?)?
        else {
            return Ok(false);
        };
        self.put_buffer(out, y)?;
        self.pitched[out.index()] = true;
        Ok(true)
    }
}

/// A shard op's operands and results (none for another instruction).
pub(super) fn vocab_parts(ins: &Instr) -> (&[BufferId], &[BufferId]) {
    match ins {
        Instr::Vocab {
            inputs, outputs, ..
        } => (inputs, outputs),
        _ => (&[], &[]),
    }
}
