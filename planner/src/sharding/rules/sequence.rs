//! Sequence parallelism (Korthikanti et al. 2022): norms and dropout run on sequence shards,
//! and an all-reduce becomes a reduce-scatter followed by an all-gather.
//!
//! - `layernorm-tokens`, `rmsnorm-tokens`: a norm acts per token, so it commutes with a split
//!   of the batch or sequence axis (its weights stay whole).
//! - `reduce-scatter`: the slice of an all-reduced sum is a reduce-scatter.
//! - `all-reduce-split`: all-reduce = all-gather ∘ reduce-scatter along the sequence.
//!
//! Dropout and residual adds on sequence shards come from `map-shard` and `zip-shard`.

use super::{Rule, rw};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    Ok(vec![
        rw(
            "layernorm-tokens",
            "(shard ?d (lnorm ?o ?x ?g ?b))",
            "(lnorm ?o (shard ?d ?x) ?g ?b)",
        )?,
        rw(
            "rmsnorm-tokens",
            "(shard ?d (rmsnorm ?o ?x ?g))",
            "(rmsnorm ?o (shard ?d ?x) ?g)",
        )?,
        rw(
            "reduce-scatter",
            "(shard ?d (allreduce ?p))",
            "(reducescatter ?d ?p)",
        )?,
        rw(
            "all-reduce-split",
            "(allreduce ?p)",
            "(allgather @1 (reducescatter @1 ?p))",
        )?,
    ])
}
