//! The architecture an engine needs to build the same model, read from the IR graph (not
//! from the file the model came from): the ops say which norm, position encoding, MLP and
//! attention the layers have.

use ir::{Graph, OpId, OpKind, RopeScaling, Routing};

use crate::error::PlanError;
use crate::model::ModelInfo;
pub use crate::model::latent::Latent;

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
    /// An ungated squared-ReLU MLP (Nemotron's `relu2`).
    pub squared_relu: bool,
    /// The share of each head's dimensions the rotary embedding turns (Nemotron's
    /// `partial_rotary_factor`; 1 for the whole head).
    pub rotary_share: f64,
    /// Each attention head's width (`--kv-channels` where it is not hidden / heads).
    pub head_dim: u64,
    /// Biases on the q, k and v projections, on any other linear layer of the block, and on
    /// every other one (Megatron-LM's `--add-bias-linear` puts them on all).
    pub qkv_bias: bool,
    pub other_bias: bool,
    pub all_other_bias: bool,
    /// A norm on each head's queries and keys before attention (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// The inner width of a shared expert beside the routed ones (ungated).
    pub shared_expert_ffn: Option<u64>,
    /// The head reads the embedding table.
    pub tied: bool,
    /// Dropout probability of the model's dropout ops (0 without).
    pub dropout: f64,
    /// Routed experts and experts per token (0 and 0 for a dense MLP).
    pub experts: u64,
    pub experts_per_token: u64,
    /// How the router weighs the experts it picks (Mixtral's for a dense MLP).
    pub routing: Routing,
    /// A factor on the routed experts' weighted sum (DeepSeek's `routed_scaling_factor`).
    pub routed_scale: Option<f64>,
    /// Multi-head latent attention's widths (DeepSeek-V2 and V3).
    pub latent: Option<Latent>,
    /// Where dense layers and expert layers alternate, each run's kind (experts or not) and
    /// length in order (DeepSeek's first dense layers); empty where every layer is alike.
    pub moe_layers: Vec<(bool, u32)>,
    /// The dense layers' MLP width where the block also has expert layers.
    pub dense_ffn: Option<u64>,
    /// A sliding attention window on every layer or on all but every n-th.
    pub window: Option<WindowPattern>,
    /// Whether each layer, in order, leaves positions unrotated (NoPE: SmolLM3's every
    /// fourth, Cohere2's global layers); empty where every layer rotates.
    pub nope: Vec<bool>,
}

/// Sliding-window attention as Megatron-Core's `--window-size` and `--window-attn-skip-freq`
/// say it: each windowed query sees its `keys` most recent keys (itself included), and where
/// `full_every` is n, layer i (from 0) attends to every earlier key when (i + 1) % n = 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowPattern {
    pub keys: u64,
    pub full_every: Option<u32>,
}

/// The base and scaling of each rotary embedding of `g` that turns (a NoPE layer's does not).
fn turning_rotaries(g: &Graph) -> impl Iterator<Item = (f64, RopeScaling)> + '_ {
    g.order().iter().filter_map(|&o| match g.op(o).kind {
        OpKind::Rotary { theta, scaling, .. } if !scaling.is_nope() => Some((theta, scaling)),
        _ => None,
    })
}

/// Whether every rotary embedding of `g` that turns does so by one base and scaling (the
/// engines' one `--rotary-base`).
fn rotary_is_uniform(g: &Graph) -> bool {
    let mut rotaries = turning_rotaries(g);
    let first = rotaries.next();
    rotaries.all(|r| Some(r) == first)
}

/// Whether each layer of `g` leaves positions unrotated (its rotaries turn nothing); empty
/// where no layer does.
fn nope_layers(g: &Graph) -> Vec<bool> {
    let nope: Vec<bool> = g
        .ops_by_layer()
        .iter()
        .map(|ops| {
            ops.iter().any(
                |&o| matches!(&g.op(o).kind, OpKind::Rotary { scaling, .. } if scaling.is_nope()),
            )
        })
        .collect();
    if nope.contains(&true) {
        nope
    } else {
        Vec::new()
    }
}

