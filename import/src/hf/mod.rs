//! Hugging Face `config.json` → [`ModelSpec`], by `model_type` (gpt2, the Llama-structured
//! families, mixtral and the Qwen MoE families).
//!
//! Field names and defaults follow transformers' `GPT2Config`, `LlamaConfig` and `MixtralConfig`.

mod activation;
mod checks;
mod error;
mod layernorm;
mod llama4;
mod minimax;
mod moe;
mod nope;
mod rope;
mod rope_parameters;
mod text_model;
mod unsupported;
mod window;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use error::ConfigError;

use crate::spec::{Family, Mla, ModelSpec, Ungated, Variant};

/// The `model_type` values plait imports.
pub const SUPPORTED_MODEL_TYPES: [&str; 57] = [
    "gpt2",
    "llama",
    "mistral",
    "mistral3",
    "mixtral",
    "ministral",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "olmo",
    "olmo2",
    "olmo3",
    "olmoe",
    "granite",
    "granitemoe",
    "granitemoeshared",
    "qwen2_moe",
    "qwen3_moe",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "seed_oss",
    "nemotron",
    "deepseek_v2",
    "deepseek_v3",
    "cohere",
    "cohere2",
    "glm",
    "glm4",
    "glm4_moe",
    "gpt_oss",
    "gpt_neox",
    "phi",
    "falcon",
    "stablelm",
    "starcoder2",
    "smollm3",
    "exaone4",
    "llama4",
    "llama4_text",
    "arcee",
    "ernie4_5",
    "ernie4_5_moe",
    "dots1",
    "hunyuan_v1_dense",
    "minimax_m2",
    "flex_olmo",
    "glm4_moe_lite",
    "nanochat",
    "vaultgemma",
    "helium",
    "exaone_moe",
];

const DENSE_REQUIRED: &str =
    "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size";

