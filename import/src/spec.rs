//! A decoder-only transformer described by its hyper-parameters: what a Hugging Face
//! `config.json` or a zoo entry says, before it becomes an IR graph.

use serde::Serialize;

/// The architecture family, which fixes the block's structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// GPT-2 / GPT-3 / Megatron GPT: learned positions, LayerNorm, GELU MLP, biases.
    Gpt2,
    /// Llama: rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases.
    Llama,
    /// Mixtral: Llama with a top-k routed mixture of SwiGLU experts instead of the MLP.
    Mixtral,
}

/// What a Llama-structured family changes in the block ([`Variant::default`] is Llama itself).
/// Each field names the families that set it; `hf` reads them from the config.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Variant {
    /// The config's `model_type` when it is not the family's own (qwen2, gemma, ...).
    pub model_type: Option<String>,
    /// Head size when it differs from hidden / heads (Qwen3, Gemma: an explicit `head_dim`).
    pub head_dim: Option<u64>,
    /// Biases on the q, k and v projections (Qwen2, Qwen2-MoE; `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the attention's output projection (`attention_bias` where transformers puts
    /// it on o_proj too: Llama, Qwen3, OLMo 2, Granite, Gemma, Nemotron).
    pub o_bias: bool,
    /// RMSNorm over each head of q and of k before the rotary embedding (Qwen3).
    pub qk_norm: bool,
    /// With `qk_norm`, the norms after the rotary embedding rather than before it (Hunyuan's
    /// `query_layernorm` and `key_layernorm`).
    pub qk_norm_after_rotary: bool,
    /// With `qk_norm`, q and k normed over their whole projections (all heads at once: OLMo
    /// 2, OLMoE) rather than per head.
    pub qk_norm_whole: bool,
    /// The gate's activation: SiLU (SwiGLU) or GELU-tanh (GeGLU: Gemma).
    pub gelu_gate: bool,
    /// Embedding output multiplied by sqrt(hidden) (Gemma).
    pub embed_scale: bool,
    /// A norm on the attention output and on the MLP output before each residual add, and a
    /// separate norm before the MLP (Gemma 2: four norms per layer).
    pub sandwich_norms: bool,
    /// Attention scores soft-capped as cap · tanh(s / cap) (Gemma 2's
    /// `attn_logit_softcapping`).
    pub attn_softcap: Option<f64>,
    /// Logits soft-capped as cap · tanh(logits / cap) (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<f64>,
    /// The attention scale's denominator squared, when it is not the head size (Gemma 2's
    /// `query_pre_attn_scalar`).
    pub query_scale: Option<f64>,
    /// A dense SwiGLU expert every token visits, of this width (Qwen2-MoE's `shared_expert`,
    /// DeepSeek-V3's `shared_experts`: `n_shared_experts` experts as one MLP).
    pub shared_expert_ffn: Option<u64>,
    /// The shared expert's output scaled by a sigmoid gate of one column (Qwen2-MoE).
    pub shared_expert_gate: bool,
    /// How the router weighs the experts it picks (Mixtral's softmax over the top k; Qwen-MoE's
    /// `norm_topk_prob`; DeepSeek-V3's group-limited sigmoid).
    pub routing: ir::Routing,
    /// The routed experts' sum multiplied by this factor (DeepSeek-V3's
    /// `routed_scaling_factor`).
    pub routed_scale: Option<f64>,
    /// Layers with a dense SwiGLU MLP of their own width in place of the experts (DeepSeek-V3's
    /// `first_k_dense_replace` leading layers of `intermediate_size`, Llama 4 Maverick's every
    /// other layer of `intermediate_size_mlp`).
    pub dense_layers: Option<DenseLayers>,
    /// Multi-head latent attention in place of q/k/v projections (DeepSeek-V3).
    pub mla: Option<Mla>,
    /// An ungated MLP, `act(x·up)·down`: Nemotron's squared ReLU, GPT-NeoX's, Falcon's, Phi's
    /// and StarCoder2's GELU.
    pub ungated_mlp: Option<Ungated>,
    /// Biases on the MLP's projections (GPT-NeoX, Phi, Falcon's `bias`, StarCoder2's
    /// `use_bias`).
    pub mlp_bias: bool,
    /// Attention and the MLP both read the layer's input and add their outputs to it together,
    /// `x + attn(n₁(x)) + mlp(n₂(x))` (GPT-NeoX's and StableLM's `use_parallel_residual`,
    /// Falcon's `parallel_attn`, Phi), with one norm or two.
    pub parallel: Option<ParallelNorms>,
    /// A bias on the output head (Phi's `lm_head`).
    pub head_bias: bool,
    /// LayerNorm with weight and bias in place of RMSNorm (Nemotron's `LayerNorm1P`, GPT-NeoX,
    /// Phi, Falcon, StableLM, StarCoder2).
    pub layer_norm: bool,
    /// Rotary embedding over only the first this many dimensions of each head, the rest
    /// passed through (Nemotron's `partial_rotary_factor`).
    pub rotary_dims: Option<u64>,
    /// Norms on the attention and MLP outputs before each residual add and none before them
    /// (OLMo 2's reordered norms).
    pub post_norms: bool,
    /// Granite's four constant multipliers (transformers' `GraniteConfig`).
    pub multipliers: Option<Multipliers>,
    /// LayerNorm with a weight and no bias (Cohere's `CohereLayerNorm`).
    pub bias_free_layer_norm: bool,
    /// LayerNorms with neither weight nor bias (OLMo 1's `OlmoLayerNorm`), composed of
    /// elementwise ops and means: (x − mean(x))·rsqrt(var(x) + eps).
    pub weightless_norms: bool,
    /// RMSNorms with no weight (NanoChat's, `F.rms_norm`), composed of elementwise ops and a
    /// mean: x·rsqrt(mean(x²) + eps).
    pub weightless_rms_norms: bool,
    /// The embedding normed before the first layer as the block's norms are (NanoChat's
    /// `self.norm` on `inputs_embeds`).
    pub embed_norm: bool,
    /// q, k and v clamped to ±this after their projections (and OLMoE's q/k norms): OLMo's
    /// and OLMoE's `clip_qkv`.
    pub clip_qkv: Option<f64>,
    /// The logits multiplied by this factor (Cohere's `logit_scale`).
    pub logit_scale: Option<f64>,
    /// A learned sink logit per attention head (gpt-oss's `sinks`).
    pub attention_sinks: bool,
    /// A bias on the router's logits (gpt-oss's `router.bias`).
    pub router_bias: bool,
    /// The routed experts' gated unit and biases (gpt-oss's clamped SwiGLU with biases on
    /// all three projections: the down projection's is added per expert as the others).
    pub expert_form: ir::ExpertForm,
    /// A sliding attention window on some or all layers (Mistral's `sliding_window`, Gemma 2's
    /// and gpt-oss's alternate layers, Gemma 3's five of six, OLMo 3's three of four).
    pub sliding_window: Option<SlidingWindow>,
    /// The sliding-kind layers' own rotary, where they have one (Gemma 3's
    /// `rope_local_base_freq`; OLMo 3's `rope_theta` without its scaling).
    pub local_rope: Option<LocalRope>,
    /// Whether each layer, in order, leaves positions unrotated (NoPE: SmolLM3's
    /// `no_rope_layers`, Cohere2's global-attention layers); none where every layer rotates.
    pub nope: Option<Vec<bool>>,
    /// Chunked attention on some layers (Llama 4's `attention_chunk_size` on its rotated
    /// layers): each query sees only the keys of its own chunk.
    pub chunked_attention: Option<ChunkedAttention>,
    /// Whether each layer, in order, divides q and k (after the rotary) per head by their root
    /// mean square, with no weight (Llama 4's `use_qk_norm`, `Llama4TextL2Norm`, on its rotated
    /// layers); none where no layer does.
    pub qk_l2_norm: Option<Vec<bool>>,
    /// The NoPE layers' queries scaled by a temperature growing with the position (Llama 4's
    /// `attn_temperature_tuning`, [`ir::RopeScaling::Temperature`]).
    pub attn_temperature: Option<AttnTemperature>,
}

