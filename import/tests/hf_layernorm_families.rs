//! The LayerNorm families, GPT-NeoX (Pythia), Phi and Falcon from their published config.json
//! files, StableLM and StarCoder2 from their sizes: parameter counts against the counts their
//! authors published or transformers' modules, the parallel block built as the config says
//! (two norms, one, or Llama's order), and what plait does not build refused by field.

use std::collections::HashSet;
use std::path::Path;

use import::spec::{ParallelNorms, Ungated};
use import::{ModelSpec, build_forward, hf};
use ir::{DType, Graph, OpKind, ValueId};

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/../fixtures/hf/{name}/config.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path).expect("fixture")
}

fn parse(json: &str) -> ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

fn refusal(json: &str) -> String {
    hf::parse_config(json, Path::new("config.json"))
        .expect_err("refused")
        .to_string()
}

/// The spec's count and the built graph's, which must agree.
fn counted(spec: &ModelSpec) -> u64 {
    let graph = build_forward(spec, DType::Bf16).expect("graph builds");
    assert_eq!(graph.param_count(), spec.param_count(), "{}", spec.name);
    spec.param_count()
}

/// Pythia's model card ("Total params": 162,322,944 for Pythia-160M), the GPT-NeoX-20B paper
/// (Black et al. 2022: 20,554,567,680) and Phi-2's checkpoint (2,779,683,840).
#[test]
fn published_gpt_neox_and_phi_configs_count_their_published_parameters() {
    for (name, published) in [
        ("pythia-160m", 162_322_944),
        ("gpt-neox-20b", 20_554_567_680),
        ("phi-2", 2_779_683_840),
    ] {
        assert_eq!(counted(&parse(&fixture(name))), published, "{name}");
    }
}

/// Falcon counted module by module as transformers' `FalconForCausalLM` builds them: the
/// fused query_key_value of (heads + 2·kv heads)·64 columns, dense, 4h MLP, LayerNorms with
/// biases (one per layer in the old architecture, two in the new), the head tied.
#[test]
fn falcon_counts_its_modules_old_and_new_architecture() {
    let module_count = |h: u64, heads: u64, kv: u64, layers: u64, norms: u64| {
        let qkv = h * (heads + 2 * kv) * 64;
        let layer = qkv + h * h + 2 * h * 4 * h + norms * 2 * h;
        65_024 * h + layers * layer + 2 * h
    };
    let seven = parse(&fixture("falcon-7b"));
    assert_eq!(
        (seven.kv_heads, seven.variant.parallel),
        (1, Some(ParallelNorms::Shared))
    );
    assert!(seven.tied_embeddings && !seven.variant.mlp_bias && !seven.variant.qkv_bias);
    assert_eq!(counted(&seven), module_count(4544, 71, 1, 32, 1));
    assert_eq!(counted(&seven), 6_921_720_704);
    let forty = parse(&fixture("falcon-40b"));
    assert_eq!(
        (forty.kv_heads, forty.variant.parallel),
        (8, Some(ParallelNorms::Separate))
    );
    assert_eq!(counted(&forty), module_count(8192, 128, 8, 60, 2));
}

/// The families' blocks as transformers builds them: GPT-NeoX's quarter-head rotary, exact
/// GELU and norm per branch; Phi's 0.4 of an 80-wide head, tanh GELU, one shared norm and a
/// biased head.
#[test]
fn each_family_builds_its_own_block() {
    let pythia = parse(&fixture("pythia-160m"));
    let v = &pythia.variant;
    assert_eq!(v.rotary_dims, Some(16), "a quarter of a 64-wide head");
    assert_eq!(v.ungated_mlp, Some(Ungated::Gelu { tanh: false }));
    assert_eq!(v.parallel, Some(ParallelNorms::Separate));
    assert!(v.layer_norm && v.qkv_bias && v.o_bias && v.mlp_bias && !v.head_bias);
    let phi = parse(&fixture("phi-2"));
    let v = &phi.variant;
    assert_eq!(v.rotary_dims, Some(32), "0.4 of an 80-wide head");
    assert_eq!(v.ungated_mlp, Some(Ungated::Gelu { tanh: true }));
    assert_eq!(v.parallel, Some(ParallelNorms::Shared));
    assert!(v.head_bias && v.mlp_bias && !phi.tied_embeddings);
}

