//! Parameter counts of imported configs against the counts their authors published.

use std::path::Path;

use import::{build_forward, hf, zoo};
use ir::DType;

fn parse(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

/// The spec's sliding window: its keys and how many layers attend within it.
fn window(spec: &import::ModelSpec) -> Option<(u64, usize)> {
    let w = spec.variant.sliding_window.as_ref()?;
    Some((w.keys, w.windowed_layers()))
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
    assert_eq!(window(&spec), Some((4096, 32)));
    assert!(hf::approximations(text).is_empty());
}

#[test]
fn mistral_nemo_has_an_explicit_head_size() {
    // mistralai/Mistral-Nemo-Base-2407: 12,247,782,400 parameters; head_dim 128 with hidden
    // 5120 and 32 heads (5120 / 32 = 160), so q is 4096 wide.
    let spec = parse(
        r#"{"model_type":"mistral","hidden_size":5120,"intermediate_size":14336,
            "num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":8,
            "head_dim":128,"vocab_size":131072,"max_position_embeddings":1024000,
            "rope_theta":1000000.0,"tie_word_embeddings":false}"#,
    );
    assert_eq!(spec.q_width(), 4096);
    assert_eq!(graph_params(&spec), 12_247_782_400);
    assert_eq!(spec.param_count(), 12_247_782_400);
}

/// Published parameter counts of today's open models (the model cards' safetensors totals),
/// from configs with their published fields.
fn assert_published(text: &str, published: u64) {
    let spec = parse(text);
    assert_eq!(graph_params(&spec), published, "{}", spec.model_type());
    assert_eq!(spec.param_count(), published, "{}", spec.model_type());
}

#[test]
fn qwen2_has_qkv_biases_and_ties_its_small_models() {
    // Qwen/Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings).
    assert_published(
        r#"{"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,
            "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,
            "vocab_size":151936,"max_position_embeddings":32768,"rope_theta":1000000.0,
            "rms_norm_eps":1e-06,"sliding_window":32768,"use_sliding_window":false,
            "tie_word_embeddings":true}"#,
        494_032_768,
    );
    // Qwen/Qwen2.5-7B: 7,615,616,512.
    let seven_b = r#"{"model_type":"qwen2","hidden_size":3584,"intermediate_size":18944,
            "num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,
            "vocab_size":152064,"max_position_embeddings":131072,"rope_theta":1000000.0,
            "sliding_window":131072,"use_sliding_window":false,"tie_word_embeddings":false}"#;
    assert_published(seven_b, 7_615_616_512);
    // The window is off: nothing to say about it.
    assert!(hf::approximations(seven_b).is_empty());
}

#[test]
fn qwen3_normalizes_q_and_k_per_head() {
    // Qwen/Qwen3-0.6B: 596,049,920 (head_dim 128 with hidden 1024 and 16 heads; tied).
    assert_published(
        r#"{"model_type":"qwen3","hidden_size":1024,"intermediate_size":3072,
            "num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,
            "head_dim":128,"vocab_size":151936,"max_position_embeddings":40960,
            "rope_theta":1000000,"attention_bias":false,"tie_word_embeddings":true}"#,
        596_049_920,
    );
    // Qwen/Qwen3-8B: 8,190,735,360.
    assert_published(
        r#"{"model_type":"qwen3","hidden_size":4096,"intermediate_size":12288,
            "num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,
            "head_dim":128,"vocab_size":151936,"max_position_embeddings":40960,
            "rope_theta":1000000,"tie_word_embeddings":false}"#,
        8_190_735_360,
    );
}

#[test]
fn phi3_counts_its_fused_projections() {
    // microsoft/Phi-3-mini-4k-instruct: 3,821,079,552.
    let text = r#"{"model_type":"phi3","hidden_size":3072,"intermediate_size":8192,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,
            "vocab_size":32064,"max_position_embeddings":4096,"rms_norm_eps":1e-05,
            "sliding_window":2047,"tie_word_embeddings":false}"#;
    assert_published(text, 3_821_079_552);
    let notes = hf::approximations(text);
    assert!(notes.iter().any(|n| n.contains("qkv_proj")), "{notes:?}");
}

/// microsoft/Phi-4-mini-instruct: 3,836,021,760 parameters (tied, 24 heads of 128 over 8 KV
/// heads, vocabulary 200,064), its rotary embedding on 0.75 of each head (96 of 128 dimensions,
/// transformers' `int(head_dim * partial_rotary_factor)`), the rest passed through.
#[test]
fn phi4_mini_turns_three_quarters_of_each_head() {
    let text = r#"{"model_type":"phi3","hidden_size":3072,"intermediate_size":8192,
            "num_hidden_layers":32,"num_attention_heads":24,"num_key_value_heads":8,
            "vocab_size":200064,"max_position_embeddings":131072,"rms_norm_eps":1e-05,
            "partial_rotary_factor":0.75,"tie_word_embeddings":true,"hidden_act":"silu"}"#;
    assert_published(text, 3_836_021_760);
    let spec = parse(text);
    assert_eq!(spec.variant.rotary_dims, Some(96));
    let e = hf::parse_config(&text.replace("0.75", "0.7"), Path::new("config.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("partial_rotary_factor = 0.7 gives 89"), "{e}");
}

#[test]
fn gemma_has_256_wide_heads_and_geglu() {
    // google/gemma-7b: 8,537,680,896 (hidden 3072, 16 heads of 256: q is 4096 wide; tied).
    assert_published(
        r#"{"model_type":"gemma","hidden_size":3072,"intermediate_size":24576,
            "num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":16,
            "head_dim":256,"vocab_size":256000,"max_position_embeddings":8192,
            "hidden_act":"gelu","hidden_activation":"gelu_pytorch_tanh"}"#,
        8_537_680_896,
    );
    // google/gemma-2b: 2,506,172,416 (one KV head).
    assert_published(
        r#"{"model_type":"gemma","hidden_size":2048,"intermediate_size":16384,
            "num_hidden_layers":18,"num_attention_heads":8,"num_key_value_heads":1,
            "head_dim":256,"vocab_size":256000}"#,
        2_506_172_416,
    );
}

