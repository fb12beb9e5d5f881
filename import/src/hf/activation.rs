//! The MLP a config names against the one plait builds for its family: an activation or a bias
//! plait would not build is refused, naming the field, never built as something else.

use serde_json::Value;

use super::{ConfigError, Fields};

/// transformers' names (`ACT2FN`) of the tanh-approximated GELU plait's `Gelu { tanh }`
/// computes, and of the exact one, which differs from it by under 1e-3: GPT-2's
/// `activation_function` (default `gelu_new`) and Gemma's GeGLU gate.
pub(super) const GELU: &[&str] = &[
    "gelu_new",
    "gelu_pytorch_tanh",
    "gelu_fast",
    "gelu",
    "gelu_python",
];

/// GPT-2's `activation_function`.
pub(super) fn check_gpt2(f: &Fields<'_>) -> Result<(), ConfigError> {
    named(f, "activation_function", GELU, "a GELU MLP")
}

/// A Llama-like family's `hidden_act` (Gemma 2 and 3: `hidden_activation`; Nemotron's and
/// Arcee's squared ReLU) and `mlp_bias`.
pub(super) fn check_llama(f: &Fields<'_>, model_type: &str) -> Result<(), ConfigError> {
    let gemma = matches!(
        model_type,
        "gemma" | "gemma2" | "gemma3_text" | "vaultgemma"
    );
    if gemma {
        let key = if f.obj.contains_key("hidden_activation") {
            "hidden_activation"
        } else {
            "hidden_act"
        };
        named(f, key, GELU, "GeGLU (a GELU gate)")?;
    } else if matches!(model_type, "nemotron" | "arcee" | "nanochat") {
        named(f, "hidden_act", &["relu2"], "a squared-ReLU MLP")?;
    } else {
        named(f, "hidden_act", &["silu", "swish"], "SwiGLU (a SiLU gate)")?;
    }
    if f.opt_bool("mlp_bias")?.unwrap_or(false) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "mlp_bias = true: plait builds {model_type}'s MLP without biases; set it to \
                 false or drop it"
            ),
        });
    }
    Ok(())
}

/// Refuses `key` unless it is absent, null or one of `accepted`.
fn named(
    f: &Fields<'_>,
    key: &'static str,
    accepted: &[&str],
    builds: &str,
) -> Result<(), ConfigError> {
    match f.obj.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(a)) if accepted.contains(&a.as_str()) => Ok(()),
        Some(other) => Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "{key} = {other}: plait builds this model's MLP as {builds} ({key} one of {})",
                accepted.join(", ")
            ),
        }),
    }
}