/// A family built on Llama's block: its defaults (transformers' `<Name>Config`) and what it
/// changes.
struct LlamaLike {
    model_type: &'static str,
    family: Family,
    required: &'static str,
    /// transformers' default `max_position_embeddings`.
    positions: u64,
    rms_eps: f64,
    rope_theta: f64,
    tied: bool,
    /// The config fields of the expert count, experts per token and expert width.
    experts: Option<(&'static str, &'static str, &'static str)>,
}

impl LlamaLike {
    fn of(model_type: &str) -> Option<LlamaLike> {
        let dense = |model_type, positions, rms_eps, rope_theta, tied| LlamaLike {
            model_type,
            family: Family::Llama,
            required: DENSE_REQUIRED,
            positions,
            rms_eps,
            rope_theta,
            tied,
            experts: None,
        };
        let moe_required = "hidden_size, moe_intermediate_size, num_hidden_layers, \
                            num_attention_heads, vocab_size, num_experts, num_experts_per_tok";
        let qwen_moe = |model_type| LlamaLike {
            model_type,
            family: Family::Mixtral,
            required: moe_required,
            positions: 32768,
            rms_eps: 1e-6,
            rope_theta: 10000.0,
            tied: false,
            experts: Some((
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
            )),
        };
        Some(match model_type {
            "llama" => dense("llama", 2048, 1e-6, 10000.0, false),
            // Mistral is Llama's architecture in a sliding window (`window.rs`).
            "mistral" => dense("mistral", 4096 * 32, 1e-6, 10000.0, false),
            // transformers' MinistralConfig (Ministral-8B): Mistral's block, each layer of
            // `layer_types` sliding or full (every layer sliding where it names none).
            "ministral" => dense("ministral", 4096 * 32, 1e-6, 10000.0, false),
            "qwen2" => dense("qwen2", 32768, 1e-6, 10000.0, false),
            "qwen3" => dense("qwen3", 32768, 1e-6, 10000.0, false),
            "phi3" => dense("phi3", 4096, 1e-5, 10000.0, false),
            "gemma" => dense("gemma", 8192, 1e-6, 10000.0, true),
            "gemma2" => dense("gemma2", 8192, 1e-6, 10000.0, true),
            // transformers' VaultGemmaConfig (Gemma2Config's defaults): Gemma 2's attention in a
            // block of two norms, before attention and before the MLP.
            "vaultgemma" => dense("vaultgemma", 8192, 1e-6, 10000.0, true),
            // Gemma 3's text model (transformers' Gemma3TextConfig): Gemma 2's block with
            // q/k norms in place of the soft-caps.
            "gemma3_text" => dense("gemma3_text", 131072, 1e-6, 1e6, true),
            "nemotron" => dense("nemotron", 4096, 1e-5, 10000.0, false),
            // transformers' ArceeConfig defaults (AFM-4.5B): Llama's block with Nemotron's
            // ungated squared-ReLU MLP.
            "arcee" => dense("arcee", 4096, 1e-5, 10000.0, false),
            // transformers' HunYuanDenseV1Config defaults (Hunyuan-7B and smaller): Llama's
            // block with per-head q/k RMSNorms after the rotary, whose base an NTK alpha
            // raises.
            "hunyuan_v1_dense" => dense("hunyuan_v1_dense", 2048, 1e-5, 10000.0, false),
            // transformers' NanoChatConfig defaults (nanochat-d32's shapes): Llama's block with
            // weightless RMSNorms (the embedding normed too), q and k normed per head after
            // the rotary, an ungated squared-ReLU MLP and soft-capped logits.
            "nanochat" => dense("nanochat", 2048, 1e-6, 10000.0, false),
            // transformers' HeliumConfig defaults (Helium-1 2B): Llama's block with heads of
            // 128, q, k and v biased where attention_bias says, rotary pairs interleaved.
            "helium" => dense("helium", 4096, 1e-8, 100000.0, false),
            // transformers' SeedOssConfig defaults (Seed-OSS-36B): Llama's block with q/k/v
            // biases and dropout after attention and the MLP.
            "seed_oss" => dense("seed_oss", 524288, 1e-6, 1e7, false),
            // transformers' OlmoConfig defaults (OLMo 1, 1.7): Llama's block with LayerNorms
            // of neither weight nor bias (eps 1e-5, fixed), q, k and v optionally clamped.
            "olmo" => dense("olmo", 2048, 1e-5, 10000.0, false),
            // transformers' Olmo2Config defaults.
            "olmo2" => dense("olmo2", 2048, 1e-5, 10000.0, false),
            // transformers' Olmo3Config defaults: OLMo 2's block, three of every four layers
            // with a sliding window (`window.rs`).
            "olmo3" => dense("olmo3", 2048, 1e-5, 10000.0, false),
            // transformers' GraniteConfig defaults: Llama's block with four multipliers.
            "granite" => dense("granite", 2048, 1e-6, 10000.0, false),
            // GPTNeoXConfig's, PhiConfig's, FalconConfig's, StableLmConfig's and
            // Starcoder2Config's defaults (layernorm.rs).
            "gpt_neox" => dense("gpt_neox", 2048, 1e-5, 10000.0, false),
            "phi" => dense("phi", 2048, 1e-5, 10000.0, false),
            "falcon" => LlamaLike {
                required: "hidden_size, num_hidden_layers, num_attention_heads, vocab_size",
                ..dense("falcon", 2048, 1e-5, 10000.0, true)
            },
            "stablelm" => dense("stablelm", 4096, 1e-5, 10000.0, false),
            "starcoder2" => dense("starcoder2", 4096, 1e-5, 10000.0, true),
            "mixtral" => LlamaLike {
                model_type: "mixtral",
                family: Family::Mixtral,
                required: "hidden_size, intermediate_size, num_hidden_layers, \
                           num_attention_heads, vocab_size, num_local_experts, num_experts_per_tok",
                positions: 4096 * 32,
                rms_eps: 1e-5,
                rope_theta: 1e6,
                tied: false,
                experts: Some((
                    "num_local_experts",
                    "num_experts_per_tok",
                    "intermediate_size",
                )),
            },
            // transformers' OlmoeConfig defaults: OLMo 2's whole-projection q/k norms in
            // Llama's pre-norm block, with routed experts of `intermediate_size`.
            "olmoe" => LlamaLike {
                model_type: "olmoe",
                required: "hidden_size, intermediate_size, num_hidden_layers, \
                           num_attention_heads, vocab_size, num_experts, num_experts_per_tok",
                positions: 4096,
                rms_eps: 1e-5,
                experts: Some(("num_experts", "num_experts_per_tok", "intermediate_size")),
                ..qwen_moe("olmoe")
            },
            // transformers' FlexOlmoConfig defaults (FlexOlmo-7x7B-1T): OLMo 2's block (norms
            // after attention and the MLP, whole-projection q/k norms) with OLMoE's experts.
            "flex_olmo" => LlamaLike {
                model_type: "flex_olmo",
                positions: 4096,
                rms_eps: 1e-6,
                rope_theta: 500000.0,
                ..LlamaLike::of("olmoe")?
            },
            // transformers' GraniteMoeConfig defaults (Granite 3.0/3.1 MoE, PowerMoE): Mixtral's
            // block and router (a softmax over the top k logits) with Granite's multipliers;
            // GraniteMoeSharedConfig adds an ungated shared MLP of `shared_intermediate_size`.
            "granitemoe" | "granitemoeshared" => LlamaLike {
                model_type: if model_type == "granitemoe" {
                    "granitemoe"
                } else {
                    "granitemoeshared"
                },
                positions: 2048,
                rms_eps: 1e-6,
                rope_theta: 10000.0,
                ..LlamaLike::of("mixtral")?
            },
            "qwen2_moe" => qwen_moe("qwen2_moe"),
            // transformers' Ernie4_5Config defaults (ERNIE-4.5-0.3B): Llama's block, tied,
            // its rotary pairs interleaved (GLM's rotate_half).
            "ernie4_5" => dense("ernie4_5", 131072, 1e-5, 500000.0, true),
            // transformers' Ernie4_5_MoeConfig defaults (ERNIE-4.5-21B-A3B): that block with
            // a softmax router over `moe_num_experts` experts of `moe_intermediate_size`
            // beside `moe_num_shared_experts` shared ones, dense layers where
            // `moe_layer_start_index`, `moe_layer_end_index` and `moe_layer_interval` say.
            "ernie4_5_moe" => LlamaLike {
                model_type: "ernie4_5_moe",
                family: Family::Mixtral,
                required: "hidden_size, intermediate_size, moe_intermediate_size, \
                           num_hidden_layers, num_attention_heads, vocab_size, \
                           moe_num_experts, moe_k",
                positions: 131072,
                rms_eps: 1e-5,
                rope_theta: 500000.0,
                tied: true,
                experts: Some(("moe_num_experts", "moe_k", "moe_intermediate_size")),
            },
            "qwen3_moe" => qwen_moe("qwen3_moe"),
            // transformers' DeepseekV2Config defaults: DeepSeek-V3's block (latent attention,
            // shared and routed experts) with V2's softmax router.
            "deepseek_v2" => LlamaLike {
                model_type: "deepseek_v2",
                positions: 2048,
                ..LlamaLike::of("deepseek_v3")?
            },
            // transformers' DeepseekV3Config defaults.
            "deepseek_v3" => LlamaLike {
                model_type: "deepseek_v3",
                family: Family::Mixtral,
                required: "hidden_size, intermediate_size, moe_intermediate_size, \
                           num_hidden_layers, num_attention_heads, vocab_size, \
                           n_routed_experts, num_experts_per_tok",
                positions: 4096,
                rms_eps: 1e-6,
                rope_theta: 10000.0,
                tied: false,
                experts: Some((
                    "n_routed_experts",
                    "num_experts_per_tok",
                    "moe_intermediate_size",
                )),
            },
            // transformers' CohereConfig defaults (Command R, Aya): attention and the MLP in
            // parallel off one bias-free LayerNorm, tied, the logits scaled.
            "cohere" => dense("cohere", 8192, 1e-5, 10000.0, true),
            // transformers' Cohere2Config defaults (Command R7B, Command A): Cohere's block,
            // three of four layers in a sliding window and rotated, the fourth global and
            // unrotated (`nope.rs`).
            "cohere2" => dense("cohere2", 8192, 1e-5, 10000.0, true),
            // transformers' SmolLM3Config defaults (SmolLM3-3B): Llama's block, every fourth
            // layer unrotated (`nope.rs`).
            "smollm3" => dense("smollm3", 32768, 1e-6, 2_000_000.0, true),
            // transformers' Exaone4Config defaults (EXAONE 4.0): OLMo 2's norms after
            // attention and the MLP, per-head q/k norms as Qwen3's, three of four layers in a
            // sliding window and rotated, the fourth global and unrotated (`nope.rs`).
            "exaone4" => dense("exaone4", 2048, 1e-5, 10000.0, false),
            // transformers' Glm4Config defaults (GLM-4-0414): Llama's block with norms after
            // attention and the MLP as well (Gemma 2's four), biases on q, k and v, half of
            // each head rotated.
            "glm4" => dense("glm4", 131072, 1.5625e-7, 10000.0, false),
            // transformers' GlmConfig defaults (GLM-4-9B-chat-hf, GLM-Edge): GLM-4-0414's
            // attention in Llama's two-norm block.
            "glm" => dense("glm", 131072, 1.5625e-7, 10000.0, false),
            // transformers' Glm4MoeConfig defaults (GLM-4.5): Llama's attention with biases
            // on q, k and v only, half of each head rotated and optional per-head q/k norms,
            // before DeepSeek-V3's shared and routed experts behind a leading dense layer.
            "glm4_moe" => LlamaLike {
                model_type: "glm4_moe",
                positions: 131072,
                rms_eps: 1e-5,
                ..LlamaLike::of("deepseek_v3")?
            },
            // transformers' ExaoneMoeConfig defaults (K-EXAONE): EXAONE 4's attention (per-head
            // q/k norms, windowed layers beside unrotated global ones) in a pre-norm block,
            // before DeepSeek-V3's sigmoid-routed experts beside shared ones.
            "exaone_moe" => LlamaLike {
                model_type: "exaone_moe",
                required: "hidden_size, intermediate_size, moe_intermediate_size, \
                           num_hidden_layers, num_attention_heads, vocab_size, num_experts, \
                           num_experts_per_tok",
                positions: 2048,
                rms_eps: 1e-5,
                experts: Some((
                    "num_experts",
                    "num_experts_per_tok",
                    "moe_intermediate_size",
                )),
                ..LlamaLike::of("deepseek_v3")?
            },
            // transformers' Glm4MoeLiteConfig defaults (GLM-4.7-Flash): DeepSeek-V3's latent
            // attention before GLM-4.5's experts (its sigmoid router, a shared expert), the
            // layers `mlp_layer_types` calls dense (default the first) a SwiGLU.
            "glm4_moe_lite" => LlamaLike {
                model_type: "glm4_moe_lite",
                positions: 202752,
                rms_eps: 1e-5,
                ..LlamaLike::of("deepseek_v3")?
            },
            // transformers' Dots1Config defaults (dots.llm1): Qwen3's attention (per-head q/k
            // norms) before DeepSeek-V3's sigmoid-routed experts and shared experts, behind
            // first_k_dense_replace dense layers.
            "dots1" => LlamaLike {
                model_type: "dots1",
                positions: 2048,
                rms_eps: 1e-6,
                rope_theta: 10000.0,
                ..LlamaLike::of("deepseek_v3")?
            },
            // transformers' MiniMaxM2Config defaults (MiniMax-M2): Mixtral's block and experts
            // behind a sigmoid router, whole-projection q/k norms, part of each head rotated
            // (`minimax.rs`).
            "minimax_m2" => LlamaLike {
                model_type: "minimax_m2",
                positions: 196608,
                rms_eps: 1e-6,
                rope_theta: 5e6,
                ..LlamaLike::of("mixtral")?
            },
            // transformers' GptOssConfig defaults (gpt-oss-120b): Llama's attention with
            // biases and a sink logit per head, half the layers in a sliding window
            // (`window.rs`), then routed experts with
            // biases and a clamped SwiGLU behind a biased router.
            "gpt_oss" => LlamaLike {
                model_type: "gpt_oss",
                positions: 131072,
                rms_eps: 1e-5,
                rope_theta: 150000.0,
                ..LlamaLike::of("mixtral")?
            },
            // transformers' Llama4TextConfig defaults (Llama 4 Scout): Llama's attention with
            // chunks, NoPE layers, q/k L2 norms and the attention temperature (`llama4.rs`),
            // and a top-1 sigmoid router weighing its experts' inputs beside a shared expert.
            // Mixtral's fields and defaults but the rotary base.
            "llama4_text" => LlamaLike {
                model_type: "llama4_text",
                rope_theta: 500000.0,
                ..LlamaLike::of("mixtral")?
            },
            _ => return None,
        })
    }

