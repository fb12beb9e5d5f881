//! Per-layer sizes of the tagged repeated block, for reports such as
//! `repeated block: decoder_layer x12, 16 ops, 7.1M params each`.

use std::fmt;

use crate::blocks::structure::views_from_tags;
use crate::graph::Graph;
use crate::op::OpKind;
use crate::verify::lookup;

/// Sizes of one layer instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerStats {
    /// Compute (non-source) ops tagged with the layer.
    pub ops: usize,
    /// Elements of the `param` ops tagged with the layer (symbolic shapes count as 0).
    pub params: u64,
    /// Number of `param` ops tagged with the layer.
    pub param_tensors: usize,
}

/// The tagged repeated block: its name and each layer's sizes, in tag order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSummary {
    pub block_name: String,
    pub layers: Vec<LayerStats>,
}

impl BlockSummary {
    /// The common sizes when every layer has the same (as a verified graph's layers do).
    pub fn uniform(&self) -> Option<LayerStats> {
        let first = *self.layers.first()?;
        self.layers.iter().all(|l| *l == first).then_some(first)
    }
}

/// Summarizes the tagged block; `None` when the graph has no block name or no tagged op.
pub fn layer_summary(graph: &Graph) -> Option<BlockSummary> {
    let block_name = graph.block_name.clone()?;
    let views = views_from_tags(graph);
    if views.is_empty() {
        return None;
    }
    let layers = views
        .values()
        .map(|view| {
            let params: Vec<u64> = view
                .sources
                .iter()
                .filter_map(|&o| lookup::op(graph, o))
                .filter(|op| matches!(op.kind, OpKind::Param { .. }))
                .map(|op| {
                    // Checked: a parsed shape may be absurdly large.
                    op.results
                        .iter()
                        .filter_map(|&v| lookup::value(graph, v))
                        .filter_map(|d| {
                            d.ty.shape
                                .dims()
                                .iter()
                                .try_fold(1u64, |n, d| n.checked_mul(d.fixed()?))
                        })
                        .fold(0u64, u64::saturating_add)
                })
                .collect();
            LayerStats {
                ops: view.compute.len(),
                params: params.iter().copied().fold(0, u64::saturating_add),
                param_tensors: params.len(),
            }
        })
        .collect();
    Some(BlockSummary { block_name, layers })
}

/// A count with a metric suffix: `950`, `12.3K`, `7.1M`, `1.5B`.
pub fn human_count(n: u64) -> String {
    let x = n as f64;
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}K", x / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", x / 1e6),
        _ => format!("{:.1}B", x / 1e9),
    }
}

impl fmt::Display for BlockSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} x{}", self.block_name, self.layers.len())?;
        if let Some(l) = self.uniform() {
            return write!(f, ", {} ops, {} params each", l.ops, human_count(l.params));
        }
        // Runs of consecutive layers of equal sizes (DeepSeek-V3: 3 dense, then 58 expert
        // layers), at most a few; beyond that the ranges.
        let mut runs: Vec<(usize, LayerStats)> = Vec::new();
        for l in &self.layers {
            match runs.last_mut() {
                Some((n, last)) if *last == *l => *n += 1,
                _ => runs.push((1, *l)),
            }
        }
        if runs.len() <= 4 {
            f.write_str(":")?;
            for (i, (n, l)) in runs.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                write!(
                    f,
                    "{sep} {n} x ({} ops, {} params)",
                    l.ops,
                    human_count(l.params)
                )?;
            }
            return Ok(());
        }
        let ops = self.layers.iter().map(|l| l.ops);
        let params = self.layers.iter().map(|l| l.params);
        let (omin, omax) = (ops.clone().min().unwrap_or(0), ops.max().unwrap_or(0));
        let (pmin, pmax) = (params.clone().min().unwrap_or(0), params.max().unwrap_or(0));
        write!(
            f,
            ", {omin}-{omax} ops, {}-{} params per layer",
            human_count(pmin),
            human_count(pmax)
        )
    }
}
