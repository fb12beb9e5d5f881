//! The planner's errors: bad cluster files and invalid strategies, each naming what to fix.

use std::path::PathBuf;

/// Why planning could not proceed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("cannot read {}: {message}", file.display())]
    Io { file: PathBuf, message: String },
    #[error("`{name}` is neither a cluster file nor a preset; presets: {presets}")]
    UnknownCluster { name: String, presets: String },
    #[error("{file}: {message}")]
    ClusterFile { file: String, message: String },
    #[error("invalid strategy: {constraint}")]
    InvalidStrategy { constraint: String },
    #[error("the model graph has no repeated layers to split into pipeline stages")]
    NoLayers,
    /// The block's structure changes ([`ir::Graph::kind_starts`]) at layers that are not
    /// ascending from 1 to below the layer count.
    #[error(
        "the block's structure changes at layers {starts:?}, which must ascend from 1 to below \
         its {layers} layers"
    )]
    KindStarts { starts: Vec<u32>, layers: u32 },
    /// A layer only the sharding extraction's layout runs at this tp (OLMo 2's q/k norms over
    /// all heads), priced without it: its extraction failed, or did not lower and the plan
    /// fell back to Megatron-LM's rules.
    #[error(
        "tp {tp}: {feature}; plait runs it only in the e-graph's layout, which does not \
         run here ({why}): use --tp 1"
    )]
    NeedsExtraction {
        tp: u32,
        feature: &'static str,
        why: String,
    },
    #[error("sharding extraction failed: {message}")]
    Sharding { message: String },
    /// The target engine cannot run what the plan asks for.
    #[error("{engine} cannot run this plan: {feature} ({limit})")]
    Unexportable {
        engine: &'static str,
        feature: String,
        limit: String,
    },
}

impl PlanError {
    pub fn invalid(constraint: impl Into<String>) -> PlanError {
        PlanError::InvalidStrategy {
            constraint: constraint.into(),
        }
    }
}