/// The window pattern of `g`'s layers' attention (one attention op a layer), or what in it the
/// engines cannot say.
fn window_pattern(g: &Graph) -> Result<Option<WindowPattern>, String> {
    let windows: Vec<Option<u64>> = g
        .ops_by_layer()
        .iter()
        .map(|ops| {
            ops.iter().find_map(|&o| match g.op(o).kind {
                OpKind::Attention { window, .. } => Some(window),
                _ => None,
            })
        })
        .map(Option::flatten)
        .collect();
    let Some(keys) = windows.iter().flatten().copied().max() else {
        return Ok(None);
    };
    if windows.iter().flatten().any(|&w| w != keys) {
        return Err("sliding windows of different sizes on different layers".into());
    }
    if windows.iter().all(Option::is_some) {
        return Ok(Some(WindowPattern {
            keys,
            full_every: None,
        }));
    }
    let full_every = (2..=windows.len()).find(|&n| {
        windows
            .iter()
            .enumerate()
            .all(|(i, w)| w.is_none() == ((i + 1) % n == 0))
    });
    match full_every {
        Some(n) => Ok(Some(WindowPattern {
            keys,
            full_every: u32::try_from(n).ok(),
        })),
        None => Err(format!(
            "sliding-window layers {:?} (not all layers, nor all but every n-th)",
            windows
                .iter()
                .enumerate()
                .filter(|(_, w)| w.is_some())
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        )),
    }
}

