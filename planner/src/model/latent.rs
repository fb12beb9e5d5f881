//! Multi-head latent attention (DeepSeek-V2 and V3) read off a layer's graph, in the widths
//! Megatron-Core's MLA takes (`--q-lora-rank`, `--kv-lora-rank`, `--qk-head-dim`,
//! `--qk-pos-emb-head-dim`, `--v-head-dim`): the export states them, and the estimate prices
//! what the engine's MLA turns off.
//!
//! Its shape in the IR (import's DeepSeek builder): keys and values are one up-projection of
//! a normed latent, the latent being a slice of a down-projection whose other slice is the
//! rotary key every head shares; queries are a plain projection of the layer's input or,
//! with a query latent, an up-projection of a normed down-projection.

use ir::{Graph, OpId, OpKind, ValueId};

/// The widths of a latent attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latent {
    /// The query latent's width (`q_lora_rank`); `None`: queries are projected directly.
    pub q_lora_rank: Option<u64>,
    /// The key/value latent's width (`kv_lora_rank`).
    pub kv_lora_rank: u64,
    /// Each query and key head's width without its rotary part (`qk_nope_head_dim`).
    pub qk_head_dim: u64,
    /// The rotary part of each query and key head (`qk_rope_head_dim`).
    pub qk_pos_emb_head_dim: u64,
    /// Each value head's width (`v_head_dim`).
    pub v_head_dim: u64,
    /// The attention's softmax scale (YaRN's `mscale_all_dim` is folded into it).
    pub softmax_scale: f64,
}

impl Latent {
    /// A query or key head's whole width.
    pub fn q_head_dim(&self) -> u64 {
        self.qk_head_dim + self.qk_pos_emb_head_dim
    }
}

fn width(g: &Graph, v: ValueId) -> Option<u64> {
    g.ty(v).shape.last().and_then(|d| d.fixed())
}

/// The op among `ops` that made `v`.
fn made_by<'g>(g: &'g Graph, ops: &[OpId], v: ValueId) -> Option<&'g ir::OpData> {
    let o = g.def_op(v);
    ops.contains(&o).then(|| g.op(o))
}

/// The linear that made `v`, following first operands through layout ops and rotaries.
fn projection(g: &Graph, ops: &[OpId], mut v: ValueId) -> Option<OpId> {
    for _ in 0..16 {
        let o = g.def_op(v);
        if !ops.contains(&o) {
            return None;
        }
        match g.op(o).kind {
            OpKind::Linear { .. } => return Some(o),
            OpKind::Reshape { .. }
            | OpKind::Slice { .. }
            | OpKind::Concat { .. }
            | OpKind::Expand { .. }
            | OpKind::Rotary { .. } => v = *g.op(o).inputs.first()?,
            _ => return None,
        }
    }
    None
}

/// The width of the normed latent `linear` reads, if it reads one: a norm of a slice or of
/// another linear within the layer (an ordinary projection reads the norm of the layer's
/// input, made outside the attention's projections).
fn latent_into(g: &Graph, ops: &[OpId], linear: OpId) -> Option<u64> {
    let x = g.op(linear).inputs[0];
    let norm = made_by(g, ops, x)?;
    if !matches!(norm.kind, OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. }) {
        return None;
    }
    let before = made_by(g, ops, norm.inputs[0])?;
    matches!(before.kind, OpKind::Slice { .. } | OpKind::Linear { .. })
        .then(|| width(g, x))
        .flatten()
}

/// The layer's latent attention, if its keys come from a latent.
pub fn read(g: &Graph, ops: &[OpId]) -> Option<Latent> {
    let attention = ops
        .iter()
        .map(|&o| g.op(o))
        .find(|op| matches!(op.kind, OpKind::Attention { .. }))?;
    let OpKind::Attention { heads, scale, .. } = attention.kind else {
        return None;
    };
    let heads = heads.max(1);
    let kv = projection(g, ops, attention.inputs[1])?;
    let kv_lora_rank = latent_into(g, ops, kv)?;
    let q = projection(g, ops, attention.inputs[0])?;
    // The key rotary every head shares: one head wide.
    let rope = ops.iter().find_map(|&o| match g.op(o).kind {
        OpKind::Rotary { heads: 1, .. } => width(g, g.op(o).inputs[0]),
        _ => None,
    })?;
    let q_head = width(g, attention.inputs[0])? / heads;
    Some(Latent {
        q_lora_rank: latent_into(g, ops, q),
        kv_lora_rank,
        qk_head_dim: q_head.checked_sub(rope)?,
        qk_pos_emb_head_dim: rope,
        v_head_dim: width(g, attention.inputs[2])? / heads,
        softmax_scale: scale,
    })
}

/// The norms of the latents (each read by an up-projection).
pub fn norms(l: &Latent) -> usize {
    1 + usize::from(l.q_lora_rank.is_some())
}
