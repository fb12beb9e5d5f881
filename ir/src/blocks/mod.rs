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

use crate::graph::Graph;

/// For each of `layers` (tags of `g`), the position in `layers` of the first earlier one it is
/// structurally identical to (the verifier's invariant 8d: the same ops, types and wiring,
/// per-instance attributes such as windows and rotaries aside), if any: Llama 4's runs of
/// rotated and unrotated layers alternate between two structures.
pub fn earlier_alike(g: &Graph, layers: &[u32]) -> Vec<Option<usize>> {
    let views = structure::views_from_tags(g);
    let names = crate::text::names::Names::new(g);
    layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let view = views.get(layer)?;
            layers[..i].iter().position(|earlier| {
                views
                    .get(earlier)
                    .is_some_and(|r| structure::compare(g, &names, r, view).is_ok())
            })
        })
        .collect()
}
pub use summary::{BlockSummary, LayerStats, human_count, layer_summary};

#[cfg(test)]
mod tests;