/// StableLM-2-1.6B's sizes (Hugging Face shows 1.64B) and StarCoder2-3B's (3.03B, its head
/// tied), counted module by module as transformers builds them: StableLM's SwiGLU MLP without
/// biases, q, k and v biased (`use_qkv_bias`), a quarter of each head rotated; StarCoder2's
/// biases on every projection (`use_bias`) and GELU MLP, two KV heads.
#[test]
fn stablelm_and_starcoder2_count_their_modules() {
    let stablelm = parse(
        r#"{"model_type":"stablelm","hidden_size":2048,"intermediate_size":5632,
        "num_hidden_layers":24,"num_attention_heads":32,"num_key_value_heads":32,
        "vocab_size":100352,"hidden_act":"silu","layer_norm_eps":1e-05,
        "max_position_embeddings":4096,"partial_rotary_factor":0.25,"rope_theta":10000,
        "use_qkv_bias":true,"use_parallel_residual":false,"qk_layernorm":false,
        "tie_word_embeddings":false}"#,
    );
    let h = 2048u64;
    let layer = 3 * (h * h + h) + h * h + 3 * h * 5632 + 2 * 2 * h;
    assert_eq!(counted(&stablelm), 2 * 100_352 * h + 24 * layer + 2 * h);
    assert_eq!(counted(&stablelm), 1_644_515_328);
    let v = &stablelm.variant;
    assert_eq!(
        (v.rotary_dims, v.ungated_mlp, v.parallel),
        (Some(16), None, None)
    );
    assert!(v.qkv_bias && !v.o_bias && !v.mlp_bias);
    let starcoder = parse(
        r#"{"model_type":"starcoder2","hidden_size":3072,"intermediate_size":12288,
        "num_hidden_layers":30,"num_attention_heads":24,"num_key_value_heads":2,
        "vocab_size":49152,"hidden_act":"gelu_pytorch_tanh","norm_epsilon":1e-05,
        "max_position_embeddings":16384,"rope_theta":999999.4420358813,
        "sliding_window":4096,"use_bias":true,"residual_dropout":0.1}"#,
    );
    let (h, f, kv) = (3072u64, 12_288u64, 2 * 128u64);
    let attention = (h * h + h) + 2 * (h * kv + kv) + (h * h + h);
    let layer = attention + (h * f + f) + (f * h + h) + 2 * 2 * h;
    assert_eq!(counted(&starcoder), 49_152 * h + 30 * layer + 2 * h);
    assert_eq!(counted(&starcoder), 3_030_371_328);
    let v = &starcoder.variant;
    assert_eq!(v.ungated_mlp, Some(Ungated::Gelu { tanh: true }));
    assert!(starcoder.tied_embeddings && v.mlp_bias && v.parallel.is_none());
}

/// Whether each of `graph`'s values depends on layer 0's attention.
fn after_attention(graph: &Graph) -> HashSet<ValueId> {
    let mut after = HashSet::new();
    for &o in graph.order() {
        let op = graph.op(o);
        let first_attention = matches!(op.kind, OpKind::Attention { .. }) && after.is_empty();
        if first_attention || op.inputs.iter().any(|v| after.contains(v)) {
            after.extend(op.results.iter().copied());
        }
    }
    after
}