/// The first of Llama 4's departures from the engines' GPT that `g` has, named: chunked
/// attention (no engine argument masks by chunk), its NoPE layers' attention temperature and
/// experts whose gate scales their input.
fn unexpressed_llama4_part(g: &Graph) -> Option<&'static str> {
    let kinds = || g.order().iter().map(|&o| &g.op(o).kind);
    if kinds().any(|k| matches!(k, OpKind::Attention { chunk: Some(_), .. })) {
        return Some("chunked attention (Llama 4's attention_chunk_size)");
    }
    if kinds().any(|k| matches!(k, OpKind::Rotary { scaling, .. } if scaling.temperature().0 > 0.0))
    {
        return Some(
            "the attention temperature on the unrotated layers' queries (Llama 4's \
             attn_temperature_tuning)",
        );
    }
    if kinds().any(|k| matches!(k, OpKind::MoeExperts { form, .. } if form.scales_input)) {
        return Some("experts whose router weight scales their input (Llama 4's MoE)");
    }
    None
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
        limit: "its GPT model builds LayerNorm/RMSNorm, learned or rotary positions, GELU, \
                SwiGLU or squared-ReLU MLPs and top-k MoE layers"
            .into(),
    };
    let window = window_pattern(g).map_err(|why| refuse(&why))?;
    if let Some(feature) = unexpressed_llama4_part(g) {
        return Err(refuse(feature));
    }
    if !rotary_is_uniform(g) {
        return Err(refuse(
            "rotary embeddings whose base or scaling differs between layers (Gemma 3's and \
             OLMo 3's sliding-window layers)",
        ));
    }
    if !info.layer_runs.is_empty() {
        let nope = nope_layers(g);
        return read_runs(info, engine).map(|a| Architecture { window, nope, ..a });
    }
    let latent = info.latent;
    let narrower_values = info.layer_ops.iter().any(|&o| {
        let op = g.op(o);
        matches!(op.kind, OpKind::Attention { .. })
            && last_width(g, op.inputs[0]) != last_width(g, op.results[0])
    });
    if narrower_values && latent.is_none() {
        return Err(refuse(
            "value heads narrower than query heads outside multi-head latent attention",
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
    if layer
        .iter()
        .any(|k| matches!(k, OpKind::Attention { sinks: true, .. }))
    {
        return Err(refuse(
            "attention sinks (gpt-oss's learned sink logit per head)",
        ));
    }
    if layer.iter().any(|k| {
        matches!(k, OpKind::TopKRouter { bias: true, .. })
            || matches!(k, OpKind::MoeExperts { form, .. } if !form.is_swiglu())
    }) {
        return Err(refuse(
            "experts other than SwiGLU without biases (gpt-oss's biased, clamped experts)",
        ));
    }
    let qkv = QkvPaths::of(g, &info.layer_ops);
    refuse_unexpressed(info, &layer, &qkv, latent.as_ref()).map_err(refuse)?;
    let norm = layer.iter().find_map(|k| match k {
        OpKind::RmsNorm { eps } => Some((true, *eps)),
        OpKind::LayerNorm { eps, .. } => Some((false, *eps)),
        _ => None,
    });
    let (rms_norm, norm_eps) = norm.ok_or_else(|| refuse("a layer without a norm"))?;
    // The first layer may be one that does not rotate (NoPE): the positions are the turning
    // layers'.
    let rotary = turning_rotaries(g).next();
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
    let squared_relu = layer.iter().any(|k| matches!(k, OpKind::Relu))
        && layer
            .iter()
            .any(|k| matches!(k, OpKind::Pow { exponent } if *exponent == 2.0));
    if !swiglu && !squared_relu && !layer.iter().any(|k| matches!(k, OpKind::Gelu { .. })) {
        return Err(refuse(
            "an MLP activation other than GELU, SwiGLU or a squared ReLU",
        ));
    }
    let (experts, experts_per_token, routing) = layer
        .iter()
        .find_map(|k| match k {
            OpKind::TopKRouter {
                experts,
                k,
                routing,
                ..
            } => Some((*experts, *k, *routing)),
            _ => None,
        })
        .unwrap_or((0, 0, Routing::default()));
    let shared_expert_ffn = (experts > 0)
        .then(|| gate_width(g, &info.layer_ops, OpKind::Silu))
        .flatten();
    let ffn = if experts > 0 {
        expert_width(g, &info.layer_ops)
    } else {
        ffn_width(g, &info.layer_ops)
    };
    Ok(Architecture {
        layers: info.layers,
        hidden: info.hidden,
        ffn: ffn.ok_or_else(|| refuse("an MLP plait cannot find"))?,
        heads: info.heads,
        kv_heads: info.kv_heads,
        vocab: info.vocab,
        positions,
        rms_norm,
        norm_eps,
        swiglu,
        squared_relu,
        // Latent attention's rotary part is a head of its own (`--qk-pos-emb-head-dim`).
        rotary_share: if latent.is_some() {
            1.0
        } else {
            rotary_share(g, &info.layer_ops, qkv.head_dim)
        },
        head_dim: qkv.head_dim.unwrap_or(info.hidden / info.heads.max(1)),
        qkv_bias: qkv.biased(g, true),
        other_bias: other_linears(g, &info.layer_ops, &qkv.linears).any(|b| b),
        all_other_bias: other_linears(g, &info.layer_ops, &qkv.linears).all(|b| b),
        qk_norm: qkv.norms > 0,
        shared_expert_ffn,
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
        routed_scale: routed_scale(g, &info.layer_ops),
        latent,
        moe_layers: Vec::new(),
        dense_ffn: None,
        window,
        nope: nope_layers(g),
    })
}

/// A block of runs of layers (DeepSeek's dense layers, then its expert layers): the engines
/// build it where the runs differ only in their MLP, dense or routed experts, each kind one
/// width.
fn read_runs(info: &ModelInfo<'_>, engine: &'static str) -> Result<Architecture, PlanError> {
    let refuse = |feature: String| PlanError::Unexportable {
        engine,
        feature,
        limit: "its layers differ only in their MLP, dense or experts, each of one width".into(),
    };
    let runs = info
        .layer_runs
        .iter()
        .map(|r| Ok((read(&r.info, engine)?, r.info.layers)))
        .collect::<Result<Vec<_>, PlanError>>()?;
    let Some((moe, _)) = runs.iter().find(|(a, _)| a.experts > 0) else {
        return Err(refuse(
            "dense layers of more than one structure (no expert layers)".into(),
        ));
    };
    let dense: Vec<u64> = runs
        .iter()
        .filter(|(a, _)| a.experts == 0)
        .map(|(a, _)| a.ffn)
        .collect();
    if dense.windows(2).any(|w| w[0] != w[1]) {
        return Err(refuse(format!("dense MLPs of widths {dense:?}")));
    }
    // Expert runs alike but for their length; every run alike but for its MLP.
    let any_length = |a: &Architecture| Architecture {
        layers: 0,
        ..a.clone()
    };
    let (first, _) = &runs[0];
    for (a, _) in &runs {
        let expert_differs = a.experts > 0 && any_length(a) != any_length(moe);
        if expert_differs || without_mlp(a) != without_mlp(first) {
            return Err(refuse(
                "layers of more than one structure beyond dense and expert MLPs".into(),
            ));
        }
    }
    Ok(Architecture {
        layers: info.layers,
        moe_layers: runs.iter().map(|(a, n)| (a.experts > 0, *n)).collect(),
        dense_ffn: dense.first().copied(),
        ..moe.clone()
    })
}

/// `a` with its MLP's fields and length cleared: what dense and expert layers share.
fn without_mlp(a: &Architecture) -> Architecture {
    Architecture {
        layers: 0,
        ffn: 0,
        shared_expert_ffn: None,
        experts: 0,
        experts_per_token: 0,
        routing: Routing::default(),
        routed_scale: None,
        ..a.clone()
    }
}

/// The factor on the routed experts' sum: a scale op reading the expert op's result.
fn routed_scale(g: &Graph, ops: &[OpId]) -> Option<f64> {
    ops.iter().find_map(|&o| match g.op(o).kind {
        OpKind::Scale { factor } if reads_experts(g, ops, g.op(o).inputs[0]) => Some(factor),
        _ => None,
    })
}

fn reads_experts(g: &Graph, ops: &[OpId], v: ir::ValueId) -> bool {
    let d = g.def_op(v);
    ops.contains(&d) && matches!(g.op(d).kind, OpKind::MoeExperts { .. })
}

/// The share of a head the first rotary embedding among `ops` turns: the width it reads over
/// its heads' whole width (Nemotron turns the first half of each head).
fn rotary_share(g: &Graph, ops: &[OpId], head_dim: Option<u64>) -> f64 {
    ops.iter()
        .find_map(|&o| {
            let op = g.op(o);
            let OpKind::Rotary { heads, .. } = op.kind else {
                return None;
            };
            let width = last_width(g, op.inputs[0])? as f64;
            Some(width / (heads * head_dim?) as f64)
        })
        .unwrap_or(1.0)
}

/// The MLP's inner width: the width of what its activation reads (a GELU's input, a SiLU's
/// for SwiGLU, a ReLU's for a squared ReLU).
fn ffn_width(g: &Graph, ops: &[OpId]) -> Option<u64> {
    ops.iter().find_map(|&o| {
        let op = g.op(o);
        matches!(op.kind, OpKind::Gelu { .. } | OpKind::Silu | OpKind::Relu)
            .then(|| last_width(g, op.inputs[0]))
            .flatten()
    })
}

/// Each routed expert's inner width (plait's expert op: w1, w3 `[E, h, f]`, then w2).
fn expert_width(g: &Graph, ops: &[OpId]) -> Option<u64> {
    ops.iter().find_map(|&o| {
        let op = g.op(o);
        match op.kind {
            OpKind::MoeExperts { .. } => op.inputs.get(2).and_then(|&w| last_width(g, w)),
            _ => None,
        }
    })
}

/// The inner width of a gated MLP whose activation is `act` (its output multiplied by
/// another tensor as wide): a SwiGLU shared expert beside routed ones, or Gemma's GeGLU.
fn gate_width(g: &Graph, ops: &[OpId], act: OpKind) -> Option<u64> {
    let is_act = |v: ir::ValueId| {
        let d = g.def_op(v);
        ops.contains(&d) && std::mem::discriminant(&g.op(d).kind) == std::mem::discriminant(&act)
    };
    ops.iter().find_map(|&o| {
        let op = g.op(o);
        let gated = matches!(op.kind, OpKind::Mul)
            && op.inputs.len() == 2
            && op.inputs.iter().any(|&x| is_act(x))
            && last_width(g, op.inputs[0]) == last_width(g, op.inputs[1]);
        gated.then(|| last_width(g, op.results[0])).flatten()
    })
}

fn last_width(g: &Graph, v: ir::ValueId) -> Option<u64> {
    g.ty(v).shape.last().and_then(|d| d.fixed())
}

/// What lies between the layer's q, k and v projections and its attention: the projections,
/// the norms on the way (a per-head q/k norm) and the heads' width.
struct QkvPaths {
    linears: Vec<OpId>,
    norms: usize,
    head_dim: Option<u64>,
}

impl QkvPaths {
    fn of(g: &Graph, ops: &[OpId]) -> QkvPaths {
        let mut paths = QkvPaths {
            linears: Vec::new(),
            norms: 0,
            head_dim: None,
        };
        for &o in ops {
            let op = g.op(o);
            let OpKind::Attention { heads, .. } = op.kind else {
                continue;
            };
            paths.head_dim = last_width(g, op.inputs[0]).map(|w| w / heads.max(1));
            for &x in op.inputs.iter().take(3) {
                paths.walk_back(g, ops, x);
            }
        }
        paths
    }

    /// Follows `v` back through single-operand ops (reshapes, rotary, norms, a split) to the
    /// linear that made it.
    fn walk_back(&mut self, g: &Graph, ops: &[OpId], mut v: ir::ValueId) {
        for _ in 0..32 {
            let o = g.def_op(v);
            if !ops.contains(&o) {
                return;
            }
            let op = g.op(o);
            match op.kind {
                OpKind::Linear { .. } => {
                    if !self.linears.contains(&o) {
                        self.linears.push(o);
                    }
                    return;
                }
                OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. } => self.norms += 1,
                _ => {}
            }
            let Some(&x) = op.inputs.first() else {
                return;
            };
            v = x;
        }
    }

    /// Whether the q, k and v projections have biases.
    fn biased(&self, g: &Graph, bias: bool) -> bool {
        self.linears
            .iter()
            .any(|&o| matches!(g.op(o).kind, OpKind::Linear { bias: b } if b == bias))
    }
}

/// Whether linear `o` projects a norm's output (a pre-norm block's q, k and v do).
fn reads_a_norm(g: &Graph, o: OpId) -> bool {
    let input = g.def_op(g.op(o).inputs[0]);
    matches!(
        g.op(input).kind,
        OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. }
    )
}