#[test]
fn gemma2_has_four_norms_per_layer_and_soft_caps() {
    // google/gemma-2-9b: 9,241,705,984; google/gemma-2-2b: 2,614,341,888.
    let nine_b = r#"{"model_type":"gemma2","hidden_size":3584,"intermediate_size":14336,
            "num_hidden_layers":42,"num_attention_heads":16,"num_key_value_heads":8,
            "head_dim":256,"vocab_size":256000,"query_pre_attn_scalar":256,
            "final_logit_softcapping":30.0,"attn_logit_softcapping":50.0,
            "sliding_window":4096}"#;
    assert_published(nine_b, 9_241_705_984);
    assert_published(
        r#"{"model_type":"gemma2","hidden_size":2304,"intermediate_size":9216,
            "num_hidden_layers":26,"num_attention_heads":8,"num_key_value_heads":4,
            "head_dim":256,"vocab_size":256000,"final_logit_softcapping":30.0}"#,
        2_614_341_888,
    );
    let notes = hf::approximations(nine_b);
    assert!(
        notes.iter().all(|n| !n.contains("softcapping")),
        "{notes:?}"
    );
    let spec = parse(nine_b);
    assert_eq!(window(&spec), Some((4096, 21)));
    assert_eq!(spec.variant.final_softcap, Some(30.0));
    // The attention cap reaches every layer's attention op.
    let g = import::build_forward(&spec, DType::F32).expect("builds");
    let capped = g
        .op_ids()
        .filter(|&o| {
            matches!(
                g.op(o).kind,
                ir::OpKind::Attention {
                    softcap: Some(50.0),
                    sinks: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(capped, 42);
    // transformers: absent means its default (50 and 30), null means no cap.
    let uncapped = parse(
        r#"{"model_type":"gemma2","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "head_dim":16,"vocab_size":100,"attn_logit_softcapping":null,
            "final_logit_softcapping":null}"#,
    );
    assert_eq!(
        (
            uncapped.variant.attn_softcap,
            uncapped.variant.final_softcap
        ),
        (None, None)
    );
    let defaults = parse(
        r#"{"model_type":"gemma2","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "head_dim":16,"vocab_size":100}"#,
    );
    assert_eq!(
        (
            defaults.variant.attn_softcap,
            defaults.variant.final_softcap
        ),
        (Some(50.0), Some(30.0))
    );
}

#[test]
fn gemma3_keeps_gemma2s_block_with_qk_norms_and_no_soft_caps() {
    // KerasHub's Gemma 3 presets (keras_hub/src/models/gemma3/gemma3_presets.py, "params"):
    // gemma3_1b 999,885,952 (google/gemma-3-1b-pt's config); gemma3_12b_text 11,765,788,416.
    let one_b = r#"{"model_type":"gemma3_text","hidden_size":1152,"intermediate_size":6912,
            "num_hidden_layers":26,"num_attention_heads":4,"num_key_value_heads":1,
            "head_dim":256,"vocab_size":262144,"query_pre_attn_scalar":256,
            "attn_logit_softcapping":null,"final_logit_softcapping":null,
            "sliding_window":512,"rope_local_base_freq":10000}"#;
    assert_published(one_b, 999_885_952);
    assert_published(
        r#"{"model_type":"gemma3_text","hidden_size":3840,"intermediate_size":15360,
            "num_hidden_layers":48,"num_attention_heads":16,"num_key_value_heads":8,
            "head_dim":256,"vocab_size":262144,
            "rope_scaling":{"rope_type":"linear","factor":8.0}}"#,
        11_765_788_416,
    );
    let spec = parse(one_b);
    let v = &spec.variant;
    assert!(v.qk_norm && v.sandwich_norms && v.gelu_gate && v.embed_scale);
    // transformers' Gemma3TextConfig: no soft-caps unless set.
    assert_eq!((v.attn_softcap, v.final_softcap), (None, None));
    let g = import::build_forward(&spec, DType::F32).expect("builds");
    let norms = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, ir::OpKind::RmsNorm { .. }))
        .count();
    // Per layer four around attention and the MLP, and q's and k's; then the final norm.
    assert_eq!(norms, 26 * 6 + 1);
    assert!(hf::approximations(one_b).is_empty());
    // Five of every six of its 26 layers in a window of 512 keys, rotating by
    // rope_local_base_freq (transformers' `rotary_emb_local`); the sixth by rope_theta.
    assert_eq!(window(&parse(one_b)), Some((512, 22)));
    let bases: Vec<f64> = g
        .op_ids()
        .filter_map(|o| match g.op(o).kind {
            ir::OpKind::Rotary { theta, .. } => Some(theta),
            _ => None,
        })
        .collect();
    let want: Vec<f64> = (0..26)
        .flat_map(|l| [if l % 6 == 5 { 1e6 } else { 1e4 }; 2])
        .collect();
    assert_eq!(bases, want);
}

/// google/gemma-3-4b-it's multimodal config as published: `model_type` gemma3, its language
/// model under `text_config` with only the fields that differ from transformers'
/// Gemma3TextConfig defaults (heads 8, KV heads 4, head_dim 256, vocabulary 262,208). plait
/// plans that text model: KerasHub's gemma3_4b_text preset counts 3,880,099,328 parameters
/// with a vocabulary of 262,144; the multimodal vocabulary's 64 more rows (its image tokens)
/// add 64 × 2560.
#[test]
fn gemma3s_multimodal_config_plans_its_text_model() {
    let four_b_it = r#"{"architectures":["Gemma3ForConditionalGeneration"],
        "boi_token_index":255999,"eoi_token_index":256000,"image_token_index":262144,
        "mm_tokens_per_image":256,"model_type":"gemma3",
        "text_config":{"hidden_size":2560,"intermediate_size":10240,"model_type":"gemma3_text",
            "num_hidden_layers":34,"rope_scaling":{"factor":8.0,"rope_type":"linear"},
            "sliding_window":1024},
        "vision_config":{"hidden_size":1152,"image_size":896,"intermediate_size":4304,
            "model_type":"siglip_vision_model","num_attention_heads":16,
            "num_hidden_layers":27,"patch_size":14,"vision_use_head":false}}"#;
    assert_published(four_b_it, 3_880_099_328 + 64 * 2560);
    let spec = parse(four_b_it);
    assert_eq!((spec.heads, spec.kv_heads, spec.head_dim()), (8, 4, 256));
    let notes = hf::approximations(four_b_it);
    assert!(
        notes.iter().any(|n| n.contains("vision tower")),
        "{notes:?}"
    );
    assert_eq!(window(&spec), Some((1024, 29)));
    let err = hf::parse_config(
        r#"{"model_type":"gemma3","vision_config":{}}"#,
        std::path::Path::new("mm.json"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("mm.json") && err.contains("text_config"),
        "{err}"
    );
}

/// OLMo 2 (transformers' `Olmo2ForCausalLM`): norms after attention and the MLP only, and q
/// and k normed over their whole projections. allenai/OLMo-2-1124-7B: 7,298,617,344
/// parameters, -13B: 13,716,198,400 (their safetensors totals).
#[test]
fn olmo2_norms_outputs_and_whole_projections() {
    let seven_b = r#"{"model_type":"olmo2","hidden_size":4096,"intermediate_size":11008,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,
        "vocab_size":100352,"max_position_embeddings":4096,"rms_norm_eps":1e-06,
        "rope_theta":500000,"tie_word_embeddings":false,"attention_bias":false}"#;
    assert_published(seven_b, 7_298_617_344);
    assert_published(
        r#"{"model_type":"olmo2","hidden_size":5120,"intermediate_size":13824,
            "num_hidden_layers":40,"num_attention_heads":40,"num_key_value_heads":40,
            "vocab_size":100352,"rms_norm_eps":1e-06,"rope_theta":500000,
            "tie_word_embeddings":false}"#,
        13_716_198_400,
    );
    let g = import::build_forward(&parse(seven_b), DType::F32).expect("builds");
    // The q norm's weight is the whole projection's width, and it reads q_proj directly.
    let q_norm = g
        .op_ids()
        .find(|&o| matches!(g.op(o).kind, ir::OpKind::RmsNorm { .. }))
        .expect("a norm");
    let gamma = g.op(q_norm).inputs[1];
    assert_eq!(g.ty(gamma).shape.fixed_numel(), Some(4096));
    assert!(matches!(
        g.op(g.def_op(g.op(q_norm).inputs[0])).kind,
        ir::OpKind::Linear { .. }
    ));
}