/// Llama 4's chunked attention: each query of a chunked layer sees only the keys of its own
/// chunk of `keys` positions (transformers' `create_chunked_causal_mask`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkedAttention {
    pub keys: u64,
    /// Whether each layer, in order, attends in chunks.
    pub chunked: Vec<bool>,
}

impl ChunkedAttention {
    /// The chunk of layer `layer`'s attention (none: every earlier key).
    pub fn of_layer(&self, layer: u64) -> Option<u64> {
        let chunked = usize::try_from(layer)
            .ok()
            .and_then(|l| self.chunked.get(l));
        chunked.copied().unwrap_or(false).then_some(self.keys)
    }
}

/// Llama 4's attention temperature: a NoPE layer's query at position p is scaled by
/// 1 + `scale`·ln(⌊(p + 1)/`floor`⌋ + 1) (`floor_scale`, `attn_scale`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AttnTemperature {
    pub floor: f64,
    pub scale: f64,
}

/// The rotary of a model's sliding-kind layers (transformers' `rotary_emb_local`): base
/// `theta`, unscaled; `layers` says which layers are of that kind, window or not.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocalRope {
    pub theta: f64,
    pub layers: Vec<bool>,
}

/// The sliding window of a model's attention: each query of a windowed layer sees its `keys`
/// most recent keys, itself included; the other layers attend to every earlier key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    pub keys: u64,
    /// Whether each layer, in order, attends within the window.
    pub windowed: Vec<bool>,
}

