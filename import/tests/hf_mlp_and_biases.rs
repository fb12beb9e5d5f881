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

/// Arcee (transformers' `ArceeForCausalLM`, AFM-4.5B): Llama's block whose MLP is Nemotron's,
/// up_proj → squared ReLU → down_proj with no gate, in RMSNorm's pre-norm block. AFM-4.5B's
/// shapes (hidden 2560, MLP 18432, 36 layers, 20 heads of 128 beside 4 KV heads, vocabulary
/// 128004, untied) counted module by module.
#[test]
fn arcee_builds_an_ungated_squared_relu_mlp() {
    let afm = r#"{"model_type":"arcee","hidden_size":2560,"intermediate_size":18432,
        "num_hidden_layers":36,"num_attention_heads":20,"num_key_value_heads":4,"head_dim":128,
        "vocab_size":128004,"max_position_embeddings":65536,"tie_word_embeddings":false,
        "rope_scaling":{"rope_type":"yarn","factor":20.0,"original_max_position_embeddings":4096}}"#;
    let (h, f, kv, vocab) = (2560u64, 18432u64, 512u64, 128_004u64);
    let layer = 2 * h * h + 2 * h * kv + 2 * h * f + 2 * h;
    assert_eq!(params(afm), 2 * vocab * h + 36 * layer + h);
    let spec = hf::parse_config(afm, Path::new("config.json")).expect("parses");
    let g = build_forward(&spec, DType::F32).expect("builds");
    let count = |pred: fn(&ir::OpKind) -> bool| g.op_ids().filter(|&o| pred(&g.op(o).kind)).count();
    assert_eq!(count(|k| matches!(k, ir::OpKind::Relu)), 36);
    assert_eq!(count(|k| matches!(k, ir::OpKind::Silu)), 0);
    assert_eq!(
        count(|k| matches!(k, ir::OpKind::RmsNorm { .. })),
        2 * 36 + 1
    );
    assert_eq!(count(|k| matches!(k, ir::OpKind::LayerNorm { .. })), 0);
    // ArceeConfig's hidden_act is relu2; SwiGLU is not what its modeling code builds.
    let err = refusal(&afm.replace(
        r#""tie_word_embeddings""#,
        r#""hidden_act":"silu","tie_word_embeddings""#,
    ));
    assert!(err.contains("hidden_act") && err.contains("relu2"), "{err}");
}