/// OLMoE (transformers' `OlmoeForCausalLM`): Llama's pre-norm block with OLMo 2's q and k
/// norms over their whole projections, and 64 experts of 1024, top 8, each keeping its share
/// of the softmax over all 64 (`norm_topk_prob` false). allenai/OLMoE-1B-7B-0924: its modules'
/// shapes sum to 6,919,161,856 (the card's 6.92B), counted here module by module.
#[test]
fn olmoe_norms_whole_projections_in_a_pre_norm_expert_block() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/olmoe-1b-7b/config.json"
    );
    let text = std::fs::read_to_string(fixture).unwrap();
    let (h, vocab, layers, experts, ffn) = (2048u64, 50304u64, 16u64, 64u64, 1024u64);
    // q, k, v, o; q_norm and k_norm (2048 each); two block norms; the router; the experts.
    let layer = 4 * h * h + 2 * h + 2 * h + h * experts + experts * 3 * h * ffn;
    let modules = 2 * vocab * h + layers * layer + h;
    assert_eq!(modules, 6_919_161_856);
    assert_published(&text, modules);
    let spec = parse(&text);
    assert_eq!(
        spec.variant.routing,
        ir::Routing {
            normalize: false,
            ..ir::Routing::default()
        }
    );
    let g = import::build_forward(&spec, DType::F32).expect("builds");
    let norms: Vec<ir::OpId> = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, ir::OpKind::RmsNorm { .. }))
        .collect();
    let reads_a_projection = |o: ir::OpId| {
        matches!(
            g.op(g.def_op(g.op(o).inputs[0])).kind,
            ir::OpKind::Linear { .. }
        )
    };
    // Each layer: the input norm (on the residual stream), q's and k's norms over the whole
    // projections, the norm before the experts; then the final norm.
    assert_eq!(norms.len() as u64, 4 * layers + 1);
    assert!(!reads_a_projection(norms[0]));
    assert!(reads_a_projection(norms[1]) && reads_a_projection(norms[2]));
    assert_eq!(g.ty(g.op(norms[1]).inputs[1]).shape.fixed_numel(), Some(h));
}

/// Granite (transformers' `GraniteForCausalLM`): Llama's parameters, with its multipliers as
/// scale ops. ibm-granite/granite-3.1-2b-instruct: 2,533,531,648 parameters; -base, whose
/// vocabulary is 3 rows smaller: 2,533,525,504 (their safetensors totals).
#[test]
fn granite_scales_its_embedding_branches_scores_and_logits() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/granite-3.1-2b-instruct"
    );
    let text = std::fs::read_to_string(format!("{fixture}/config.json")).unwrap();
    assert_published(&text, 2_533_531_648);
    assert_published(&text.replace("49155", "49152"), 2_533_525_504);
    let g = import::build_forward(&parse(&text), DType::F32).expect("builds");
    let scales: Vec<f64> = g
        .op_ids()
        .filter_map(|o| match g.op(o).kind {
            ir::OpKind::Scale { factor } => Some(factor),
            _ => None,
        })
        .collect();
    // The embedding, two branches in each of 40 layers, the logits.
    assert_eq!(scales.len(), 1 + 2 * 40 + 1);
    assert_eq!((scales[0], scales[1], scales[81]), (12.0, 0.22, 1.0 / 8.0));
    assert!(g.op_ids().all(|o| match g.op(o).kind {
        ir::OpKind::Attention { scale, .. } => scale == 0.015625,
        _ => true,
    }));
}

#[test]
fn qwen_moe_families_have_many_small_experts() {
    // Qwen/Qwen3-30B-A3B: 30,532,122,624 (128 experts of 768, top 8, q/k norms).
    assert_published(
        r#"{"model_type":"qwen3_moe","hidden_size":2048,"intermediate_size":6144,
            "moe_intermediate_size":768,"num_hidden_layers":48,"num_attention_heads":32,
            "num_key_value_heads":4,"head_dim":128,"num_experts":128,"num_experts_per_tok":8,
            "norm_topk_prob":true,"vocab_size":151936,"tie_word_embeddings":false}"#,
        30_532_122_624,
    );
    // Qwen/Qwen1.5-MoE-A2.7B: 14,315,784,192 (60 experts of 1408, top 4, a shared expert of
    // 5632 behind a sigmoid gate, q/k/v biases).
    let qwen2_moe = r#"{"model_type":"qwen2_moe","hidden_size":2048,"intermediate_size":5632,
            "moe_intermediate_size":1408,"shared_expert_intermediate_size":5632,
            "num_hidden_layers":24,"num_attention_heads":16,"num_key_value_heads":16,
            "num_experts":60,"num_experts_per_tok":4,"norm_topk_prob":false,
            "vocab_size":151936,"tie_word_embeddings":false}"#;
    assert_published(qwen2_moe, 14_315_784_192);
    // norm_topk_prob false: each chosen expert keeps its share of the softmax over all 60.
    assert_eq!(
        parse(qwen2_moe).variant.routing,
        ir::Routing {
            normalize: false,
            ..ir::Routing::default()
        }
    );
}

#[test]
fn moe_routers_follow_transformers_defaults_and_refuse_impossible_groups() {
    let routing = |json: &str| parse(json).variant.routing;
    // DeepseekV3Config: sigmoid scores, n_group 8, topk_group 4, norm_topk_prob true.
    let v3 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/deepseek-v3/config.json"
    ))
    .expect("fixture");
    let deepseek = ir::Routing {
        sigmoid: true,
        normalize: true,
        groups: 8,
        groups_kept: 4,
        group_top: 2,
    };
    assert_eq!(routing(&v3), deepseek);
    // Qwen3MoeConfig's norm_topk_prob defaults to false.
    let qwen3 = r#"{"model_type":"qwen3_moe","hidden_size":64,"intermediate_size":96,
        "moe_intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":4,
        "num_experts":8,"num_experts_per_tok":2,"vocab_size":100}"#;
    assert!(!routing(qwen3).normalize && !routing(qwen3).sigmoid);
    // Six experts cannot form DeepSeek's default eight groups (transformers' view() fails).
    let bad = r#"{"model_type":"deepseek_v3","hidden_size":64,"intermediate_size":96,
        "moe_intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":4,
        "kv_lora_rank":8,"qk_nope_head_dim":6,"qk_rope_head_dim":4,"v_head_dim":5,
        "n_routed_experts":6,"num_experts_per_tok":2,"vocab_size":100}"#;
    let err = hf::parse_config(bad, Path::new("config.json"))
        .expect_err("6 experts in 8 groups")
        .to_string();
    assert!(err.contains("n_group") && err.contains("8 groups"), "{err}");
    // Eight experts in the default eight groups: a group of one has no second-best expert
    // for DeepSeek-V3's score (transformers' topk(2) over it fails).
    let singletons = bad.replace(r#""n_routed_experts":6"#, r#""n_routed_experts":8"#);
    let err = hf::parse_config(&singletons, Path::new("config.json"))
        .expect_err("groups of one expert")
        .to_string();
    assert!(err.contains("best 2 experts, of the 1 in a group"), "{err}");
}

