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
    /// The block changes structure ([`ir::Graph::kind_starts`]); the planner prices one.
    #[error(
        "the model's layers are not all alike: the structure changes at layer(s) {starts:?} of \
         {layers} (DeepSeek-V3's first_k_dense_replace dense layers before its expert layers); \
         plait plans models whose layers repeat one structure, and planning several is not \
         built yet (`plait inspect` still counts and describes this model)"
    )]
    MixedLayers { starts: Vec<u32>, layers: u32 },
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
