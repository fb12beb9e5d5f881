//! The families built on LayerNorms with biases (transformers' `GPTNeoXConfig`, `PhiConfig`,
//! `FalconConfig`, `StableLmConfig`, `Starcoder2Config`): Llama's attention with biases where
//! the config puts them, an ungated GELU MLP (StableLM: SwiGLU), and attention and the MLP
//! in parallel off the layer's input where the family runs them so.

use serde_json::{Map, Value};

use super::{ConfigError, Fields};
use crate::spec::{ParallelNorms, Ungated};

/// The model types of this module.
pub(super) const MODEL_TYPES: [&str; 5] = ["gpt_neox", "phi", "falcon", "stablelm", "starcoder2"];

/// transformers' names of the exact GELU; the other GELUs it names are tanh-approximated.
const EXACT_GELU: [&str; 2] = ["gelu", "gelu_python"];

/// What these families set in the block, read from the config with transformers' defaults.
pub(super) struct Block {
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// The ungated MLP's activation; `None`: a gated SiLU MLP (StableLM's).
    pub mlp: Option<Ungated>,
    pub mlp_bias: bool,
    pub parallel: Option<ParallelNorms>,
    pub head_bias: bool,
}

/// Reads `f`'s block (its model type one of [`MODEL_TYPES`]).
pub(super) fn block(f: &Fields<'_>) -> Result<Block, ConfigError> {
    match f.model_type {
        // GPTNeoXConfig: attention_bias and use_parallel_residual default to true; the MLP's
        // dense_h_to_4h and dense_4h_to_h always have biases.
        "gpt_neox" => {
            let bias = f.opt_bool("attention_bias")?.unwrap_or(true);
            let parallel = f.opt_bool("use_parallel_residual")?.unwrap_or(true);
            Ok(Block {
                qkv_bias: bias,
                o_bias: bias,
                mlp: Some(gelu(f, "hidden_act", "gelu")?),
                mlp_bias: true,
                parallel: parallel.then_some(ParallelNorms::Separate),
                head_bias: false,
            })
        }
        // PhiForCausalLM: one LayerNorm both branches read, biases on every linear layer
        // including the head.
        "phi" => {
            if f.opt_bool("qk_layernorm")?.unwrap_or(false) {
                return Err(ConfigError::Inconsistent {
                    file: f.file.clone(),
                    reason: "qk_layernorm = true: plait builds Phi's attention without q and k \
                             LayerNorms; set it to false (as the published Phi-1, 1.5 and 2 \
                             configs do)"
                        .into(),
                });
            }
            Ok(Block {
                qkv_bias: true,
                o_bias: true,
                mlp: Some(gelu(f, "hidden_act", "gelu_new")?),
                mlp_bias: true,
                parallel: Some(ParallelNorms::Shared),
                head_bias: true,
            })
        }
        "stablelm" => stablelm_block(f),
        // Starcoder2Config: `use_bias` (default true) on every linear layer, c_fc and c_proj
        // an ungated GELU MLP, Llama's order.
        "starcoder2" => {
            let bias = f.opt_bool("use_bias")?.unwrap_or(true);
            Ok(Block {
                qkv_bias: bias,
                o_bias: bias,
                mlp: Some(gelu(f, "hidden_act", "gelu_pytorch_tanh")?),
                mlp_bias: bias,
                parallel: None,
                head_bias: false,
            })
        }
        _ => falcon_block(f),
    }
}

/// StableLmConfig: a SwiGLU MLP without biases, q, k and v biased by `use_qkv_bias`, and
/// `use_parallel_residual` running the MLP off the input norm beside attention.
fn stablelm_block(f: &Fields<'_>) -> Result<Block, ConfigError> {
    if f.opt_bool("qk_layernorm")?.unwrap_or(false) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: "qk_layernorm = true: plait builds StableLM's attention without per-head q \
                     and k LayerNorms; set it to false (as StableLM-2-1.6B and StableLM-3B do)"
                .into(),
        });
    }
    match f.obj.get("hidden_act") {
        None | Some(Value::Null) => {}
        Some(Value::String(a)) if a == "silu" || a == "swish" => {}
        Some(other) => {
            return Err(ConfigError::Inconsistent {
                file: f.file.clone(),
                reason: format!(
                    "hidden_act = {other}: plait builds StableLM's MLP as SwiGLU (hidden_act \
                     silu)"
                ),
            });
        }
    }
    let parallel = f.opt_bool("use_parallel_residual")?.unwrap_or(false);
    Ok(Block {
        qkv_bias: f.opt_bool("use_qkv_bias")?.unwrap_or(false),
        o_bias: false,
        mlp: None,
        mlp_bias: false,
        parallel: parallel.then_some(ParallelNorms::Shared),
        head_bias: false,
    })
}

