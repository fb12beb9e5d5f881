//! Multimodal configs whose language model plait plans: Gemma 3's `gemma3` nests its text
//! model's config under `text_config`, listing only the fields that differ from transformers'
//! `Gemma3TextConfig` defaults; Mistral Small 3.1's `mistral3` nests a whole Mistral config
//! there; Qwen2-VL's and Qwen2.5-VL's configs carry their Qwen2 text model's fields at the top
//! (or, written by newer transformers, under `text_config`), Qwen3-VL's a Qwen3 or Qwen3-MoE
//! text model under `text_config`. plait imports that text model (the vision tower is not
//! built), with Gemma 3's defaults filled in.

use serde_json::{Map, Value, json};

/// (multimodal `model_type`, its text model's `model_type` where `text_config` names none:
/// transformers' default text config).
const TEXT_CONFIGS: [(&str, &str); 7] = [
    ("gemma3", "gemma3_text"),
    ("llama4", "llama4_text"),
    ("mistral3", "mistral"),
    ("qwen2_vl", "qwen2"),
    ("qwen2_5_vl", "qwen2"),
    ("qwen3_vl", "qwen3"),
    ("qwen3_vl_moe", "qwen3_moe"),
];

/// Multimodal configs whose text model's fields may sit at the top instead of under
/// `text_config` (Qwen2-VL's and Qwen2.5-VL's as first published).
const TOP_LEVEL_TEXT: [&str; 2] = ["qwen2_vl", "qwen2_5_vl"];

/// Text models' own `model_type`s that are a family plait builds: (name, family).
const TEXT_ALIASES: [(&str, &str); 4] = [
    ("qwen2_vl_text", "qwen2"),
    ("qwen2_5_vl_text", "qwen2"),
    ("qwen3_vl_text", "qwen3"),
    ("qwen3_vl_moe_text", "qwen3_moe"),
];

/// Fields a multimodal config may keep at the top that its text model reads.
const INHERITED: [&str; 1] = ["tie_word_embeddings"];

/// transformers' `Gemma3TextConfig` defaults (`configuration_gemma3.py`) for the fields plait
/// reads; the soft-caps and rope scaling default to none.
fn gemma3_text_defaults() -> [(&'static str, Value); 13] {
    [
        ("vocab_size", json!(262_208)),
        ("hidden_size", json!(2304)),
        ("intermediate_size", json!(9216)),
        ("num_hidden_layers", json!(26)),
        ("num_attention_heads", json!(8)),
        ("num_key_value_heads", json!(4)),
        ("head_dim", json!(256)),
        ("max_position_embeddings", json!(131_072)),
        ("rms_norm_eps", json!(1e-6)),
        ("rope_theta", json!(1_000_000.0)),
        ("query_pre_attn_scalar", json!(256)),
        ("sliding_window", json!(4096)),
        ("tie_word_embeddings", json!(true)),
    ]
}

/// The text model's `model_type` where `model_type` is a multimodal config plait reads the
/// language model of.
pub(super) fn text_model_type(model_type: &str) -> Option<&'static str> {
    TEXT_CONFIGS
        .iter()
        .find(|(m, _)| *m == model_type)
        .map(|&(_, t)| t)
}

/// The config plait reads for `model_type`: a multimodal config's `text_config` (`Err`: the
/// field that is missing or not an object), or `obj` itself; with a Gemma 3 text model's
/// defaults for what it leaves out.
pub(super) fn text_model(
    obj: Map<String, Value>,
    model_type: &str,
) -> Result<(Map<String, Value>, String), &'static str> {
    let (mut text, model_type) = match text_model_type(model_type) {
        Some(default) => match obj.get("text_config") {
            Some(Value::Object(c)) => {
                let named = c.get("model_type").and_then(Value::as_str);
                let mut text = c.clone();
                for field in INHERITED {
                    if let (false, Some(v)) = (text.contains_key(field), obj.get(field)) {
                        text.insert(field.into(), v.clone());
                    }
                }
                (text, named.unwrap_or(default).to_string())
            }
            None | Some(Value::Null) if TOP_LEVEL_TEXT.contains(&model_type) => {
                (obj, default.to_string())
            }
            _ => return Err("text_config"),
        },
        None => (obj, model_type.to_string()),
    };
    let model_type = TEXT_ALIASES
        .iter()
        .find(|(name, _)| *name == model_type)
        .map_or(model_type, |&(_, family)| family.to_string());
    if model_type == "gemma3_text" {
        for (field, value) in gemma3_text_defaults() {
            if !text.contains_key(field) {
                text.insert(field.into(), value);
            }
        }
    }
    text.insert("model_type".into(), Value::String(model_type.clone()));
    Ok((text, model_type))
}
