//! Layers without rotary embeddings (NoPE) as transformers builds them: SmolLM3's
//! `no_rope_layers` and Cohere2's global-attention layers, read from published configs and
//! from each family's defaults, counted module by module against the published sizes.

use std::path::Path;

use import::{build_forward, hf};
use ir::{DType, OpKind, RopeScaling};

fn spec(json: &str) -> import::ModelSpec {
    hf::parse_config(json, Path::new("config.json")).expect("config parses")
}

fn fixture(name: &str) -> (String, import::ModelSpec) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/hf")
        .join(name)
        .join("config.json");
    let text = std::fs::read_to_string(&path).expect("fixture");
    let spec = hf::parse_config(&text, &path).expect("fixture parses");
    (text, spec)
}

/// Per layer, in order: whether its rotaries turn nothing, and its attention window.
fn layers(spec: &import::ModelSpec) -> Vec<(bool, Option<u64>)> {
    let g = build_forward(spec, DType::F32).expect("graph builds");
    g.ops_by_layer()
        .iter()
        .map(|ops| {
            let rotaries: Vec<RopeScaling> = ops
                .iter()
                .filter_map(|&o| match g.op(o).kind {
                    OpKind::Rotary { scaling, .. } => Some(scaling),
                    _ => None,
                })
                .collect();
            assert_eq!(rotaries.len(), 2, "q and k");
            assert_eq!(rotaries[0], rotaries[1], "q and k turn alike");
            let window = ops.iter().find_map(|&o| match g.op(o).kind {
                OpKind::Attention { window, .. } => Some(window),
                _ => None,
            });
            (rotaries[0].is_nope(), window.flatten())
        })
        .collect()
}

fn nope_of(layers: &[(bool, Option<u64>)]) -> Vec<bool> {
    layers.iter().map(|l| l.0).collect()
}

/// Each op's kind with per-layer attributes (window, rotary scaling) cleared.
fn neutral_kinds(spec: &import::ModelSpec) -> Vec<String> {
    let g = build_forward(spec, DType::F32).expect("graph builds");
    g.op_ids()
        .map(|o| match g.op(o).kind.clone().with_window(None) {
            OpKind::Rotary { heads, theta, .. } => format!("rotary {heads} {theta}"),
            k => format!("{k:?}"),
        })
        .collect()
}

/// SmolLM3-3B's published config (`fixtures/hf/smollm3-3b`): Llama's block, op for op, with
/// every fourth layer unrotated; 3,075,098,624 parameters counted here module by module (its
/// card: 3.08B), tied.
#[test]
fn smollm3_leaves_every_fourth_layer_unrotated() {
    let (text, smollm3) = fixture("smollm3-3b");
    let (h, ffn, layers_n, vocab, kv) = (2048u64, 11008u64, 36u64, 128256u64, 512u64);
    // q and o, k and v, the SwiGLU MLP, two norms; the tied embedding; the final norm.
    let modules = vocab * h + layers_n * (2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h) + h;
    assert_eq!(modules, 3_075_098_624);
    let g = build_forward(&smollm3, DType::F32).expect("builds");
    assert_eq!(g.param_count(), modules);
    let every_fourth: Vec<bool> = (0..36).map(|i| i % 4 == 3).collect();
    assert_eq!(nope_of(&layers(&smollm3)), every_fourth);
    assert_eq!(smollm3.nope_layers(), 9);
    assert!(hf::approximations(&text).is_empty());
    // The same numbers as a Llama: the same ops but for the rotaries' per-layer scaling.
    let llama = text.replace("\"smollm3\"", "\"llama\"");
    let llama = hf::parse_config(&llama, Path::new("config.json")).expect("llama");
    assert_eq!(neutral_kinds(&smollm3), neutral_kinds(&llama));
    assert!(layers(&llama).iter().all(|l| !l.0));
}

const TINY: &str = r#""hidden_size":64,"intermediate_size":128,"num_hidden_layers":8,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100"#;