#[test]
fn a_zoo_name_and_its_published_config_default_to_the_same_sequence() {
    // meta-llama/Meta-Llama-3-8B's config.json: trained and published at 8192 positions.
    let config = parse(
        r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
            "vocab_size":128256,"max_position_embeddings":8192,"rope_theta":500000.0}"#,
    );
    let zoo = zoo::find("llama3-8b").expect("in zoo");
    assert_eq!(config.param_count(), zoo.param_count());
    assert_eq!((config.default_seq, zoo.default_seq), (8192, 8192));
    // Every zoo entry follows the configs' rule.
    for m in zoo::zoo() {
        assert_eq!(
            m.default_seq,
            import::spec::default_seq(m.max_positions),
            "{}",
            m.name
        );
    }
}

/// Nemotron: the graph builds its LayerNorms (weight and bias), ungated squared-ReLU MLP and
/// half-head rotary, and counts what the spec's formula counts; what plait does not build is
/// refused by field.
#[test]
fn nemotron_builds_its_block_and_refuses_what_it_does_not_build() {
    let base = r#""model_type":"nemotron","hidden_size":256,"intermediate_size":768,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":1000"#;
    let spec = parse(&format!("{{{base}}}"));
    assert_eq!(spec.variant.rotary_dims, Some(32), "half of a 64-wide head");
    assert!(spec.variant.layer_norm);
    assert_eq!(
        spec.variant.ungated_mlp,
        Some(import::spec::Ungated::SquaredRelu)
    );
    // Embedding, head, and per layer q, k, v, o, up, down and two LayerNorms; the final norm.
    let (h, f, kv) = (256, 768, 2 * 64);
    let layer = h * h + 2 * h * kv + h * h + 2 * h * f + 4 * h;
    let want = 2 * 1000 * h + 2 * layer + 2 * h;
    assert_eq!(spec.param_count(), want);
    assert_eq!(graph_params(&spec), want);
    for (extra, field) in [
        (r#","hidden_act":"silu""#, "hidden_act"),
        (r#","mlp_bias":true"#, "mlp_bias"),
        (r#","partial_rotary_factor":0.3"#, "partial_rotary_factor"),
    ] {
        let e = hf::parse_config(&format!("{{{base}{extra}}}"), Path::new("config.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
}

/// DeepSeek-V3 (transformers' `DeepseekV3ForCausalLM`): multi-head latent attention, 256
/// routed experts of 2048 with one shared expert, and the first three layers dense. Counted
/// module by module as transformers builds them: 671,026,404,352, the model card's "671B
/// total parameters" (the checkpoint's 685B adds the 14B multi-token-prediction module,
/// which transformers does not build; the router's `e_score_correction_bias` is a buffer).
#[test]
fn deepseek_v3_counts_its_latent_attention_dense_layers_and_experts() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/deepseek-v3/config.json"
    ))
    .expect("fixture");
    let (h, heads, v) = (7168u64, 128u64, 129_280u64);
    let (q_rank, kv_rank, nope, rope, dv) = (1536u64, 512u64, 128u64, 64u64, 128u64);
    let q_a = h * q_rank + q_rank;
    let q_b = q_rank * heads * (nope + rope);
    let kv_a = h * (kv_rank + rope) + kv_rank;
    let kv_b = kv_rank * heads * (nope + dv);
    let o = heads * dv * h;
    let attention = q_a + q_b + kv_a + kv_b + o;
    let norms = 2 * h;
    let dense_mlp = 3 * h * 18_432;
    let moe = 256 * 3 * h * 2048 + 256 * h + 3 * h * 2048;
    let modules = 2 * v * h + h + 61 * (attention + norms) + 3 * dense_mlp + 58 * moe;
    assert_eq!(modules, 671_026_404_352);
    assert_published(&text, modules);
    let g = build_forward(&parse(&text), DType::Bf16).expect("graph builds");
    assert_eq!(
        g.kind_starts,
        [3],
        "the expert layers start a run of their own"
    );
    ir::verify::verify(&g).expect("every layer matches the first of its run");
    let summary = ir::blocks::layer_summary(&g)
        .expect("a tagged block")
        .to_string();
    assert_eq!(
        summary,
        "decoder_layer x61: 3 x (36 ops, 583.5M params), 58 x (40 ops, 11.5B params)"
    );
    // Without a query bottleneck (`q_lora_rank: null`): one q_proj.
    let no_lora = r#"{"model_type":"deepseek_v3","hidden_size":64,"intermediate_size":96,
        "moe_intermediate_size":16,"num_hidden_layers":3,"num_attention_heads":4,
        "q_lora_rank":null,"kv_lora_rank":8,"qk_nope_head_dim":6,"qk_rope_head_dim":4,
        "v_head_dim":5,"n_routed_experts":4,"n_shared_experts":2,"num_experts_per_tok":2,
        "n_group":2,"topk_group":1,"first_k_dense_replace":1,"vocab_size":100}"#;
    let attention = 64 * 4 * 10 + 64 * (8 + 4) + 8 + 8 * 4 * (6 + 5) + 4 * 5 * 64;
    let moe = 4 * 3 * 64 * 16 + 4 * 64 + 3 * 64 * 32;
    let want = 2 * 100 * 64 + 64 + 3 * (attention + 2 * 64) + 3 * 64 * 96 + 2 * moe;
    assert_published(no_lora, want);
    // moe_layer_freq 2 (transformers: experts where i >= first_k_dense_replace and i % 2 ==
    // 0): of three layers only layer 2 has experts, layer 1 is dense between them.
    let every_other = parse(&no_lora.replace(
        r#""vocab_size":100"#,
        r#""vocab_size":100,"moe_layer_freq":2"#,
    ));
    assert_eq!(
        every_other.variant.dense_layers,
        Some(import::spec::DenseLayers {
            dense: vec![true, true, false],
            ffn: 96
        })
    );
    let want = 2 * 100 * 64 + 64 + 3 * (attention + 2 * 64) + 2 * 3 * 64 * 96 + moe;
    assert_eq!(graph_params(&every_other), want);
    assert_eq!(every_other.param_count(), want);
}

/// Qwen-MoE's `mlp_only_layers` / `decoder_sparse_step`: transformers gives those layers a
/// dense MLP of `intermediate_size`, leading or between expert layers.
#[test]
fn qwen_moe_dense_layers_follow_mlp_only_layers() {
    let config = |extra: &str| {
        format!(
            r#"{{"model_type":"qwen2_moe","hidden_size":64,"intermediate_size":96,
            "moe_intermediate_size":16,"shared_expert_intermediate_size":32,
            "num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":4,
            "num_experts":8,"num_experts_per_tok":2,"vocab_size":100{extra}}}"#
        )
    };
    let all_experts = graph_params(&parse(&config("")));
    let two_dense = parse(&config(r#","mlp_only_layers":[0,1]"#));
    assert_eq!(
        two_dense.variant.dense_layers,
        Some(import::spec::DenseLayers {
            dense: vec![true, true, false, false],
            ffn: 96
        })
    );
    // Per layer: the router (64·8), 8 experts of 3·64·16, the shared expert 3·64·32 and its
    // one-column gate, against a dense SwiGLU of 3·64·96.
    let (h, moe) = (64u64, 64 * 8 + 8 * 3 * 64 * 16 + 3 * 64 * 32 + 64);
    assert_eq!(
        graph_params(&two_dense),
        all_experts - 2 * moe + 2 * 3 * h * 96
    );
    // decoder_sparse_step 2: experts where 2 divides i + 1, layers 1 and 3.
    let every_other = parse(&config(r#","decoder_sparse_step":2"#));
    assert_eq!(
        every_other.variant.dense_layers,
        Some(import::spec::DenseLayers {
            dense: vec![true, false, true, false],
            ffn: 96
        })
    );
    assert_eq!(
        graph_params(&every_other),
        all_experts - 2 * moe + 2 * 3 * h * 96
    );
    assert_eq!(every_other.param_count(), graph_params(&every_other));
}

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/../fixtures/hf/{name}/config.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// DeepSeek-V2 (transformers' `DeepseekV2ForCausalLM`): DeepSeek-V3's block (latent
/// attention, shared and routed experts, the first layer dense) with 160 routed experts of
/// 1536 and two shared. Counted module by module as transformers builds them: 235,741,434,880,
/// the model card's "236B total parameters"; DeepSeek-V2-Lite (no query bottleneck, 64
/// experts of 1408): 15,706,484,224, its card's 15.7B.
#[test]
fn deepseek_v2_and_v2_lite_count_their_published_parameters() {
    let (h, heads, v) = (5120u64, 128u64, 102_400u64);
    let attention =
        h * 1536 + 1536 + 1536 * heads * 192 + h * 576 + 512 + 512 * heads * 256 + heads * 128 * h;
    let dense = 3 * h * 12_288;
    let moe = 160 * 3 * h * 1536 + 160 * h + 3 * h * 2 * 1536;
    let modules = 2 * v * h + h + 60 * (attention + 2 * h) + dense + 59 * moe;
    assert_eq!(modules, 235_741_434_880);
    assert_published(&fixture("deepseek-v2"), modules);
    let (h, heads) = (2048u64, 16u64);
    let attention = h * heads * 192 + h * 576 + 512 + 512 * heads * 256 + heads * 128 * h;
    let dense = 3 * h * 10_944;
    let moe = 64 * 3 * h * 1408 + 64 * h + 3 * h * 2 * 1408;
    let modules = 2 * v * h + h + 27 * (attention + 2 * h) + dense + 26 * moe;
    assert_eq!(modules, 15_706_484_224);
    assert_published(&fixture("deepseek-v2-lite"), modules);
}

/// DeepSeek-V2's router as transformers' `DeepseekV2Moe` routes: softmax shares, never
/// renormalized; `group_limited_greedy` keeps `topk_group` of `n_group` groups scored by their
/// best expert, `greedy` every expert; `routed_scaling_factor` scales the experts' sum unless
/// it is 1. What it does not have is refused by field.
#[test]
fn deepseek_v2_routes_as_transformers_and_refuses_other_routers() {
    let v2 = parse(&fixture("deepseek-v2"));
    let want = ir::Routing {
        sigmoid: false,
        normalize: false,
        groups: 8,
        groups_kept: 3,
        group_top: 1,
    };
    assert_eq!(v2.variant.routing, want);
    assert_eq!(v2.variant.routed_scale, Some(16.0));
    let lite = parse(&fixture("deepseek-v2-lite"));
    assert_eq!(
        lite.variant.routing,
        ir::Routing {
            normalize: false,
            ..ir::Routing::default()
        }
    );
    assert_eq!(
        lite.variant.routed_scale, None,
        "a factor of 1 scales nothing"
    );
    let lite_text = fixture("deepseek-v2-lite");
    for (from, to, field) in [
        (
            r#""scoring_func": "softmax""#,
            r#""scoring_func": "sigmoid""#,
            "scoring_func",
        ),
        (
            r#""topk_method": "greedy""#,
            r#""topk_method": "noaux_tc""#,
            "topk_method",
        ),
        (
            r#""topk_method": "greedy""#,
            r#""topk_method": "group_limited_greedy""#,
            "n_group",
        ),
    ] {
        assert!(lite_text.contains(from), "{from}");
        let edited = lite_text.replace(from, to).replace(r#""n_group": 1,"#, "");
        let err = hf::parse_config(&edited, Path::new("config.json"))
            .expect_err(field)
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    // Wrong types and counts are named by the config's own fields.
    for (from, to, want) in [
        (
            r#""norm_topk_prob": false"#,
            r#""norm_topk_prob": "false""#,
            "norm_topk_prob",
        ),
        (
            r#""num_experts_per_tok": 6"#,
            r#""num_experts_per_tok": 65"#,
            "exceeds n_routed_experts = 64",
        ),
    ] {
        assert!(lite_text.contains(from), "{from}");
        let err = hf::parse_config(&lite_text.replace(from, to), Path::new("config.json"))
            .expect_err(want)
            .to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
    // Only the rotary columns need an even width: 127 + 64-wide query heads import.
    let odd = lite_text.replace(r#""qk_nope_head_dim": 128"#, r#""qk_nope_head_dim": 127"#);
    assert_eq!(parse(&odd).variant.mla.map(|m| m.qk_head_dim()), Some(191));
    let notes = hf::approximations(&fixture("deepseek-v2"));
    assert!(
        notes.iter().any(|n| n.contains("mscale squared (1.5896)")),
        "{notes:?}"
    );
}

/// GLM-4.5 (transformers' `Glm4MoeForCausalLM`): Llama's attention with biases on q, k and v
/// (none on o), 128-wide heads of which half rotate, one dense layer, then DeepSeek-V3's
/// sigmoid router over 128 experts of 1408 beside a shared expert of 1408. zai-org/GLM-4.5-Air:
/// its modules' shapes sum to 106,852,245,504 (the card's 106B total), counted here module by
/// module; its multi-token prediction layer is not built, as in transformers.
#[test]
fn glm4_moe_biases_q_k_v_rotates_half_heads_and_routes_like_deepseek_v3() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/glm-4.5-air/config.json"
    );
    let text = std::fs::read_to_string(fixture).unwrap();
    let (h, vocab, layers, q, kv) = (4096u64, 151552u64, 46u64, 96 * 128u64, 8 * 128u64);
    let (ffn, experts, expert_ffn) = (10944u64, 128u64, 1408u64);
    // q, k, v with biases; o without; the two block norms.
    let attention = h * q + q + 2 * (h * kv + kv) + q * h + 2 * h;
    let dense = attention + 3 * h * ffn;
    // The router, the routed experts and the shared one.
    let moe = attention + h * experts + (experts + 1) * 3 * h * expert_ffn;
    let modules = 2 * vocab * h + dense + (layers - 1) * moe + h;
    assert_eq!(modules, 106_852_245_504);
    assert_published(&text, modules);
    let spec = parse(&text);
    assert_eq!(
        spec.variant.routing,
        ir::Routing {
            sigmoid: true,
            normalize: true,
            groups: 1,
            groups_kept: 1,
            group_top: 2,
        }
    );
    assert_eq!(spec.variant.rotary_dims, Some(64));
    let dense = spec.variant.dense_layers.as_ref();
    assert_eq!(dense.map(|d| d.count(spec.layers)), Some(1));
    assert!(spec.variant.qkv_bias && !spec.variant.o_bias && !spec.variant.qk_norm);
    let g = import::build_forward(&spec, DType::F32).expect("builds");
    let biased = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, ir::OpKind::Linear { bias: true }))
        .count() as u64;
    assert_eq!(biased, 3 * layers);
    // GLM-4.5 (355B) norms q and k per head: two more norms of 128 per layer.
    let normed = parse(&text.replace("\"use_qk_norm\": false", "\"use_qk_norm\": true"));
    let g = import::build_forward(&normed, DType::F32).expect("builds");
    let widths: Vec<Option<u64>> = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, ir::OpKind::RmsNorm { .. }))
        .map(|o| g.ty(g.op(o).inputs[1]).shape.fixed_numel())
        .collect();
    assert_eq!(widths.len() as u64, 4 * layers + 1);
    assert_eq!(widths[1..3], [Some(128), Some(128)]);
    assert_eq!(normed.param_count(), modules + 2 * 128 * layers);
}

/// gpt-oss (transformers' `GptOssForCausalLM`): biases on q, k, v and o, a sink logit per
/// head, a biased router over experts whose gate, up and down projections are biased, with
/// the clamped SwiGLU of `GptOssExperts`. OpenAI's model card gives 20.91B and 116.83B
/// parameters for openai/gpt-oss-20b and -120b; counted module by module from their published
/// configs (`fixtures/hf`) they are 20,914,757,184 and 116,829,156,672.
#[test]
fn gpt_oss_counts_sinks_and_biased_experts() {
    let fixture = |name: &str| {
        let path = format!(
            "{}/../fixtures/hf/{name}/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(path).unwrap()
    };
    let (h, vocab, heads, kv, d, ffn) = (2880u64, 201088u64, 64u64, 8u64, 64u64, 2880u64);
    let count = |layers: u64, experts: u64| {
        let (q, k) = (heads * d, kv * d);
        // q, k, v and o with biases, the sinks, the two block norms.
        let attention = h * q + q + 2 * (h * k + k) + q * h + h + heads + 2 * h;
        let router = h * experts + experts;
        let experts = experts * (2 * (h * ffn + ffn) + ffn * h + h);
        2 * vocab * h + layers * (attention + router + experts) + h
    };
    assert_eq!(count(24, 32), 20_914_757_184);
    assert_eq!(count(36, 128), 116_829_156_672);
    assert_published(&fixture("gpt-oss-20b"), count(24, 32));
    assert_published(&fixture("gpt-oss-120b"), count(36, 128));
    let spec = parse(&fixture("gpt-oss-20b"));
    let v = &spec.variant;
    assert!(v.qkv_bias && v.o_bias && v.attention_sinks && v.router_bias);
    assert_eq!(
        v.expert_form,
        ir::ExpertForm {
            bias: true,
            alpha: 1.702,
            limit: Some(7.0),
            up_offset: 1.0,
            scales_input: false,
        }
    );
    assert_eq!(v.routing, ir::Routing::default());
    assert_eq!(spec.head_dim(), 64);
    assert!(matches!(
        spec.rope_scaling,
        ir::RopeScaling::Yarn {
            factor: 32.0,
            original_max: 4096.0,
            truncate: false,
            ..
        }
    ));
    // GptOssConfig's defaults where a config leaves its fields out: gpt-oss-120b's shape,
    // the biases on, YaRN ×32 untruncated.
    let bare = r#"{"model_type":"gpt_oss","hidden_size":2880,"intermediate_size":2880,
        "num_hidden_layers":36,"num_attention_heads":64,"num_key_value_heads":8,
        "vocab_size":201088,"num_local_experts":128,"num_experts_per_tok":4}"#;
    let defaults = parse(bare);
    assert_eq!(defaults.param_count(), count(36, 128));
    assert_eq!(defaults.rope_theta, 150000.0);
    assert!(matches!(
        defaults.rope_scaling,
        ir::RopeScaling::Yarn {
            factor: 32.0,
            truncate: false,
            ..
        }
    ));
    assert_eq!(window(&defaults), Some((128, 18)));
}

/// OLMo 3 (transformers' `Olmo3ForCausalLM`) is OLMo 2's block with a sliding window on
/// three of every four layers: an OLMo 3 config of OLMo-2-1124-7B's shape builds OLMo 2's
/// graph op for op but for the windows (7,298,617,344 parameters), transformers' default
/// window 4096 where the config names none, its windowed layers rotating unscaled.
#[test]
fn olmo3_is_olmo2s_block_in_a_sliding_window() {
    let olmo = |model_type: &str, extra: &str| {
        format!(
            r#"{{"model_type":"{model_type}","hidden_size":4096,"intermediate_size":11008,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,
            "vocab_size":100352,"rms_norm_eps":1e-06,"rope_theta":500000{extra}}}"#
        )
    };
    // Each op's kind with its attention window cleared, and the windows.
    let kinds = |text: &str| {
        let g = import::build_forward(&parse(text), DType::F32).expect("builds");
        let kinds: Vec<String> = g
            .op_ids()
            .map(|o| format!("{:?}", g.op(o).kind.clone().with_window(None)))
            .collect();
        let windows: Vec<Option<u64>> = g
            .op_ids()
            .filter(|&o| matches!(g.op(o).kind, ir::OpKind::Attention { .. }))
            .map(|o| g.op(o).kind.attention_window())
            .collect();
        (kinds, windows)
    };
    let olmo3 = olmo(
        "olmo3",
        r#","sliding_window":4096,"rope_scaling":{"rope_type":"yarn","factor":8.0,
            "original_max_position_embeddings":8192,"attention_factor":1.2079441541679836}"#,
    );
    let plain = olmo("olmo3", "");
    assert_published(&plain, 7_298_617_344);
    let ((olmo3_kinds, windows), (olmo2_kinds, full)) = (kinds(&plain), kinds(&olmo("olmo2", "")));
    assert_eq!(olmo3_kinds, olmo2_kinds);
    let three_of_four: Vec<Option<u64>> = (0..32).map(|i| (i % 4 != 3).then_some(4096)).collect();
    assert_eq!((windows, full), (three_of_four, vec![None; 32]));
    // With YaRN, the windowed layers rotate unscaled (transformers' default rope type for
    // them), the full ones scaled.
    assert!(hf::approximations(&olmo3).is_empty());
    let g = import::build_forward(&parse(&olmo3), DType::F32).expect("builds");
    let scaled: Vec<bool> = g
        .op_ids()
        .filter_map(|o| match g.op(o).kind {
            ir::OpKind::Rotary { theta, scaling, .. } => {
                assert_eq!(theta, 500000.0);
                Some(scaling != ir::RopeScaling::None)
            }
            _ => None,
        })
        .collect();
    let want: Vec<bool> = (0..32).flat_map(|l| [l % 4 == 3; 2]).collect();
    assert_eq!(scaled, want);
}