/// FalconConfig: `bias` on every linear layer of the block; the new decoder architecture
/// (Falcon-40B, 180B) norms each branch separately (unless `num_ln_in_parallel_attn` is 1),
/// the old one (Falcon-7B) shares one norm, and `parallel_attn: false` is Llama's order.
fn falcon_block(f: &Fields<'_>) -> Result<Block, ConfigError> {
    if f.opt_bool("alibi")?.unwrap_or(false) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: "alibi = true: plait builds Falcon with rotary positions, not ALiBi; set it \
                     to false (as the published Falcon configs do)"
                .into(),
        });
    }
    let bias = f.opt_bool("bias")?.unwrap_or(false);
    let new_arch = f.opt_bool("new_decoder_architecture")?.unwrap_or(false);
    let norms_in_parallel = f.opt_positive("num_ln_in_parallel_attn")?;
    let parallel = if new_arch {
        Some(match norms_in_parallel {
            Some(1) => ParallelNorms::Shared,
            _ => ParallelNorms::Separate,
        })
    } else if f.opt_bool("parallel_attn")?.unwrap_or(true) {
        Some(ParallelNorms::Shared)
    } else {
        None
    };
    Ok(Block {
        qkv_bias: bias,
        o_bias: bias,
        mlp: Some(gelu(f, "activation", "gelu")?),
        mlp_bias: bias,
        parallel,
        head_bias: false,
    })
}

/// The MLP's GELU named by `key` (`default` where absent), exact or tanh-approximated.
fn gelu(f: &Fields<'_>, key: &'static str, default: &str) -> Result<Ungated, ConfigError> {
    let name = match f.obj.get(key) {
        None | Some(Value::Null) => default,
        Some(Value::String(s)) if super::activation::GELU.contains(&s.as_str()) => s,
        Some(other) => {
            return Err(ConfigError::Inconsistent {
                file: f.file.clone(),
                reason: format!(
                    "{key} = {other}: plait builds {}'s MLP with a GELU ({key} one of {})",
                    f.model_type,
                    super::activation::GELU.join(", ")
                ),
            });
        }
    };
    Ok(Ungated::Gelu {
        tanh: !EXACT_GELU.contains(&name),
    })
}

/// The share of each head the rotary embedding turns, and the field it comes from:
/// GPT-NeoX's `rotary_pct` (default 0.25; newer configs `partial_rotary_factor`), Phi's
/// `partial_rotary_factor` (0.5), StableLM's (0.25); Falcon and StarCoder2 turn the whole
/// head.
pub(super) fn rotary_share(f: &Fields<'_>) -> Result<(&'static str, f64), ConfigError> {
    let factor = "partial_rotary_factor";
    Ok(match f.model_type {
        "gpt_neox" => match f.opt_float(factor)? {
            Some(x) => (factor, x),
            None => ("rotary_pct", f.opt_float("rotary_pct")?.unwrap_or(0.25)),
        },
        "phi" => (factor, f.opt_float(factor)?.unwrap_or(0.5)),
        "stablelm" => (factor, f.opt_float(factor)?.unwrap_or(0.25)),
        _ => (factor, 1.0),
    })
}

/// Falcon's key/value heads: `num_kv_heads` in the new decoder architecture, one with
/// `multi_query` (its default), else one per query head.
pub(super) fn falcon_kv_heads(f: &Fields<'_>, heads: u64) -> Result<u64, ConfigError> {
    if f.opt_bool("new_decoder_architecture")?.unwrap_or(false) {
        Ok(f.opt_positive("num_kv_heads")?.unwrap_or(heads))
    } else if f.opt_bool("multi_query")?.unwrap_or(true) {
        Ok(1)
    } else {
        Ok(heads)
    }
}

/// Falcon's older field names (`n_layer`, `n_head`, `n_head_kv`, FalconConfig's
/// `attribute_map`), copied to the names plait reads where those are absent.
pub(super) fn falcon_aliases(mut obj: Map<String, Value>) -> Map<String, Value> {
    for (alias, name) in [
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
        ("n_head_kv", "num_kv_heads"),
    ] {
        if !obj.contains_key(name)
            && let Some(v) = obj.get(alias).cloned()
        {
            obj.insert(name.into(), v);
        }
    }
    obj
}

/// How plait builds these families differently from transformers, one sentence each.
pub(super) fn notes(obj: &Map<String, Value>) -> Vec<String> {
    let model_type = obj.get("model_type").and_then(Value::as_str).unwrap_or("");
    let mut notes = Vec::new();
    if matches!(model_type, "gpt_neox" | "falcon") {
        notes.push(format!(
            "{model_type}'s fused query_key_value projection is built as separate q, k and v \
             projections (the same parameters and FLOPs, three GEMMs instead of one)"
        ));
    }
    let dropout = [
        "resid_pdrop",
        "embd_pdrop",
        "hidden_dropout",
        "attention_dropout",
    ]
    .into_iter()
    .filter(|&k| obj.get(k).and_then(Value::as_f64).is_some_and(|p| p > 0.0));
    let dropout: Vec<&str> = dropout.collect();
    if MODEL_TYPES.contains(&model_type) && !dropout.is_empty() {
        notes.push(format!(
            "{} set: plait builds {model_type} without dropout (the same shapes; FLOPs and \
             memory of the masks are not counted)",
            dropout.join(", ")
        ));
    }
    notes
}
