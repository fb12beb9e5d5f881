//! The e-graph language: tensor ops of one block with *per-rank* semantics, plus layout changes
//! and collectives over the tensor-parallel group.
//!
//! A term denotes the tensor that **each rank holds locally**. `v7` is the whole value `%7` on
//! every rank; `(shard @2 t)` is rank r's r-th slice of `t` along axis 2; `(allreduce t)` is the
//! sum over ranks of each rank's local `t`. So `(linear o x w)` over whole operands is the
//! replicated op, `(linear o (shard @2 x) (shard @0 w))` is a partial sum, and the rewrite
//! `(linear o x w) = (allreduce (linear o (shard @2 x) (shard @0 w)))` is a true equality of
//! local values. Every compute node carries the tag `oN` of the IR op it computes, so an
//! extracted program maps back to the op list.
//!
//! Leaves are [`Atom`]s: `oN` (IR op `N`), `vN` (value `%N`, whole), `vN@2` (value `%N` stored
//! sharded along axis 2: a parameter kept as its shard, or the block input under sequence
//! parallelism), `@2` / `@2/3` (an axis; `/3` = the axis is 3 equal blocks, each split across
//! ranks, as in a fused QKV weight), `#i` (result `i` of a multi-result op).

use std::fmt;
use std::str::FromStr;

use egg::{Id, define_language};
use serde::{Deserialize, Serialize};

/// A tensor axis split across the tensor-parallel group, possibly block-wise.
///
/// `blocks = k` means the axis is `k` equal consecutive blocks and every block is split across
/// the ranks; rank r holds the concatenation of the r-th slice of each block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Axis {
    pub axis: u8,
    pub blocks: u8,
}

impl Axis {
    pub fn new(axis: u8) -> Axis {
        Axis { axis, blocks: 1 }
    }
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.blocks == 1 {
            write!(f, "@{}", self.axis)
        } else {
            write!(f, "@{}/{}", self.axis, self.blocks)
        }
    }
}

impl FromStr for Axis {
    type Err = String;
    fn from_str(s: &str) -> Result<Axis, String> {
        let body = s
            .strip_prefix('@')
            .ok_or_else(|| format!("`{s}` is not an axis"))?;
        let (a, k) = match body.split_once('/') {
            Some((a, k)) => (a, k),
            None => (body, "1"),
        };
        let axis = a.parse().map_err(|_| format!("bad axis in `{s}`"))?;
        let blocks: u8 = k.parse().map_err(|_| format!("bad block count in `{s}`"))?;
        if blocks == 0 {
            return Err(format!("zero blocks in `{s}`"));
        }
        Ok(Axis { axis, blocks })
    }
}

/// A leaf of the language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Atom {
    /// IR op tag: `o12`.
    Op(u32),
    /// A whole IR value: `v12`.
    Val(u32),
    /// An IR value held as its shard: `v12@1`.
    Stored(u32, Axis),
    /// An axis: `@2`, `@2/3`.
    Axis(Axis),
    /// A result index: `#1`.
    Part(u32),
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Op(o) => write!(f, "o{o}"),
            Atom::Val(v) => write!(f, "v{v}"),
            Atom::Stored(v, a) => write!(f, "v{v}{a}"),
            Atom::Axis(a) => write!(f, "{a}"),
            Atom::Part(i) => write!(f, "#{i}"),
        }
    }
}

impl FromStr for Atom {
    type Err = String;
    fn from_str(s: &str) -> Result<Atom, String> {
        let num = |t: &str| {
            t.parse::<u32>()
                .map_err(|_| format!("`{s}` is not an atom"))
        };
        if let Some(r) = s.strip_prefix('o') {
            return Ok(Atom::Op(num(r)?));
        }
        if let Some(r) = s.strip_prefix('#') {
            return Ok(Atom::Part(num(r)?));
        }
        if s.starts_with('@') {
            return Ok(Atom::Axis(s.parse()?));
        }
        if let Some(r) = s.strip_prefix('v') {
            return match r.split_once('@') {
                Some((v, a)) => Ok(Atom::Stored(num(v)?, format!("@{a}").parse()?)),
                None => Ok(Atom::Val(num(r)?)),
            };
        }
        Err(format!("`{s}` is not an atom"))
    }
}

define_language! {
    /// Sharded tensor programs of one block (see the module docs for the semantics).
    pub enum Shard {
        // Layout changes and collectives over the TP group.
        "shard" = Shard([Id; 2]),
        "allreduce" = AllReduce([Id; 1]),
        "allgather" = AllGather([Id; 2]),
        "reducescatter" = ReduceScatter([Id; 2]),
        "alltoall" = AllToAll([Id; 3]),
        // Tensor ops; the first child is the IR op tag.
        "linear" = Linear([Id; 3]),
        "bias" = Bias([Id; 3]),
        "map" = Map([Id; 2]),
        "zip" = Zip([Id; 3]),
        // A mean or sum over the last axis, keeping it as size 1.
        "reduce" = Reduce([Id; 2]),
        "lnorm" = LayerNorm([Id; 4]),
        "rmsnorm" = RmsNorm([Id; 3]),
        "attn" = Attention([Id; 4]),
        // Attention with a sink logit per head (gpt-oss): q, k, v, sinks.
        "sattn" = SinkAttention([Id; 5]),
        "rope" = Rotary([Id; 2]),
        "part" = Part([Id; 3]),
        "embed" = Embed([Id; 3]),
        "vembed" = VocabEmbed([Id; 3]),
        "xent" = CrossEntropy([Id; 3]),
        "vxent" = VocabCrossEntropy([Id; 3]),
        "transpose" = Transpose([Id; 2]),
        "reshape" = Reshape([Id; 2]),
        "slice" = Slice([Id; 2]),
        "concat" = Concat([Id; 3]),
        "expand" = Expand([Id; 2]),
        "router" = Router([Id; 3]),
        "moe" = Moe([Id; 6]),
        // gpt-oss's: a router with a bias (x, w, b) and experts with gate and up biases
        // (x, gates, w1, w3, w2, b1, b3).
        "brouter" = BiasedRouter([Id; 4]),
        "bmoe" = BiasedMoe([Id; 8]),
        "opaque" = Opaque(Box<[Id]>),
        Atom(Atom),
    }
}

impl Shard {
    /// The collective kind this node performs in the forward pass, if it is a collective.
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            Shard::AllReduce(_)
                | Shard::AllGather(_)
                | Shard::ReduceScatter(_)
                | Shard::AllToAll(_)
        )
    }

    /// Whether the node carries an IR op tag as its first child.
    pub fn is_tagged(&self) -> bool {
        !matches!(self, Shard::Atom(_) | Shard::Shard(_)) && !self.is_collective()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoms_round_trip() {
        for s in ["o3", "v12", "v12@1", "v7@2/3", "@0", "@2/3", "#2"] {
            let a: Atom = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
        assert!("x1".parse::<Atom>().is_err());
        assert!("@1/0".parse::<Atom>().is_err());
    }

    #[test]
    fn terms_parse() {
        let e: egg::RecExpr<Shard> = "(allreduce (linear o4 (shard @2 v1) (shard @0 v3)))"
            .parse()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "(allreduce (linear o4 (shard @2 v1) (shard @0 v3)))"
        );
    }
}