/// Mistral Small 3.1's multimodal config (`model_type` mistral3): its language model is a whole
/// Mistral config under `text_config` (128-wide heads beside hidden 5120, 8 KV heads, untied),
/// planned as Mistral Small 3's text model: 23,572,403,200 parameters, counted here module by
/// module (Mistral-Small-24B's card: 23.6B); the vision tower is noted as not built.
#[test]
fn mistral3s_multimodal_config_plans_its_mistral_text_model() {
    let small_3_1 = r#"{"architectures":["Mistral3ForConditionalGeneration"],
        "image_token_index":10,"model_type":"mistral3","multimodal_projector_bias":false,
        "projector_hidden_act":"gelu","spatial_merge_size":2,
        "text_config":{"attention_dropout":0.0,"head_dim":128,"hidden_act":"silu",
            "hidden_size":5120,"initializer_range":0.02,"intermediate_size":32768,
            "max_position_embeddings":131072,"model_type":"mistral","num_attention_heads":32,
            "num_hidden_layers":40,"num_key_value_heads":8,"rms_norm_eps":1e-05,
            "rope_theta":1000000000.0,"sliding_window":null,"use_cache":true,
            "vocab_size":131072},
        "vision_config":{"head_dim":64,"hidden_size":1024,"image_size":1540,
            "intermediate_size":4096,"model_type":"pixtral","num_attention_heads":16,
            "num_hidden_layers":24,"patch_size":14},
        "vision_feature_layer":-1}"#;
    let (h, q, kv, ffn, layers, vocab) = (5120u64, 4096u64, 1024u64, 32768u64, 40u64, 131072u64);
    let layer = 2 * h * q + 2 * h * kv + 3 * h * ffn + 2 * h;
    let modules = 2 * vocab * h + layers * layer + h;
    assert_eq!(modules, 23_572_403_200);
    assert_published(small_3_1, modules);
    let spec = parse(small_3_1);
    assert_eq!((spec.head_dim(), spec.rope_theta), (128, 1e9));
    let notes = hf::approximations(small_3_1);
    assert!(
        notes.iter().any(|n| n.contains("vision tower")),
        "{notes:?}"
    );
}

