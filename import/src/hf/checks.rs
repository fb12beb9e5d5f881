//! Fields plait does not build from but transformers reads: a config whose values there are
//! absurd or of the wrong type is refused naming the field, as transformers would fail on it
//! or build something else, rather than planned as if the field were absent.

use serde_json::Value;

use super::{ConfigError, Fields};

/// Dropout probabilities of layers plait builds without dropout (attention scores,
/// embeddings): each must still be a probability.
const PROBABILITIES: [&str; 5] = [
    "attn_pdrop",
    "embd_pdrop",
    "attention_dropout",
    "hidden_dropout",
    "residual_dropout",
];

/// Switches transformers reads as booleans.
const SWITCHES: [&str; 7] = [
    "use_sliding_window",
    "scale_attn_weights",
    "attention_bias",
    "mlp_bias",
    "norm_topk_prob",
    "use_qk_norm",
    "attention_out_bias",
];

/// Families whose attention turns only part of each head (transformers slices the rotary
/// dimensions there); elsewhere `partial_rotary_factor` below 1 breaks its rotary.
const PARTIAL_ROTARY: [&str; 9] = [
    "nemotron",
    "phi3",
    "gpt_neox",
    "phi",
    "stablelm",
    "glm",
    "glm4",
    "glm4_moe",
    "minimax_m2",
];

/// The attention kinds per layer (`layer_types`): Gemma 3's and the other windowed families',
/// and Llama 4's chunked layers.
const LAYER_TYPES: [&str; 2] = ["sliding_attention", "full_attention"];
const LLAMA4_LAYER_TYPES: [&str; 2] = ["chunked_attention", "full_attention"];

/// Checks the fields above for `f`'s config of `layers` layers.
pub(super) fn unbuilt_fields(f: &Fields<'_>, layers: u64) -> Result<(), ConfigError> {
    for field in PROBABILITIES {
        f.opt_probability(field)?;
    }
    for field in SWITCHES {
        f.opt_bool(field)?;
    }
    // 0 as well as null turns the window off in some configs.
    if let Some(v) = f
        .obj
        .get("sliding_window")
        .filter(|v| !v.is_null() && v.as_u64().is_none())
    {
        return Err(f.wrong("sliding_window", "a non-negative integer or null", v));
    }
    // EXAONE 4 may spell it as local and global layers ("LLLG"), read by `window`.
    let spelled = matches!(f.model_type, "exaone4" | "exaone_moe")
        && matches!(f.obj.get("sliding_window_pattern"), Some(Value::String(_)));
    if !spelled {
        f.opt_positive("sliding_window_pattern")?;
    }
    f.opt_rope_base("rope_local_base_freq")?;
    for field in ["max_window_layers", "num_nextn_predict_layers"] {
        if let Some(v) = f
            .obj
            .get(field)
            .filter(|v| !v.is_null() && v.as_u64().is_none())
        {
            return Err(f.wrong(field, "a non-negative integer", v));
        }
    }
    layer_types(f, layers)?;
    whole_head_rotary(f)
}

/// Gemma 3's `layer_types`: one of its attention kinds per layer.
fn layer_types(f: &Fields<'_>, layers: u64) -> Result<(), ConfigError> {
    let Some(v) = f.obj.get("layer_types").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let (kinds_known, expected) = if f.model_type == "llama4_text" {
        (
            LLAMA4_LAYER_TYPES,
            "a list of \"chunked_attention\" or \"full_attention\", one per layer",
        )
    } else {
        (
            LAYER_TYPES,
            "a list of \"sliding_attention\" or \"full_attention\", one per layer",
        )
    };
    let Value::Array(kinds) = v else {
        return Err(f.wrong("layer_types", expected, v));
    };
    let known = |k: &Value| k.as_str().is_some_and(|k| kinds_known.contains(&k));
    if kinds.len() as u64 != layers || !kinds.iter().all(known) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "layer_types must be {expected} (num_hidden_layers = {layers}); it has {} \
                 entries{}",
                kinds.len(),
                match kinds.iter().find(|k| !known(k)) {
                    Some(k) => format!(", among them {k}"),
                    None => String::new(),
                }
            ),
        });
    }
    Ok(())
}

/// `partial_rotary_factor` other than 1 where the family's attention turns the whole head.
fn whole_head_rotary(f: &Fields<'_>) -> Result<(), ConfigError> {
    if PARTIAL_ROTARY.contains(&f.model_type) {
        return Ok(());
    }
    match f.opt_float("partial_rotary_factor")? {
        Some(factor) if factor != 1.0 => Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "partial_rotary_factor = {factor}: {}'s attention turns the whole head (only \
                 {} turn part of it); remove the field or set it to 1.0",
                f.model_type,
                PARTIAL_ROTARY.join(", ")
            ),
        }),
        _ => Ok(()),
    }
}
