//! MiniMax-M2 as transformers builds it (`MiniMaxM2Config`, `modeling_minimax_m2.py`):
//! Mixtral's block and experts, q and k each normed over the whole projection (OLMo 2's
//! `q_norm` of `heads × head_dim`), the first `rotary_dim` of each head rotated, and a
//! sigmoid router whose top k scores are renormalized (DeepSeek-V3's, one group).
//!
//! MiniMax's own configuration (the checkpoint's `configuration_minimax_m2.py`) names more
//! switches than transformers reads: `use_qk_norm` and `qk_norm_type` are honoured (per head
//! is Qwen3's norm), `rotary_dim` gives the rotary width where `partial_rotary_factor` is
//! absent, and what transformers would build differently from the file — lightning-attention
//! layers in `attn_type_list`, a shared expert, a softmax router — is refused by name.

use serde_json::Value;

use super::{ConfigError, Fields};

/// `MiniMaxM2Config`'s `head_dim` default.
pub(super) const HEAD_DIM: u64 = 128;
/// `MiniMaxM2Config`'s `num_key_value_heads` default.
pub(super) const KV_HEADS: u64 = 8;

/// Whether q and k are normed, and over the whole projection (`qk_norm_type: per_layer`, the
/// published configs') rather than per head.
pub(super) fn qk_norm(f: &Fields<'_>) -> Result<(bool, bool), ConfigError> {
    if !f.opt_bool("use_qk_norm")?.unwrap_or(true) {
        return Ok((false, false));
    }
    match word(f, "qk_norm_type", "per_layer")?.as_str() {
        "per_layer" => Ok((true, true)),
        "per_head" => Ok((true, false)),
        other => Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "qk_norm_type = \"{other}\": MiniMax-M2 norms q and k over the whole projection \
                 (\"per_layer\") or per head (\"per_head\"); use one of those"
            ),
        }),
    }
}

/// The rotary width: `partial_rotary_factor` of the head where given (transformers reads
/// only it), else the checkpoint's `rotary_dim`; both given, they must agree. `None`: the
/// whole head.
pub(super) fn rotary_dims(f: &Fields<'_>, head_dim: u64) -> Result<Option<u64>, ConfigError> {
    let by_factor = match f.opt_float("partial_rotary_factor")? {
        Some(factor) => super::rotary_dims(f, head_dim, ("partial_rotary_factor", factor))?,
        None => None,
    };
    let Some(dims) = f.opt_positive("rotary_dim")? else {
        return Ok(by_factor);
    };
    if dims > head_dim || !dims.is_multiple_of(2) {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "rotary_dim = {dims} of a head of {head_dim}: it must be an even number from 2 \
                 to the head size"
            ),
        });
    }
    let rotary = (dims < head_dim).then_some(dims);
    if f.opt_float("partial_rotary_factor")?.is_some() && by_factor != rotary {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "rotary_dim = {dims} but partial_rotary_factor turns {} of a head of \
                 {head_dim}: transformers reads partial_rotary_factor, MiniMax's code \
                 rotary_dim; make them agree",
                by_factor.unwrap_or(head_dim)
            ),
        });
    }
    Ok(rotary)
}

/// transformers' `MiniMaxM2TopKRouter`: a sigmoid per expert, the top k renormalized. The
/// checkpoint's `scoring_func` may only say so.
pub(super) fn routing(f: &Fields<'_>) -> Result<ir::Routing, ConfigError> {
    let scoring = word(f, "scoring_func", "sigmoid")?;
    if scoring != "sigmoid" {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "scoring_func = \"{scoring}\": transformers' MiniMax-M2 router scores experts \
                 with a sigmoid whatever the file says; set it to \"sigmoid\""
            ),
        });
    }
    Ok(ir::Routing {
        sigmoid: true,
        normalize: true,
        groups: 1,
        groups_kept: 1,
        group_top: 2,
    })
}

/// What transformers' MiniMax-M2 does not build, refused rather than planned as something
/// else: lightning-attention layers (`attn_type_list` 0s, MiniMax-Text-01's) and a shared
/// expert (`shared_intermediate_size` above 0).
pub(super) fn check_unbuilt(f: &Fields<'_>) -> Result<(), ConfigError> {
    if let Some(kinds) = f.obj.get("attn_type_list").filter(|v| !v.is_null()) {
        let Some(kinds) = kinds.as_array() else {
            return Err(f.wrong("attn_type_list", "a list of 0s and 1s", kinds));
        };
        for (layer, kind) in kinds.iter().enumerate() {
            match kind.as_u64() {
                Some(1) => {}
                Some(0) => {
                    return Err(ConfigError::Inconsistent {
                        file: f.file.clone(),
                        reason: format!(
                            "attn_type_list[{layer}] = 0: a lightning (linear) attention \
                             layer, which plait does not build (MiniMax-M2's layers are all \
                             1, full attention)"
                        ),
                    });
                }
                _ => return Err(f.wrong("attn_type_list", "a list of 0s and 1s", kind)),
            }
        }
    }
    if f.opt_count("shared_intermediate_size")?.unwrap_or(0) > 0 {
        return Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: "shared_intermediate_size above 0: transformers' MiniMax-M2 builds no \
                     shared expert; set it to 0 (as the published configs do)"
                .into(),
        });
    }
    Ok(())
}

/// A string field, `default` where absent or null.
fn word(f: &Fields<'_>, field: &'static str, default: &str) -> Result<String, ConfigError> {
    match f.obj.get(field) {
        None | Some(Value::Null) => Ok(default.to_string()),
        Some(Value::String(w)) => Ok(w.clone()),
        Some(v) => Err(f.wrong(field, "a string", v)),
    }
}

/// The checkpoint's multi-token prediction modules (`use_mtp`, `num_mtp_modules`), which
/// transformers does not build.
pub(super) fn unbuilt_prediction_modules(obj: &serde_json::Map<String, Value>) -> Option<String> {
    if obj.get("use_mtp") != Some(&Value::Bool(true)) {
        return None;
    }
    let n = obj
        .get("num_mtp_modules")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)?;
    Some(format!(
        "use_mtp with num_mtp_modules {n}: the multi-token prediction modules are not built (as \
         in transformers; their parameters are not counted)"
    ))
}