impl ModelSpec {
    /// The rotary base and scaling of layer `layer` (none: outside the layers): none at all
    /// ([`ir::RopeScaling::Nope`]) in a NoPE layer, the sliding-kind layers' own where the
    /// family gives them one, else the model's.
    pub fn rope_of_layer(&self, layer: Option<u32>) -> (f64, ir::RopeScaling) {
        let at = layer.and_then(|l| usize::try_from(l).ok());
        let marked = |layers: &Vec<bool>| at.and_then(|l| layers.get(l)).copied().unwrap_or(false);
        if self.variant.nope.as_ref().is_some_and(marked) {
            return (self.rope_theta, ir::RopeScaling::Nope);
        }
        match self
            .variant
            .local_rope
            .as_ref()
            .filter(|r| marked(&r.layers))
        {
            Some(r) => (r.theta, ir::RopeScaling::None),
            None => (self.rope_theta, self.rope_scaling),
        }
    }

    /// The rotary of layer `layer`'s queries: [`ModelSpec::rope_of_layer`], with the attention
    /// temperature in place of no rotation in a NoPE layer where the model has one.
    pub fn query_rope_of_layer(&self, layer: Option<u32>) -> (f64, ir::RopeScaling) {
        let (theta, scaling) = self.rope_of_layer(layer);
        match self.variant.attn_temperature {
            Some(t) if scaling == ir::RopeScaling::Nope => (
                theta,
                ir::RopeScaling::Temperature {
                    floor: t.floor,
                    scale: t.scale,
                },
            ),
            _ => (theta, scaling),
        }
    }

    /// Whether layer `layer` divides q and k by their root mean square after the rotary.
    pub fn qk_l2_norm_in(&self, layer: Option<u32>) -> bool {
        let at = layer.and_then(|l| usize::try_from(l).ok());
        let layers = self.variant.qk_l2_norm.as_deref().unwrap_or_default();
        at.and_then(|l| layers.get(l)).copied().unwrap_or(false)
    }

