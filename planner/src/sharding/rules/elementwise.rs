//! Elementwise ops and multi-result splits propagate along a sharded axis.
//!
//! - `map-shard`: `shard(d, f(x)) = f(shard(d, x))` for unary elementwise `f` (gelu, silu,
//!   dropout, scale...).
//! - `zip-shard`: the same for binary elementwise ops on equal shapes (residual add, SwiGLU mul)
//!   or broadcasting along other axes than the split one (a one-column gate times a
//!   hidden-wide output).
//! - `zip-shard-left`: the same with the second operand whole where it broadcasts along the
//!   split axis (Llama 4's eps beside a head-split mean).
//! - `reduce-other`: a mean or sum over the last axis commutes with a split of another axis
//!   (Llama 4's per-head L2 norms on head-split q and k).
//! - `part-blocks/k`: part `i` of a `k`-way split along `a`, sharded along `a`, is part `i` of
//!   the input sharded block-wise (`@a/k`) — how a fused QKV projection splits by heads.
//! - `part-other`: a split along another axis commutes with the split.

use super::{BLOCKS, Rule, rw};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    let mut v = vec![
        rw(
            "map-shard",
            "(shard ?d (map ?o ?x))",
            "(map ?o (shard ?d ?x))",
        )?,
        rw(
            "zip-shard",
            "(shard ?d (zip ?o ?a ?b))",
            "(zip ?o (shard ?d ?a) (shard ?d ?b))",
        )?,
        // The second operand whole where it broadcasts along the split axis (the analysis
        // checks): how the builders write a constant, after the tensor it meets.
        rw(
            "zip-shard-left",
            "(shard ?d (zip ?o ?a ?b))",
            "(zip ?o (shard ?d ?a) ?b)",
        )?,
        rw(
            "reduce-other",
            "(shard ?d (reduce ?o ?x))",
            "(reduce ?o (shard ?d ?x))",
        )?,
        rw(
            "part-other",
            "(shard ?d (part ?o ?i ?x))",
            "(part ?o ?i (shard ?d ?x))",
        )?,
    ];
    // Splits along the feature axis (2) of [B, S, F] activations, as fused projections have.
    for k in BLOCKS.into_iter().filter(|&k| k > 1) {
        v.push(rw(
            &format!("part-blocks/{k}"),
            "(shard @2 (part ?o ?i ?x))",
            &format!("(part ?o ?i (shard @2/{k} ?x))"),
        )?);
    }
    Ok(v)
}
