//! A config's `rope_scaling`, read as transformers' `ROPE_INIT_FUNCTIONS` read it: the kind
//! from `rope_type` (or the older `type`), each kind's fields with transformers' defaults.

use ir::RopeScaling;
use ir::rope::yarn_mscale;
use serde_json::{Map, Value};

use super::{ConfigError, Fields};

/// The kinds plait computes; the others are modelled as plain frequencies ([`note`]).
const COMPUTED: [&str; 4] = ["default", "linear", "llama3", "yarn"];

/// Every kind transformers' `ROPE_INIT_FUNCTIONS` knows, with the older spellings its
/// configs still carry (`su` for longrope; Qwen2-VL's `mrope`, read as the default); a config
/// naming another is refused, as transformers refuses it.
const KNOWN: [&str; 8] = [
    "default", "linear", "dynamic", "yarn", "longrope", "llama3", "su", "mrope",
];

fn kind(r: &Map<String, Value>) -> Option<&str> {
    r.get("rope_type")
        .or_else(|| r.get("type"))
        .and_then(Value::as_str)
}

fn scaling_object(obj: &Map<String, Value>) -> Option<&Map<String, Value>> {
    match obj.get("rope_scaling") {
        Some(Value::Object(r)) => Some(r),
        _ => None,
    }
}

/// The scaling `f`'s config asks for; `max_positions` is its `max_position_embeddings` (YaRN's
/// original context when the scaling does not name one).
pub(super) fn rope_scaling(f: &Fields<'_>, max_positions: u64) -> Result<RopeScaling, ConfigError> {
    let r = match f.obj.get("rope_scaling") {
        None | Some(Value::Null) => return Ok(RopeScaling::None),
        Some(Value::Object(r)) => r,
        Some(v) => return Err(f.wrong("rope_scaling", "an object or null", v)),
    };
    let num = |key: &str| -> Result<Option<f64>, ConfigError> {
        match r.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| ConfigError::Inconsistent {
                    file: f.file.clone(),
                    reason: format!("rope_scaling.{key} must be a number, got {v}"),
                }),
        }
    };
    let need = |key: &str| -> Result<f64, ConfigError> {
        num(key)?.ok_or_else(|| ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!(
                "rope_scaling of type {} needs `{key}` (as transformers requires)",
                kind(r).unwrap_or("?")
            ),
        })
    };
    check_kind(f, r)?;
    let scaling = match kind(r) {
        Some("linear") => RopeScaling::Linear {
            factor: need("factor")?,
        },
        Some("llama3") => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max: need("original_max_position_embeddings")?,
        },
        Some("yarn") => {
            let factor = need("factor")?;
            let attention_factor = match (
                num("attention_factor")?,
                num("mscale")?,
                num("mscale_all_dim")?,
            ) {
                (Some(a), _, _) => a,
                // transformers: a ratio when both are set and non-zero.
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, all)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            RopeScaling::Yarn {
                factor,
                beta_fast: num("beta_fast")?.unwrap_or(32.0),
                beta_slow: num("beta_slow")?.unwrap_or(1.0),
                original_max: num("original_max_position_embeddings")?
                    .unwrap_or(max_positions as f64),
                attention_factor,
                truncate: match r.get("truncate") {
                    None | Some(Value::Null) => true,
                    Some(Value::Bool(t)) => *t,
                    Some(v) => {
                        return Err(ConfigError::Inconsistent {
                            file: f.file.clone(),
                            reason: format!("rope_scaling.truncate must be true or false, got {v}"),
                        });
                    }
                },
            }
        }
        Some("dynamic") => {
            at_least_one(f, "dynamic", need("factor")?)?;
            RopeScaling::None
        }
        Some("longrope" | "su") => {
            longrope_factors(f, r)?;
            RopeScaling::None
        }
        _ => RopeScaling::None,
    };
    scaling
        .check()
        .map_err(|reason| ConfigError::Inconsistent {
            file: f.file.clone(),
            reason,
        })?;
    Ok(scaling)
}

/// The scaling's kind, under `rope_type` or the older `type` (the same one if both), one
/// transformers knows.
fn check_kind(f: &Fields<'_>, r: &Map<String, Value>) -> Result<(), ConfigError> {
    let refuse = |reason: String| ConfigError::Inconsistent {
        file: f.file.clone(),
        reason,
    };
    let named = ["rope_type", "type"].map(|key| r.get(key).filter(|v| !v.is_null()));
    let (key, k) = match named {
        [Some(a), Some(b)] if a != b => {
            return Err(refuse(format!(
                "rope_scaling names two kinds, rope_type {a} and type {b}: keep one"
            )));
        }
        [Some(k), _] => ("rope_type", k),
        [None, Some(k)] => ("type", k),
        [None, None] => {
            return Err(refuse(format!(
                "rope_scaling {} names no kind: set rope_type to one of {} (transformers \
                 needs it)",
                Value::Object(brief(r)),
                KNOWN.join(", ")
            )));
        }
    };
    match k.as_str() {
        Some(name) if KNOWN.contains(&name) => Ok(()),
        _ => Err(refuse(format!(
            "rope_scaling.{key} = {k} is not a kind transformers knows ({})",
            KNOWN.join(", ")
        ))),
    }
}

