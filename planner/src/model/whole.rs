//! The layer parameters tensor parallelism keeps whole on every rank: what Megatron-Core
//! replicates inside a transformer layer, and what plait's codegen lowers that way. The
//! estimate counts them whole ([`super::ModelInfo::tp_whole_params_per_layer`]) and codegen
//! takes its replicated linears from here, so the two cannot disagree.

use std::collections::HashSet;

use ir::{Graph, OpId, OpKind, ValueId};

/// Linears into a low-rank latent (multi-head latent attention's `q_a_proj` and
/// `kv_a_proj_with_mqa`): the output, or a slice of its features, is normalized and the norm
/// feeds another linear. A column split would leave each rank part of every feature vector
/// the norm reads, so every rank computes them whole (Megatron-Core's MLA builds these
/// down-projections `duplicated`). A norm on a row-parallel output back on the residual
/// stream (Gemma 2's post-attention norm) is not one: that output is whole after its
/// reduction.
pub fn duplicated_linears(g: &Graph, ops: &[OpId]) -> HashSet<OpId> {
    let uses = g.uses();
    ops.iter()
        .copied()
        .filter(|&o| matches!(g.op(o).kind, OpKind::Linear { .. }))
        .filter(|&o| into_latent(g, &uses, g.op(o).results[0], 1))
        .collect()
}

/// Whether `y` (or, `slices` deep, a slice of its features) is normalized into a linear.
fn into_latent(g: &Graph, uses: &ir::Uses, y: ValueId, slices: u32) -> bool {
    let last = g.ty(y).shape.rank().saturating_sub(1);
    uses[y.index()].iter().any(|&u| {
        let reader = g.op(u);
        if reader.inputs.first() != Some(&y) {
            return false;
        }
        match reader.kind {
            OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. } => uses[reader.results[0].index()]
                .iter()
                .any(|&l| matches!(g.op(l).kind, OpKind::Linear { .. })),
            OpKind::Slice { axis, .. } if axis == last && slices > 0 => {
                into_latent(g, uses, reader.results[0], slices - 1)
            }
            _ => false,
        }
    })
}

/// The linears that compute the keys and values (through a rotary, for keys) of attentions
/// with fewer key/value heads than `tp` ranks, where `tp` is a multiple of them: those stay
/// whole on every rank (vLLM's replicated KV heads; Megatron requires the heads to divide).
pub fn replicated_kv_projections(g: &Graph, ops: &[OpId], tp: u32) -> HashSet<OpId> {
    kv_projections(g, ops)
        .into_iter()
        .filter(|&(_, kv_heads)| kv_replicated(kv_heads, tp))
        .map(|(o, _)| o)
        .collect()
}

/// Each linear among `ops` that computes an attention's keys or values, with that
/// attention's key/value head count.
fn kv_projections(g: &Graph, ops: &[OpId]) -> Vec<(OpId, u64)> {
    let mut out = Vec::new();
    for &o in ops {
        let op = g.op(o);
        let OpKind::Attention { kv_heads, .. } = op.kind else {
            continue;
        };
        for &x in op.inputs.iter().skip(1).take(2) {
            let d = projection_of(g, x);
            if matches!(g.op(d).kind, OpKind::Linear { .. })
                && ops.contains(&d)
                && !out.iter().any(|&(p, _)| p == d)
            {
                out.push((d, kv_heads));
            }
        }
    }
    out
}

/// The op that made `x` before the per-head steps between a projection and the attention:
/// rotary, reshapes, and a per-head norm (Qwen3's `k_norm`: reshape, norm, reshape, rotary).
fn projection_of(g: &Graph, x: ValueId) -> OpId {
    let mut d = g.def_op(x);
    for _ in 0..6 {
        let op = g.op(d);
        let through = matches!(
            op.kind,
            OpKind::Rotary { .. }
                | OpKind::Reshape { .. }
                | OpKind::RmsNorm { .. }
                | OpKind::LayerNorm { .. }
        );
        match op.inputs.first() {
            Some(&i) if through => d = g.def_op(i),
            _ => break,
        }
    }
    d
}

