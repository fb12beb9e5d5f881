//! Parameter counts of imported configs against the counts their authors published.

use std::path::Path;

use import::{build_forward, hf, zoo};
use ir::DType;

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

fn graph_params(spec: &import::ModelSpec) -> u64 {
    build_forward(spec, DType::F32)
        .expect("graph builds")
        .param_count()
}

#[test]
fn gpt2_small_has_124m_parameters() {
    // Hugging Face `gpt2`: 124,439,808 parameters (tied embeddings).
    let spec = parse(
        r#"{"model_type":"gpt2","n_layer":12,"n_embd":768,"n_head":12,"vocab_size":50257,
            "n_positions":1024,"tie_word_embeddings":true}"#,
    );
    assert_eq!(graph_params(&spec), 124_439_808);
    assert_eq!(spec.param_count(), 124_439_808);
}

#[test]
fn llama2_7b_has_6_74b_parameters() {
    // meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters.
    let spec = parse(
        r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,
            "num_attention_heads":32,"num_key_value_heads":32,"vocab_size":32000,
            "max_position_embeddings":4096,"tie_word_embeddings":false}"#,
    );
    assert_eq!(graph_params(&spec), 6_738_415_616);
}

#[test]
fn zoo_counts_match_published_sizes() {
    // Published parameter counts of the released checkpoints.
    let published = [
        ("llama2-7b", 6_738_415_616u64),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
        ("mixtral-8x7b", 46_702_792_704),
    ];
    for (name, want) in published {
        let spec = zoo::find(name).expect("in zoo");
        assert_eq!(graph_params(&spec), want, "{name}");
    }
}

#[test]
fn megatron_sizes_match_the_gpt_formula() {
    // Narayanan et al. (SC'21): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), which counts the
    // same tensors as plait's graph (tied head, learned positions, biases, two norms per layer).
    for spec in zoo::zoo().into_iter().filter(|m| m.name.starts_with("gpt")) {
        let (l, h, v, s) = (spec.layers, spec.hidden, spec.vocab, spec.max_positions);
        let formula = 12 * l * h * h + 13 * l * h + (v + s) * h + 2 * h;
        assert_eq!(graph_params(&spec), formula, "{}", spec.name);
        assert_eq!(spec.param_count(), formula, "{}", spec.name);
    }
    let gpt3 = zoo::find("gpt3-175b").expect("in zoo");
    let billions = graph_params(&gpt3) as f64 / 1e9;
    assert!((billions - 174.6).abs() < 0.1, "{billions}");
}

#[test]
fn every_zoo_graph_builds_with_tagged_layers() {
    for spec in zoo::zoo() {
        let g = build_forward(&spec, DType::Bf16).expect("graph builds");
        assert_eq!(u64::from(g.num_layers()), spec.layers, "{}", spec.name);
        assert_eq!(g.param_count(), spec.param_count(), "{}", spec.name);
    }
}

#[test]
fn mistral_7b_has_7_24b_parameters() {
    // mistralai/Mistral-7B-v0.1: 7,241,732,096 parameters (its safetensors index: 14,483,464,192
    // bytes of bf16). Llama's architecture with grouped-query attention and a sliding window.
    let text = r#"{"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
        "vocab_size":32000,"max_position_embeddings":32768,"rms_norm_eps":1e-05,
        "rope_theta":10000.0,"sliding_window":4096,"tie_word_embeddings":false}"#;
    let spec = parse(text);
    assert_eq!(graph_params(&spec), 7_241_732_096);
    let notes = hf::approximations(text);
    assert!(
        notes.iter().any(|n| n.contains("sliding_window 4096")),
        "{notes:?}"
    );
}

#[test]
fn an_explicit_head_size_that_differs_is_refused_by_name() {
    // Mistral-Nemo: head_dim 128 with hidden 5120 and 32 heads (5120 / 32 = 160).
    let e = hf::parse_config(
        r#"{"model_type":"mistral","hidden_size":5120,"intermediate_size":14336,
            "num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":8,
            "head_dim":128,"vocab_size":131072}"#,
        Path::new("config.json"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("head_dim = 128") && e.contains("160"), "{e}");
}