    /// How the family's block departs from Llama's, read from the config where it is a field.
    fn variant(&self, f: &Fields<'_>) -> Result<Variant, ConfigError> {
        let t = self.model_type;
        let layernorm_family = layernorm::MODEL_TYPES.contains(&t);
        let block = if layernorm_family {
            Some(layernorm::block(f)?)
        } else {
            activation::check_llama(f, t)?;
            None
        };
        let qwen3 = matches!(t, "qwen3" | "qwen3_moe");
        // Qwen3's attention (per-head q/k norms) with hidden / heads heads by default.
        let qwen3_attention = qwen3 || t == "dots1";
        let gemma = matches!(t, "gemma" | "gemma2" | "gemma3_text" | "vaultgemma");
        // Gemma 2's sandwich norms and query scale; Gemma 3 keeps them.
        let gemma2_block = matches!(t, "gemma2" | "gemma3_text");
        // Gemma 2's attention (soft-caps, query scale), VaultGemma's without its sandwich.
        let gemma2_attention = gemma2_block || t == "vaultgemma";
        // DeepSeek's latent attention: V2's and V3's, GLM-4.7-Flash's.
        let deepseek = matches!(t, "deepseek_v2" | "deepseek_v3" | "glm4_moe_lite");
        let glm = matches!(t, "glm" | "glm4" | "glm4_moe");
        let cohere = matches!(t, "cohere" | "cohere2");
        let mla = if deepseek { Some(mla(f, t)?) } else { None };
        let layers = f.positive("num_hidden_layers")?;
        let nope = nope::nope_layers(f, layers)?;
        // Each layer's NoPE flag (all rotate where none is listed).
        let nope_list = nope
            .clone()
            .unwrap_or_else(|| vec![false; usize::try_from(layers.min(MAX_LAYERS)).unwrap_or(0)]);
        // transformers' configs honour an explicit `head_dim` (Mistral-Nemo: 128 with hidden
        // 5120 and 32 heads); plait records it where it is not hidden / heads.
        let implied = f.positive("hidden_size")? / f.positive("num_attention_heads")?.max(1);
        let head_dim = match f.opt_positive("head_dim")? {
            // MLA's query/key heads are `qk_nope_head_dim + qk_rope_head_dim` wide whatever
            // `head_dim` says (transformers sets it to the rotary part).
            _ if mla.is_some() => mla.map(|m| m.qk_head_dim()),
            // Cohere2Config sets head_dim to hidden / heads whatever the file says.
            _ if t == "cohere2" => None,
            Some(d) => Some(d),
            // transformers' defaults: Qwen3, GLM-4, Seed-OSS, ERNIE 4.5 and Helium 128, Gemma 256,
            // gpt-oss 64.
            None if qwen3 || matches!(t, "glm" | "glm4" | "seed_oss" | "ernie4_5" | "helium") => {
                Some(128)
            }
            None if gemma => Some(256),
            None if t == "gpt_oss" => Some(64),
            None if t == "minimax_m2" => Some(minimax::HEAD_DIM),
            None => None,
        };
        if matches!(t, "ernie4_5" | "ernie4_5_moe") {
            ernie_bias_free(f)?;
        }
        let minimax = t == "minimax_m2";
        if minimax {
            minimax::check_unbuilt(f)?;
        }
        let (minimax_qk_norm, minimax_whole) = if minimax {
            minimax::qk_norm(f)?
        } else {
            (false, false)
        };
        Ok(Variant {
            model_type: (!matches!(t, "llama" | "mixtral")).then(|| t.to_string()),
            head_dim: head_dim.filter(|&d| d != implied),
            qkv_bias: match &block {
                Some(b) => b.qkv_bias,
                // Glm4Config's, SeedOssConfig's and GptOssConfig's attention_bias default
                // to true.
                None if matches!(t, "glm" | "glm4" | "seed_oss" | "gpt_oss") => {
                    f.opt_bool("attention_bias")?.unwrap_or(true)
                }
                None => matches!(t, "qwen2" | "qwen2_moe") || attention_bias(f, t)?,
            },
            // GLM-4.5's `attention_bias` is on q, k and v; its o_proj has none.
            o_bias: match &block {
                Some(b) => b.o_bias,
                // Seed-OSS biases o_proj by its own switch.
                None if t == "seed_oss" => f.opt_bool("attention_out_bias")?.unwrap_or(false),
                None if t == "gpt_oss" => f.opt_bool("attention_bias")?.unwrap_or(true),
                // Helium's o_proj has no bias whatever attention_bias says.
                None => !glm && t != "helium" && attention_bias(f, t)?,
            },
            qk_norm: qwen3_attention
                || t == "hunyuan_v1_dense"
                || matches!(
                    t,
                    "gemma3_text"
                        | "olmo2"
                        | "olmo3"
                        | "olmoe"
                        | "flex_olmo"
                        | "exaone4"
                        | "exaone_moe"
                )
                || (t == "glm4_moe" && f.opt_bool("use_qk_norm")?.unwrap_or(false))
                || minimax_qk_norm,
            qk_norm_whole: matches!(t, "olmo2" | "olmo3" | "olmoe" | "flex_olmo") || minimax_whole,
            qk_norm_after_rotary: t == "hunyuan_v1_dense",
            gelu_gate: gemma,
            embed_scale: gemma,
            sandwich_norms: gemma2_block || t == "glm4",
            // Gemma 2's soft-caps are on unless set to null; Gemma 3's off unless set.
            attn_softcap: match t {
                "gemma2" | "vaultgemma" => f.float_or_off("attn_logit_softcapping", 50.0)?,
                "gemma3_text" => f.opt_float("attn_logit_softcapping")?,
                _ => None,
            },
            final_softcap: match t {
                "gemma2" | "vaultgemma" => f.float_or_off("final_logit_softcapping", 30.0)?,
                "nanochat" => f.float_or_off("final_logit_softcapping", 15.0)?,
                "gemma3_text" => f.opt_float("final_logit_softcapping")?,
                _ => None,
            },
            query_scale: if gemma2_attention {
                f.opt_float("query_pre_attn_scalar")?.or(Some(256.0))
            } else {
                None
            },
            shared_expert_ffn: match t {
                "qwen2_moe" => f.opt_positive("shared_expert_intermediate_size")?,
                // transformers: one MLP of moe_intermediate_size × n_shared_experts.
                "deepseek_v2" | "deepseek_v3" | "dots1" => {
                    match f.opt_positive("n_shared_experts")? {
                        Some(n) => Some(n * f.positive("moe_intermediate_size")?),
                        None => None,
                    }
                }
                // Glm4MoeConfig's and Glm4MoeLiteConfig's n_shared_experts default to 1.
                "glm4_moe" | "glm4_moe_lite" => Some(
                    f.opt_positive("n_shared_experts")?.unwrap_or(1)
                        * f.positive("moe_intermediate_size")?,
                ),
                // Llama 4's shared expert is an MLP of intermediate_size, as each expert.
                "llama4_text" => Some(f.positive("intermediate_size")?),
                // moe_num_shared_experts (Ernie4_5_MoeConfig's default 2) MLPs as one.
                "ernie4_5_moe" => match f.opt_count("moe_num_shared_experts")?.unwrap_or(2) {
                    0 => None,
                    n => Some(n * f.positive("moe_intermediate_size")?),
                },
                // num_shared_experts (ExaoneMoeConfig's default 1) MLPs as one.
                "exaone_moe" => match f.opt_count("num_shared_experts")?.unwrap_or(1) {
                    0 => None,
                    n => Some(n * f.positive("moe_intermediate_size")?),
                },
                // GraniteMoeSharedConfig's shared_intermediate_size 0 (its default) means none.
                "granitemoeshared" => f.opt_count("shared_intermediate_size")?.filter(|&n| n > 0),
                _ => None,
            },
            shared_expert_gate: t == "qwen2_moe",
            routing: moe::routing(f, t)?,
            routed_scale: match t {
                "deepseek_v3" => Some(f.opt_float("routed_scaling_factor")?.unwrap_or(2.5)),
                "exaone_moe" => {
                    Some(f.opt_float("routed_scaling_factor")?.unwrap_or(2.5)).filter(|&x| x != 1.0)
                }
                "glm4_moe_lite" => f
                    .opt_float("routed_scaling_factor")?
                    .or(Some(1.8))
                    .filter(|&x| x != 1.0),
                // DeepseekV2Config's and Glm4MoeConfig's default 1.0 scales nothing.
                "deepseek_v2" | "glm4_moe" | "dots1" => {
                    f.opt_float("routed_scaling_factor")?.filter(|&x| x != 1.0)
                }
                _ => None,
            },
            dense_layers: match t {
                "deepseek_v2" => moe::deepseek_dense_layers(f, 0)?,
                "deepseek_v3" => moe::deepseek_dense_layers(f, 3)?,
                "glm4_moe" => moe::leading_dense_layers(f, 1)?,
                "glm4_moe_lite" | "exaone_moe" => moe::mlp_layer_types(f, layers)?,
                "dots1" => moe::leading_dense_layers(f, 0)?,
                "qwen2_moe" | "qwen3_moe" => moe::qwen_dense_layers(f)?,
                "ernie4_5_moe" if layers <= MAX_LAYERS => moe::ernie_dense_layers(f, layers)?,
                "llama4_text" if layers <= MAX_LAYERS => llama4::dense_layers(f, layers)?,
                _ => None,
            },
            mla,
            ungated_mlp: match &block {
                Some(b) => b.mlp,
                None => {
                    matches!(t, "nemotron" | "arcee" | "nanochat").then_some(Ungated::SquaredRelu)
                }
            },
            mlp_bias: block.as_ref().is_some_and(|b| b.mlp_bias),
            parallel: match &block {
                Some(b) => b.parallel,
                None => cohere.then_some(crate::spec::ParallelNorms::Shared),
            },
            head_bias: block.as_ref().is_some_and(|b| b.head_bias),
            layer_norm: t == "nemotron" || layernorm_family,
            post_norms: matches!(t, "olmo2" | "olmo3" | "exaone4" | "flex_olmo"),
            multipliers: if matches!(t, "granite" | "granitemoe" | "granitemoeshared") {
                Some(granite_multipliers(f)?)
            } else {
                None
            },
            bias_free_layer_norm: cohere,
            weightless_norms: t == "olmo",
            weightless_rms_norms: t == "nanochat",
            embed_norm: t == "nanochat",
            clip_qkv: clip_qkv(f, t)?,
            logit_scale: if cohere { cohere_logit_scale(f)? } else { None },
            attention_sinks: t == "gpt_oss",
            router_bias: t == "gpt_oss",
            sliding_window: window::sliding_window(f, f.positive("num_hidden_layers")?)?,
            local_rope: window::local_rope(
                f,
                self.rope_theta(f)?,
                f.positive("num_hidden_layers")?,
            )?,
            nope: nope.clone(),
            chunked_attention: match t {
                "llama4_text" => llama4::chunked_attention(f, &nope_list)?,
                _ => None,
            },
            qk_l2_norm: match t {
                "llama4_text" => llama4::qk_l2_norm(f, &nope_list)?,
                // NanoChat's q_norm and k_norm: Llama 4's norm on every layer.
                "nanochat" => Some(vec![true; nope_list.len()]),
                _ => None,
            },
            attn_temperature: match t {
                "llama4_text" => llama4::temperature(f)?,
                _ => None,
            },
            expert_form: match t {
                "gpt_oss" => moe::gpt_oss_experts(f)?,
                "llama4_text" => ir::ExpertForm {
                    scales_input: true,
                    ..ir::ExpertForm::SWIGLU
                },
                _ => ir::ExpertForm::SWIGLU,
            },
            rotary_dims: match t {
                "nemotron" => partial_rotary_dims(f, head_dim.unwrap_or(implied), 0.5)?,
                "phi3" => partial_rotary_dims(f, head_dim.unwrap_or(implied), 1.0)?,
                "glm" | "glm4" | "glm4_moe" => {
                    partial_rotary_dims(f, head_dim.unwrap_or(implied), 0.5)?
                }
                "minimax_m2" => minimax::rotary_dims(f, head_dim.unwrap_or(implied))?,
                _ if layernorm_family => {
                    let share = layernorm::rotary_share(f)?;
                    rotary_dims(f, head_dim.unwrap_or(implied), share)?
                }
                _ => None,
            },
        })
    }
}

/// ERNIE 4.5's `use_bias` (biases on every projection, the MoE's head too) is refused: plait
/// builds its projections without them, as every published ERNIE 4.5 config has them.
fn ernie_bias_free(f: &Fields<'_>) -> Result<(), ConfigError> {
    if f.opt_bool("use_bias")?.unwrap_or(false) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: "use_bias = true: plait builds ERNIE 4.5's projections without biases; set \
                     it to false (as the published ERNIE 4.5 configs do)"
                .into(),
        });
    }
    Ok(())
}

