//! Sliding-window attention as transformers builds it: which families read `sliding_window`,
//! their defaults, which layers are of the sliding kind (`layer_types` where the config lists
//! them, else the family's own pattern), and the rotary those layers turn by.

use serde_json::Value;

use super::{ConfigError, Fields};
use crate::spec::{LocalRope, SlidingWindow};

/// Which layers of a family are of the sliding kind when the config lists no `layer_types`
/// (transformers' configs compute their default `layer_types` so).
#[derive(Clone, Copy, Debug)]
enum Pattern {
    /// Every layer (Mistral, Mixtral, Phi-3, StarCoder2, Qwen3-MoE).
    All,
    /// Every layer but each `n`-th: (i + 1) % n ≠ 0 (Gemma 2 and gpt-oss: n = 2; OLMo 3:
    /// n = 4; Gemma 3: `sliding_window_pattern`, default 6).
    AllButEvery(u64),
    /// Layers from `max_window_layers` on (Qwen2, Qwen3).
    FromMaxWindowLayers,
    /// Even layers below `max_window_layers`: (i + 1) % 2 ≠ 0 and i < it (Qwen2-MoE).
    EvenBelowMaxWindowLayers,
    /// The NoPE layers (SmolLM3, whose config builds its default `layer_types` so).
    NopeLayers,
}

/// A family whose attention reads `sliding_window`: transformers' default window (its config
/// class's `sliding_window` default), the sliding layers, and whether the window is on only
/// with `use_sliding_window` (Qwen's configs set it to none otherwise).
struct Family {
    default: Option<u64>,
    pattern: Pattern,
    switched: bool,
}

fn family(model_type: &str) -> Option<Family> {
    let (default, pattern, switched) = match model_type {
        "mistral" | "ministral" => (Some(4096), Pattern::All, false),
        "mixtral" | "phi3" | "starcoder2" => (None, Pattern::All, false),
        "gemma2" | "vaultgemma" => (Some(4096), Pattern::AllButEvery(2), false),
        "olmo3" => (Some(4096), Pattern::AllButEvery(4), false),
        "gemma3_text" => (Some(4096), Pattern::AllButEvery(6), false),
        "gpt_oss" => (Some(128), Pattern::AllButEvery(2), false),
        "qwen2" | "qwen3" => (Some(4096), Pattern::FromMaxWindowLayers, true),
        "qwen2_moe" => (Some(4096), Pattern::EvenBelowMaxWindowLayers, true),
        "qwen3_moe" => (Some(4096), Pattern::All, true),
        // Dots1Config: layers from max_window_layers (default 62) on, no switch.
        "dots1" => (Some(4096), Pattern::FromMaxWindowLayers, false),
        "cohere2" => (Some(4096), Pattern::AllButEvery(4), false),
        "smollm3" => (None, Pattern::NopeLayers, true),
        "exaone4" | "exaone_moe" => (Some(4096), Pattern::AllButEvery(4), false),
        _ => return None,
    };
    Some(Family {
        default,
        pattern,
        switched,
    })
}

/// The sliding window of `f`'s config of `layers` layers: none where its family reads no window
/// or the window is off (null or 0; Qwen's `use_sliding_window` false) or no layer has it.
pub(super) fn sliding_window(
    f: &Fields<'_>,
    layers: u64,
) -> Result<Option<SlidingWindow>, ConfigError> {
    let Some(fam) = family(f.model_type) else {
        return Ok(None);
    };
    if fam.switched && !f.opt_bool("use_sliding_window")?.unwrap_or(false) {
        return Ok(None);
    }
    let keys = match f.obj.get("sliding_window") {
        None => fam.default,
        Some(v) => v.as_u64(),
    };
    let Some(keys) = keys.filter(|&k| k > 0) else {
        return Ok(None);
    };
    let windowed = sliding_layers(f, fam.pattern, layers)?;
    Ok(windowed
        .contains(&true)
        .then_some(SlidingWindow { keys, windowed }))
}

