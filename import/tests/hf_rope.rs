//! `rope_scaling` read as transformers reads it, and the frequencies it gives against the
//! numbers its definitions imply.

use std::path::Path;

use import::hf;
use ir::RopeScaling;

fn scaling(json: &str) -> RopeScaling {
    hf::parse_config(json, Path::new("config.json"))
        .expect("config parses")
        .rope_scaling
}

fn llama(rope: &str) -> String {
    format!(
        r#"{{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
        "vocab_size":128256,"max_position_embeddings":131072,"rope_theta":500000.0,
        "rope_scaling":{rope}}}"#
    )
}

#[test]
fn llama_3_1_scaling_is_computed_not_noted() {
    // meta-llama/Llama-3.1-8B's config.json.
    let json = llama(
        r#"{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}"#,
    );
    assert_eq!(
        scaling(&json),
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max: 8192.0,
        }
    );
    assert!(
        hf::approximations(&json)
            .iter()
            .all(|n| !n.contains("rope")),
        "{:?}",
        hf::approximations(&json)
    );
    // The graph's rotary ops carry it.
    let spec = hf::parse_config(&json, Path::new("config.json")).expect("parses");
    let g = import::build_forward(&spec, ir::DType::F32).expect("builds");
    let carried = g
        .op_ids()
        .filter(|&o| matches!(g.op(o).kind, ir::OpKind::Rotary { scaling, .. } if scaling == spec.rope_scaling))
        .count();
    assert_eq!(carried, 2 * 32, "q and k of every layer");
}

#[test]
fn yarn_attention_factor_follows_transformers_defaults() {
    // Qwen2.5's long-context recipe: factor 4 over 32768, no mscale: 0.1·ln 4 + 1.
    let qwen = llama(r#"{"type":"yarn","factor":4.0,"original_max_position_embeddings":32768}"#);
    match scaling(&qwen) {
        RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max,
            attention_factor,
            ..
        } => {
            assert_eq!(
                (factor, beta_fast, beta_slow, original_max),
                (4.0, 32.0, 1.0, 32768.0)
            );
            assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
        }
        other => panic!("{other:?}"),
    }
    // DeepSeek-V3: mscale = mscale_all_dim, so the two cancel in cos and sin (the softmax
    // scale carries mscale_all_dim's square instead).
    let v3 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/deepseek-v3/config.json"
    ))
    .expect("fixture");
    assert!(matches!(
        scaling(&v3),
        RopeScaling::Yarn {
            factor: 40.0,
            original_max: 4096.0,
            attention_factor: 1.0,
            ..
        }
    ));
}