/// OLMo's and OLMoE's `clip_qkv`: q, k and v clamped to ±it (null, their default: none). A
/// limit that is not positive would clamp everything to a point or nothing.
fn clip_qkv(f: &Fields<'_>, t: &str) -> Result<Option<f64>, ConfigError> {
    if !matches!(t, "olmo" | "olmoe") {
        return Ok(None);
    }
    let Some(limit) = f.opt_float("clip_qkv")? else {
        return Ok(None);
    };
    if !(limit > 0.0 && limit.is_finite()) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "clip_qkv = {limit}: q, k and v are clamped to ±clip_qkv, which must be a \
                 positive number (or null for no clamp)"
            ),
        });
    }
    Ok(Some(limit))
}

/// Cohere's `logit_scale` (CohereConfig's and Cohere2Config's default 0.0625; none where it
/// is 1). Cohere's per-head q/k LayerNorms (`use_qk_norm`, Command R+) are refused: plait does
/// not build them (Cohere2 has none).
fn cohere_logit_scale(f: &Fields<'_>) -> Result<Option<f64>, ConfigError> {
    if f.model_type == "cohere" && f.opt_bool("use_qk_norm")?.unwrap_or(false) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: "use_qk_norm = true: plait builds Cohere's attention without its per-head \
                     q and k LayerNorms (Command R+'s); set it to false (as Command R and Aya \
                     do)"
            .into(),
        });
    }
    let scale = f.opt_float("logit_scale")?.unwrap_or(0.0625);
    Ok((scale != 1.0).then_some(scale))
}

/// Granite's multipliers (each 1 unless the config sets it, as `GraniteConfig`).
fn granite_multipliers(f: &Fields<'_>) -> Result<crate::spec::Multipliers, ConfigError> {
    let or_one = |field| Ok::<f64, ConfigError>(f.opt_float(field)?.unwrap_or(1.0));
    Ok(crate::spec::Multipliers {
        embedding: or_one("embedding_multiplier")?,
        residual: or_one("residual_multiplier")?,
        attention: or_one("attention_multiplier")?,
        logits: or_one("logits_scaling")?,
    })
}

