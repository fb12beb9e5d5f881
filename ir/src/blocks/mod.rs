//! Repeated transformer blocks: detecting them in untagged graphs, checking tagged ones
//! (shared with the verifier), and summarizing their size.
//!
//! A graph marks its repeated block by tagging each op of layer k with `layer = Some(k)` and
//! naming the block in `block_name`. Builders tag as they go; imported graphs (ONNX) arrive
//! untagged, and [`detect_repeated_layers`] recovers the tags by structural hashing.

mod detect;
pub(crate) mod structure;
mod summary;

pub use detect::detect_repeated_layers;
pub use summary::{BlockSummary, LayerStats, human_count, layer_summary};

#[cfg(test)]
mod tests;
