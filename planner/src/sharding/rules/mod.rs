//! Sharding rewrites, one file per family. Every rule is a named one-liner whose right-hand side
//! is instantiated only if it type-checks ([`Checked`]): each new node's [`Fact`] follows from its
//! children, and the new term's fact equals the matched class's (same global shape, same layout).
//! So a rule never needs a hand-written side condition for divisibility or head counts: the
//! analysis refuses, e.g., to split 12 heads 8 ways.
//!
//! Megatron's column→row MLP and head-split attention are *not* rules: they are what extraction
//! finds after `matmul-row` puts a split input in front of the second linear and the
//! propagation rules (`map-shard`, `attention-heads`, `part-blocks`, `bias-column`,
//! `matmul-column`) push that split back to the first linear's weight.

pub mod attention;
pub mod batch;
pub mod collective;
pub mod elementwise;
pub mod embedding;
pub mod matmul;
pub mod moe;
pub mod sequence;
pub mod shape;

use egg::{Applier, Id, Language, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

use super::analysis::{Fact, ShardAnalysis, ShardGraph, node_fact};
use super::error::ShardError;
use super::lang::Shard;

pub type Rule = Rewrite<Shard, ShardAnalysis>;

/// Block counts for which block-wise (`@a/k`) variants of the column rules are generated: fused
/// QKV is 3 blocks (the only fused projection the importers produce; add 2 for a fused
/// gate/up projection).
pub const BLOCKS: [u8; 2] = [1, 3];

/// Applies a pattern only when the result type-checks to the matched class's fact, and unions
/// it with the matched class, or with the class bound to `target` if given.
#[derive(Debug)]
pub struct Checked {
    pub rhs: Pattern<Shard>,
    pub target: Option<Var>,
}

impl Checked {
    /// The fact the instantiated pattern would have, without adding anything.
    fn fact(&self, eg: &ShardGraph, subst: &Subst) -> Fact {
        let ast: &PatternAst<Shard> = &self.rhs.ast;
        let mut facts: Vec<Fact> = Vec::with_capacity(ast.len());
        for n in ast.iter() {
            let f = match n {
                egg::ENodeOrVar::Var(v) => match subst.get(*v) {
                    Some(&id) => eg[id].data.clone(),
                    None => Fact::Invalid(format!("unbound {v}")),
                },
                egg::ENodeOrVar::ENode(node) => {
                    let kids: Vec<Fact> = node
                        .children()
                        .iter()
                        .map(|&c| facts[usize::from(c)].clone())
                        .collect();
                    node_fact(&eg.analysis.ctx, node, &kids)
                }
            };
            facts.push(f);
        }
        facts.pop().unwrap_or(Fact::Invalid("empty pattern".into()))
    }
}

impl Applier<Shard, ShardAnalysis> for Checked {
    fn apply_one(
        &self,
        eg: &mut ShardGraph,
        eclass: Id,
        subst: &Subst,
        _searcher_ast: Option<&PatternAst<Shard>>,
        _rule_name: Symbol,
    ) -> Vec<Id> {
        let into = match self.target {
            Some(v) => match subst.get(v) {
                Some(&id) => id,
                None => return vec![],
            },
            None => eclass,
        };
        let want = eg[into].data.clone();
        let got = self.fact(eg, subst);
        // Every intermediate node must type-check too: `fact` propagates Invalid upwards.
        if !matches!(got, Fact::Tensor(_)) || got != want {
            return vec![];
        }
        let id = eg.add_instantiation(&self.rhs.ast, subst);
        if eg.union(into, id) {
            vec![into]
        } else {
            vec![]
        }
    }

    fn vars(&self) -> Vec<Var> {
        self.rhs.vars()
    }
}

fn pattern(rule: &str, s: &str) -> Result<Pattern<Shard>, ShardError> {
    s.parse().map_err(|e| ShardError::Rule {
        rule: rule.into(),
        reason: format!("cannot parse `{s}`: {e}"),
    })
}

/// A checked rewrite `lhs => rhs`.
pub fn rw(name: &str, lhs: &str, rhs: &str) -> Result<Rule, ShardError> {
    let applier = Checked {
        rhs: pattern(name, rhs)?,
        target: None,
    };
    Rewrite::new(name, pattern(name, lhs)?, applier).map_err(|reason| ShardError::Rule {
        rule: name.into(),
        reason,
    })
}

/// A checked rewrite that adds `rhs` to the class of `target` (a variable of `lhs`) instead of
/// the matched class.
pub fn rw_into(name: &str, lhs: &str, target: &str, rhs: &str) -> Result<Rule, ShardError> {
    let var: Var = target.parse().map_err(|e| ShardError::Rule {
        rule: name.into(),
        reason: format!("bad variable `{target}`: {e}"),
    })?;
    let applier = Checked {
        rhs: pattern(name, rhs)?,
        target: Some(var),
    };
    Rewrite::new(name, pattern(name, lhs)?, applier).map_err(|reason| ShardError::Rule {
        rule: name.into(),
        reason,
    })
}

/// Every rule used by the planner. Which layouts appear is decided by the seeds (the block's
/// boundary layout), not by leaving rules out.
pub fn all_rules() -> Result<Vec<Rule>, ShardError> {
    let mut v = Vec::new();
    v.extend(matmul::rules()?);
    v.extend(elementwise::rules()?);
    v.extend(attention::rules()?);
    v.extend(embedding::rules()?);
    v.extend(moe::rules()?);
    v.extend(sequence::rules()?);
    v.extend(shape::rules()?);
    v.extend(collective::rules()?);
    v.extend(batch::rules()?);
    Ok(v)
}