/// DeepSeek-V3's multi-head latent attention, with transformers' defaults. Refuses attention
/// biases (plait builds MLA without them).
fn mla(f: &Fields<'_>, model_type: &str) -> Result<Mla, ConfigError> {
    if f.opt_bool("attention_bias")?.unwrap_or(false) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: "attention_bias = true: plait builds DeepSeek's latent attention without \
                     biases; set it to false (as the published DeepSeek-V2, V3 and \
                     GLM-4.7-Flash configs do)"
                .into(),
        });
    }
    let or = |field, default| -> Result<u64, ConfigError> {
        Ok(f.opt_positive(field)?.unwrap_or(default))
    };
    // transformers' defaults: DeepseekV3Config's (V2's the same where plait reads them),
    // Glm4MoeLiteConfig's narrower query rank and wider heads.
    let (q_rank, nope_dim, v_dim) = match model_type {
        "glm4_moe_lite" => (768, 192, 256),
        _ => (1536, 128, 128),
    };
    // `q_lora_rank: null` (DeepSeek-V2-Lite) means one q_proj.
    let q_lora_rank = match f.obj.get("q_lora_rank") {
        Some(Value::Null) => None,
        _ => Some(or("q_lora_rank", q_rank)?),
    };
    let (nope, rope) = (
        or("qk_nope_head_dim", nope_dim)?,
        or("qk_rope_head_dim", 64)?,
    );
    if !rope.is_multiple_of(2) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "qk_rope_head_dim = {rope} is odd: rotary embeddings need an even head size"
            ),
        });
    }
    Ok(Mla {
        q_lora_rank,
        kv_lora_rank: or("kv_lora_rank", 512)?,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
        v_head_dim: or("v_head_dim", v_dim)?,
        scale: ((nope + rope) as f64).powf(-0.5) * yarn_mscale(f.obj).powi(2),
    })
}

/// YaRN's attention factor as DeepSeek-V3 applies it to the softmax scale: with `rope_scaling`
/// of type yarn and `mscale_all_dim` m, 0.1·m·ln(factor) + 1 (transformers'
/// `yarn_get_mscale`); 1 otherwise.
fn yarn_mscale(obj: &Map<String, Value>) -> f64 {
    let Some(Value::Object(r)) = obj.get("rope_scaling") else {
        return 1.0;
    };
    let num = |k: &str| r.get(k).and_then(Value::as_f64);
    let kind = r.get("type").or_else(|| r.get("rope_type"));
    match (
        kind.and_then(Value::as_str),
        num("mscale_all_dim"),
        num("factor"),
    ) {
        (Some("yarn"), Some(m), Some(factor)) if m > 0.0 && factor > 1.0 => {
            0.1 * m * factor.ln() + 1.0
        }
        _ => 1.0,
    }
}

/// Whether `attention_bias` puts biases on q, k, v and o: transformers reads it for Llama,
/// Qwen3, OLMo 2, Granite, Gemma and Nemotron, and builds Mistral's, Mixtral's, Phi-3's,
/// Qwen2's and DeepSeek's attention projections with their own fixed biases whatever it says.
fn attention_bias(f: &Fields<'_>, model_type: &str) -> Result<bool, ConfigError> {
    let read = !matches!(
        model_type,
        "mistral"
            | "ministral"
            | "mixtral"
            | "phi3"
            | "qwen2"
            | "qwen2_moe"
            | "deepseek_v2"
            | "deepseek_v3"
    );
    Ok(read && f.opt_bool("attention_bias")?.unwrap_or(false))
}

/// The rotary width of a head turned only in part (Nemotron, whose transformers default is
/// 0.5; Phi-3 and Phi-4-mini, 1.0): `partial_rotary_factor` of it, `None` when that is the whole
/// head.
fn partial_rotary_dims(
    f: &Fields<'_>,
    head_dim: u64,
    default_factor: f64,
) -> Result<Option<u64>, ConfigError> {
    let factor = f
        .opt_float("partial_rotary_factor")?
        .unwrap_or(default_factor);
    rotary_dims(f, head_dim, ("partial_rotary_factor", factor))
}

/// The rotary width of a head of `head_dim` turned by the share `field` gives; `None` for
/// the whole head.
fn rotary_dims(
    f: &Fields<'_>,
    head_dim: u64,
    (field, factor): (&str, f64),
) -> Result<Option<u64>, ConfigError> {
    // transformers: int(head_dim * partial_rotary_factor).
    let dims = (head_dim as f64 * factor) as u64;
    if dims == 0 || dims > head_dim || !dims.is_multiple_of(2) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "{field} = {factor} gives {dims} rotary dimensions of a head of {head_dim}: it \
                 must be an even number from 2 to the head size"
            ),
        });
    }
    Ok((dims < head_dim).then_some(dims))
}

impl LlamaLike {
    /// The config field of the norms' epsilon; `None` where it is fixed (OlmoLayerNorm's
    /// 1e-5, whatever the config says).
    fn eps_field(&self) -> Option<&'static str> {
        Some(match self.model_type {
            "olmo" => return None,
            "nemotron" => "norm_eps",
            "gpt_neox" | "phi" | "stablelm" => "layer_norm_eps",
            "starcoder2" => "norm_epsilon",
            "falcon" => "layer_norm_epsilon",
            "cohere" | "cohere2" => "layer_norm_eps",
            _ => "rms_norm_eps",
        })
    }

    /// The dropout after attention and after the MLP: Seed-OSS's `residual_dropout` (its
    /// transformers default 0.1); none elsewhere.
    fn residual_dropout(&self, f: &Fields<'_>) -> Result<f64, ConfigError> {
        if self.model_type != "seed_oss" {
            return Ok(0.0);
        }
        Ok(f.opt_probability("residual_dropout")?.unwrap_or(0.1))
    }

    /// The config's rope scaling; gpt-oss's where its config names none (GptOssConfig's
    /// default: YaRN ×32 over 4096 positions, untruncated).
    fn rope_scaling(
        &self,
        f: &Fields<'_>,
        max_positions: u64,
    ) -> Result<ir::RopeScaling, ConfigError> {
        if self.model_type == "hunyuan_v1_dense" && rope::ntk_alpha(f)?.is_some() {
            // The alpha changes the base only (`rope_theta`).
            return Ok(ir::RopeScaling::None);
        }
        if self.model_type == "gpt_oss" && !f.obj.contains_key("rope_scaling") {
            return Ok(ir::RopeScaling::Yarn {
                factor: 32.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max: 4096.0,
                attention_factor: ir::rope::yarn_mscale(32.0, 1.0),
                truncate: false,
            });
        }
        rope::rope_scaling(f, max_positions)
    }

    /// The rotary base: `rope_theta`, or GPT-NeoX's older `rotary_emb_base`; Hunyuan's raised
    /// by its NTK alpha ([`rope::ntk_alpha`]).
    fn rope_theta(&self, f: &Fields<'_>) -> Result<f64, ConfigError> {
        let mut theta = f.opt_rope_base("rope_theta")?;
        if self.model_type == "gpt_neox" && theta.is_none() {
            theta = f.opt_rope_base("rotary_emb_base")?;
        }
        let theta = theta.unwrap_or(self.rope_theta);
        if self.model_type == "hunyuan_v1_dense"
            && let Some(alpha) = rope::ntk_alpha(f)?
        {
            // HunYuanDenseV1RotaryEmbedding: base · alpha^(d / (d − 2)) over a head of d.
            let implied = f.positive("hidden_size")? / f.positive("num_attention_heads")?.max(1);
            let d = f.opt_positive("head_dim")?.unwrap_or(implied) as f64;
            return Ok(theta * alpha.powf(d / (d - 2.0)));
        }
        Ok(theta)
    }
}

/// Reads and interprets a `config.json` file.
pub fn read_config(path: &Path) -> Result<ModelSpec, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    parse_config(&text, path)
}

