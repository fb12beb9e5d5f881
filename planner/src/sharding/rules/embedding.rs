//! Vocabulary-parallel embedding and LM head (Megatron-LM §3).
//!
//! - `embedding-vocab`: each rank looks tokens up in its vocabulary range of the table and
//!   writes zeros for the others (`vembed`); the sum over ranks is the embedding.
//! - `embedding-tokens`: a split of the token ids splits the output the same way.
//! - `cross-entropy-vocab`: the cross-entropy of vocabulary-split logits (`vxent`: each
//!   rank's max, sum of exponentials and target logit, B·S floats each, are all-gathered over
//!   the group and combined) equals the cross-entropy of the whole logits. The LM head's column split comes from
//!   `matmul-column`.

use super::{Rule, rw};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    Ok(vec![
        rw(
            "embedding-vocab",
            "(embed ?o ?w ?ids)",
            "(allreduce (vembed ?o (shard @0 ?w) ?ids))",
        )?,
        rw(
            "embedding-tokens",
            "(shard ?d (embed ?o ?w ?ids))",
            "(embed ?o ?w (shard ?d ?ids))",
        )?,
        rw(
            "cross-entropy-vocab",
            "(xent ?o ?l ?t)",
            "(vxent ?o (shard @2 ?l) ?t)",
        )?,
    ])
}
