//! Llama 4's text model as transformers builds it (`Llama4TextConfig`, `modeling_llama4.py`):
//! three of every four layers rotated (`no_rope_layers`, read as SmolLM3's), attending in
//! chunks of `attention_chunk_size` and normalizing q and k after the rotary
//! (`use_qk_norm`, a weightless L2 norm); the fourth unrotated, attending to every earlier key,
//! its queries scaled by the attention temperature (`attn_temperature_tuning`, `floor_scale`,
//! `attn_scale`); experts on the `moe_layers` (every `interleave_moe_layer_step`-th layer), a
//! dense MLP of `intermediate_size_mlp` on the others.

use serde_json::Value;

use super::{ConfigError, Fields};
use crate::spec::{AttnTemperature, ChunkedAttention, DenseLayers};

/// `Llama4TextConfig`'s `attention_chunk_size` default.
const CHUNK: u64 = 8192;

/// The layers that attend in chunks: `layer_types`' "chunked_attention" ones where listed,
/// else the rotated layers (transformers' default `layer_types`); none where the chunk size
/// is null.
pub(super) fn chunked_attention(
    f: &Fields<'_>,
    nope: &[bool],
) -> Result<Option<ChunkedAttention>, ConfigError> {
    let keys = match f.obj.get("attention_chunk_size") {
        None => CHUNK,
        Some(Value::Null) => return Ok(None),
        Some(_) => f.positive("attention_chunk_size")?,
    };
    let chunked = match f.obj.get("layer_types") {
        Some(Value::Array(kinds)) => kinds
            .iter()
            .map(|k| k.as_str() == Some("chunked_attention"))
            .collect(),
        _ => nope.iter().map(|&n| !n).collect::<Vec<bool>>(),
    };
    Ok(chunked
        .contains(&true)
        .then_some(ChunkedAttention { keys, chunked }))
}

/// The layers whose q and k are L2-normed after the rotary: the rotated ones, where
/// `use_qk_norm` (default true; Maverick's config turns it off).
pub(super) fn qk_l2_norm(f: &Fields<'_>, nope: &[bool]) -> Result<Option<Vec<bool>>, ConfigError> {
    if !f.opt_bool("use_qk_norm")?.unwrap_or(true) {
        return Ok(None);
    }
    let normed: Vec<bool> = nope.iter().map(|&n| !n).collect();
    Ok(normed.contains(&true).then_some(normed))
}

/// The attention temperature on the unrotated layers' queries: on unless
/// `attn_temperature_tuning` is false or 0 (Scout's config writes it as the number 4, which
/// transformers reads as true), with `floor_scale` (8192) and `attn_scale` (0.1).
pub(super) fn temperature(f: &Fields<'_>) -> Result<Option<AttnTemperature>, ConfigError> {
    let on = match f.obj.get("attn_temperature_tuning") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => match v.as_f64() {
            Some(x) => x != 0.0,
            None => return Err(f.wrong("attn_temperature_tuning", "true or false", v)),
        },
    };
    if !on {
        return Ok(None);
    }
    let floor = f.opt_float("floor_scale")?.unwrap_or(8192.0);
    let scale = f.opt_float("attn_scale")?.unwrap_or(0.1);
    let t = ir::RopeScaling::Temperature { floor, scale };
    t.check().map_err(|reason| ConfigError::Inconsistent {
        file: f.file.clone(),
        reason: format!("floor_scale and attn_scale: {reason}"),
    })?;
    Ok(Some(AttnTemperature { floor, scale }))
}

/// The dense layers: those not in `moe_layers` (default every `interleave_moe_layer_step`-th
/// layer from step − 1: all of them at step 1, Scout; every other one at 2, Maverick), with a
/// SwiGLU MLP of `intermediate_size_mlp` (default 16384); none where every layer has experts.
pub(super) fn dense_layers(
    f: &Fields<'_>,
    layers: u64,
) -> Result<Option<DenseLayers>, ConfigError> {
    const EXPECTED: &str = "a list of layer indices";
    let moe: Vec<u64> = match f.obj.get("moe_layers") {
        None | Some(Value::Null) => {
            let step = f.opt_positive("interleave_moe_layer_step")?.unwrap_or(1);
            (0..layers).filter(|i| (i + 1) % step == 0).collect()
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_u64().ok_or_else(|| f.wrong("moe_layers", EXPECTED, v)))
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(f.wrong("moe_layers", EXPECTED, v)),
    };
    if moe.is_empty() {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: "moe_layers names no layer: plait builds Llama 4 with experts on at least \
                     one layer (the published configs list them, or interleave_moe_layer_step \
                     gives them)"
                .into(),
        });
    }
    let dense: Vec<bool> = (0..layers).map(|i| !moe.contains(&i)).collect();
    if !dense.contains(&true) {
        return Ok(None);
    }
    let ffn = f.opt_positive("intermediate_size_mlp")?.unwrap_or(16384);
    Ok(Some(DenseLayers { dense, ffn }))
}

/// Llama 4's top-k experts weigh their inputs (`routed_in = hidden_states * router_scores`);
/// with more than one expert a token, each expert reads its own scaled copy, as plait builds
/// it. Its router: the sigmoid of the chosen logits, not renormalized.
pub(super) fn routing() -> ir::Routing {
    ir::Routing {
        sigmoid: true,
        normalize: false,
        ..ir::Routing::default()
    }
}