/// Interprets the text of a `config.json`; `file` is used in messages and for the model name.
pub fn parse_config(text: &str, file: &Path) -> Result<ModelSpec, ConfigError> {
    // A byte-order mark some Windows editors write before the JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
        file: file.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: strip_position(&e.to_string()),
    })?;
    let obj = match value {
        Value::Object(m) => m,
        other => {
            return Err(ConfigError::NotAnObject {
                file: file.to_path_buf(),
                found: json_kind(&other),
            });
        }
    };
    let supported = SUPPORTED_MODEL_TYPES.join(", ");
    let model_type = match obj.get("model_type") {
        None | Some(Value::Null) => {
            return Err(ConfigError::MissingModelType {
                file: file.to_path_buf(),
                supported,
            });
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(ConfigError::WrongType {
                file: file.to_path_buf(),
                field: "model_type",
                expected: "a string",
                got: other.to_string(),
            });
        }
    };
    let multimodal = text_model::text_model_type(&model_type).is_some();
    // Where its text model's fields are nested (not at the top: Qwen2-VL's first configs).
    let nested = multimodal && matches!(obj.get("text_config"), Some(Value::Object(_)));
    let (obj, model_type) =
        text_model::text_model(obj, &model_type).map_err(|field| ConfigError::Inconsistent {
            file: file.to_path_buf(),
            reason: format!(
                "model_type \"{model_type}\" is a multimodal config: plait plans its language \
                 model from `{field}`, which is missing or not an object"
            ),
        })?;
    let obj = if model_type == "falcon" {
        layernorm::falcon_aliases(obj)
    } else {
        obj
    };
    let name = model_name(file);
    // A multimodal config's fields are its text_config's: messages name the section.
    let section = if nested {
        PathBuf::from(format!("{}: text_config", file.display()))
    } else {
        file.to_path_buf()
    };
    let obj = rope_parameters::as_v4_fields(obj, &section)?;
    let fields = Fields {
        obj: &obj,
        file: section,
        model_type: "",
        required: "",
    };
    let spec = match model_type.as_str() {
        "gpt2" => gpt2(
            Fields {
                model_type: "gpt2",
                required: "n_layer, n_embd, n_head, vocab_size, n_positions",
                ..fields
            },
            name,
        )?,
        other => match LlamaLike::of(other) {
            Some(kind) => llama(
                Fields {
                    model_type: kind.model_type,
                    required: kind.required,
                    ..fields
                },
                name,
                &kind,
            )?,
            None => {
                return Err(ConfigError::UnsupportedModelType {
                    file: file.to_path_buf(),
                    lacking: unsupported::lacks(&model_type),
                    model_type,
                    supported,
                });
            }
        },
    };
    check_consistent(&spec, file)?;
    Ok(spec)
}

fn gpt2(f: Fields<'_>, name: String) -> Result<ModelSpec, ConfigError> {
    activation::check_gpt2(&f)?;
    checks::unbuilt_fields(&f, f.positive("n_layer")?)?;
    let hidden = f.positive("n_embd")?;
    Ok(ModelSpec {
        name,
        family: Family::Gpt2,
        layers: f.positive("n_layer")?,
        hidden,
        heads: f.positive("n_head")?,
        kv_heads: f.positive("n_head")?,
        ffn: f.opt_positive("n_inner")?.unwrap_or(4 * hidden),
        vocab: f.vocabulary()?,
        max_positions: f.positive("n_positions")?,
        tied_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(true),
        norm_eps: f.opt_epsilon("layer_norm_epsilon")?.unwrap_or(1e-5),
        rope_theta: 0.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: crate::spec::default_seq(f.positive("n_positions")?),
        // GPT2Config defaults: embd_pdrop = resid_pdrop = 0.1.
        dropout: f.opt_probability("resid_pdrop")?.unwrap_or(0.1),
        variant: Variant::default(),
    })
}

fn llama(f: Fields<'_>, name: String, kind: &LlamaLike) -> Result<ModelSpec, ConfigError> {
    let layers = f.positive("num_hidden_layers")?;
    checks::unbuilt_fields(&f, layers)?;
    let heads = f.positive("num_attention_heads")?;
    let max_positions = f
        .opt_positive("max_position_embeddings")?
        .unwrap_or(kind.positions);
    let hidden = f.positive("hidden_size")?;
    let variant = kind.variant(&f)?;
    let (experts, experts_per_token, ffn) = match kind.experts {
        Some((count, per_token, width)) => (
            f.positive(count)?,
            f.positive(per_token)?,
            f.positive(width)?,
        ),
        // FalconConfig: ffn_hidden_size, 4 × hidden when absent.
        None if kind.model_type == "falcon" => {
            let ffn = f.opt_positive("ffn_hidden_size")?;
            (0, 0, ffn.unwrap_or(4 * hidden))
        }
        None => (0, 0, f.positive("intermediate_size")?),
    };
    let kv_heads = if kind.model_type == "falcon" {
        layernorm::falcon_kv_heads(&f, heads)?
    } else if kind.model_type == "minimax_m2" {
        f.opt_positive("num_key_value_heads")?
            .unwrap_or(minimax::KV_HEADS)
    } else {
        f.opt_positive("num_key_value_heads")?.unwrap_or(heads)
    };
    Ok(ModelSpec {
        name,
        family: kind.family,
        layers,
        hidden,
        heads,
        kv_heads,
        ffn,
        vocab: f.vocabulary()?,
        max_positions,
        tied_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(kind.tied),
        norm_eps: match kind.eps_field() {
            Some(field) => f.opt_epsilon(field)?.unwrap_or(kind.rms_eps),
            None => kind.rms_eps,
        },
        rope_theta: kind.rope_theta(&f)?,
        rope_scaling: kind.rope_scaling(&f, max_positions)?,
        experts,
        experts_per_token,
        default_seq: crate::spec::default_seq(max_positions),
        dropout: kind.residual_dropout(&f)?,
        variant,
    })
}

/// What a config asks for that plait models more simply, one sentence each (`plait inspect`
/// prints them): a rope scaling plait does not compute (longrope) as plain rotary embeddings.
pub fn approximations(text: &str) -> Vec<String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    let model_type = obj
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let multimodal = text_model::text_model_type(&model_type).is_some();
    // The object the model is read from, with its family's defaults filled in.
    let Ok((text, _)) = text_model::text_model(obj, &model_type) else {
        return Vec::new();
    };
    let Ok(text) = rope_parameters::as_v4_fields(text, Path::new("config.json")) else {
        return Vec::new();
    };
    let mut notes = Vec::new();
    if multimodal {
        notes.push(format!(
            "{model_type} is a multimodal config: plait plans its language model \
             (text_config, or its top-level text fields); the vision tower (vision_config) is \
             not built or counted"
        ));
    }
    notes.extend(object_approximations(&text));
    notes
}