    /// Whether layer `layer` has a dense MLP in place of the experts.
    pub fn dense_in(&self, layer: u64) -> bool {
        self.variant
            .dense_layers
            .as_ref()
            .is_some_and(|d| d.is_dense(layer))
    }

    /// The layers where the block changes structure ([`ir::Graph::kind_starts`]): where a
    /// layer's MLP turns dense or routed, or its q/k norm appears or goes, against the layer
    /// before it.
    pub fn kind_starts(&self) -> Vec<u32> {
        let kind = |l: u64| {
            let layer = u32::try_from(l).ok();
            (self.dense_in(l), self.qk_l2_norm_in(layer))
        };
        (1..self.layers)
            .filter(|&l| kind(l) != kind(l - 1))
            .filter_map(|l| u32::try_from(l).ok())
            .collect()
    }

    /// How many layers leave positions unrotated (NoPE).
    pub fn nope_layers(&self) -> usize {
        let nope = self.variant.nope.as_deref().unwrap_or_default();
        nope.iter().filter(|&&n| n).count()
    }
}

impl SlidingWindow {
    /// The window of layer `layer`'s attention (none: full attention).
    pub fn of_layer(&self, layer: u64) -> Option<u64> {
        let windowed = usize::try_from(layer)
            .ok()
            .and_then(|l| self.windowed.get(l));
        windowed.copied().unwrap_or(false).then_some(self.keys)
    }

    /// How many layers attend within the window.
    pub fn windowed_layers(&self) -> usize {
        self.windowed.iter().filter(|&&w| w).count()
    }
}

/// The activation of an ungated MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ungated {
    /// relu(x)² (Nemotron's `relu2`).
    SquaredRelu,
    /// GELU, exact (`gelu`) or tanh-approximated (`gelu_new` and its aliases).
    Gelu { tanh: bool },
}

/// The norms of a parallel block: one both branches read (Phi, Falcon-7B, StableLM), or one
/// per branch (GPT-NeoX, Falcon's `new_decoder_architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ParallelNorms {
    Shared,
    Separate,
}

/// Granite's scalings: the embedding output times `embedding`, each attention and MLP output
/// times `residual` before its residual add, the attention scores times `attention` (in place
/// of 1/√head size), the logits divided by `logits`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Multipliers {
    pub embedding: f64,
    pub residual: f64,
    pub attention: f64,
    pub logits: f64,
}

/// The dense layers of a mixture-of-experts model and their MLP's width.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DenseLayers {
    /// Whether each layer, in order, is dense (past the list: routed).
    pub dense: Vec<bool>,
    pub ffn: u64,
}

impl DenseLayers {
    /// The first `count` of `layers` layers dense (DeepSeek's `first_k_dense_replace`).
    pub fn leading(count: u64, layers: u64, ffn: u64) -> DenseLayers {
        DenseLayers {
            dense: (0..layers).map(|l| l < count).collect(),
            ffn,
        }
    }

    pub fn is_dense(&self, layer: u64) -> bool {
        let at = usize::try_from(layer).ok();
        at.and_then(|l| self.dense.get(l)).copied().unwrap_or(false)
    }

