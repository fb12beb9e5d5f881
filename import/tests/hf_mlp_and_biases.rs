//! What a config says of its MLP's activation and its projections' biases is built as
//! transformers builds it, or refused naming the field: never silently built otherwise.

use std::path::Path;

use import::{build_forward, hf};
use ir::DType;

const LLAMA_8B: &str = r#""hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,
    "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
    "max_position_embeddings":8192,"tie_word_embeddings":false"#;

fn config(model_type: &str, extra: &str) -> String {
    format!(r#"{{"model_type":"{model_type}",{LLAMA_8B}{extra}}}"#)
}

fn params(json: &str) -> u64 {
    let spec = hf::parse_config(json, Path::new("config.json")).expect("config parses");
    let graph = build_forward(&spec, DType::F32).expect("graph builds");
    assert_eq!(
        graph.param_count(),
        spec.param_count(),
        "graph and count agree"
    );
    graph.param_count()
}

fn refusal(json: &str) -> String {
    match hf::parse_config(json, Path::new("config.json")) {
        Ok(_) => panic!("accepted: {json}"),
        Err(e) => e.to_string(),
    }
}

/// Llama-3 8B's published 8,030,261,248 parameters; `attention_bias` adds transformers'
/// biases on q, k, v and o (`LlamaAttention`: 4096 + 2·1024 + 4096 a layer), which Mistral's
/// attention never has whatever the field says (`MistralAttention`'s `bias=False`).
#[test]
fn attention_bias_puts_biases_on_q_k_v_and_o_where_transformers_does() {
    const LLAMA3_8B: u64 = 8_030_261_248;
    assert_eq!(params(&config("llama", "")), LLAMA3_8B);
    let per_layer = 4096 + 2 * 1024 + 4096;
    let biased = params(&config("llama", r#","attention_bias":true"#));
    assert_eq!(biased, LLAMA3_8B + 32 * per_layer);
    let mistral = params(&config("mistral", r#","attention_bias":true"#));
    assert_eq!(mistral, params(&config("mistral", "")));
}

#[test]
fn an_activation_plait_does_not_build_is_refused_by_name() {
    for (model_type, act) in [("llama", "gelu"), ("qwen2", "relu"), ("olmo2", "swiglu")] {
        let err = refusal(&config(model_type, &format!(r#","hidden_act":"{act}""#)));
        assert!(err.contains("hidden_act") && err.contains("silu"), "{err}");
    }
    // SiLU by either of transformers' names is what plait builds.
    assert_eq!(
        params(&config("llama", r#","hidden_act":"swish""#)),
        params(&config("llama", r#","hidden_act":"silu""#))
    );
    let gpt2 = r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":4,"vocab_size":100,
        "n_positions":64,"activation_function":"relu"}"#;
    let err = refusal(gpt2);
    assert!(err.contains("activation_function"), "{err}");
}

#[test]
fn mlp_biases_are_refused_rather_than_dropped() {
    let err = refusal(&config("llama", r#","mlp_bias":true"#));
    assert!(err.contains("mlp_bias"), "{err}");
    assert_eq!(
        params(&config("llama", r#","mlp_bias":false"#)),
        params(&config("llama", ""))
    );
}