/// In a parallel block the MLP reads the layer's input, not the attention's residual sum:
/// layer 0's MLP projections do not depend on its attention; in Llama's order (GPT-NeoX's
/// `use_parallel_residual: false`, Falcon's `parallel_attn: false`) they do.
#[test]
fn a_parallel_block_runs_the_mlp_beside_attention_not_after_it() {
    let base = |model_type: &str, extra: &str| {
        format!(
            r#"{{"model_type":"{model_type}","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":256{extra}}}"#
        )
    };
    for (json, parallel) in [
        (base("gpt_neox", ""), true),
        (base("gpt_neox", r#","use_parallel_residual":false"#), false),
        (base("phi", ""), true),
        (base("falcon", ""), true),
        (base("falcon", r#","new_decoder_architecture":true"#), true),
        (base("falcon", r#","parallel_attn":false"#), false),
        (base("stablelm", r#","use_parallel_residual":true"#), true),
        (base("stablelm", ""), false),
        (base("starcoder2", ""), false),
    ] {
        let spec = parse(&json);
        assert_eq!(spec.variant.parallel.is_some(), parallel, "{json}");
        let graph = build_forward(&spec, DType::F32).expect("graph builds");
        let after = after_attention(&graph);
        let up = graph.layer_ops(0).into_iter().find(|&o| {
            let op = graph.op(o);
            matches!(op.kind, OpKind::Linear { .. })
                && graph.ty(op.results[0]).shape.last().and_then(|d| d.fixed()) == Some(spec.ffn)
        });
        let up = graph.op(up.expect("an MLP up projection"));
        assert_eq!(!after.contains(&up.results[0]), parallel, "{json}");
    }
}

/// Falcon's older field names (`n_layer`, `n_head`, `n_head_kv`) read as the new ones, and
/// `num_ln_in_parallel_attn: 1` shares one norm in the new architecture.
#[test]
fn falcon_reads_its_older_field_names_and_norm_count() {
    let new = |names: &str, extra: &str| {
        parse(&format!(
            r#"{{"model_type":"falcon","hidden_size":256,{names},"vocab_size":1000,
            "new_decoder_architecture":true{extra}}}"#
        ))
    };
    let canonical = new(
        r#""num_hidden_layers":3,"num_attention_heads":8,"num_kv_heads":2"#,
        "",
    );
    let older = new(r#""n_layer":3,"n_head":8,"n_head_kv":2"#, "");
    assert_eq!((older.layers, older.heads, older.kv_heads), (3, 8, 2));
    assert_eq!(older.param_count(), canonical.param_count());
    let one_norm = new(
        r#""n_layer":3,"n_head":8,"n_head_kv":2"#,
        r#","num_ln_in_parallel_attn":1"#,
    );
    assert_eq!(one_norm.variant.parallel, Some(ParallelNorms::Shared));
}

/// What plait does not build is refused naming the field.
#[test]
fn what_plait_does_not_build_is_refused_by_field() {
    let neox = r#""model_type":"gpt_neox","hidden_size":256,"intermediate_size":512,
        "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":1000"#;
    let phi = neox.replace("gpt_neox", "phi");
    let falcon = r#""model_type":"falcon","hidden_size":256,"num_hidden_layers":2,
        "num_attention_heads":4,"vocab_size":1000"#;
    for (json, field) in [
        (format!(r#"{{{neox},"hidden_act":"silu"}}"#), "hidden_act"),
        // 0.3 of a 64-wide head is 19 dimensions: odd.
        (format!(r#"{{{neox},"rotary_pct":0.3}}"#), "rotary_pct"),
        (format!(r#"{{{phi},"qk_layernorm":true}}"#), "qk_layernorm"),
        (
            format!(
                r#"{{{},"qk_layernorm":true}}"#,
                neox.replace("gpt_neox", "stablelm")
            ),
            "qk_layernorm",
        ),
        (
            format!(
                r#"{{{},"hidden_act":"gelu"}}"#,
                neox.replace("gpt_neox", "stablelm")
            ),
            "hidden_act",
        ),
        (
            format!(
                r#"{{{},"hidden_act":"relu"}}"#,
                neox.replace("gpt_neox", "starcoder2")
            ),
            "hidden_act",
        ),
        (format!(r#"{{{falcon},"alibi":true}}"#), "alibi"),
        (format!(r#"{{{falcon},"activation":"relu"}}"#), "activation"),
        (
            format!(r#"{{{falcon},"partial_rotary_factor":0.5}}"#),
            "partial_rotary_factor",
        ),
    ] {
        let e = refusal(&json);
        assert!(e.contains(field), "{field}: {e}");
    }
}

/// `inspect`'s notes say what is built differently: the fused query_key_value as three
/// projections, and dropout the config asks for (Phi-2's resid_pdrop) not built.
#[test]
fn notes_name_the_fused_projection_and_the_dropout_not_built() {
    let neox = hf::approximations(&fixture("pythia-160m"));
    assert!(
        neox.iter().any(|n| n.contains("query_key_value")),
        "{neox:?}"
    );
    let phi = hf::approximations(&fixture("phi-2"));
    assert!(
        phi.iter()
            .any(|n| n.contains("resid_pdrop") && n.contains("without dropout")),
        "{phi:?}"
    );
}