/// A layer's parameters kept whole on every tensor-parallel rank, in elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WholeParams {
    /// Whole at every degree: norm weights, a router's weights, the duplicated linears'.
    pub always: u64,
    /// The key/value projections' parameters, whole where the degree exceeds the
    /// key/value heads ([`replicated_kv_projections`]).
    pub kv_projections: u64,
    /// The key/value head count of those projections' attention.
    pub kv_heads: u64,
}

impl WholeParams {
    /// Counts the parameters of the layer `ops` by the ops that read them
    /// ([`whole_at`]).
    pub fn of(g: &Graph, ops: &[OpId]) -> WholeParams {
        let kv = kv_projections(g, ops);
        let mut w = WholeParams {
            kv_heads: kv.first().map_or(0, |&(_, h)| h),
            ..WholeParams::default()
        };
        for (v, class) in classify(g, ops) {
            let numel = g.ty(v).shape.fixed_numel().unwrap_or(0);
            match class {
                Kept::Always => w.always += numel,
                Kept::WithKv => w.kv_projections += numel,
                Kept::Split => {}
            }
        }
        w
    }

    /// The whole parameters at tensor-parallel degree `tp`.
    pub fn at(&self, tp: u32) -> u64 {
        self.always
            + if kv_replicated(self.kv_heads, tp) {
                self.kv_projections
            } else {
                0
            }
    }
}

/// The parameters among the layer `ops` that every one of `tp` ranks holds whole: those
/// every reader of which is a norm, a router or a whole linear.
pub fn whole_at(g: &Graph, ops: &[OpId], tp: u32) -> HashSet<ValueId> {
    let kv_heads = kv_projections(g, ops).first().map_or(0, |&(_, h)| h);
    classify(g, ops)
        .into_iter()
        .filter(|&(_, class)| match class {
            Kept::Always => true,
            Kept::WithKv => kv_replicated(kv_heads, tp),
            Kept::Split => false,
        })
        .map(|(v, _)| v)
        .collect()
}

fn kv_replicated(kv_heads: u64, tp: u32) -> bool {
    let t = u64::from(tp);
    kv_heads > 0 && kv_heads < t && t.is_multiple_of(kv_heads)
}

/// How tensor parallelism keeps a layer parameter.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kept {
    Always,
    /// Whole where the key/value projections are replicated.
    WithKv,
    Split,
}

/// Each parameter among `ops`, by the ops that read it.
fn classify(g: &Graph, ops: &[OpId]) -> Vec<(ValueId, Kept)> {
    let uses = g.uses();
    let duplicated = duplicated_linears(g, ops);
    let kv = kv_projections(g, ops);
    let mut out = Vec::new();
    for &o in ops {
        let OpKind::Param { .. } = g.op(o).kind else {
            continue;
        };
        let v = g.op(o).results[0];
        let readers = &uses[v.index()];
        let read_by =
            |keep: &dyn Fn(OpId) -> bool| !readers.is_empty() && readers.iter().all(|&u| keep(u));
        let class = if read_by(&|u| replicated_reader(g, u) || duplicated.contains(&u)) {
            Kept::Always
        } else if read_by(&|u| kv.iter().any(|&(p, _)| p == u)) {
            Kept::WithKv
        } else {
            Kept::Split
        };
        out.push((v, class));
    }
    out
}

/// Ops whose parameters every tensor-parallel rank holds whole: norms (their scale and
/// shift), a router (Megatron-Core's `TopKRouter` weight is not split) and the routing
/// weights' product (gpt-oss's experts' down-projection bias).
fn replicated_reader(g: &Graph, o: OpId) -> bool {
    matches!(
        g.op(o).kind,
        OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. } | OpKind::TopKRouter { .. }
    ) || crate::model::reads_routing_weights(g, o)
}
