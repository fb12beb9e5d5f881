//! Fields plait does not build from but transformers reads (dropout of attention scores and
//! embeddings, switches, sliding windows, Gemma 3's layer kinds, a partial rotary where the
//! family turns whole heads): absurd or mistyped values are refused naming the field, while
//! every published config of `fixtures/hf/` still reads.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use import::hf;
use serde_json::{Value, json};

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/hf")
        .join(name)
        .join("config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The error of `name`'s config with `field` set to `value`, or `None` if it reads.
fn with(name: &str, field: &str, value: Value) -> Option<String> {
    let mut config = fixture(name);
    config[field] = value;
    hf::parse_config(&config.to_string(), Path::new("config.json"))
        .err()
        .map(|e| e.to_string())
}

#[test]
fn absurd_values_of_fields_plait_does_not_build_are_refused_by_name() {
    let cases: [(&str, &str, Value); 17] = [
        ("gpt2", "attn_pdrop", json!(2.0)),
        ("gpt2", "embd_pdrop", json!(-0.5)),
        ("gpt2", "scale_attn_weights", json!("yes")),
        ("qwen2.5-7b", "attention_dropout", json!(-1)),
        ("qwen2.5-7b", "use_sliding_window", json!("yes")),
        ("qwen2.5-7b", "attention_bias", json!("true")),
        ("qwen2.5-7b", "max_window_layers", json!(-1)),
        ("qwen2.5-7b", "max_window_layers", json!("x")),
        ("qwen2.5-7b", "partial_rotary_factor", json!(0.5)),
        ("mistral-nemo-base", "sliding_window", json!(-4096)),
        ("mistral-nemo-base", "sliding_window", json!(4096.5)),
        ("gemma-3-1b", "sliding_window_pattern", json!(0)),
        ("gemma-3-1b", "rope_local_base_freq", json!(-1)),
        ("gemma-3-1b", "layer_types", json!("sliding")),
        ("gemma-3-1b", "layer_types", json!(vec!["foo"; 26])),
        (
            "gemma-3-1b",
            "layer_types",
            json!(vec!["full_attention"; 3]),
        ),
        ("deepseek-v3", "num_nextn_predict_layers", json!(-1)),
    ];
    for (name, field, value) in cases {
        let err = with(name, field, value.clone())
            .unwrap_or_else(|| panic!("{name}: {field} = {value} was accepted"));
        assert!(err.contains(field), "{name}: {field} = {value}: {err}");
    }
}

#[test]
fn sensible_values_of_those_fields_still_read() {
    for (name, field, value) in [
        ("qwen2.5-7b", "max_window_layers", json!(999)),
        ("qwen2.5-7b", "partial_rotary_factor", json!(1.0)),
        ("mistral-nemo-base", "sliding_window", json!(4096)),
        ("mistral-nemo-base", "sliding_window", Value::Null),
        ("mistral-nemo-base", "sliding_window", json!(0)),
        (
            "gemma-3-1b",
            "layer_types",
            json!(vec!["sliding_attention"; 26]),
        ),
        ("nemotron-mini-4b", "partial_rotary_factor", json!(0.25)),
        ("gpt2", "attn_pdrop", json!(0.0)),
    ] {
        assert_eq!(
            with(name, field, value.clone()),
            None,
            "{name}: {field} = {value}"
        );
    }
    for name in [
        "gpt2",
        "qwen2.5-7b",
        "gemma-3-1b",
        "phi-3-mini-4k",
        "deepseek-v3",
    ] {
        let text = fixture(name).to_string();
        hf::parse_config(&text, Path::new("config.json")).unwrap();
        // Saved with a byte-order mark, as some Windows editors write it.
        hf::parse_config(&format!("\u{feff}{text}"), Path::new("config.json")).unwrap();
    }
}

/// A multimodal config's text model is read from `text_config`: a bad field there is named
/// in that section.
#[test]
fn a_bad_text_config_field_is_named_in_its_section() {
    let config = json!({"model_type": "gemma3", "text_config": {"hidden_size": 0}});
    let err = hf::parse_config(&config.to_string(), Path::new("config.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("text_config: field `hidden_size`"), "{err}");
}

/// Expert fields that leave no expert layer, or name layers past the last, are said by
/// `inspect` (transformers builds the model all the same: dense).
#[test]
fn expert_fields_that_reach_no_layer_are_noted() {
    for (name, field, value, says) in [
        (
            "deepseek-v2-lite",
            "first_k_dense_replace",
            json!(27),
            "no expert layer",
        ),
        (
            "deepseek-v2-lite",
            "first_k_dense_replace",
            json!(u64::MAX),
            "no expert layer",
        ),
        (
            "qwen3-30b-a3b",
            "decoder_sparse_step",
            json!(100),
            "no expert layer",
        ),
        ("qwen3-30b-a3b", "mlp_only_layers", json!([999]), "[999]"),
    ] {
        let mut config = fixture(name);
        config[field] = value;
        let notes = hf::approximations(&config.to_string());
        assert!(
            notes.iter().any(|n| n.contains(field) && n.contains(says)),
            "{name}: {notes:?}"
        );
    }
    let notes = hf::approximations(&fixture("deepseek-v2-lite").to_string());
    assert!(
        !notes.iter().any(|n| n.contains("no expert layer")),
        "{notes:?}"
    );
}

/// Values of fields plait builds from that no trained model has: a normalization epsilon of 1
/// or more (it swamps the variance), a one-token vocabulary (the loss is always zero), a rotary
/// base at or below 1 (the frequencies grow across the head instead of falling), YaRN's fast
/// boundary below its slow one (transformers only warns, and ramps the wrong dimensions).
/// Each is refused naming the field; the published values beside them still read.
#[test]
fn values_no_trained_model_has_are_refused_by_name() {
    let cases: [(&str, &str, Value); 6] = [
        ("qwen3-8b", "rms_norm_eps", json!(10)),
        ("gpt2", "layer_norm_epsilon", json!(1.0)),
        ("qwen3-8b", "vocab_size", json!(1)),
        ("qwen3-8b", "rope_theta", json!(1e-300)),
        ("gemma-3-1b", "rope_local_base_freq", json!(1.0)),
        ("qwen2.5-7b", "rope_theta", json!(0.5)),
    ];
    for (name, field, value) in cases {
        let err = with(name, field, value.clone())
            .unwrap_or_else(|| panic!("{name}: {field} = {value} was accepted"));
        assert!(err.contains(field), "{name}: {field} = {value}: {err}");
    }
    let mut yarn = fixture("deepseek-v3")["rope_scaling"].clone();
    yarn["beta_fast"] = json!(1);
    yarn["beta_slow"] = json!(32);
    let err = with("deepseek-v3", "rope_scaling", yarn).expect("inverted YaRN betas accepted");
    assert!(
        err.contains("beta_fast 1 must be at least beta_slow 32"),
        "{err}"
    );
    // Equal boundaries are Kimi-K2's published ones (a DeepSeek-V3 architecture).
    let mut kimi = fixture("deepseek-v3")["rope_scaling"].clone();
    kimi["beta_fast"] = json!(1.0);
    kimi["beta_slow"] = json!(1.0);
    assert_eq!(with("deepseek-v3", "rope_scaling", kimi), None);
    for (name, field, value) in [
        ("qwen3-8b", "rms_norm_eps", json!(1e-6)),
        ("qwen3-8b", "vocab_size", json!(2)),
        ("qwen3-8b", "rope_theta", json!(5e5)),
    ] {
        assert_eq!(
            with(name, field, value.clone()),
            None,
            "{name}: {field} = {value}"
        );
    }
}
