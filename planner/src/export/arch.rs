//! The architecture an engine needs to build the same model, read from the IR graph (not
//! from the file the model came from): the ops say which norm, position encoding, MLP and
//! attention the layers have.

use ir::{Graph, OpId, OpKind, RopeScaling, Routing};

use crate::error::PlanError;
use crate::model::ModelInfo;

/// How positions enter the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Positions {
    /// A learned table added to the token embedding (GPT).
    Learned { rows: u64 },
    /// Rotary embeddings on queries and keys (Llama), with their base and rescaling.
    Rotary { theta: f64, scaling: RopeScaling },
}

/// A decoder-only transformer's shape, as the engines' model arguments describe it.
#[derive(Clone, Debug, PartialEq)]
pub struct Architecture {
    pub layers: u32,
    pub hidden: u64,
    pub ffn: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    pub positions: Positions,
    /// RMSNorm (else LayerNorm), and the norms' epsilon.
    pub rms_norm: bool,
    pub norm_eps: f64,
    /// A gated SiLU MLP (SwiGLU) rather than GELU.
    pub swiglu: bool,
    /// The linear layers have biases.
    pub linear_bias: bool,
    /// The head reads the embedding table.
    pub tied: bool,
    /// Dropout probability of the model's dropout ops (0 without).
    pub dropout: f64,
    /// Routed experts and experts per token (0 and 0 for a dense MLP).
    pub experts: u64,
    pub experts_per_token: u64,
    /// How the router weighs the experts it picks (Mixtral's for a dense MLP).
    pub routing: Routing,
}

fn kinds<'g>(g: &'g Graph, ops: &'g [OpId]) -> impl Iterator<Item = &'g OpKind> + 'g {
    ops.iter().map(move |&o| &g.op(o).kind)
}

/// Reads the architecture of `info`'s graph; a layer the engines' GPT model cannot express is
/// refused by name.
pub fn read(info: &ModelInfo<'_>, engine: &'static str) -> Result<Architecture, PlanError> {
    let g = info.graph;
    let layer: Vec<&OpKind> = kinds(g, &info.layer_ops).collect();
    let refuse = |feature: &str| PlanError::Unexportable {
        engine,
        feature: feature.into(),
        limit: "its GPT model builds LayerNorm/RMSNorm, learned or rotary positions, GELU or \
                SwiGLU MLPs and top-k MoE layers"
            .into(),
    };
    if !info.layer_runs.is_empty() {
        return Err(refuse(
            "layers of more than one structure (dense layers before expert layers)",
        ));
    }
    let latent = info.layer_ops.iter().any(|&o| {
        let op = g.op(o);
        let width = |v: ir::ValueId| g.ty(v).shape.last().and_then(|d| d.fixed());
        matches!(op.kind, OpKind::Attention { .. }) && width(op.inputs[0]) != width(op.results[0])
    });
    if latent {
        return Err(refuse(
            "multi-head latent attention (value heads narrower than query heads)",
        ));
    }
    if layer.iter().any(|k| {
        matches!(
            k,
            OpKind::Attention {
                softcap: Some(_),
                ..
            }
        )
    }) {
        return Err(refuse(
            "attention scores soft-capped (Gemma 2's attn_logit_softcapping)",
        ));
    }
    let norm = layer.iter().find_map(|k| match k {
        OpKind::RmsNorm { eps } => Some((true, *eps)),
        OpKind::LayerNorm { eps } => Some((false, *eps)),
        _ => None,
    });
    let (rms_norm, norm_eps) = norm.ok_or_else(|| refuse("a layer without a norm"))?;
    let rotary = layer.iter().find_map(|k| match k {
        OpKind::Rotary { theta, scaling, .. } => Some((*theta, *scaling)),
        _ => None,
    });
    let learned = kinds(g, &info.pre_ops)
        .filter(|k| matches!(k, OpKind::Embedding))
        .count()
        > 1;
    let positions = match (rotary, learned) {
        (Some((theta, scaling)), false) => Positions::Rotary { theta, scaling },
        (None, true) => Positions::Learned { rows: info.max_seq },
        _ => {
            return Err(refuse(
                "a position encoding that is neither learned nor rotary",
            ));
        }
    };
    // plait's expert op is a SwiGLU MLP per expert (w1, w3 gate and up; w2 down).
    let swiglu = layer
        .iter()
        .any(|k| matches!(k, OpKind::Silu | OpKind::MoeExperts { .. }));
    if !swiglu && !layer.iter().any(|k| matches!(k, OpKind::Gelu { .. })) {
        return Err(refuse("an MLP activation other than GELU or SwiGLU"));
    }
    let (experts, experts_per_token, routing) = layer
        .iter()
        .find_map(|k| match k {
            OpKind::TopKRouter {
                experts,
                k,
                routing,
            } => Some((*experts, *k, *routing)),
            _ => None,
        })
        .unwrap_or((0, 0, Routing::default()));
    Ok(Architecture {
        layers: info.layers,
        hidden: info.hidden,
        ffn: ffn_width(g, &info.layer_ops).ok_or_else(|| refuse("an MLP plait cannot find"))?,
        heads: info.heads,
        kv_heads: info.kv_heads,
        vocab: info.vocab,
        positions,
        rms_norm,
        norm_eps,
        swiglu,
        linear_bias: layer
            .iter()
            .any(|k| matches!(k, OpKind::Linear { bias: true })),
        tied: info.tied_params > 0,
        dropout: layer
            .iter()
            .find_map(|k| match k {
                OpKind::Dropout { p, .. } => Some(*p),
                _ => None,
            })
            .unwrap_or(0.0),
        experts,
        experts_per_token,
        routing,
    })
}

/// The MLP's inner width: the width of what its activation reads (a GELU's input, or a SiLU's
/// for SwiGLU; per expert for an MoE layer).
fn ffn_width(g: &Graph, ops: &[OpId]) -> Option<u64> {
    ops.iter().find_map(|&o| {
        let op = g.op(o);
        match op.kind {
            OpKind::Gelu { .. } | OpKind::Silu => op
                .inputs
                .first()
                .and_then(|&x| g.ty(x).shape.last())
                .and_then(|d| d.fixed()),
            OpKind::MoeExperts { .. } => op
                .inputs
                .get(2)
                .and_then(|&w| g.ty(w).shape.last())
                .and_then(|d| d.fixed()),
            _ => None,
        }
    })
}
