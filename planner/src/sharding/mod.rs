//! Intra-layer (tensor, sequence, expert) parallelism as equality saturation plus ILP
//! extraction.
//!
//! 1. [`build`] lowers one block's op list into an e-graph over the [`lang::Shard`] language,
//!    whose terms denote per-rank local tensors, and saturates it with the [`rules`] (matmul
//!    column/row splits, head-split attention, vocabulary-parallel embedding and
//!    cross-entropy, elementwise and norm propagation, sequence parallelism, expert splits,
//!    collectives). Every rule's right-hand side is type-checked by the [`analysis`] (global
//!    shape and layout per e-class) before it is added.
//! 2. [`exact`] (or, as the independent check, [`ilp`] with good_lp: microlp, or HiGHS with
//!    the `highs` feature) chooses one e-node per needed e-class minimizing forward + backward
//!    time (compute of the local shard + collectives, including the backward conjugates) under
//!    a per-rank memory limit. A replicated tensor's gradient is completed as the program
//!    completes it ([`candidates::GradReduce::pick`]): all-reduced where a split op reads it,
//!    reduce-scattered where an all-gather made it, and all-gathered where only slices read
//!    it (each rank its piece, as Megatron's `scatter_to_sequence_parallel_region`).
//! 3. [`plan`] reads the choice back as a plain-data [`BlockPlan`]: per-op layouts, the
//!    collectives with their position and bytes, and totals.
//!
//! Megatron-LM's column→row MLP, head-split attention and sequence parallelism are not written
//! anywhere: they are the optimum the extraction finds among everything the rules derive.

pub mod analysis;
pub mod build;
pub mod candidates;
pub mod cost;
pub mod error;
pub mod exact;
pub mod ilp;
pub mod lang;
pub mod plan;
pub mod rules;

use ir::{Binding, Graph, OpId};
use serde::{Deserialize, Serialize};

pub use candidates::{Pass, REGATHER, RESPLIT};
pub use cost::{CollectiveKind, ComputeKind, CostOracle, SimpleCosts};
pub use error::ShardError;
pub use ilp::SolveReport;
pub use plan::{BlockPlan, CollectivePlan, Formula, Layout, OpPlan, Totals};

/// How the extraction problem is solved.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Extraction {
    /// Dynamic programming over frontiers ([`exact`]): the optimum, deterministically.
    Exact,
    /// The 0-1 ILP ([`ilp`]) with good_lp; past the time limit the best solution found is
    /// returned with `optimal: false`.
    Ilp { time_limit_s: f64 },
}

/// What to plan for.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardOptions {
    /// Tensor-parallel degree (ranks sharing one block).
    pub tp: u32,
    /// Keep the residual stream split along the sequence between blocks (and run norms and
    /// dropout on sequence shards).
    pub sequence_parallel: bool,
    /// Batch and sequence used to evaluate costs and bytes.
    pub binding: Binding,
    /// Resident bytes per rank allowed for this block (parameters as the oracle counts them +
    /// activations kept for the backward pass). `None`: unlimited.
    pub memory_limit_bytes: Option<f64>,
    /// How the extraction is solved: exactly (the default), or as the ILP, the independent
    /// check the tests compare it with.
    pub extraction: Extraction,
    /// Also consider splitting the batch inside the TP group (data parallelism). Off by
    /// default: data parallelism belongs to the outer search.
    pub allow_batch_split: bool,
    /// The group (`tp` ranks) is an expert-parallel group of data-parallel ranks: the block's
    /// input and output are split along the batch, the routed experts' weights are held split
    /// along their expert axis (the whole weights exist nowhere), every other weight whole.
    /// The axis-changing `all-to-all` is left out (GShard's token dispatch has no rule): what
    /// plait lowers, and Megatron-Core's default, is the all-gather dispatcher.
    pub expert_parallel: bool,
    /// The routed experts' expert axis is split by an expert-parallel group outside this one
    /// (`--ep` > 1 beside tensor parallelism): this group may split each expert's FFN
    /// (Megatron-Core's expert tensor parallelism) or the tokens, not the experts again
    /// (`moe-experts` is left out of its saturation).
    pub experts_split_outside: bool,
    /// A dimension of this length (the vocabulary, where it does not divide by `tp`) may split
    /// padded: ⌈d / tp⌉ per rank, zeros past its end, which only ops that leave the padding
    /// out or at zero read (the vocabulary-parallel lookup and loss, the head's product, an
    /// element-wise map); no collective gathers or scatters such a split.
    pub padded_dim: Option<u64>,
}

impl ShardOptions {
    pub fn new(tp: u32, sequence_parallel: bool, binding: Binding) -> ShardOptions {
        ShardOptions {
            tp,
            sequence_parallel,
            binding,
            memory_limit_bytes: None,
            extraction: Extraction::Exact,
            allow_batch_split: false,
            expert_parallel: false,
            experts_split_outside: false,
            padded_dim: None,
        }
    }

    /// An expert-parallel group of `ep` data-parallel ranks ([`ShardOptions::expert_parallel`]).
    pub fn expert_group(ep: u32, binding: Binding) -> ShardOptions {
        ShardOptions {
            expert_parallel: true,
            allow_batch_split: true,
            ..ShardOptions::new(ep, false, binding)
        }
    }
}

/// Plans one transformer block: `layer_ops` is `graph.layer_ops(0)` (all layers are
/// identical, so they share the plan). The block's input and output keep one layout —
/// replicated, or split along the sequence with `sequence_parallel` — so layers chain.
pub fn plan_block(
    graph: &Graph,
    layer_ops: &[OpId],
    opts: &ShardOptions,
    costs: &dyn CostOracle,
) -> Result<BlockPlan, ShardError> {
    plan_ops(graph, layer_ops, opts, costs)
}

/// Plans any op list the same way (e.g. the embedding ops before the first layer, or the final
/// norm, LM head and loss after the last).
pub fn plan_ops(
    graph: &Graph,
    ops: &[OpId],
    opts: &ShardOptions,
    costs: &dyn CostOracle,
) -> Result<BlockPlan, ShardError> {
    if opts.tp == 0 {
        return Err(ShardError::InvalidTp { tp: opts.tp });
    }
    // One rank: every program is the replicated one (a "split" over one rank is a no-op whose
    // zero-cost collectives would only create ties), so skip the rewrites.
    let built = if opts.tp == 1 {
        let single = ShardOptions {
            sequence_parallel: false,
            allow_batch_split: false,
            expert_parallel: false,
            ..*opts
        };
        build::lower(graph, ops, &single)?
    } else {
        build::build(graph, ops, opts)?
    };
    let problem = candidates::Problem::new(graph, &built, opts, costs).ok_or_else(|| {
        let value = built
            .roots
            .iter()
            .map(|&(v, _)| v)
            .next()
            .unwrap_or_default();
        ShardError::NoProgram { value }
    })?;
    let selection = match opts.extraction {
        Extraction::Exact => exact::solve(&problem, opts.memory_limit_bytes)?,
        Extraction::Ilp { time_limit_s } => {
            ilp::solve(&problem, opts.memory_limit_bytes, time_limit_s)?
        }
    };
    Ok(plan::assemble(
        graph,
        &built,
        &problem,
        selection,
        opts.sequence_parallel,
    ))
}