    /// How many of the first `layers` layers are dense.
    pub fn count(&self, layers: u64) -> u64 {
        (0..layers).filter(|&l| self.is_dense(l)).count() as u64
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3, transformers' `DeepseekV3Attention`): queries
/// through an optional low-rank bottleneck, keys and values from one compressed latent per
/// token plus one rotary key shared by every head.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Mla {
    /// Rank of the query bottleneck (`q_a_proj`, `q_a_layernorm`, `q_b_proj`); `None`: one
    /// `q_proj`.
    pub q_lora_rank: Option<u64>,
    /// Width of the compressed key/value latent (`kv_a_layernorm`, `kv_b_proj`'s input).
    pub kv_lora_rank: u64,
    /// Per-head query/key dimensions without and with the rotary embedding.
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    /// Per-head value (and attention output) dimension.
    pub v_head_dim: u64,
    /// The softmax scale: 1/sqrt(qk head size), times YaRN's mscale² where rope scaling sets
    /// `mscale_all_dim` (transformers' `DeepseekV3Attention.scaling`).
    pub scale: f64,
}

impl Mla {
    /// A query or key head: the part without and the part with the rotary embedding.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Parameters of one layer's attention with `heads` heads on `hidden`.
    pub fn params(&self, hidden: u64, heads: u64) -> u64 {
        self.count(hidden, heads)
    }

    /// [`Mla::params`] in `N`'s arithmetic.
    fn count<N: Count>(&self, hidden: u64, heads: u64) -> N {
        let n = N::of;
        let (hidden, heads, kv_lora) = (n(hidden), n(heads), n(self.kv_lora_rank));
        let q_out = heads * (n(self.qk_nope_head_dim) + n(self.qk_rope_head_dim));
        let q = match self.q_lora_rank.map(n) {
            Some(r) => hidden * r + r + r * q_out,
            None => hidden * q_out,
        };
        let kv = hidden * (kv_lora + n(self.qk_rope_head_dim))
            + kv_lora
            + kv_lora * heads * (n(self.qk_nope_head_dim) + n(self.v_head_dim));
        q + kv + heads * n(self.v_head_dim) * hidden
    }
}

impl Family {
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mixtral => "mixtral",
        }
    }
}

/// Hyper-parameters of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelSpec {
    pub name: String,
    pub family: Family,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    /// MLP inner width (per expert for Mixtral).
    pub ffn: u64,
    pub vocab: u64,
    /// Longest sequence the position embedding covers (GPT-2's n_positions).
    pub max_positions: u64,
    pub tied_embeddings: bool,
    pub norm_eps: f64,
    pub rope_theta: f64,
    /// The config's `rope_scaling`, where plait computes it (linear, llama3, yarn).
    pub rope_scaling: ir::RopeScaling,
    pub experts: u64,
    pub experts_per_token: u64,
    /// Sequence length used when the user gives none.
    pub default_seq: u64,
    /// Dropout probability on the embedding output and after each attention and MLP block
    /// (GPT-2's embd_pdrop / resid_pdrop); 0 disables it. Llama-family models train without.
    pub dropout: f64,
    /// Departures from the family's block (Llama-structured families only).
    pub variant: Variant,
}

/// The longest sequence plait trains at when none is given: today's engines' default for the
/// dense models they train (torchtitan's and Megatron-LM's Llama 3 recipes train at 8192),
/// or the model's own context if shorter. Configs and the zoo share this rule, so a zoo name
/// and its published config.json plan the same run.
pub const DEFAULT_SEQ_CAP: u64 = 8192;

/// [`DEFAULT_SEQ_CAP`] applied to a model whose position range is `max_positions`.
pub fn default_seq(max_positions: u64) -> u64 {
    max_positions.min(DEFAULT_SEQ_CAP)
}

impl ModelSpec {
    pub fn head_dim(&self) -> u64 {
        self.variant
            .head_dim
            .unwrap_or(self.hidden / self.heads.max(1))
    }

    /// Width of the query projection (and of the attention output): heads × head size.
    pub fn q_width(&self) -> u64 {
        self.heads * self.head_dim()
    }

    /// The config's `model_type`.
    pub fn model_type(&self) -> &str {
        self.variant
            .model_type
            .as_deref()
            .unwrap_or(self.family.model_type())
    }

    /// Exact trainable parameter count, by formula (the graph's own count must agree). For a
    /// spec whose count may not fit in 64 bits, [`ModelSpec::param_count_f64`] first.
    pub fn param_count(&self) -> u64 {
        self.count()
    }

