//! Attention and rotary embeddings split by heads (Megatron) or by batch.
//!
//! - `attention-heads`: heads are independent, so splitting q, k and v by heads (their last
//!   axis, whole heads per rank) splits the output by heads. The analysis admits it only when
//!   both the query heads and the kv heads divide by the TP degree; with grouped-query
//!   attention query head `h` reads kv head `h / (heads / kv_heads)`, and contiguous splits of
//!   both keep every group on one rank.
//! - `attention-heads-whole-kv`: with fewer kv heads than ranks (a multiple of them), q split
//!   by heads and k and v whole: each rank attends with the one kv head its query heads share
//!   (vLLM's replicated KV heads; codegen selects the head from the whole K and V).
//! - `sink-attention-*`: the same three with gpt-oss's sinks, one logit per query head, split
//!   with the query heads and whole otherwise.
//! - `rotary-heads`: rotary embedding acts per head.
//! - `attention-batch`, `rotary-batch`: sequences are independent. (There is no sequence rule:
//!   attention needs every key, and rotary needs absolute positions.)

use super::{Rule, rw};
use crate::sharding::error::ShardError;

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    Ok(vec![
        rw(
            "attention-heads",
            "(shard @2 (attn ?o ?q ?k ?v))",
            "(attn ?o (shard @2 ?q) (shard @2 ?k) (shard @2 ?v))",
        )?,
        rw(
            "attention-heads-whole-kv",
            "(shard @2 (attn ?o ?q ?k ?v))",
            "(attn ?o (shard @2 ?q) ?k ?v)",
        )?,
        rw(
            "attention-batch",
            "(shard @0 (attn ?o ?q ?k ?v))",
            "(attn ?o (shard @0 ?q) (shard @0 ?k) (shard @0 ?v))",
        )?,
        rw(
            "sink-attention-heads",
            "(shard @2 (sattn ?o ?q ?k ?v ?s))",
            "(sattn ?o (shard @2 ?q) (shard @2 ?k) (shard @2 ?v) (shard @0 ?s))",
        )?,
        rw(
            "sink-attention-heads-whole-kv",
            "(shard @2 (sattn ?o ?q ?k ?v ?s))",
            "(sattn ?o (shard @2 ?q) ?k ?v (shard @0 ?s))",
        )?,
        rw(
            "sink-attention-batch",
            "(shard @0 (sattn ?o ?q ?k ?v ?s))",
            "(sattn ?o (shard @0 ?q) (shard @0 ?k) (shard @0 ?v) ?s)",
        )?,
        rw(
            "rotary-heads",
            "(shard @2 (rope ?o ?x))",
            "(rope ?o (shard @2 ?x))",
        )?,
        rw(
            "rotary-batch",
            "(shard @0 (rope ?o ?x))",
            "(rope ?o (shard @0 ?x))",
        )?,
    ])
}
