//! plait's planner: hardware description, cost model and (next) the parallelization search.
//!
//! [`estimate::estimate`] predicts the iteration time and per-rank memory of one [`Strategy`]
//! for a model's IR graph on a [`hardware::Cluster`].

pub mod calibration;
pub mod cost;
pub mod dp_comm;
pub mod engine;
pub mod error;
pub mod estimate;
pub mod export;
pub mod hardware;
pub mod layer_tp;
pub mod model;
pub mod modern_runs;
pub mod nccl_reference;
pub mod plan;
pub mod precision;
pub mod report;
pub mod search;
pub mod sharding;
pub mod sharding_costs;
pub mod strategy;
pub mod training;

pub use error::PlanError;
pub use estimate::{Estimate, Pricing, TpPricing, estimate};
pub use hardware::Cluster;
pub use model::ModelInfo;
pub use precision::Precision;
pub use strategy::{Recompute, Schedule, Strategy};