fn tiny(model_type: &str, extra: &str) -> import::ModelSpec {
    spec(&format!(r#"{{"model_type":"{model_type}",{TINY}{extra}}}"#))
}

/// SmolLM3Config's defaults and fields: absent `no_rope_layers`, one layer in
/// `no_rope_layer_interval` (default 4) is NoPE; a list says 1 (rotates) or 0 per layer; a
/// window, where `use_sliding_window` turns it on, falls on the NoPE layers (the config's
/// default `layer_types`); wrong lists are refused naming the field.
#[test]
fn smollm3_reads_no_rope_layers_and_its_interval() {
    let at = |layers: &[usize]| (0..8).map(|i| layers.contains(&i)).collect::<Vec<bool>>();
    assert_eq!(nope_of(&layers(&tiny("smollm3", ""))), at(&[3, 7]));
    let every_second = tiny("smollm3", r#","no_rope_layer_interval":2"#);
    assert_eq!(nope_of(&layers(&every_second)), at(&[1, 3, 5, 7]));
    let listed = tiny(
        "smollm3",
        r#","no_rope_layer_interval":2,"no_rope_layers":[0,1,1,1,1,1,1,0,1]"#,
    );
    assert_eq!(nope_of(&layers(&listed)), at(&[0, 7]));
    // Every layer rotating: no NoPE at all.
    let none = tiny("smollm3", r#","no_rope_layers":[1,1,1,1,1,1,1,1]"#);
    assert!(none.variant.nope.is_none());
    let windowed = tiny(
        "smollm3",
        r#","use_sliding_window":true,"sliding_window":16"#,
    );
    let want: Vec<(bool, Option<u64>)> = (0..8)
        .map(|i| (i % 4 == 3, (i % 4 == 3).then_some(16)))
        .collect();
    assert_eq!(layers(&windowed), want);
    let off = tiny("smollm3", r#","sliding_window":16"#);
    assert!(layers(&off).iter().all(|l| l.1.is_none()));
    for (extra, says) in [
        (
            r#","no_rope_layers":[1,1,1]"#,
            "no_rope_layers has 3 entries",
        ),
        (r#","no_rope_layers":[1,1,1,2,1,1,1,1]"#, "no_rope_layers"),
        (r#","no_rope_layers":"1,1""#, "no_rope_layers"),
        (r#","no_rope_layer_interval":0"#, "no_rope_layer_interval"),
    ] {
        let text = format!(r#"{{"model_type":"smollm3",{TINY}{extra}}}"#);
        let err = hf::parse_config(&text, Path::new("config.json"))
            .expect_err(extra)
            .to_string();
        assert!(err.contains(says), "{extra}: {err}");
    }
}

/// Command R7B's published config (`fixtures/hf/command-r7b`, `model_type` cohere2): Cohere's
/// block (attention and the MLP off one bias-free LayerNorm, tied, logits scaled), three of
/// four layers in a 4096-key window and rotated, the fourth global and unrotated; its heads
/// hidden / heads wide (Cohere2Config overrides `head_dim`); 8,028,033,024 parameters counted
/// here module by module (its card: 8.03B).
#[test]
fn cohere2_rotates_only_its_windowed_layers() {
    let (text, r7b) = fixture("command-r7b");
    let (h, ffn, layers_n, vocab, kv) = (4096u64, 14336u64, 32u64, 256000u64, 1024u64);
    // q and o, k and v, the SwiGLU MLP, one norm's weight; the tied embedding; the final norm.
    let modules = vocab * h + layers_n * (2 * h * h + 2 * h * kv + 3 * h * ffn + h) + h;
    assert_eq!(modules, 8_028_033_024);
    let g = build_forward(&r7b, DType::F32).expect("builds");
    assert_eq!(g.param_count(), modules);
    let want: Vec<(bool, Option<u64>)> = (0..32)
        .map(|i| (i % 4 == 3, (i % 4 != 3).then_some(4096)))
        .collect();
    assert_eq!(layers(&r7b), want);
    assert!(
        g.op_ids()
            .any(|o| matches!(g.op(o).kind, OpKind::Scale { factor } if factor == 0.25))
    );
    let notes = hf::approximations(&text);
    assert!(notes.iter().any(|n| n.contains("interleaved")), "{notes:?}");
    // Cohere's block op for op, but for the windows and the rotaries' scaling.
    let cohere = text.replace("\"cohere2\"", "\"cohere\"");
    let cohere = hf::parse_config(&cohere, Path::new("config.json")).expect("cohere");
    assert_eq!(neutral_kinds(&r7b), neutral_kinds(&cohere));
}

/// Cohere2Config's defaults: a 4096-key window on three of four layers
/// (`sliding_window_pattern` 4), the others NoPE; its pattern and `layer_types` move both;
/// with `sliding_window` null no layer has a window, and none rotates.
#[test]
fn cohere2_windows_and_rotations_follow_its_pattern() {
    let pattern = |n: usize, window: u64| -> Vec<(bool, Option<u64>)> {
        (0..8)
            .map(|i| {
                let sliding = (i + 1) % n != 0;
                (!sliding, sliding.then_some(window))
            })
            .collect()
    };
    assert_eq!(layers(&tiny("cohere2", "")), pattern(4, 4096));
    let halves = tiny(
        "cohere2",
        r#","sliding_window":8,"sliding_window_pattern":2"#,
    );
    assert_eq!(layers(&halves), pattern(2, 8));
    let (sw, full) = ("\"sliding_attention\"", "\"full_attention\"");
    let listed = tiny(
        "cohere2",
        &format!(r#","layer_types":[{full},{sw},{sw},{sw},{sw},{sw},{sw},{full}]"#),
    );
    let want: Vec<(bool, Option<u64>)> = (0..8)
        .map(|i| {
            let global = i == 0 || i == 7;
            (global, (!global).then_some(4096))
        })
        .collect();
    assert_eq!(layers(&listed), want);
    let unwindowed = tiny("cohere2", r#","sliding_window":null"#);
    assert_eq!(layers(&unwindowed), vec![(true, None); 8]);
}

/// EXAONE 4.0-32B's shape (`model_type` exaone4): OLMo 2's norms after attention and the MLP,
/// per-head q/k norms, three of four layers in a 4096-key window and rotated (llama3-scaled),
/// the fourth global and unrotated; 30,954,640,384 parameters without the embeddings counted
/// here module by module (its card: 30.95B without embeddings), untied. EXAONE 4.0-1.2B has no
/// window: every layer rotates (its card: 1.07B without embeddings, tied).
#[test]
fn exaone4_leaves_its_global_layers_unrotated() {
    let (sw, full) = ("\"sliding_attention\"", "\"full_attention\"");
    let types = |layers: usize, every: Option<usize>| {
        let kinds: Vec<&str> = (0..layers)
            .map(|i| match every {
                Some(n) if (i + 1) % n != 0 => sw,
                _ => full,
            })
            .collect();
        format!("[{}]", kinds.join(","))
    };
    let large = format!(
        r#"{{"model_type":"exaone4","hidden_size":5120,"intermediate_size":27392,
        "num_hidden_layers":64,"num_attention_heads":40,"num_key_value_heads":8,"head_dim":128,
        "vocab_size":102400,"max_position_embeddings":131072,"rms_norm_eps":1e-05,
        "rope_theta":1000000,"rope_scaling":{{"rope_type":"llama3","factor":16.0,
        "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}},
        "sliding_window":4096,"sliding_window_pattern":"LLLG","layer_types":{},
        "tie_word_embeddings":false}}"#,
        types(64, Some(4))
    );
    let (h, ffn, q, kv, d) = (5120u64, 27392u64, 5120u64, 1024u64, 128u64);
    // q and o, k and v, the SwiGLU MLP, the norms after attention and the MLP, q/k norms.
    let layer = 2 * h * q + 2 * h * kv + 3 * h * ffn + 2 * h + 2 * d;
    let body = 64 * layer + h;
    assert_eq!(body, 30_954_640_384);
    let exaone = spec(&large);
    let g = build_forward(&exaone, DType::F32).expect("builds");
    assert_eq!(g.param_count(), body + 2 * 102400 * h);
    let want: Vec<(bool, Option<u64>)> = (0..64)
        .map(|i| (i % 4 == 3, (i % 4 != 3).then_some(4096)))
        .collect();
    assert_eq!(layers(&exaone), want);
    // Without the layer types, the pattern string says the same; as an integer too.
    let spelled = large.replace(&types(64, Some(4)), "null");
    assert_eq!(layers(&spec(&spelled)), want);
    let numbered = spelled.replace("\"LLLG\"", "4");
    assert_eq!(layers(&spec(&numbered)), want);
    let small = format!(
        r#"{{"model_type":"exaone4","hidden_size":2048,"intermediate_size":4096,
        "num_hidden_layers":30,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,
        "vocab_size":102400,"rms_norm_eps":1e-05,"rope_theta":1000000,"sliding_window":null,
        "layer_types":{},"tie_word_embeddings":true}}"#,
        types(30, None)
    );
    let (h, ffn, q, kv, d) = (2048u64, 4096u64, 2048u64, 512u64, 64u64);
    let body = 30 * (2 * h * q + 2 * h * kv + 3 * h * ffn + 2 * h + 2 * d) + h;
    assert_eq!(body, 1_069_676_288);
    let small = spec(&small);
    assert_eq!(graph_params(&small), body + 102400 * h);
    assert_eq!(layers(&small), vec![(false, None); 30]);
    for bad in ["\"LLXG\"", "\"\""] {
        let text = spelled.replace("\"LLLG\"", bad);
        let err = hf::parse_config(&text, Path::new("config.json"))
            .expect_err(bad)
            .to_string();
        assert!(err.contains("sliding_window_pattern"), "{bad}: {err}");
    }
}

fn graph_params(spec: &import::ModelSpec) -> u64 {
    build_forward(spec, DType::F32)
        .expect("builds")
        .param_count()
}