/// GLM-4-0414 (transformers' `Glm4ForCausalLM`): Llama's attention with biases on q, k and v
/// (attention_bias defaults to true; o_proj has none), 2 KV heads of 128, half of each head
/// rotated, and four norms per layer named as transformers names them (post_self_attn_layernorm
/// and post_mlp_layernorm after attention and the MLP). GLM-4-9B-0414's shape: 9,400,279,040
/// parameters counted here module by module (its card: 9.4B).
#[test]
fn glm4_norms_after_attention_and_the_mlp_and_rotates_half_heads() {
    let nine_b = r#"{"architectures":["Glm4ForCausalLM"],"attention_dropout":0.0,
        "eos_token_id":[151329,151336,151338],"head_dim":128,"hidden_act":"silu",
        "hidden_size":4096,"intermediate_size":13696,"max_position_embeddings":32768,
        "model_type":"glm4","num_attention_heads":32,"num_hidden_layers":40,
        "num_key_value_heads":2,"pad_token_id":151329,"partial_rotary_factor":0.5,
        "rms_norm_eps":1e-05,"rope_theta":10000.0,"tie_word_embeddings":false,
        "vocab_size":151552}"#;
    let (h, q, kv, ffn, layers, vocab) = (4096u64, 4096u64, 256u64, 13696u64, 40u64, 151552u64);
    let attention = h * q + q + 2 * (h * kv + kv) + q * h;
    let modules = 2 * vocab * h + layers * (attention + 3 * h * ffn + 4 * h) + h;
    assert_eq!(modules, 9_400_279_040);
    assert_published(nine_b, modules);
    let spec = parse(nine_b);
    assert!(spec.variant.qkv_bias && !spec.variant.o_bias && spec.variant.sandwich_norms);
    assert_eq!(spec.variant.rotary_dims, Some(64));
    let g = import::build_forward(&spec, DType::F32).expect("builds");
    let names: Vec<String> = g
        .op_ids()
        .filter_map(|o| match &g.op(o).kind {
            ir::OpKind::Param { name } if name.starts_with("model.layers.0.") => Some(name.clone()),
            _ => None,
        })
        .collect();
    for norm in [
        "input_layernorm",
        "post_self_attn_layernorm",
        "post_attention_layernorm",
        "post_mlp_layernorm",
    ] {
        let name = format!("model.layers.0.{norm}.weight");
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    let notes = hf::approximations(nine_b);
    assert!(
        notes.iter().any(|n| n.contains("gate_up_proj"))
            && notes.iter().any(|n| n.contains("interleaved")),
        "{notes:?}"
    );
}