/// A scaling factor transformers requires to be at least 1.
fn at_least_one(f: &Fields<'_>, kind: &str, factor: f64) -> Result<(), ConfigError> {
    if factor >= 1.0 && factor.is_finite() {
        return Ok(());
    }
    Err(ConfigError::Inconsistent {
        file: f.file.clone(),
        reason: format!("rope_scaling of type {kind} needs a factor of at least 1, got {factor}"),
    })
}

/// LongRoPE's per-frequency factors (Phi-3's 128k configs): `short_factor` and `long_factor`,
/// positive numbers, one per rotated pair of a head (transformers'
/// `_validate_longrope_parameters`).
fn longrope_factors(f: &Fields<'_>, r: &Map<String, Value>) -> Result<(), ConfigError> {
    let heads = f.opt_positive("num_attention_heads")?;
    let head = f.opt_positive("head_dim")?.or_else(|| {
        let hidden = f.opt_positive("hidden_size").ok().flatten()?;
        Some(hidden / heads?)
    });
    let share = f.opt_float("partial_rotary_factor")?.unwrap_or(1.0);
    let pairs = head.map(|d| (d as f64 * share) as u64 / 2);
    for key in ["short_factor", "long_factor"] {
        let factors = match r.get(key) {
            Some(Value::Array(a)) => a,
            _ => &Vec::new(),
        };
        let positive = |v: &Value| v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0);
        let length_ok = pairs.is_none_or(|p| factors.len() as u64 == p);
        if factors.is_empty() || !length_ok || !factors.iter().all(positive) {
            return Err(ConfigError::Inconsistent {
                file: f.file.clone(),
                reason: format!(
                    "rope_scaling.{key} must be a list of positive numbers, one per rotated \
                     pair of a head ({}); it has {} entries",
                    pairs.map_or("head_dim / 2".to_string(), |p| p.to_string()),
                    factors.len()
                ),
            });
        }
    }
    Ok(())
}

/// Hunyuan's dynamic NTK alpha (`rope_scaling: {"type": "dynamic", "alpha": a}`), which
/// raises the rotary base once (HunYuanDenseV1RotaryEmbedding); `None` without one. An alpha
/// that is not a number above 1 is refused, as HunYuanDenseV1Config refuses it.
pub(super) fn ntk_alpha(f: &Fields<'_>) -> Result<Option<f64>, ConfigError> {
    let Some(r) = scaling_object(f.obj) else {
        return Ok(None);
    };
    let Some(v) = r.get("alpha").filter(|_| kind(r) == Some("dynamic")) else {
        return Ok(None);
    };
    match v.as_f64() {
        Some(a) if a > 1.0 && a.is_finite() => Ok(Some(a)),
        _ => Err(ConfigError::Inconsistent {
            file: f.file.clone(),
            reason: format!("rope_scaling.alpha must be a number above 1, got {v}"),
        }),
    }
}

/// What `inspect` says of a scaling plait does not compute, `None` for one it does.
pub(super) fn note(obj: &Map<String, Value>) -> Option<String> {
    let r = scaling_object(obj)?;
    let hunyuan = obj.get("model_type").and_then(Value::as_str) == Some("hunyuan_v1_dense");
    if hunyuan && kind(r) == Some("dynamic") && r.contains_key("alpha") {
        // Computed: the alpha raises the base (`ntk_alpha`).
        return None;
    }
    match kind(r) {
        Some(k) if COMPUTED.contains(&k) => None,
        Some("dynamic") => Some(format!(
            "rope_scaling {} (dynamic NTK) changes the frequencies only beyond \
             max_position_embeddings: plait's are the plain ones, exact up to that length",
            Value::Object(r.clone())
        )),
        _ => Some(format!(
            "rope_scaling {} is modelled as plain rotary embeddings (the same shapes and FLOPs; \
             plait computes the linear, llama3 and yarn kinds)",
            Value::Object(brief(r))
        )),
    }
}

/// `r` with its per-dimension factor lists (longrope's `long_factor`, `short_factor`: 48 or 64
/// numbers each) shown by their length, so a note stays one readable line.
fn brief(r: &Map<String, Value>) -> Map<String, Value> {
    r.iter()
        .map(|(k, v)| match v {
            Value::Array(a) if a.len() > 4 => {
                (k.clone(), Value::String(format!("[{} numbers]", a.len())))
            }
            _ => (k.clone(), v.clone()),
        })
        .collect()
}
