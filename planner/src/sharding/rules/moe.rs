//! Mixture-of-experts layers (Mixtral: top-k router, then Σₑ gateₑ · FFNₑ(x)).
//!
//! - `moe-experts`: each rank runs its experts (weights split along the expert axis, gates
//!   sliced to its experts) for every token; the ranks' partial sums are all-reduced.
//! - `moe-ffn`: each rank runs a slice of every expert's FFN (w1, w3 by columns, w2 by rows);
//!   partial sums again.
//! - `moe-tokens`: a split of the token axes commutes with the layer (experts replicated).
//! - `router-tokens`: the router acts per token.
//! - `bmoe-experts`, `bmoe-ffn`, `bmoe-tokens`, `brouter-tokens`: the same with gpt-oss's
//!   biases, each gate and up bias (`[E, F]`) split as its weight is (by experts, or by the
//!   FFN's columns), the router's whole.
//!
//! GShard's dispatch (tokens split, each rank holding its experts, tokens sent to them and back
//! by all-to-alls whose counts follow the routing) has no rule: the programs have no such
//! collective, and an extraction that chose it (Mixtral at tp 2 did) was priced as one layout
//! and lowered as another. Expert parallelism over data-parallel ranks (`--ep`) runs
//! Megatron-Core's all-gather dispatcher (`ShardOptions::expert_parallel`).

use super::{Rule, rw};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    Ok(vec![
        rw(
            "moe-experts",
            "(moe ?o ?x ?g ?w1 ?w3 ?w2)",
            "(allreduce (moe ?o ?x (shard @2 ?g) (shard @0 ?w1) (shard @0 ?w3) (shard @0 ?w2)))",
        )?,
        rw(
            "moe-ffn",
            "(moe ?o ?x ?g ?w1 ?w3 ?w2)",
            "(allreduce (moe ?o ?x ?g (shard @2 ?w1) (shard @2 ?w3) (shard @1 ?w2)))",
        )?,
        rw(
            "moe-tokens",
            "(shard ?d (moe ?o ?x ?g ?w1 ?w3 ?w2))",
            "(moe ?o (shard ?d ?x) (shard ?d ?g) ?w1 ?w3 ?w2)",
        )?,
        rw(
            "router-tokens",
            "(shard ?d (router ?o ?x ?w))",
            "(router ?o (shard ?d ?x) ?w)",
        )?,
        rw(
            "bmoe-experts",
            "(bmoe ?o ?x ?g ?w1 ?w3 ?w2 ?b1 ?b3)",
            "(allreduce (bmoe ?o ?x (shard @2 ?g) (shard @0 ?w1) (shard @0 ?w3) (shard @0 ?w2) \
             (shard @0 ?b1) (shard @0 ?b3)))",
        )?,
        rw(
            "bmoe-ffn",
            "(bmoe ?o ?x ?g ?w1 ?w3 ?w2 ?b1 ?b3)",
            "(allreduce (bmoe ?o ?x ?g (shard @2 ?w1) (shard @2 ?w3) (shard @1 ?w2) \
             (shard @1 ?b1) (shard @1 ?b3)))",
        )?,
        rw(
            "bmoe-tokens",
            "(shard ?d (bmoe ?o ?x ?g ?w1 ?w3 ?w2 ?b1 ?b3))",
            "(bmoe ?o (shard ?d ?x) (shard ?d ?g) ?w1 ?w3 ?w2 ?b1 ?b3)",
        )?,
        rw(
            "brouter-tokens",
            "(shard ?d (brouter ?o ?x ?w ?b))",
            "(brouter ?o (shard ?d ?x) ?w ?b)",
        )?,
    ])
}
