//! Resharding collectives.
//!
//! - `all-gather`: a tensor equals the all-gather of its shards. Added to the *whole* tensor's
//!   class for every `(shard d x)` in the graph; this is what makes the e-graph cyclic
//!   (`x → allgather → shard → x`), see the ILP's acyclicity constraints.
//! - `all-to-all`: slicing along `b` what was just gathered along `a` is an all-to-all from
//!   `a`-shards to `b`-shards.
//! - `all-reduce-sum`: the sum of two all-reduced partial sums is the all-reduce of their sum
//!   (a parallel block's attention and MLP outputs reduced once, as GPT-J and Falcon's
//!   Megatron forks do); the analysis admits it only for an additive op.
//!
//! The slice `(shard d x)` of a replicated tensor is itself the "scatter" (free forward, its
//! backward conjugate is charged by the ILP), and identity needs no node.

use super::{Rule, rw, rw_into};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    Ok(vec![
        // x = allgather_d(shard_d(x))
        rw_into(
            "all-gather",
            "(shard ?d ?x)",
            "?x",
            "(allgather ?d (shard ?d ?x))",
        )?,
        // shard_b(allgather_a(s)) = alltoall_{a→b}(s)
        rw(
            "all-to-all",
            "(shard ?b (allgather ?a ?s))",
            "(alltoall ?a ?b ?s)",
        )?,
        // allreduce(a) + allreduce(b) = allreduce(a + b)
        rw(
            "all-reduce-sum",
            "(zip ?o (allreduce ?a) (allreduce ?b))",
            "(allreduce (zip ?o ?a ?b))",
        )?,
    ])
}