/// [`approximations`] of one (text) model's config object.
fn object_approximations(obj: &Map<String, Value>) -> Vec<String> {
    let mut notes = Vec::new();
    if obj.get("model_type") == Some(&Value::String("phi3".into())) {
        notes.push(
            "Phi-3's fused qkv_proj and gate_up_proj are built as separate projections (the \
             same parameters and FLOPs, three and two GEMMs instead of one each)"
                .to_string(),
        );
    }
    if obj.get("model_type") == Some(&Value::String("nemotron".into())) {
        notes.push(
            "Nemotron's LayerNorm1P (weight + 1) is built as a LayerNorm whose weight starts at \
             one (the same parameters, FLOPs and gradients; a Hugging Face checkpoint's weights \
             load with 1 added)"
                .to_string(),
        );
    }
    if matches!(
        obj.get("model_type").and_then(Value::as_str),
        Some("cohere" | "cohere2")
    ) {
        notes.extend(COHERE_APPROXIMATIONS.map(String::from));
    }
    if obj.get("model_type") == Some(&Value::String("seed_oss".into())) {
        notes.extend(seed_oss_approximations(obj));
    }
    if obj.get("model_type") == Some(&Value::String("llama4_text".into())) {
        notes.push(LLAMA4_ROTARY.to_string());
    }
    if matches!(
        obj.get("model_type").and_then(Value::as_str),
        Some("glm" | "glm4")
    ) {
        notes.extend(GLM4_APPROXIMATIONS.map(String::from));
    }
    if matches!(
        obj.get("model_type").and_then(Value::as_str),
        Some("ernie4_5" | "ernie4_5_moe")
    ) {
        notes.push(ERNIE_ROTARY.to_string());
    }
    if obj.get("model_type") == Some(&Value::String("helium".into())) {
        notes.push(ERNIE_ROTARY.replace("ERNIE 4.5", "Helium"));
    }
    if obj.get("model_type") == Some(&Value::String("ernie4_5_moe".into())) {
        notes.push(ZERO_CORRECTION_BIAS.replace("DeepSeek-V3", "ERNIE 4.5"));
        notes.extend(unbuilt_prediction_layers(obj));
    }
    if obj.get("model_type") == Some(&Value::String("deepseek_v3".into())) {
        notes.extend(deepseek_v3_approximations(obj));
    }
    if obj.get("model_type") == Some(&Value::String("exaone_moe".into())) {
        notes.push(ZERO_CORRECTION_BIAS.replace("DeepSeek-V3", "K-EXAONE"));
        notes.extend(unbuilt_prediction_layers(obj));
    }
    if obj.get("model_type") == Some(&Value::String("dots1".into())) {
        notes.push(ZERO_CORRECTION_BIAS.replace("DeepSeek-V3", "dots.llm1"));
    }
    if obj.get("model_type") == Some(&Value::String("glm4_moe".into())) {
        notes.push(ZERO_CORRECTION_BIAS.replace("DeepSeek-V3", "GLM-4.5"));
        notes.extend(unbuilt_prediction_layers(obj));
    }
    if obj.get("model_type") == Some(&Value::String("glm4_moe_lite".into())) {
        notes.extend(
            deepseek_v3_approximations(obj)
                .into_iter()
                .map(|n| n.replace("DeepSeek-V3", "GLM-4.7-Flash")),
        );
    }
    if obj.get("model_type") == Some(&Value::String("nanochat".into())) {
        notes.push(
            "NanoChat's rotary turns each pair of dimensions the other way (its rotate_half is \
             (x2, −x1)): built in Llama's convention, which equals it with the second half of \
             each head of q_proj and k_proj negated (the same scores, shapes and FLOPs)"
                .to_string(),
        );
    }
    if obj.get("model_type") == Some(&Value::String("minimax_m2".into())) {
        notes.push(ZERO_CORRECTION_BIAS.replace("DeepSeek-V3", "MiniMax-M2"));
        notes.extend(minimax::unbuilt_prediction_modules(obj));
    }
    if obj.get("model_type") == Some(&Value::String("deepseek_v2".into())) {
        notes.extend(deepseek_v2_approximations(obj));
    }
    notes.extend(layernorm::notes(obj));
    notes.extend(rope::note(obj));
    notes.extend(moe::unused_expert_notes(obj));
    notes
}

/// How plait's Cohere departs from transformers' `CohereForCausalLM`.
const COHERE_APPROXIMATIONS: [&str; 1] = [
    "Cohere's rotary dimensions are paired in the rotate-half convention, not transformers' \
     interleaved pairs (a fixed permutation of the columns of q_proj and k_proj; the same \
     shapes and FLOPs)",
];

/// How plait's Llama 4 departs from transformers' `Llama4TextAttention`.
const LLAMA4_ROTARY: &str = "Llama 4's rotary dimensions are paired in the rotate-half \
     convention, not transformers' interleaved complex pairs (a fixed permutation of the columns \
     of q_proj and k_proj; the same shapes and FLOPs)";

/// How plait's ERNIE 4.5 departs from transformers' `Ernie4_5Attention`.
const ERNIE_ROTARY: &str = "ERNIE 4.5's rotary dimensions are paired in the rotate-half \
     convention, not transformers' interleaved pairs (a fixed permutation of the columns of \
     q_proj and k_proj; the same shapes and FLOPs)";

/// How plait's Seed-OSS departs from transformers' `SeedOssForCausalLM`: the dropout of its
/// attention probabilities (`attention_dropout`, default 0.1) is not built.
fn seed_oss_approximations(obj: &Map<String, Value>) -> Option<String> {
    let p = match obj.get("attention_dropout") {
        None => 0.1,
        Some(v) => v.as_f64().filter(|&p| p > 0.0)?,
    };
    Some(format!(
        "Seed-OSS's attention_dropout {p} is not built: plait's fused attention keeps no \
         probabilities to drop (its residual_dropout after attention and the MLP is built)"
    ))
}

/// How plait's GLM-4 departs from transformers' `Glm4ForCausalLM`.
const GLM4_APPROXIMATIONS: [&str; 2] = [
    "GLM-4's fused gate_up_proj is built as separate gate and up projections (the same \
     parameters and FLOPs, two GEMMs instead of one)",
    "GLM-4's rotary dimensions are paired in the rotate-half convention, not transformers' \
     interleaved pairs (a fixed permutation of the rotary columns of q_proj and k_proj; the \
     same shapes and FLOPs)",
];

/// The sigmoid router's load-balancing bias, as plait builds it.
const ZERO_CORRECTION_BIAS: &str = "DeepSeek-V3's e_score_correction_bias is held at zero: it \
     shifts which experts are chosen, not their weights, and transformers does not update it \
     in training (a checkpoint's bias is not loaded)";

/// How plait's DeepSeek-V3 departs from transformers' `DeepseekV3ForCausalLM`.
fn deepseek_v3_approximations(obj: &Map<String, Value>) -> Vec<String> {
    let mut notes = vec![ZERO_CORRECTION_BIAS.to_string()];
    if obj.get("rope_interleave") != Some(&Value::Bool(false)) {
        notes.push(
            "rope_interleave: the rotary dimensions are paired in the rotate-half convention \
             (a fixed permutation of the rotary columns of q_b_proj and kv_a_proj_with_mqa; \
             the same shapes and FLOPs)"
                .to_string(),
        );
    }
    notes.extend(unbuilt_prediction_layers(obj));
    notes
}

/// DeepSeek-V3's and GLM-4.5's multi-token prediction layers, which transformers does not
/// build.
fn unbuilt_prediction_layers(obj: &Map<String, Value>) -> Option<String> {
    let n = obj
        .get("num_nextn_predict_layers")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)?;
    Some(format!(
        "num_nextn_predict_layers {n}: the multi-token prediction module is not built (as in \
         transformers; its parameters are not counted)"
    ))
}

/// How plait's DeepSeek-V2 departs from transformers' `DeepseekV2ForCausalLM`.
fn deepseek_v2_approximations(obj: &Map<String, Value>) -> Vec<String> {
    let mut notes = vec![
        "DeepSeek-V2's rotary dimensions are paired in the rotate-half convention, not \
         transformers' interleaved complex pairs (a fixed permutation of the rotary columns of \
         the query projection and kv_a_proj_with_mqa; the same shapes and FLOPs)"
            .to_string(),
    ];
    if obj.get("norm_topk_prob") == Some(&Value::Bool(true)) {
        notes.push(
            "norm_topk_prob: true is not applied: transformers' DeepseekV2Moe weighs the chosen \
             experts by their softmax shares as they are"
                .to_string(),
        );
    }
    let mscale = yarn_mscale(obj);
    if mscale != 1.0 {
        notes.push(format!(
            "the attention's softmax scale includes YaRN's mscale squared ({:.4}), as DeepSeek's \
             own modeling code and transformers' DeepSeek-V3 apply it (transformers' \
             DeepseekV2Attention leaves it out: the same shapes and FLOPs)",
            mscale * mscale
        ));
    }
    notes
}

/// The most layers a config may ask for. plait's IR holds every layer (a verifier checks
/// each against layer 0) and `compile` may lower a program of every layer, so a config of
/// 2^31 layers would build a graph of tens of GB before anything could say it is absurd; at
/// 10,000 layers of a narrow model `compile` takes about 27 s and 3.3 GB, and the deepest
/// published transformers have a few hundred.
pub const MAX_LAYERS: u64 = 10_000;

