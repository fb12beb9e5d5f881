//! What a mixture-of-experts config says of its router and of which layers have experts, read
//! as transformers' modeling code reads it.

use ir::Routing;
use serde_json::Value;

use super::{ConfigError, Fields};
use crate::spec::DenseLayers;

/// The router of a mixture-of-experts family, with transformers' defaults: Mixtral's softmax
/// over the top k; Qwen-MoE's shares of a softmax over all experts, renormalized when
/// `norm_topk_prob` (default false); DeepSeek-V3's sigmoid scores limited to `topk_group` of
/// `n_group` groups, renormalized when `norm_topk_prob` (default true); DeepSeek-V2's softmax
/// shares, never renormalized, limited to groups by `topk_method` ([`deepseek_v2_routing`]).
pub(super) fn routing(f: &Fields<'_>, model_type: &str) -> Result<Routing, ConfigError> {
    Ok(match model_type {
        // OlmoeConfig's and FlexOlmoConfig's `norm_topk_prob` default to false too.
        "qwen2_moe" | "qwen3_moe" | "olmoe" | "flex_olmo" => Routing {
            normalize: f.opt_bool("norm_topk_prob")?.unwrap_or(false),
            ..Routing::default()
        },
        "deepseek_v3" => sigmoid_groups(f, 8, 4)?,
        // GLM-4.5's router is DeepSeek-V3's (transformers' Glm4MoeTopkRouter), one group by
        // default.
        // K-EXAONE's too (transformers' ExaoneMoeTopkRouter is DeepseekV3TopkRouter).
        "glm4_moe" | "glm4_moe_lite" | "exaone_moe" => sigmoid_groups(f, 1, 1)?,
        // dots.llm1's is too, its norm_topk_prob false by default (Dots1Config).
        "dots1" => Routing {
            normalize: f.opt_bool("norm_topk_prob")?.unwrap_or(false),
            ..sigmoid_groups(f, 1, 1)?
        },
        "deepseek_v2" => deepseek_v2_routing(f)?,
        "llama4_text" => super::llama4::routing(),
        "minimax_m2" => super::minimax::routing(f)?,
        _ => Routing::default(),
    })
}

/// gpt-oss's experts (transformers' `GptOssExperts`): biases on every projection and the
/// clamped unit (gate ≤ limit, |up| ≤ limit) gate·σ(α·gate)·(up + 1), with GptOssConfig's
/// `swiglu_alpha` 1.702 and `swiglu_limit` 7.0 where the config leaves them out.
pub(super) fn gpt_oss_experts(f: &Fields<'_>) -> Result<ir::ExpertForm, ConfigError> {
    let alpha = f.opt_float("swiglu_alpha")?.unwrap_or(1.702);
    let limit = f.opt_float("swiglu_limit")?.unwrap_or(7.0);
    let form = ir::ExpertForm {
        bias: true,
        alpha,
        limit: Some(limit),
        up_offset: 1.0,
        scales_input: false,
    };
    form.check().map_err(|reason| ConfigError::Inconsistent {
        file: f.file.clone(),
        reason: format!("swiglu_alpha and swiglu_limit: {reason}"),
    })?;
    Ok(form)
}

/// DeepSeek-V3's sigmoid router: each group scored by its best two experts, the top k taken
/// from the `topk_group` best of `n_group` groups (defaults `groups`, `kept`), renormalized
/// unless `norm_topk_prob` is false.
fn sigmoid_groups(f: &Fields<'_>, groups: u64, kept: u64) -> Result<Routing, ConfigError> {
    Ok(Routing {
        sigmoid: true,
        normalize: f.opt_bool("norm_topk_prob")?.unwrap_or(true),
        groups: f.opt_positive("n_group")?.unwrap_or(groups),
        groups_kept: f.opt_positive("topk_group")?.unwrap_or(kept),
        group_top: 2,
    })
}

/// DeepSeek-V2's router as transformers' `DeepseekV2Moe.route_tokens_to_experts` has it: a
/// softmax over every expert (`scoring_func` softmax, the only one it has); the top k shares
/// as they are, never renormalized (it does not read `norm_topk_prob`); with `topk_method:
/// group_limited_greedy` only the experts of the `topk_group` of `n_group` groups whose best
/// expert scores highest, with `greedy` (the default) all of them.
fn deepseek_v2_routing(f: &Fields<'_>) -> Result<Routing, ConfigError> {
    let word = |field: &'static str, default: &'static str| match f.obj.get(field) {
        None | Some(Value::Null) => Ok(default.to_string()),
        Some(Value::String(w)) => Ok(w.clone()),
        Some(v) => Err(f.wrong(field, "a string", v)),
    };
    // Not applied (transformers' DeepseekV2Moe never renormalizes; `approximations` says so),
    // but a value of the wrong type is still the user's to fix.
    f.opt_bool("norm_topk_prob")?;
    let scoring = word("scoring_func", "softmax")?;
    if scoring != "softmax" {
        return Err(refused(
            f,
            format!(
                "scoring_func = \"{scoring}\": DeepSeek-V2's router scores experts by a softmax \
                 (a sigmoid router is DeepSeek-V3's: model_type \"deepseek_v3\")"
            ),
        ));
    }
    let shares = Routing {
        normalize: false,
        ..Routing::default()
    };
    match word("topk_method", "greedy")?.as_str() {
        "greedy" => Ok(shares),
        "group_limited_greedy" => Ok(Routing {
            groups: required_for_groups(f, "n_group")?,
            groups_kept: required_for_groups(f, "topk_group")?,
            group_top: 1,
            ..shares
        }),
        other => Err(refused(
            f,
            format!(
                "topk_method = \"{other}\": DeepSeek-V2 routes by \"greedy\" or \
                 \"group_limited_greedy\" (\"noaux_tc\" is DeepSeek-V3's: model_type \
                 \"deepseek_v3\")"
            ),
        )),
    }
}