/// The sliding-kind layers' own rotary, unscaled, as transformers builds them whether or not
/// a window is set: Gemma 3's `rope_local_base_freq` (default 10000; `rope_parameters`'
/// sliding kind is read into it), OLMo 3's `rope_theta` (the model's, `theta`) with the
/// default rope type. Other families rotate every layer alike.
pub(super) fn local_rope(
    f: &Fields<'_>,
    theta: f64,
    layers: u64,
) -> Result<Option<LocalRope>, ConfigError> {
    let theta = match f.model_type {
        "gemma3_text" => f.opt_rope_base("rope_local_base_freq")?.unwrap_or(10_000.0),
        "olmo3" => theta,
        _ => return Ok(None),
    };
    let Some(fam) = family(f.model_type) else {
        return Ok(None);
    };
    Ok(Some(LocalRope {
        theta,
        layers: sliding_layers(f, fam.pattern, layers)?,
    }))
}

/// The sliding layers of a family that names its period `sliding_window_pattern` (default
/// `n`): an integer n, every layer but each n-th (positive: `checks`); or, in EXAONE 4's
/// configs, a string of `L` (local: windowed) and `G` (global) read from layer 0 and repeated.
fn named_period(f: &Fields<'_>, n: u64, layers: u64) -> Result<Vec<bool>, ConfigError> {
    if let Some(v @ Value::String(kinds)) = f.obj.get("sliding_window_pattern")
        && matches!(f.model_type, "exaone4" | "exaone_moe")
    {
        let local: Vec<bool> = kinds.chars().map(|c| c == 'L').collect();
        if local.is_empty() || !kinds.chars().all(|c| c == 'L' || c == 'G') {
            return Err(f.wrong("sliding_window_pattern", LOCAL_GLOBAL, v));
        }
        return Ok((0..layers as usize)
            .map(|i| local[i % local.len()])
            .collect());
    }
    let n = f.opt_positive("sliding_window_pattern")?.unwrap_or(n);
    Ok((0..layers).map(|i| (i + 1) % n != 0).collect())
}

/// What EXAONE 4's `sliding_window_pattern` may be.
const LOCAL_GLOBAL: &str =
    "a positive integer or a string of L (local) and G (global) layers, such as \"LLLG\"";

/// Which of `f`'s `layers` layers are of the sliding kind, window or not (none where its
/// family has no sliding kind).
pub(super) fn sliding_kind(f: &Fields<'_>, layers: u64) -> Result<Vec<bool>, ConfigError> {
    match family(f.model_type) {
        Some(fam) => sliding_layers(f, fam.pattern, layers),
        None => Ok(vec![false; usize::try_from(layers).unwrap_or(0)]),
    }
}

/// Which layers are of the sliding kind: the config's `layer_types` (checked by `checks`), else
/// the family's pattern.
fn sliding_layers(f: &Fields<'_>, pattern: Pattern, layers: u64) -> Result<Vec<bool>, ConfigError> {
    if let Some(Value::Array(kinds)) = f.obj.get("layer_types") {
        return Ok(kinds
            .iter()
            .map(|k| k.as_str() == Some("sliding_attention"))
            .collect());
    }
    // Qwen2Config's default (Dots1Config's 62); a null keeps it.
    let max_window_layers = || {
        let default = if f.model_type == "dots1" { 62 } else { 28 };
        f.obj
            .get("max_window_layers")
            .and_then(Value::as_u64)
            .unwrap_or(default)
    };
    Ok(match pattern {
        Pattern::All => vec![true; usize::try_from(layers).unwrap_or(0)],
        // Gemma 3, Cohere2 and EXAONE 4 name their period `sliding_window_pattern`.
        Pattern::AllButEvery(n)
            if matches!(
                f.model_type,
                "gemma3_text" | "cohere2" | "exaone4" | "exaone_moe"
            ) =>
        {
            named_period(f, n, layers)?
        }
        Pattern::AllButEvery(n) => (0..layers).map(|i| (i + 1) % n != 0).collect(),
        Pattern::FromMaxWindowLayers => {
            let first = max_window_layers();
            (0..layers).map(|i| i >= first).collect()
        }
        Pattern::EvenBelowMaxWindowLayers => {
            let end = max_window_layers();
            (0..layers).map(|i| (i + 1) % 2 != 0 && i < end).collect()
        }
        Pattern::NopeLayers => super::nope::smollm3(f, layers)?,
    })
}