#[test]
fn kinds_plait_does_not_compute_are_noted_and_bad_values_refused() {
    // One factor per rotated pair of a 128-wide head.
    let pairs = |x: &str| vec![x; 64].join(",");
    let longrope = llama(&format!(
        r#"{{"type":"longrope","short_factor":[{}],"long_factor":[{}]}}"#,
        pairs("1.0"),
        pairs("2.0")
    ));
    assert_eq!(scaling(&longrope), RopeScaling::None);
    assert!(
        hf::approximations(&longrope)
            .iter()
            .any(|n| n.contains("longrope")),
        "{:?}",
        hf::approximations(&longrope)
    );
    let dynamic = llama(r#"{"type":"dynamic","factor":2.0}"#);
    assert!(
        hf::approximations(&dynamic)
            .iter()
            .any(|n| n.contains("dynamic NTK"))
    );
    let missing = llama(r#"{"rope_type":"llama3","factor":8.0}"#);
    let err = hf::parse_config(&missing, Path::new("config.json"))
        .expect_err("llama3 without its bands")
        .to_string();
    assert!(err.contains("low_freq_factor"), "{err}");
    let zero = llama(r#"{"type":"linear","factor":0}"#);
    let err = hf::parse_config(&zero, Path::new("config.json"))
        .expect_err("factor 0")
        .to_string();
    assert!(err.contains("factor"), "{err}");
    let unknown = llama(r#"{"rope_type":"weird","factor":2.0}"#);
    let err = hf::parse_config(&unknown, Path::new("config.json"))
        .expect_err("a kind transformers does not know")
        .to_string();
    assert!(err.contains("rope_type = \"weird\""), "{err}");
}

/// A longrope carries a factor per rotated pair of a head in each list (64 for these 128-wide
/// heads, Phi-3.5's 48 for its 96-wide ones): the note names how many, on one line.
#[test]
fn a_longrope_note_shows_its_factor_lists_by_length() {
    let factors = vec!["1.0"; 64].join(",");
    let longrope = llama(&format!(
        r#"{{"type":"longrope","short_factor":[{factors}],"long_factor":[{factors}]}}"#
    ));
    let notes = hf::approximations(&longrope);
    let note = notes
        .iter()
        .find(|n| n.contains("longrope"))
        .expect("noted");
    assert!(note.contains("[64 numbers]") && note.len() < 300, "{note}");
}

/// A `rope_scaling` transformers cannot build is refused naming what is wrong: no kind, two
/// kinds, a dynamic factor below 1, longrope factor lists not one per rotated pair; an
/// unknown kind is named under the key the file used.
#[test]
fn rope_scalings_transformers_cannot_build_are_refused() {
    let refused = |rope: &str| {
        hf::parse_config(&llama(rope), Path::new("config.json"))
            .expect_err(rope)
            .to_string()
    };
    assert!(refused(r#"{"factor":2.0}"#).contains("names no kind"));
    assert!(refused(r#"{}"#).contains("names no kind"));
    assert!(refused(r#"{"type":"linear","rope_type":"yarn","factor":2.0}"#).contains("two kinds"));
    for factor in ["0", "-3", "0.5"] {
        let err = refused(&format!(r#"{{"type":"dynamic","factor":{factor}}}"#));
        assert!(err.contains("at least 1"), "{err}");
    }
    assert!(refused(r#"{"type":"dynamic"}"#).contains("factor"));
    let three = refused(r#"{"type":"longrope","short_factor":[1,1,1],"long_factor":[1,1,1]}"#);
    assert!(
        three.contains("short_factor") && three.contains("(64)"),
        "{three}"
    );
    let negative = vec!["-1"; 64].join(",");
    let err = refused(&format!(
        r#"{{"type":"su","short_factor":[{negative}],"long_factor":[{negative}]}}"#
    ));
    assert!(err.contains("positive numbers"), "{err}");
    assert!(refused(r#"{"type":"longrope"}"#).contains("short_factor"));
    let err = refused(r#"{"type":"foo"}"#);
    assert!(err.contains("rope_scaling.type = \"foo\""), "{err}");
}

/// A config written by transformers 5 holds its rotary settings in `rope_parameters` (one
/// object, or one per attention kind where the model has `layer_types`) instead of
/// `rope_theta`, `rope_scaling` and `partial_rotary_factor`: it reads as the transformers 4
/// config of the same model, notes included, and a `rope_parameters` that is not an object is
/// refused by name.
#[test]
fn transformers_5_rope_parameters_read_as_the_older_fields() {
    let parse = |json: &str| hf::parse_config(json, Path::new("config.json"));
    let same = |v4: &str, v5: &str| {
        let (old, new) = (parse(v4).expect("v4 parses"), parse(v5).expect("v5 parses"));
        assert_eq!(format!("{old:?}"), format!("{new:?}"), "{v5}");
        assert_eq!(hf::approximations(v4), hf::approximations(v5), "{v5}");
        new
    };
    // Llama 3.1: theta and the llama3 scaling in one object.
    let v4 = llama(
        r#"{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}"#,
    );
    let v5 = v4.replace(r#""rope_theta":500000.0,"#, "").replace(
        r#""rope_scaling":{"#,
        r#""rope_parameters":{"rope_theta":500000.0,"#,
    );
    let spec = same(&v4, &v5);
    assert_eq!(spec.rope_theta, 500000.0);
    assert!(matches!(spec.rope_scaling, RopeScaling::Llama3 { .. }));
    // GLM-4.5: the partial rotary factor inside, the default type (no scaling).
    let glm = |rope: &str| {
        format!(
            r#"{{"model_type":"glm4_moe","hidden_size":64,"intermediate_size":96,
            "moe_intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":4,
            "num_key_value_heads":2,"head_dim":32,"n_routed_experts":4,"num_experts_per_tok":2,
            "vocab_size":256,{rope}}}"#
        )
    };
    let spec = same(
        &glm(r#""rope_theta":1000000,"partial_rotary_factor":0.25"#),
        &glm(
            r#""rope_parameters":{"rope_type":"default","rope_theta":1000000,"partial_rotary_factor":0.25}"#,
        ),
    );
    assert_eq!(spec.variant.rotary_dims, Some(8));
    // Gemma 3: one object per attention kind; the sliding layers' base is read as
    // rope_local_base_freq (their rotary's base).
    let gemma = |rope: &str| {
        format!(
            r#"{{"model_type":"gemma3_text","hidden_size":64,"intermediate_size":96,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":1,
            "head_dim":32,"vocab_size":256,"sliding_window":512,{rope}}}"#
        )
    };
    let spec = same(
        &gemma(
            r#""rope_theta":1000000,"rope_local_base_freq":10000,
            "rope_scaling":{"rope_type":"linear","factor":8.0}"#,
        ),
        &gemma(
            r#""rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,
            "rope_theta":1000000},"sliding_attention":{"rope_type":"default","rope_theta":10000}}"#,
        ),
    );
    assert_eq!(spec.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    let local = spec.variant.local_rope.as_ref().expect("a local rope");
    assert_eq!(
        (local.theta, local.layers.as_slice()),
        (10000.0, &[true, true][..])
    );
    // A top-level rope_scaling replaces rope_parameters whole, as in transformers 5.
    let both = parse(&glm(
        r#""rope_theta":500000,"rope_scaling":{"rope_type":"linear","factor":4.0},
        "rope_parameters":{"rope_type":"default","rope_theta":1000000}"#,
    ))
    .expect("parses");
    assert_eq!(
        (both.rope_theta, both.rope_scaling),
        (500000.0, RopeScaling::Linear { factor: 4.0 })
    );
    let err = parse(&glm(r#""rope_parameters":10000"#))
        .expect_err("a number")
        .to_string();
    assert!(err.contains("rope_parameters"), "{err}");
}

/// GLM (transformers' `GlmForCausalLM`, GLM-4-9B-chat-hf): GLM-4-0414's attention (biases on q,
/// k and v, none on o, heads of 128, half of each rotated) in Llama's two-norm block, its
/// fused gate_up_proj and interleaved pairs noted. THUDM/glm-4-9b-chat-hf's shapes: 40 layers
/// of hidden 4096, 32 query heads beside 2 KV heads, a SwiGLU of 13696, untied embeddings of
/// 151552; the card's 9.4B.
#[test]
fn glm_is_glm4_attention_in_a_two_norm_block() {
    let glm = r#"{"model_type":"glm","hidden_size":4096,"intermediate_size":13696,
        "num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":2,"head_dim":128,
        "partial_rotary_factor":0.5,"attention_bias":true,"vocab_size":151552,
        "max_position_embeddings":131072,"rms_norm_eps":1.5625e-07,"tie_word_embeddings":false}"#;
    let spec = import::hf::parse_config(glm, std::path::Path::new("config.json")).unwrap();
    let (h, kv) = (4096u64, 256u64);
    let attention = 2 * h * h + 2 * h * kv + h + 2 * kv;
    let layer = attention + 3 * h * 13696 + 2 * h;
    let want = 2 * 151_552 * h + 40 * layer + h;
    assert_eq!(want, 9_399_951_360);
    assert_eq!(spec.param_count(), want);
    let g = import::build_forward(&spec, ir::DType::F32).unwrap();
    assert_eq!(g.param_count(), want);
    assert_eq!(spec.variant.rotary_dims, Some(64));
    assert!(spec.variant.qkv_bias && !spec.variant.o_bias && !spec.variant.sandwich_norms);
    let notes = import::hf::approximations(glm);
    assert!(
        notes.iter().any(|n| n.contains("gate_up_proj")),
        "{notes:?}"
    );
    assert!(notes.iter().any(|n| n.contains("interleaved")), "{notes:?}");
}

/// Helium (transformers' `HeliumForCausalLM`, kyutai/helium-1-preview's HeliumConfig
/// defaults): Llama's block with heads of 128 and interleaved rotary pairs, built in the
/// rotate-half convention and said so; q, k and v biased by attention_bias, o_proj never.
/// Counted module by module: the card's 2B.
#[test]
fn helium_is_llamas_block_with_interleaved_rotary_pairs() {
    let helium = r#"{"model_type":"helium","vocab_size":48000,"hidden_size":2560,
        "intermediate_size":7040,"num_hidden_layers":24,"num_attention_heads":20,
        "num_key_value_heads":20,"max_position_embeddings":4096,"rms_norm_eps":1e-8,
        "tie_word_embeddings":false}"#;
    let spec = import::hf::parse_config(helium, std::path::Path::new("config.json")).unwrap();
    let (h, f, layers, vocab) = (2560u64, 7040u64, 24u64, 48_000u64);
    let want = layers * (4 * h * h + 3 * h * f + 2 * h) + 2 * vocab * h + h;
    assert_eq!(want, 2_172_643_840);
    assert_eq!(spec.param_count(), want);
    assert_eq!(
        (spec.head_dim(), spec.rope_theta, spec.norm_eps),
        (128, 100000.0, 1e-8)
    );
    let notes = import::hf::approximations(helium);
    assert!(
        notes.iter().any(|n| n.contains("Helium's rotary")),
        "{notes:?}"
    );
    let biased = import::hf::parse_config(
        &helium.replace("\"vocab_size\"", "\"attention_bias\":true,\"vocab_size\""),
        std::path::Path::new("config.json"),
    )
    .unwrap();
    assert!(biased.variant.qkv_bias && !biased.variant.o_bias);
}