/// A group field `group_limited_greedy` needs (DeepseekV2Config leaves both unset).
fn required_for_groups(f: &Fields<'_>, field: &'static str) -> Result<u64, ConfigError> {
    f.opt_positive(field)?.ok_or_else(|| {
        refused(
            f,
            format!("topk_method = \"group_limited_greedy\" needs {field} (a positive integer)"),
        )
    })
}

fn refused(f: &Fields<'_>, reason: String) -> ConfigError {
    ConfigError::Inconsistent {
        file: f.file.clone(),
        reason,
    }
}

/// DeepSeek's dense layers (transformers' `DeepseekV3DecoderLayer`): layer i has experts when
/// i ≥ `first_k_dense_replace` (absent: `default`, transformers' 3 for V3 and 0 for V2) and
/// `moe_layer_freq` (default 1) divides i; the others a SwiGLU of `intermediate_size`. `None`
/// when every layer has experts.
pub(super) fn deepseek_dense_layers(
    f: &Fields<'_>,
    default: u64,
) -> Result<Option<DenseLayers>, ConfigError> {
    let freq = f.opt_positive("moe_layer_freq")?.unwrap_or(1);
    let Some(leading) = leading_dense_layers(f, default)? else {
        if freq == 1 {
            return Ok(None);
        }
        return every_layer_where(f, |i| !i.is_multiple_of(freq));
    };
    if freq == 1 {
        return Ok(Some(leading));
    }
    let first = leading.count(leading.dense.len() as u64);
    every_layer_where(f, |i| i < first || !i.is_multiple_of(freq))
}

/// The dense layers `dense(i)` picks of `num_hidden_layers`, each a SwiGLU of
/// `intermediate_size`; `None` where it picks none.
fn every_layer_where(
    f: &Fields<'_>,
    dense: impl Fn(u64) -> bool,
) -> Result<Option<DenseLayers>, ConfigError> {
    let layers = f.positive("num_hidden_layers")?;
    if layers > super::MAX_LAYERS {
        // Refused by the consistency check, without a walk over every layer first.
        return Ok(None);
    }
    let dense: Vec<bool> = (0..layers).map(dense).collect();
    if !dense.contains(&true) {
        return Ok(None);
    }
    Ok(Some(DenseLayers {
        dense,
        ffn: f.positive("intermediate_size")?,
    }))
}

/// The `first_k_dense_replace` (absent: `default`) leading dense layers of
/// `intermediate_size`, every later layer with experts (GLM-4.5's, which reads no layer
/// frequency); `None` when there are none.
pub(super) fn leading_dense_layers(
    f: &Fields<'_>,
    default: u64,
) -> Result<Option<DenseLayers>, ConfigError> {
    let count = match f.obj.get("first_k_dense_replace") {
        None => default,
        Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| f.wrong("first_k_dense_replace", "a non-negative integer", v))?,
    };
    if count == 0 {
        return Ok(None);
    }
    let layers = f.positive("num_hidden_layers")?;
    if layers > super::MAX_LAYERS {
        // Refused by the consistency check, without a walk over every layer first.
        return Ok(None);
    }
    Ok(Some(DenseLayers::leading(
        count,
        layers,
        f.positive("intermediate_size")?,
    )))
}

/// GLM-4.7-Flash's and K-EXAONE's dense layers: those `mlp_layer_types` calls "dense" (the
/// others "sparse"); without the list, those K-EXAONE's own code marks false in
/// `is_moe_layer`; without either, the `first_k_dense_replace` leading ones (default 1:
/// transformers' default list, layer 0 dense), as the published configs say both ways.
pub(super) fn mlp_layer_types(
    f: &Fields<'_>,
    layers: u64,
) -> Result<Option<DenseLayers>, ConfigError> {
    let Some(v) = f.obj.get("mlp_layer_types").filter(|v| !v.is_null()) else {
        return match f.obj.get("is_moe_layer").filter(|v| !v.is_null()) {
            Some(listed) => is_moe_layer(f, listed, layers),
            None => leading_dense_layers(f, 1),
        };
    };
    let expected = "a list of \"dense\" and \"sparse\", one per layer";
    let kinds = v
        .as_array()
        .ok_or_else(|| f.wrong("mlp_layer_types", expected, v))?;
    let dense = kinds
        .iter()
        .map(|k| match k.as_str() {
            Some("dense") => Ok(true),
            Some("sparse") => Ok(false),
            _ => Err(f.wrong("mlp_layer_types", expected, k)),
        })
        .collect::<Result<Vec<bool>, _>>()?;
    if dense.len() as u64 != layers {
        return Err(refused(
            f,
            format!(
                "mlp_layer_types lists {} layers for num_hidden_layers = {layers}: give one \
                 entry per layer",
                dense.len()
            ),
        ));
    }
    every_layer_where(f, |i| dense[i as usize])
}