/// Seed-OSS (transformers' `SeedOssForCausalLM`): Llama's block with biases on q, k and v
/// (attention_bias, default true) but not o (attention_out_bias), 128-wide heads, and dropout
/// after attention and the MLP (residual_dropout, default 0.1), built as dropout ops; the
/// attention probabilities' dropout is noted as not built. Seed-OSS-36B's shape: 36,151,104,512
/// parameters counted here module by module (its card: 36B).
#[test]
fn seed_oss_biases_q_k_v_and_drops_out_after_attention_and_the_mlp() {
    let seed_36b = r#"{"architectures":["SeedOssForCausalLM"],"attention_bias":true,
        "attention_dropout":0.1,"attention_out_bias":false,"head_dim":128,"hidden_act":"silu",
        "hidden_size":5120,"intermediate_size":27648,"max_position_embeddings":524288,
        "mlp_bias":false,"model_type":"seed_oss","num_attention_heads":80,
        "num_hidden_layers":64,"num_key_value_heads":8,"residual_dropout":0.1,
        "rms_norm_eps":1e-06,"rope_theta":10000000.0,"tie_word_embeddings":false,
        "vocab_size":155136}"#;
    let (h, q, kv, ffn, layers, vocab) = (5120u64, 10240u64, 1024u64, 27648u64, 64u64, 155136u64);
    let attention = h * q + q + 2 * (h * kv + kv) + q * h;
    let modules = 2 * vocab * h + layers * (attention + 3 * h * ffn + 2 * h) + h;
    assert_eq!(modules, 36_151_104_512);
    assert_published(seed_36b, modules);
    let spec = parse(seed_36b);
    assert!(spec.variant.qkv_bias && !spec.variant.o_bias);
    assert_eq!((spec.head_dim(), spec.dropout), (128, 0.1));
    let g = import::build_forward(&spec, DType::F32).expect("builds");
    let dropouts = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, ir::OpKind::Dropout { p, .. } if p == 0.1))
        .count() as u64;
    assert_eq!(dropouts, 2 * layers);
    let notes = hf::approximations(seed_36b);
    assert!(
        notes.iter().any(|n| n.contains("attention_dropout 0.1")),
        "{notes:?}"
    );
    // Without dropout (as for fine-tuning), no dropout op and no note.
    let off = seed_36b
        .replace("\"residual_dropout\":0.1", "\"residual_dropout\":0.0")
        .replace("\"attention_dropout\":0.1", "\"attention_dropout\":0.0");
    let g = import::build_forward(&parse(&off), DType::F32).expect("builds");
    assert!(
        g.op_ids()
            .all(|o| !matches!(g.op(o).kind, ir::OpKind::Dropout { .. }))
    );
    assert!(
        hf::approximations(&off)
            .iter()
            .all(|n| !n.contains("dropout"))
    );
}

