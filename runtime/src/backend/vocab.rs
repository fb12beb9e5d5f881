//! Vocabulary-parallel shard ops ([`program::VocabOp`] with the shard's place): the CPU
//! kernels (`kernels::shard_*`) are every backend's default ([`crate::Backend::vocab_shard`]);
//! a device backend runs them as `vocab.cu`'s kernels.

use kernels::Tensor32;

use crate::RuntimeError;

/// One shard op and where the rank's shard sits in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VocabShard {
    /// (table shard `[rows, h]`, ids) → the rows of the ids the shard holds, zeros elsewhere.
    Embedding { start: usize },
    /// (ids, dy `[.., h]`) → the table shard's gradient, of `table_shape`.
    EmbeddingGrad {
        start: usize,
        table_shape: Vec<usize>,
    },
    /// (logits `[.., n]`, targets) → `[1, positions, 3]`: max, Σ exp and target logit over
    /// the first `valid` columns.
    LossStats { start: usize, valid: usize },
    /// (statistics `[shards, positions, 3]`) → (loss `[]`, log-sum-exp `[positions]`).
    LossCombine,
    /// (logits, targets, lse, dloss) → d logits, zero past the first `valid` columns.
    LossGrad { start: usize, valid: usize },
}

impl VocabShard {
    pub fn name(&self) -> &'static str {
        match self {
            VocabShard::Embedding { .. } => "vocab_embedding",
            VocabShard::EmbeddingGrad { .. } => "vocab_embedding_grad",
            VocabShard::LossStats { .. } => "vocab_loss_stats",
            VocabShard::LossCombine => "vocab_loss_combine",
            VocabShard::LossGrad { .. } => "vocab_loss_grad",
        }
    }

    /// The operands it takes.
    pub fn arity(&self) -> usize {
        match self {
            VocabShard::Embedding { .. }
            | VocabShard::EmbeddingGrad { .. }
            | VocabShard::LossStats { .. } => 2,
            VocabShard::LossCombine => 1,
            VocabShard::LossGrad { .. } => 4,
        }
    }

    /// The CPU kernels' results on host operands (`arity` of them).
    pub fn on_host(&self, xs: &[&Tensor32]) -> Result<Vec<Tensor32>, RuntimeError> {
        let kernel = RuntimeError::kernel(self.name());
        let operands = |n: usize| {
            (xs.len() == n)
                .then_some(())
                .ok_or(RuntimeError::BadLength {
                    op: self.name(),
                    what: "operands",
                    got: xs.len(),
                    want: n,
                })
        };
        operands(self.arity())?;
        match self {
            VocabShard::Embedding { start } => Ok(vec![
                kernels::shard_embedding(xs[0], xs[1], *start).map_err(kernel)?,
            ]),
            VocabShard::EmbeddingGrad { start, table_shape } => Ok(vec![
                kernels::shard_embedding_grad(xs[0], xs[1], table_shape, *start).map_err(kernel)?,
            ]),
            VocabShard::LossStats { start, valid } => Ok(vec![
                kernels::shard_loss_stats(xs[0], xs[1], *start, *valid).map_err(kernel)?,
            ]),
            VocabShard::LossCombine => {
                let (loss, lse) = kernels::shard_loss_combine(xs[0]).map_err(kernel)?;
                Ok(vec![loss, lse])
            }
            VocabShard::LossGrad { start, valid } => Ok(vec![
                kernels::shard_loss_grad(xs[0], xs[1], xs[2], xs[3], *start, *valid)
                    .map_err(kernel)?,
            ]),
        }
    }
}
