//! Layers without rotary embeddings (NoPE) as transformers builds them: SmolLM3's
//! `no_rope_layers` (one NoPE layer in `no_rope_layer_interval`, default every fourth),
//! Cohere2's global-attention layers (it rotates only where a layer has a sliding window) and
//! EXAONE 4's (its global layers go unrotated where the model has a window at all).

use serde_json::Value;

use super::{ConfigError, Fields, window};

/// Whether each of the `layers` layers of `f`'s config leaves positions unrotated; none where
/// its family rotates every layer, or this config does.
pub(super) fn nope_layers(f: &Fields<'_>, layers: u64) -> Result<Option<Vec<bool>>, ConfigError> {
    if layers > super::MAX_LAYERS {
        // Refused by the consistency check, without a walk over every layer first.
        return Ok(None);
    }
    let nope = match f.model_type {
        // Llama4TextConfig reads `no_rope_layers` and its interval as SmolLM3Config does.
        "smollm3" | "llama4_text" => smollm3(f, layers)?,
        "cohere2" => cohere2(f, layers)?,
        // K-EXAONE's attention is EXAONE 4's.
        "exaone4" | "exaone_moe" => exaone4(f, layers)?,
        _ => return Ok(None),
    };
    Ok(nope.contains(&true).then_some(nope))
}

/// SmolLM3Config: `no_rope_layers[i]` is 1 where layer i rotates, 0 where it does not (a list
/// at least one per layer); absent, layer i is NoPE where (i + 1) is a multiple of
/// `no_rope_layer_interval` (default 4).
pub(super) fn smollm3(f: &Fields<'_>, layers: u64) -> Result<Vec<bool>, ConfigError> {
    const EXPECTED: &str = "a list of 1 (the layer rotates) or 0 (it does not), one per layer";
    // Llama4TextConfig takes an empty list as none (`if self.no_rope_layers`).
    let empty =
        |v: &Value| f.model_type == "llama4_text" && v.as_array().is_some_and(Vec::is_empty);
    let listed = f
        .obj
        .get("no_rope_layers")
        .filter(|v| !v.is_null() && !empty(v));
    let items = match listed {
        None => {
            let interval = f.opt_positive("no_rope_layer_interval")?.unwrap_or(4);
            return Ok((0..layers).map(|i| (i + 1) % interval == 0).collect());
        }
        Some(Value::Array(items)) => items,
        Some(v) => return Err(f.wrong("no_rope_layers", EXPECTED, v)),
    };
    let rotates = |v: &Value| match v {
        Value::Bool(b) => Some(*b),
        v => v.as_u64().filter(|&n| n <= 1).map(|n| n == 1),
    };
    let nope = items
        .iter()
        .map(|v| {
            rotates(v)
                .map(|r| !r)
                .ok_or_else(|| f.wrong("no_rope_layers", EXPECTED, v))
        })
        .collect::<Result<Vec<bool>, _>>()?;
    if (nope.len() as u64) < layers {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "no_rope_layers has {} entries, fewer than num_hidden_layers = {layers}: \
                 transformers reads one per layer (1 rotates, 0 does not)",
                nope.len()
            ),
        });
    }
    Ok(nope.into_iter().take(layers as usize).collect())
}

/// Cohere2Attention rotates only where its layer has a sliding window: a layer of the sliding
/// kind while `sliding_window` is set (not null); every other layer is NoPE.
fn cohere2(f: &Fields<'_>, layers: u64) -> Result<Vec<bool>, ConfigError> {
    let window_set = !matches!(f.obj.get("sliding_window"), Some(Value::Null));
    let sliding = window::sliding_kind(f, layers)?;
    Ok((0..layers as usize)
        .map(|i| !(window_set && sliding.get(i).copied().unwrap_or(false)))
        .collect())
}

/// Exaone4Attention rotates where the model has no window (`sliding_window` null) or the layer
/// is of the sliding kind: with a window, its global layers are NoPE.
fn exaone4(f: &Fields<'_>, layers: u64) -> Result<Vec<bool>, ConfigError> {
    if matches!(f.obj.get("sliding_window"), Some(Value::Null)) {
        return Ok(vec![false; layers as usize]);
    }
    let sliding = window::sliding_kind(f, layers)?;
    Ok((0..layers as usize)
        .map(|i| !sliding.get(i).copied().unwrap_or(false))
        .collect())
}