/// Qwen's vision-language configs plan their text model: Qwen2.5-VL-7B-Instruct's config as
/// first published keeps its Qwen2 text model's fields at the top (M-RoPE read as plain
/// rotary), newer transformers write them under `text_config` as `qwen2_5_vl_text`, and
/// Qwen3-VL nests a `qwen3_vl_text` or `qwen3_vl_moe_text` model there, with
/// `tie_word_embeddings` at the top. Each text model has the shapes of the published text-only
/// model it was built from: Qwen2.5-7B's 7,615,616,512 parameters, Qwen3-8B's 8,190,735,360,
/// Qwen3-30B-A3B's 30,532,122,624 (their safetensors totals); the vision tower is noted.
#[test]
fn qwen_vision_language_configs_plan_their_text_models() {
    let qwen25_vl = r#"{"architectures":["Qwen2_5_VLForConditionalGeneration"],
        "attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151645,"hidden_act":"silu",
        "hidden_size":3584,"image_token_id":151655,"initializer_range":0.02,
        "intermediate_size":18944,"max_position_embeddings":128000,"max_window_layers":28,
        "model_type":"qwen2_5_vl","num_attention_heads":28,"num_hidden_layers":28,
        "num_key_value_heads":4,"rms_norm_eps":1e-06,"rope_theta":1000000.0,
        "sliding_window":32768,"tie_word_embeddings":false,"use_cache":true,
        "use_sliding_window":false,"video_token_id":151656,
        "vision_config":{"depth":32,"hidden_act":"silu","hidden_size":1280,
            "intermediate_size":3420,"num_heads":16,"in_chans":3,"out_hidden_size":3584,
            "patch_size":14,"spatial_merge_size":2,"window_size":112},
        "rope_scaling":{"type":"mrope","mrope_section":[16,24,24]},"vocab_size":152064}"#;
    assert_published(qwen25_vl, 7_615_616_512);
    let notes = hf::approximations(qwen25_vl);
    assert!(
        notes.iter().any(|n| n.contains("vision tower")),
        "{notes:?}"
    );
    // The same text model written under text_config by newer transformers.
    let v: serde_json::Value = serde_json::from_str(qwen25_vl).unwrap();
    let mut text = v.as_object().unwrap().clone();
    text.remove("vision_config");
    text.insert("model_type".into(), "qwen2_5_vl_text".into());
    let nested = serde_json::json!({
        "model_type": "qwen2_5_vl", "text_config": text, "vision_config": v["vision_config"]
    });
    assert_published(&nested.to_string(), 7_615_616_512);
    // A text_config that is there but not an object is refused, not read past.
    let mut broken = v.as_object().unwrap().clone();
    broken.insert("text_config".into(), "qwen2".into());
    let err = hf::parse_config(
        &serde_json::Value::Object(broken).to_string(),
        Path::new("vl.json"),
    )
    .expect_err("text_config a string")
    .to_string();
    assert!(
        err.contains("vl.json") && err.contains("text_config"),
        "{err}"
    );
    let qwen3_vl = |text: &str| {
        format!(
            r#"{{"architectures":["Qwen3VLForConditionalGeneration"],"model_type":"qwen3_vl",
            "tie_word_embeddings":false,"text_config":{{{text},"head_dim":128,
            "num_key_value_heads":{kv},"rms_norm_eps":1e-06,"rope_theta":5000000,
            "rope_scaling":{{"mrope_interleaved":true,"mrope_section":[24,20,20],
            "rope_type":"default"}},"vocab_size":151936}},
            "vision_config":{{"depth":27,"hidden_size":1152,"model_type":"qwen3_vl"}}}}"#,
            kv = if text.contains("num_experts") { 4 } else { 8 }
        )
    };
    assert_published(
        &qwen3_vl(
            r#""model_type":"qwen3_vl_text","hidden_size":4096,"intermediate_size":12288,
            "num_attention_heads":32,"num_hidden_layers":36"#,
        ),
        8_190_735_360,
    );
    let moe = qwen3_vl(
        r#""model_type":"qwen3_vl_moe_text","hidden_size":2048,"intermediate_size":6144,
        "moe_intermediate_size":768,"num_attention_heads":32,"num_hidden_layers":48,
        "num_experts":128,"num_experts_per_tok":8,"norm_topk_prob":true"#,
    )
    .replace("\"qwen3_vl\",\n", "\"qwen3_vl_moe\",\n");
    assert!(moe.contains("\"model_type\":\"qwen3_vl_moe\""), "{moe}");
    assert_published(&moe, 30_532_122_624);
}

/// Cohere (transformers' `CohereForCausalLM`, Command R and Aya): attention and a SwiGLU MLP in
/// parallel off one LayerNorm with a weight and no bias (`LayerNorm{bias: false}`), a tied head
/// whose logits are scaled by `logit_scale`. Command R (v01)'s shape: 34,980,831,232
/// parameters counted here module by module (its card: 35B). Its per-head q/k LayerNorms
/// (Command R+) are refused by name.
#[test]
fn cohere_runs_attention_and_the_mlp_off_one_bias_free_layernorm() {
    let command_r = r#"{"architectures":["CohereForCausalLM"],"attention_bias":false,
        "attention_dropout":0.0,"bos_token_id":5,"eos_token_id":255001,"hidden_act":"silu",
        "hidden_size":8192,"initializer_range":0.02,"intermediate_size":22528,
        "layer_norm_eps":1e-05,"logit_scale":0.0625,"max_position_embeddings":8192,
        "model_type":"cohere","num_attention_heads":64,"num_hidden_layers":40,
        "num_key_value_heads":64,"pad_token_id":0,"rope_theta":8000000.0,"use_cache":true,
        "use_qk_norm":false,"vocab_size":256000}"#;
    let (h, ffn, layers, vocab) = (8192u64, 22528u64, 40u64, 256000u64);
    // q, k, v, o; the SwiGLU MLP; one norm's weight.
    let modules = vocab * h + layers * (4 * h * h + 3 * h * ffn + h) + h;
    assert_eq!(modules, 34_980_831_232);
    assert_published(command_r, modules);
    let g = import::build_forward(&parse(command_r), DType::F32).expect("builds");
    let count = |f: &dyn Fn(&ir::OpKind) -> bool| g.op_ids().filter(|&o| f(&g.op(o).kind)).count();
    // One norm per layer and the final one, each without a beta.
    let bias_free = |k: &ir::OpKind| matches!(k, ir::OpKind::LayerNorm { bias: false, .. });
    assert_eq!(count(&bias_free) as u64, layers + 1);
    assert_eq!(count(&|k| matches!(k, ir::OpKind::RmsNorm { .. })), 0);
    assert_eq!(
        count(&|k| matches!(k, ir::OpKind::Scale { factor } if *factor == 0.0625)),
        1
    );
    let notes = hf::approximations(command_r);
    assert!(notes.iter().any(|n| n.contains("interleaved")), "{notes:?}");
    let plus = command_r.replace("\"use_qk_norm\":false", "\"use_qk_norm\":true");
    let err = hf::parse_config(&plus, Path::new("config.json"))
        .expect_err("q/k norms")
        .to_string();
    assert!(err.contains("use_qk_norm = true"), "{err}");
}