/// Checks the divisibility rules a transformer's shapes must obey.
fn check_consistent(s: &ModelSpec, file: &Path) -> Result<(), ConfigError> {
    let (heads_f, hidden_f, kv_f, layers_f) = match s.family {
        Family::Gpt2 => ("n_head", "n_embd", "n_head", "n_layer"),
        _ => (
            "num_attention_heads",
            "hidden_size",
            "num_key_value_heads",
            "num_hidden_layers",
        ),
    };
    let fail = |reason: String| {
        Err(ConfigError::Inconsistent {
            file: file.to_path_buf(),
            reason,
        })
    };
    if s.layers > MAX_LAYERS {
        return fail(format!(
            "{layers_f} = {} is more layers than plait builds (at most {MAX_LAYERS}); check the \
             field",
            s.layers
        ));
    }
    let params = s.param_count_f64();
    if params > crate::sizes::MAX_ELEMENTS as f64 {
        return fail(format!(
            "its sizes make {params:.3e} parameters, beyond the 2^50 plait plans for (a \
             thousand times the largest models trained); check {hidden_f}, {heads_f}, the \
             intermediate and vocabulary sizes and the expert count"
        ));
    }
    if s.variant.head_dim.is_none() && !s.hidden.is_multiple_of(s.heads) {
        return fail(format!(
            "{heads_f} = {} does not divide {hidden_f} = {}: the hidden size must be a multiple of the head count",
            s.heads, s.hidden
        ));
    }
    if !s.heads.is_multiple_of(s.kv_heads) {
        return fail(format!(
            "{kv_f} = {} does not divide {heads_f} = {}: grouped-query attention needs whole groups",
            s.kv_heads, s.heads
        ));
    }
    // Latent attention rotates only its qk_rope_head_dim columns, checked even by `mla`.
    if s.family != Family::Gpt2 && s.variant.mla.is_none() && !s.head_dim().is_multiple_of(2) {
        let source = match s.variant.head_dim {
            Some(_) => "head_dim".to_string(),
            None => format!("{hidden_f} / {heads_f}"),
        };
        return fail(format!(
            "head size {source} = {} is odd: rotary embeddings need an even head size",
            s.head_dim()
        ));
    }
    if s.family == Family::Mixtral && s.experts_per_token > s.experts {
        let experts_field = match s.variant.model_type.as_deref() {
            Some("deepseek_v2" | "deepseek_v3" | "dots1" | "glm4_moe_lite") => "n_routed_experts",
            Some("qwen2_moe" | "qwen3_moe" | "olmoe" | "flex_olmo" | "exaone_moe") => "num_experts",
            Some("ernie4_5_moe") => "moe_num_experts",
            _ => "num_local_experts",
        };
        let picked_field = match s.variant.model_type.as_deref() {
            Some("ernie4_5_moe") => "moe_k",
            _ => "num_experts_per_tok",
        };
        return fail(format!(
            "{picked_field} = {} exceeds {experts_field} = {}: a token picks at most every \
             expert",
            s.experts_per_token, s.experts
        ));
    }
    if s.family == Family::Mixtral {
        // n_group / topk_group (DeepSeek-V3) against the expert count and top-k.
        if let Err(rule) = s.variant.routing.check(s.experts, s.experts_per_token) {
            return fail(format!("the router's n_group / topk_group: {rule}"));
        }
    }
    Ok(())
}

/// Typed access to the fields of one config, with errors naming the field.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    file: PathBuf,
    model_type: &'static str,
    required: &'static str,
}

impl Fields<'_> {
    fn wrong(&self, field: &'static str, expected: &'static str, got: &Value) -> ConfigError {
        ConfigError::WrongType {
            file: self.file.clone(),
            field,
            expected,
            got: got.to_string(),
        }
    }

    fn positive(&self, field: &'static str) -> Result<u64, ConfigError> {
        self.opt_positive(field)?
            .ok_or_else(|| ConfigError::MissingField {
                file: self.file.clone(),
                field,
                model_type: self.model_type,
                required: self.required.to_string(),
            })
    }

    fn opt_positive(&self, field: &'static str) -> Result<Option<u64>, ConfigError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.wrong(field, "a positive integer", v)),
            },
        }
    }

    /// A non-negative integer field (where 0 means "none", as GraniteMoeShared's
    /// `shared_intermediate_size`).
    fn opt_count(&self, field: &'static str) -> Result<Option<u64>, ConfigError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(field, "a non-negative integer", v)),
        }
    }

    fn opt_bool(&self, field: &'static str) -> Result<Option<bool>, ConfigError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(field, "true or false", v)),
        }
    }

    fn opt_probability(&self, field: &'static str) -> Result<Option<f64>, ConfigError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if (0.0..1.0).contains(&x) => Ok(Some(x)),
                _ => Err(self.wrong(field, "a probability in [0, 1)", v)),
            },
        }
    }

    /// A positive number that transformers defaults to `default` when absent and turns off
    /// when null (Gemma 2's soft caps).
    fn float_or_off(&self, field: &'static str, default: f64) -> Result<Option<f64>, ConfigError> {
        match self.obj.get(field) {
            None => Ok(Some(default)),
            Some(_) => self.opt_float(field),
        }
    }

    /// A normalization epsilon: positive and below 1 (published configs use 1e-6 to 1e-5; one
    /// of 1 or more swamps the variance it guards, which no trained model has).
    fn opt_epsilon(&self, field: &'static str) -> Result<Option<f64>, ConfigError> {
        self.opt_float_where(field, "a positive number below 1 (e.g. 1e-5)", |x| x < 1.0)
    }

    /// A rotary base: above 1, so that the frequencies fall across the head (published
    /// configs use 1e4 to 1e6; at or below 1 they grow without bound).
    fn opt_rope_base(&self, field: &'static str) -> Result<Option<f64>, ConfigError> {
        self.opt_float_where(field, "a number above 1 (e.g. 10000)", |x| x > 1.0)
    }

    fn opt_float_where(
        &self,
        field: &'static str,
        expected: &'static str,
        ok: impl Fn(f64) -> bool,
    ) -> Result<Option<f64>, ConfigError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 && ok(x) => Ok(Some(x)),
                _ => Err(self.wrong(field, expected, v)),
            },
        }
    }

    /// The vocabulary size: at least two tokens (with one, every prediction is certain and
    /// the loss is zero).
    fn vocabulary(&self) -> Result<u64, ConfigError> {
        let n = self.positive("vocab_size")?;
        if n < 2 {
            return Err(self.wrong("vocab_size", "at least 2 tokens", &Value::from(n)));
        }
        Ok(n)
    }

    fn opt_float(&self, field: &'static str) -> Result<Option<f64>, ConfigError> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(self.wrong(field, "a positive number", v)),
            },
        }
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// serde_json appends " at line L column C"; the error carries those fields separately.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

fn dir_name(p: Option<&Path>) -> Option<&str> {
    p.and_then(Path::file_name).and_then(|s| s.to_str())
}

/// A model's name from its config path: the parent directory for `config.json` (the
/// repository's name for a snapshot in the Hugging Face cache,
/// `models--{org}--{name}/snapshots/{commit}/config.json`), else the stem.
fn model_name(file: &Path) -> String {
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    let parent = file.parent();
    if stem != "config" {
        return stem.to_string();
    }
    let snapshots = parent.and_then(Path::parent);
    let hub_name = (dir_name(snapshots) == Some("snapshots"))
        .then(|| dir_name(snapshots.and_then(Path::parent)))
        .flatten()
        .and_then(|repo| repo.strip_prefix("models--"))
        .and_then(|id| id.split_once("--"))
        .map(|(_, name)| name);
    match hub_name.or_else(|| dir_name(parent)) {
        Some(name) => name.to_string(),
        None => stem.to_string(),
    }
}