/// Dense layers where `is_moe_layer` (one boolean a layer) is false.
fn is_moe_layer(
    f: &Fields<'_>,
    listed: &Value,
    layers: u64,
) -> Result<Option<DenseLayers>, ConfigError> {
    let expected = "a list of true (experts) and false (dense), one per layer";
    let kinds = listed
        .as_array()
        .ok_or_else(|| f.wrong("is_moe_layer", expected, listed))?;
    let dense = kinds
        .iter()
        .map(|k| {
            k.as_bool()
                .map(|moe| !moe)
                .ok_or_else(|| f.wrong("is_moe_layer", expected, k))
        })
        .collect::<Result<Vec<bool>, _>>()?;
    if dense.len() as u64 != layers {
        return Err(refused(
            f,
            format!(
                "is_moe_layer lists {} layers for num_hidden_layers = {layers}: give one entry \
                 per layer",
                dense.len()
            ),
        ));
    }
    every_layer_where(f, |i| dense[i as usize])
}

/// Qwen-MoE's dense layers: transformers gives layer i experts unless it is in
/// `mlp_only_layers` or i + 1 is not a multiple of `decoder_sparse_step` (default 1); a dense
/// layer's MLP is `intermediate_size` wide.
pub(super) fn qwen_dense_layers(f: &Fields<'_>) -> Result<Option<DenseLayers>, ConfigError> {
    let step = f.opt_positive("decoder_sparse_step")?.unwrap_or(1);
    let only: Vec<u64> = match f.obj.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| f.wrong("mlp_only_layers", "a list of layer indices", v))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(f.wrong("mlp_only_layers", "a list of layer indices", v)),
    };
    every_layer_where(f, |i| only.contains(&i) || !(i + 1).is_multiple_of(step))
}

/// What `inspect` says of expert fields that leave no layer with experts or name no layer
/// (transformers builds the model all the same): a first_k_dense_replace or
/// decoder_sparse_step beyond the layers, an mlp_only_layers entry past the last layer.
pub(super) fn unused_expert_notes(obj: &serde_json::Map<String, Value>) -> Vec<String> {
    let int = |key: &str| obj.get(key).and_then(Value::as_u64);
    let Some(layers) = int("num_hidden_layers") else {
        return Vec::new();
    };
    let mut notes = Vec::new();
    // Layer i has experts from i = first_k_dense_replace on, and where decoder_sparse_step
    // divides i + 1: none when the first is at least the layers, or the step more.
    for (key, at_least) in [("first_k_dense_replace", 1), ("decoder_sparse_step", 0)] {
        if let Some(n) = int(key).filter(|&n| n.saturating_add(at_least) > layers) {
            notes.push(format!(
                "{key} = {n} leaves no expert layer in {layers} layers: the model is built \
                 dense, as transformers builds it (its expert fields are unused)"
            ));
        }
    }
    if let Some(Value::Array(only)) = obj.get("mlp_only_layers") {
        let past: Vec<u64> = only
            .iter()
            .filter_map(Value::as_u64)
            .filter(|&l| l >= layers)
            .take(4)
            .collect();
        if !past.is_empty() {
            notes.push(format!(
                "mlp_only_layers names layers {past:?} past the last of {layers} layers: \
                 those entries are unused"
            ));
        }
    }
    notes
}

/// ERNIE 4.5's dense layers (transformers' `Ernie4_5_MoeDecoderLayer`): layer i has experts
/// when `moe_layer_start_index` ≤ i ≤ `moe_layer_end_index` (−1: the last layer) and
/// `moe_layer_interval` divides i + 1 (defaults 1, −1, 1); every other layer a SwiGLU MLP of
/// `intermediate_size` (every layer, as transformers builds it, where the fields leave none with
/// experts). `None` when every layer has experts.
pub(super) fn ernie_dense_layers(
    f: &Fields<'_>,
    layers: u64,
) -> Result<Option<DenseLayers>, ConfigError> {
    let start = f.opt_count("moe_layer_start_index")?.unwrap_or(1);
    let end = match f.obj.get("moe_layer_end_index") {
        None | Some(Value::Null) => layers.saturating_sub(1),
        Some(v) if v.as_i64() == Some(-1) => layers.saturating_sub(1),
        Some(v) => v.as_u64().ok_or_else(|| {
            f.wrong(
                "moe_layer_end_index",
                "a layer index, or -1 for the last layer",
                v,
            )
        })?,
    };
    let interval = f.opt_positive("moe_layer_interval")?.unwrap_or(1);
    every_layer_where(f, |i| {
        !(start <= i && i <= end && (i + 1).is_multiple_of(interval))
    })
}
