//! transformers 5 writes a config's rotary settings into one `rope_parameters` object (its
//! `rope_theta`, `rope_type` and scaling fields, `partial_rotary_factor`), or one such object
//! per attention kind (`full_attention`, `sliding_attention`) for models with `layer_types`.
//! transformers 4 wrote them as `rope_theta`, `rope_scaling` and `partial_rotary_factor` at the
//! top. plait reads the older fields, so a newer config's are put back there first. As in
//! transformers 5, a top-level `rope_scaling` replaces `rope_parameters` whole (its
//! `rope_scaling or rope_parameters`); otherwise the values in `rope_parameters` win over the
//! top-level `rope_theta` and `partial_rotary_factor`.

use std::path::Path;

use serde_json::{Map, Value};

use super::ConfigError;

/// One attention kind's rotary parameters.
type Params = Map<String, Value>;

/// Fields of a `rope_parameters` object that are not part of the scaling.
const NOT_SCALING: [&str; 2] = ["rope_theta", "partial_rotary_factor"];

/// `obj` with its `rope_parameters` (if any) read back into the transformers 4 fields: the
/// full-attention layers' parameters as `rope_theta`, `rope_scaling` and
/// `partial_rotary_factor`, the sliding-window layers' base as `rope_local_base_freq`.
pub(super) fn as_v4_fields(
    mut obj: Map<String, Value>,
    file: &Path,
) -> Result<Map<String, Value>, ConfigError> {
    if matches!(obj.get("rope_scaling"), Some(Value::Object(_))) {
        return Ok(obj);
    }
    let params = match obj.get("rope_parameters") {
        None | Some(Value::Null) => return Ok(obj),
        Some(Value::Object(p)) => p.clone(),
        Some(v) => {
            return Err(ConfigError::WrongType {
                file: file.to_path_buf(),
                field: "rope_parameters",
                expected: "an object",
                got: v.to_string(),
            });
        }
    };
    let Some((main, local)) = per_attention_kind(&params) else {
        put_back(&mut obj, &params);
        return Ok(obj);
    };
    put_back(&mut obj, main);
    if let Some(theta) = local.and_then(|l| l.get("rope_theta")) {
        obj.insert("rope_local_base_freq".into(), theta.clone());
    }
    Ok(obj)
}

/// Where `params` holds one object per attention kind: the full-attention layers' (or, with
/// none, the first kind's) and the sliding-window layers'. `None` for one flat object, whose
/// values are numbers, strings and lists, never objects.
fn per_attention_kind(params: &Params) -> Option<(&Params, Option<&Params>)> {
    let nested = !params.is_empty() && params.values().all(|v| v.is_object() || v.is_null());
    if !nested {
        return None;
    }
    let kind = |k: &str| params.get(k).and_then(Value::as_object);
    let main = kind("full_attention").or_else(|| params.values().find_map(Value::as_object))?;
    Some((main, kind("sliding_attention")))
}

/// Writes one attention kind's `params` as `rope_theta`, `partial_rotary_factor` and (for a
/// type other than the default) `rope_scaling`.
fn put_back(obj: &mut Map<String, Value>, params: &Params) {
    for field in NOT_SCALING {
        if let Some(v) = params.get(field).filter(|v| !v.is_null()) {
            obj.insert(field.into(), v.clone());
        }
    }
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    if kind == "default" {
        return;
    }
    let scaling: Params = params
        .iter()
        .filter(|(k, _)| !NOT_SCALING.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    obj.insert("rope_scaling".into(), Value::Object(scaling));
}
