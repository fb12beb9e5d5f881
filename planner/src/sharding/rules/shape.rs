//! Views and copies of tensors (reshape, slice, concatenation, broadcast): a split passes
//! through them wherever each rank's piece is the same op on its own piece, as in the head
//! views of multi-head latent attention, Qwen3's per-head norms and Nemotron's partial rotary.
//!
//! - `reshape-prefix`: a reshape that keeps the dimensions before the split axis keeps each
//!   rank's contiguous run of every row behind them (`[b, s, h·d] ↔ [b, s, h, d]` split by
//!   heads). The analysis checks the prefix and that the axis divides on both sides (a padded
//!   split never passes: the pieces would not line up).
//! - `slice-other`, `concat-other`: a slice or concatenation along an axis the group does not
//!   split (a head's first 128 features, rotary and non-rotary parts joined per head).
//! - `expand-other`: a broadcast along axes the group does not split. (A split of the
//!   broadcast axis is the whole broadcast's slice, `(shard d x)` of a replicated tensor.)

use super::{Rule, rw};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    Ok(vec![
        rw(
            "reshape-prefix",
            "(shard ?d (reshape ?o ?x))",
            "(reshape ?o (shard ?d ?x))",
        )?,
        rw(
            "slice-other",
            "(shard ?d (slice ?o ?x))",
            "(slice ?o (shard ?d ?x))",
        )?,
        rw(
            "concat-other",
            "(shard ?d (concat ?o ?a ?b))",
            "(concat ?o (shard ?d ?a) (shard ?d ?b))",
        )?,
        rw(
            "expand-other",
            "(shard ?d (expand ?o ?x))",
            "(expand ?o (shard ?d ?x))",
        )?,
    ])
}