    /// [`ModelSpec::param_count`] in floating point: it cannot overflow, so it says whether a
    /// config's sizes are beyond any model before anything multiplies them in 64 bits.
    pub fn param_count_f64(&self) -> f64 {
        self.count()
    }

    fn count<N: Count>(&self) -> N {
        let n = N::of;
        let (h, v, f) = (n(self.hidden), n(self.vocab), n(self.ffn));
        let (zero, two, three, four) = (n(0), n(2), n(3), n(4));
        let hd = n(self.head_dim());
        let kv = n(self.kv_heads) * hd;
        let embed = v * h;
        let head = if self.tied_embeddings { zero } else { h * v };
        match self.family {
            Family::Gpt2 => {
                let layer = (h * three * h + three * h)
                    + (h * h + h)
                    + (h * f + f)
                    + (f * h + h)
                    + four * h;
                embed + n(self.max_positions) * h + n(self.layers) * layer + two * h + head
            }
            Family::Llama | Family::Mixtral => {
                let (q, var) = (n(self.heads) * hd, &self.variant);
                let bias = if var.qkv_bias { q + two * kv } else { zero };
                let bias = bias + if var.o_bias { h } else { zero };
                let qk_norm = match (var.qk_norm, var.qk_norm_whole) {
                    (false, _) => zero,
                    (true, false) => two * hd,
                    // Over the whole projections: q's and k's widths.
                    (true, true) => q + kv,
                };
                let sinks = if var.attention_sinks {
                    n(self.heads)
                } else {
                    zero
                };
                let attn = match &var.mla {
                    Some(mla) => mla.count(self.hidden, self.heads),
                    None => h * q + two * h * kv + q * h + bias + qk_norm + sinks,
                };
                let gate = if var.shared_expert_gate { h } else { zero };
                let shared = var
                    .shared_expert_ffn
                    .map_or(zero, |s| three * h * n(s) + gate);
                let experts = n(self.experts);
                let mlp_bias = if var.mlp_bias { f + h } else { zero };
                let router_bias = if var.router_bias { experts } else { zero };
                // Biases on the gate, up and down projections of each expert.
                let expert_bias = if var.expert_form.bias {
                    experts * (two * f + h)
                } else {
                    zero
                };
                let mlp = if self.family == Family::Mixtral {
                    h * experts + router_bias + experts * three * h * f + expert_bias + shared
                } else if var.ungated_mlp.is_some() {
                    two * h * f + mlp_bias
                } else {
                    three * h * f
                };
                // Dense layers swap the experts for one SwiGLU MLP.
                let dense = var
                    .dense_layers
                    .as_ref()
                    .map_or(0, |d| d.count(self.layers));
                let dense_mlp = var
                    .dense_layers
                    .as_ref()
                    .map_or(zero, |d| three * h * n(d.ffn));
                let mlps = n(self.layers - dense) * mlp + n(dense) * dense_mlp;
                // A LayerNorm has a bias beside its weight; OLMo 1's have neither.
                let norm = if var.weightless_norms || var.weightless_rms_norms {
                    zero
                } else if var.layer_norm {
                    two * h
                } else {
                    h
                };
                let norms = if var.sandwich_norms {
                    four * norm
                } else if var.parallel == Some(ParallelNorms::Shared) {
                    norm
                } else {
                    two * norm
                };
                let head_bias = if var.head_bias { v } else { zero };
                embed + n(self.layers) * (attn + norms) + mlps + norm + head + head_bias
            }
        }
    }
}

/// The arithmetic a parameter count runs in: `u64` for the exact count, `f64` to bound a
/// config's sizes without overflowing.
trait Count: Copy + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> {
    fn of(n: u64) -> Self;
}

impl Count for u64 {
    fn of(n: u64) -> u64 {
        n
    }
}

impl Count for f64 {
    fn of(n: u64) -> f64 {
        n as f64
    }
}