/// The layer structures an engine's GPT model has no argument for, named: a gated GELU MLP,
/// norms after attention and the MLP as well as before them, a scaled embedding, soft-capped
/// logits, a gated shared expert, a softmax scale other than 1/√head_dim.
fn refuse_unexpressed(
    info: &ModelInfo<'_>,
    layer: &[&OpKind],
    qkv: &QkvPaths,
    latent: Option<&Latent>,
) -> Result<(), &'static str> {
    let g = info.graph;
    if qkv.linears.is_empty() {
        return Err("attention whose q, k and v projections plait cannot find");
    }
    if layer.iter().any(|k| matches!(k, OpKind::Clamp { .. })) {
        return Err("q, k and v clamped after their projections (OLMo's and OLMoE's clip_qkv)");
    }
    if info.layer_ops.iter().any(|&o| norms_a_rotation(g, o)) {
        return Err(
            "q and k normed after the rotary embedding (Hunyuan's query_layernorm and \
             key_layernorm; Megatron's --qk-layernorm norms them before it)",
        );
    }
    if info.norm_across_heads() {
        return Err(
            "q and k normed over all their heads at once (OLMo 2's, OLMoE's and MiniMax-M2's \
             q_norm and k_norm; Megatron's --qk-layernorm norms each head)",
        );
    }
    if layer.iter().any(|k| matches!(k, OpKind::ReduceMean))
        && !layer
            .iter()
            .any(|k| matches!(k, OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. }))
    {
        return Err("norms without weights (OLMo 1's LayerNorms, NanoChat's RMSNorms)");
    }
    if gate_width(g, &info.layer_ops, OpKind::Gelu { tanh: true }).is_some() {
        return Err("a gated GELU MLP (GeGLU: Gemma's)");
    }
    if parallel_branches(g, &info.layer_ops) {
        return Err(
            "attention and the MLP in parallel off the layer's input (GPT-NeoX's \
             use_parallel_residual, Falcon's parallel_attn, Phi)",
        );
    }
    if kinds(g, &info.post_ops).any(|k| matches!(k, OpKind::Linear { bias: true })) {
        return Err("a bias on the output head (Phi's lm_head)");
    }
    if layer
        .iter()
        .any(|k| matches!(k, OpKind::LayerNorm { bias: false, .. }))
    {
        return Err("LayerNorms without biases (Cohere's)");
    }
    if !qkv.linears.iter().all(|&o| reads_a_norm(g, o)) {
        return Err(
            "norms after attention and the MLP instead of before them (OLMo 2's and EXAONE 4's \
             post_attention_layernorm and post_feedforward_layernorm)",
        );
    }
    let norms = layer
        .iter()
        .filter(|k| matches!(k, OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. }))
        .count();
    if norms > 2 + qkv.norms + latent.map_or(0, crate::model::latent::norms) {
        return Err(
            "norms after attention and the MLP as well as before them (Gemma 2 and 3, GLM-4)",
        );
    }
    if kinds(g, &info.pre_ops).any(|k| matches!(k, OpKind::Scale { .. })) {
        return Err(
            "a scaled embedding (Gemma's by the square root of the hidden size, \
                    Granite's embedding_multiplier)",
        );
    }
    if kinds(g, &info.post_ops).any(|k| matches!(k, OpKind::Tanh)) {
        return Err("soft-capped logits (Gemma 2's final_logit_softcapping)");
    }
    if kinds(g, &info.post_ops).any(|k| matches!(k, OpKind::Scale { .. })) {
        return Err("scaled logits (Granite's logits_scaling)");
    }
    let scales = layer
        .iter()
        .filter(|k| matches!(k, OpKind::Scale { .. }))
        .count();
    if scales > usize::from(routed_scale(g, &info.layer_ops).is_some()) {
        return Err("scaled residual branches (Granite's residual_multiplier)");
    }
    let routed = layer.iter().any(|k| matches!(k, OpKind::MoeExperts { .. }));
    if routed && layer.iter().any(|k| matches!(k, OpKind::Sigmoid)) {
        return Err("a shared expert behind a sigmoid gate (Qwen2-MoE's shared_expert_gate)");
    }
    // Latent attention's scale carries YaRN's mscale (the engine's own rule: megatron.rs).
    let standard = latent.is_some()
        || layer.iter().all(|k| match k {
            OpKind::Attention { scale, .. } => qkv
                .head_dim
                .is_none_or(|d| (scale * (d as f64).sqrt() - 1.0).abs() < 1e-6),
            _ => true,
        });
    if !standard {
        return Err("a softmax scale other than 1/sqrt(head size) (query_pre_attn_scalar)");
    }
    Ok(())
}

