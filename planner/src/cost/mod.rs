//! The analytical cost model: compute, communication, memory and the pipeline timeline.

pub mod comm;
pub mod compute;
pub mod memory;
pub mod pipeline;
