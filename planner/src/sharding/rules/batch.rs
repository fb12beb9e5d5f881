//! Parameters held as shards, and the batch split (data parallelism inside the group).
//!
//! - `param-stored-sharded`: a parameter can be *stored* as its shard (`vN@a`), which costs
//!   1/tp of its memory and no slicing; the whole parameter `vN` is what a replicated op reads.
//!   Fires on `(shard a vN)` when `vN` is a parameter (a custom applier: the stored leaf is made
//!   from the matched value id).
//! - Batch split: the token-axis rules (`matmul-tokens`, `bias-tokens`, `map-shard`,
//!   `zip-shard`, `*-tokens`, `attention-batch`) push a split of axis 0 through the block; the
//!   planner seeds `(shard @0 root)` only when `ShardOptions::allow_batch_split` is set, since
//!   data parallelism is the outer search's axis (and its gradient all-reduce is per iteration,
//!   not per micro-batch).

use egg::{Applier, Id, PatternAst, Rewrite, Subst, Symbol, Var};

use super::Rule;
use crate::sharding::analysis::{Fact, ShardAnalysis, ShardGraph, node_fact};
use crate::sharding::error::ShardError;
use crate::sharding::lang::{Atom, Shard};

/// Adds the stored-shard leaf of a parameter to the class of its shard.
#[derive(Debug)]
pub struct StoreSharded {
    d: Var,
    w: Var,
}

impl Applier<Shard, ShardAnalysis> for StoreSharded {
    fn apply_one(
        &self,
        eg: &mut ShardGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Shard>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let (Some(&d), Some(&w)) = (subst.get(self.d), subst.get(self.w)) else {
            return vec![];
        };
        let Fact::Meta(Atom::Axis(axis)) = eg[d].data else {
            return vec![];
        };
        let params = &eg.analysis.ctx.params;
        let param = eg[w].nodes.iter().find_map(|n| match n {
            Shard::Atom(Atom::Val(v)) if params.contains(v) => Some(*v),
            _ => None,
        });
        let Some(v) = param else { return vec![] };
        let leaf = Shard::Atom(Atom::Stored(v, axis));
        if node_fact(&eg.analysis.ctx, &leaf, &[]) != eg[eclass].data {
            return vec![];
        }
        let id = eg.add(leaf);
        if eg.union(eclass, id) {
            vec![eclass]
        } else {
            vec![]
        }
    }

    fn vars(&self) -> Vec<Var> {
        vec![self.d, self.w]
    }
}

pub fn rules() -> Result<Vec<Rule>, ShardError> {
    let err = |reason: String| ShardError::Rule {
        rule: "param-stored-sharded".into(),
        reason,
    };
    let lhs: egg::Pattern<Shard> = "(shard ?d ?w)".parse().map_err(|e| err(format!("{e}")))?;
    let var = |s: &str| s.parse::<Var>().map_err(|e| err(format!("{e}")));
    let applier = StoreSharded {
        d: var("?d")?,
        w: var("?w")?,
    };
    Ok(vec![
        Rewrite::new("param-stored-sharded", lhs, applier).map_err(err)?,
    ])
}
