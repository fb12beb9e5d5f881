//! What `plait inspect` reports about a model, read off its IR graph (so configs, the zoo and
//! ONNX files are described the same way).

use std::collections::BTreeMap;

use ir::{Binding, Graph, OpKind, cost};
use serde::Serialize;

/// The repeated block: how many instances, and one instance's size (the first layer's, where
/// the block changes structure: `runs` then gives each run's).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockSummary {
    pub name: String,
    pub count: u32,
    pub ops_per_layer: usize,
    pub params_per_layer: u64,
    /// Runs of identical layers where the block changes structure ([`Graph::kind_starts`]:
    /// DeepSeek-V3's dense layers, then its expert layers); empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunSummary>,
}

/// One run of identical layers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    pub first: u32,
    pub count: u32,
    pub ops_per_layer: usize,
    pub params_per_layer: u64,
}

/// Compute ops and parameters of layer `l`.
fn layer_size(g: &Graph, l: u32) -> (usize, u64) {
    let ops = g.layer_ops(l);
    let params = ops
        .iter()
        .filter(|&&o| matches!(g.op(o).kind, OpKind::Param { .. }))
        .map(|&o| g.ty(g.op(o).results[0]).shape.fixed_numel().unwrap_or(0))
        .sum();
    let compute = ops.iter().filter(|&&o| !g.op(o).kind.is_source()).count();
    (compute, params)
}

/// A model's headline numbers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelSummary {
    pub model: String,
    pub params: u64,
    pub layers: u32,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    pub batch: u64,
    pub seq: u64,
    /// Training FLOPs per token: forward + backward, no recompute.
    pub flops_per_token: f64,
    pub repeated_block: Option<BlockSummary>,
    /// The attention's sliding window, where some layers attend within one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<WindowSummary>,
    /// How many layers leave positions unrotated (NoPE), where some do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nope_layers: Option<usize>,
    /// The attention's chunks, where some layers attend in chunks (Llama 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_chunk: Option<WindowSummary>,
    pub op_histogram: BTreeMap<String, usize>,
}

/// A sliding attention window: its keys, and how many of the attention ops (one a layer in
/// the decoders plait imports) have it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WindowSummary {
    pub keys: u64,
    pub windowed: usize,
    pub attentions: usize,
}

/// The widest window of `g`'s attention ops and how many have a window.
fn window_summary(g: &Graph) -> Option<WindowSummary> {
    mask_summary(g, |m| m.window)
}

/// The widest of a mask's limits (`limit`: its window or its chunk) over `g`'s attention ops
/// and how many have it.
fn mask_summary(g: &Graph, limit: fn(ir::KeyMask) -> Option<u64>) -> Option<WindowSummary> {
    let windows: Vec<Option<u64>> = g
        .order()
        .iter()
        .filter(|&&o| matches!(g.op(o).kind, OpKind::Attention { .. }))
        .map(|&o| limit(g.op(o).kind.attention_mask()))
        .collect();
    Some(WindowSummary {
        keys: windows.iter().flatten().copied().max()?,
        windowed: windows.iter().flatten().count(),
        attentions: windows.len(),
    })
}

/// How many layers' rotaries turn nothing ([`ir::RopeScaling::Nope`]); none where none do.
fn nope_layers(g: &Graph) -> Option<usize> {
    let layers: std::collections::BTreeSet<Option<u32>> = g
        .order()
        .iter()
        .map(|&o| g.op(o))
        .filter(|op| matches!(&op.kind, OpKind::Rotary { scaling, .. } if scaling.is_nope()))
        .map(|op| op.layer)
        .collect();
    (!layers.is_empty()).then_some(layers.len())
}

/// Summarizes a forward graph at the given batch and sequence length.
pub fn summarize(g: &Graph, b: Binding) -> ModelSummary {
    let mut hidden = 0;
    let mut vocab = 0;
    let (mut heads, mut kv_heads) = (0, 0);
    for &o in g.order() {
        let op = g.op(o);
        match &op.kind {
            OpKind::Embedding if hidden == 0 => {
                let dims = g.ty(op.inputs[0]).shape.eval(b);
                hidden = dims.get(1).copied().unwrap_or(0);
            }
            OpKind::Attention {
                heads: h,
                kv_heads: k,
                ..
            } if heads == 0 => {
                heads = *h;
                kv_heads = *k;
            }
            _ => {}
        }
    }
    if let Some(logits) = g.output("logits") {
        vocab = g.ty(logits).shape.eval(b).last().copied().unwrap_or(0);
    }
    let layers = g.num_layers();
    let repeated_block = (layers > 0).then(|| {
        let (ops_per_layer, params_per_layer) = layer_size(g, 0);
        let firsts: Vec<u32> = if g.kind_starts.is_empty() {
            Vec::new()
        } else {
            std::iter::once(0)
                .chain(g.kind_starts.iter().copied())
                .collect()
        };
        let runs = firsts
            .iter()
            .enumerate()
            .map(|(i, &first)| {
                let end = firsts.get(i + 1).copied().unwrap_or(layers).max(first);
                let (ops_per_layer, params_per_layer) = layer_size(g, first);
                RunSummary {
                    first,
                    count: end - first,
                    ops_per_layer,
                    params_per_layer,
                }
            })
            .collect();
        BlockSummary {
            name: g.block_name.clone().unwrap_or_else(|| "layer".into()),
            count: layers,
            ops_per_layer,
            params_per_layer,
            runs,
        }
    });
    ModelSummary {
        model: g.name.clone(),
        params: g.param_count(),
        layers,
        hidden,
        heads,
        kv_heads,
        vocab,
        batch: b.batch,
        seq: b.seq,
        flops_per_token: cost::training_flops_per_token(g, b),
        repeated_block,
        sliding_window: window_summary(g),
        attention_chunk: mask_summary(g, |m| m.chunk),
        nope_layers: nope_layers(g),
        op_histogram: g.histogram().into_iter().collect(),
    }
}
