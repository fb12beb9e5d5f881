//! Linear layers (`x[.., K] · w[K, N]`, weights input-major) and their bias.
//!
//! - `matmul-column`: split the output features = split the weight's columns; the input stays
//!   whole. No communication in the forward pass.
//! - `matmul-row`: split the contraction `K` = split the input's last axis and the weight's
//!   rows; each rank holds a partial sum, completed by an all-reduce.
//! - `matmul-tokens`: a split of a token axis (batch, sequence) commutes with a linear.
//! - `bias-column` / `bias-tokens`: the bias follows the output's split.
//! - `transpose-swap`: `shard(a, wᵀ) = (shard(1 − a, w))ᵀ` for 2-D weights (tied LM heads).

use super::{BLOCKS, Rule, rw};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    let mut v = vec![
        // x·w = Σ_r x[.., K_r] · w[K_r, :]
        rw(
            "matmul-row",
            "(linear ?o ?x ?w)",
            "(allreduce (linear ?o (shard @2 ?x) (shard @0 ?w)))",
        )?,
        // (x·w)[T_r] = x[T_r] · w for a token axis T
        rw(
            "matmul-tokens",
            "(shard ?d (linear ?o ?x ?w))",
            "(linear ?o (shard ?d ?x) ?w)",
        )?,
        rw(
            "bias-tokens",
            "(shard ?d (bias ?o ?y ?b))",
            "(bias ?o (shard ?d ?y) ?b)",
        )?,
        rw(
            "transpose-swap-0",
            "(shard @0 (transpose ?o ?w))",
            "(transpose ?o (shard @1 ?w))",
        )?,
        rw(
            "transpose-swap-1",
            "(shard @1 (transpose ?o ?w))",
            "(transpose ?o (shard @0 ?w))",
        )?,
    ];
    for k in BLOCKS {
        let (suffix, a) = if k == 1 {
            (String::new(), String::new())
        } else {
            (format!("/{k}"), format!("/{k}"))
        };
        // (x·w)[.., N_r] = x · w[:, N_r]
        v.push(rw(
            &format!("matmul-column{suffix}"),
            &format!("(shard @2{a} (linear ?o ?x ?w))"),
            &format!("(linear ?o ?x (shard @1{a} ?w))"),
        )?);
        // (y + b)[.., N_r] = y[.., N_r] + b[N_r]
        v.push(rw(
            &format!("bias-column{suffix}"),
            &format!("(shard @2{a} (bias ?o ?y ?b))"),
            &format!("(bias ?o (shard @2{a} ?y) (shard @0{a} ?b))"),
        )?);
    }
    Ok(v)
}