/// Whether `o` is a norm whose input is a rotated q or k (through its views).
fn norms_a_rotation(g: &Graph, o: OpId) -> bool {
    if !matches!(
        g.op(o).kind,
        OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. }
    ) {
        return false;
    }
    let mut x = g.op(o).inputs[0];
    while let OpKind::Reshape { .. } = g.op(g.def_op(x)).kind {
        x = g.op(g.def_op(x)).inputs[0];
    }
    matches!(g.op(g.def_op(x)).kind, OpKind::Rotary { .. })
}

/// Whether the block's last projection (the MLP's output) does not read the attention's
/// output: attention and the MLP run side by side and their outputs add (a parallel block),
/// where the engines' layer runs the MLP on the attention's residual sum.
fn parallel_branches(g: &Graph, layer: &[OpId]) -> bool {
    let mut after_attention = std::collections::HashSet::new();
    let mut mlp_reads_attention = None;
    for &o in layer {
        let op = g.op(o);
        let reads = op.inputs.iter().any(|v| after_attention.contains(v));
        if matches!(op.kind, OpKind::Attention { .. }) || reads {
            after_attention.extend(op.results.iter().copied());
        }
        if matches!(op.kind, OpKind::Linear { .. } | OpKind::MoeExperts { .. }) {
            mlp_reads_attention = Some(reads);
        }
    }
    mlp_reads_attention == Some(false)
}

/// Whether each linear layer of the block but the q, k and v projections has a bias.
fn other_linears<'a>(
    g: &'a Graph,
    layer: &'a [OpId],
    qkv: &'a [OpId],
) -> impl Iterator<Item = bool> + 'a {
    layer
        .iter()
        .filter(move |o| !qkv.contains(o))
        .filter_map(move |&o| match g.op(o).kind {
            OpKind::Linear { bias } => Some(bias),
            _ => None,
        })
}
