//! Sliding-window attention as transformers builds it: which families read `sliding_window`,
//! their defaults, and which layers attend within the window (`layer_types` where the config
//! lists them, else the family's own pattern).

use serde_json::Value;

use super::{ConfigError, Fields};
use crate::spec::SlidingWindow;

/// Which layers of a family attend within the window when the config lists no `layer_types`
/// (transformers' configs compute their default `layer_types` so).
#[derive(Clone, Copy, Debug)]
enum Pattern {
    /// Every layer (Mistral, Mixtral, Phi-3, StarCoder2).
    All,
    /// Every layer but each `n`-th: (i + 1) % n ≠ 0 (Gemma 2 and gpt-oss: n = 2; OLMo 3:
    /// n = 4; Gemma 3: `sliding_window_pattern`, default 6).
    AllButEvery(u64),
    /// Layers from `max_window_layers` on, where `use_sliding_window` is true (Qwen2, Qwen3 and
    /// their mixtures of experts).
    FromMaxWindowLayers,
}

/// The families whose attention reads `sliding_window`, with transformers' default window
/// (their config classes' `sliding_window` defaults) and the layers it applies to.
fn family(model_type: &str) -> Option<(Option<u64>, Pattern)> {
    Some(match model_type {
        "mistral" => (Some(4096), Pattern::All),
        "mixtral" | "phi3" | "starcoder2" => (None, Pattern::All),
        "gemma2" | "olmo3" | "gemma3_text" => (Some(4096), pattern_of(model_type)),
        "gpt_oss" => (Some(128), Pattern::AllButEvery(2)),
        "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" => (Some(4096), Pattern::FromMaxWindowLayers),
        _ => return None,
    })
}

fn pattern_of(model_type: &str) -> Pattern {
    match model_type {
        "olmo3" => Pattern::AllButEvery(4),
        "gemma3_text" => Pattern::AllButEvery(6),
        _ => Pattern::AllButEvery(2),
    }
}

/// The sliding window of `f`'s config of `layers` layers: none where its family reads no window
/// or the window is off (null or 0; Qwen's `use_sliding_window` false) or no layer has it.
pub(super) fn sliding_window(
    f: &Fields<'_>,
    layers: u64,
) -> Result<Option<SlidingWindow>, ConfigError> {
    let Some((default, pattern)) = family(f.model_type) else {
        return Ok(None);
    };
    let keys = match f.obj.get("sliding_window") {
        None => default,
        Some(v) => v.as_u64(),
    };
    let Some(keys) = keys.filter(|&k| k > 0) else {
        return Ok(None);
    };
    let windowed = match listed_layer_types(f) {
        Some(listed) => listed,
        None => default_layers(f, pattern, layers)?,
    };
    Ok(windowed
        .contains(&true)
        .then_some(SlidingWindow { keys, windowed }))
}

/// The config's `layer_types` as windowed or not, one per layer (checked by `checks`).
fn listed_layer_types(f: &Fields<'_>) -> Option<Vec<bool>> {
    let Some(Value::Array(kinds)) = f.obj.get("layer_types") else {
        return None;
    };
    Some(
        kinds
            .iter()
            .map(|k| k.as_str() == Some("sliding_attention"))
            .collect(),
    )
}

fn default_layers(f: &Fields<'_>, pattern: Pattern, layers: u64) -> Result<Vec<bool>, ConfigError> {
    Ok(match pattern {
        Pattern::All => (0..layers).map(|_| true).collect(),
        Pattern::AllButEvery(n) => {
            // Gemma 3 names its period `sliding_window_pattern` (positive: `checks`).
            let n = if f.model_type == "gemma3_text" {
                f.opt_positive("sliding_window_pattern")?.unwrap_or(n)
            } else {
                n
            };
            (0..layers).map(|i| (i + 1) % n != 0).collect()
        }
        Pattern::FromMaxWindowLayers => {
            let on = f.opt_bool("use_sliding_window")?.unwrap_or(false);
            // Qwen2Config's default; a null keeps it.
            let first = f
                .obj
                .get("max_window_layers")
                .and_then(Value::as_u64)
                .unwrap_or(28);
            (0..layers).map(|i| on && i >= first).collect()
        }
    })
}

/// The sliding-window layers' own rotary base, unscaled, as transformers builds them: Gemma 3's
/// `rope_local_base_freq` (default 10000; `rope_parameters`' sliding kind is read into it),
/// OLMo 3's `rope_theta` (the model's, `theta`) with the default rope type. Other families
/// rotate every layer alike.
pub(super) fn rope_theta(
    f: &Fields<'_>,
    model_type: &str,
    theta: f64,
) -> Result<Option<f64>, ConfigError> {
    Ok(match model_type {
        "gemma3_text" => Some(f.opt_rope_base("rope_local_base_freq")?.unwrap_or(10_000.0)),
        "olmo3" => Some(theta),
        _ => None,
    })
}
