//! Every kind of bad input exits with code 2 and one clear message, never a panic.

use std::path::PathBuf;
use std::process::Command;

fn plait(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_plait"))
        .args(args)
        .output()
        .expect("plait runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "plait panicked: {stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

/// Writes `contents` to a fresh file named `name` in a per-test directory.
fn file(test: &str, name: &str, contents: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("plait-bad-input-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, contents).expect("write");
    p
}

fn expect_error(args: &[&str], fragments: &[&str]) {
    let (code, stderr) = plait(args);
    assert_eq!(code, 2, "exit code for {args:?}: {stderr}");
    for f in fragments {
        assert!(
            stderr.contains(f),
            "message for {args:?} lacks `{f}`: {stderr}"
        );
    }
    assert_eq!(stderr.trim().lines().count(), 1, "one message: {stderr}");
}

#[test]
fn missing_file() {
    expect_error(
        &["inspect", "/nonexistent/plait/config.json"],
        &["cannot read /nonexistent/plait/config.json"],
    );
}

#[test]
fn unknown_model_name() {
    expect_error(
        &["inspect", "gpt5-turbo"],
        &[
            "`gpt5-turbo` is neither a file nor a zoo model",
            "llama3-8b",
        ],
    );
}

#[test]
fn malformed_json() {
    let p = file(
        "malformed",
        "config.json",
        br#"{"model_type": "gpt2", "n_layer": "#,
    );
    let ps = p.to_string_lossy().to_string();
    expect_error(&["inspect", &ps], &[&ps, "not valid JSON at line 1"]);
}

#[test]
fn missing_required_field() {
    let p = file("missing", "config.json", br#"{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "vocab_size": 100, "n_positions": 32}"#);
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps],
        &[&ps, "required field `n_head` is missing"],
    );
}

#[test]
fn field_with_wrong_type() {
    let p = file("wrongtype", "config.json", br#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": "four", "vocab_size": 100}"#);
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps],
        &[
            &ps,
            "field `num_attention_heads` must be a positive integer, got \"four\"",
        ],
    );
}

#[test]
fn unsupported_model_type() {
    let p = file(
        "modeltype",
        "config.json",
        br#"{"model_type": "bert", "hidden_size": 64}"#,
    );
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps],
        &[
            &ps,
            "model_type \"bert\" is not supported (plait does not build encoders",
            "gpt2, llama, mistral, mistral3, mixtral",
        ],
    );
    // A family people train says what plait lacks for it; an unknown one only lists.
    for (model_type, said) in [
        (
            "qwen3_next",
            "\"qwen3_next\" is not supported (plait does not build Qwen3-Next's and Qwen3.5's \
             Gated DeltaNet",
        ),
        (
            "gemma4_text",
            "(plait does not build Gemma 4's per-layer embeddings",
        ),
        (
            "hunyuan_v1_moe",
            "(plait does not build Hunyuan-A13B's experts of fixed capacity",
        ),
        (
            "wibble",
            "\"wibble\" is not supported; supported model types: gpt2",
        ),
    ] {
        let json = format!(r#"{{"model_type": "{model_type}"}}"#);
        let p = file(model_type, "config.json", json.as_bytes());
        let ps = p.to_string_lossy().to_string();
        expect_error(&["inspect", &ps], &[&ps, said]);
    }
}

#[test]
fn heads_not_dividing_hidden() {
    let p = file("heads", "config.json", br#"{"model_type": "gpt2", "n_layer": 2, "n_embd": 70, "n_head": 4, "vocab_size": 100, "n_positions": 32}"#);
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps],
        &[&ps, "n_head = 4 does not divide n_embd = 70"],
    );
}

#[test]
fn kv_heads_not_dividing_heads() {
    let p = file("kvheads", "config.json", br#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3, "vocab_size": 100}"#);
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps],
        &[
            &ps,
            "num_key_value_heads = 3 does not divide num_attention_heads = 4",
        ],
    );
}

#[test]
fn top_level_not_an_object() {
    let p = file("array", "config.json", b"[1, 2, 3]");
    let ps = p.to_string_lossy().to_string();
    expect_error(&["inspect", &ps], &[&ps, "expected a JSON object"]);
}

#[test]
fn zero_batch_is_a_usage_error() {
    let (code, stderr) = plait(&["inspect", "gpt2", "--batch", "0"]);
    assert_eq!(code, 2, "{stderr}");
}

// ONNX inputs.

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/onnx")
        .join(name)
}

#[test]
fn onnx_missing_file() {
    expect_error(
        &["inspect", "/nonexistent/plait/model.onnx"],
        &["/nonexistent/plait/model.onnx", "file not found"],
    );
}

#[test]
fn onnx_truncated_fixture() {
    let bytes = std::fs::read(fixture("gpt2_tiny").join("model.onnx")).expect("fixture");
    let p = file("onnx-truncated", "half.onnx", &bytes[..bytes.len() / 2]);
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps, "--batch", "2", "--seq", "8"],
        &[&ps, "not a valid ONNX model", "truncated"],
    );
}

#[test]
fn onnx_file_that_is_not_onnx() {
    let p = file("onnx-text", "x.onnx", b"{\"model_type\": \"gpt2\"}\n");
    let ps = p.to_string_lossy().to_string();
    expect_error(&["inspect", &ps], &[&ps, "not a valid ONNX model"]);
    // The decoder's reason is quoted once, not again as the error's source.
    let (_, stderr) = plait(&["inspect", &ps]);
    assert_eq!(stderr.matches("failed to decode").count(), 1, "{stderr}");
}

/// A one-node model whose second node is an op plait has no lowering for, written with the
/// importer's own protobuf structs.
#[test]
fn onnx_unsupported_op() {
    use import::onnx::proto::{
        Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
        TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto, data_type,
    };
    use prost::Message;
    let dim = |p: &str| Dimension {
        dim_param: Some(p.into()),
        ..Default::default()
    };
    let node = |name: &str, op: &str, inputs: &[&str], output: &str| NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let m = ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(20),
        }],
        graph: Some(GraphProto {
            name: Some("unsupported".into()),
            node: vec![
                node("lookup", "Gather", &["emb", "input_ids"], "h"),
                node("nms", "NonMaxSuppression", &["h"], "logits"),
            ],
            initializer: vec![TensorProto {
                name: Some("emb".into()),
                dims: vec![16, 4],
                data_type: Some(data_type::FLOAT),
                float_data: vec![0.5; 64],
                ..Default::default()
            }],
            input: vec![ValueInfoProto {
                name: Some("input_ids".into()),
                r#type: Some(TypeProto {
                    tensor_type: Some(TypeProtoTensor {
                        elem_type: Some(data_type::INT64),
                        shape: Some(TensorShapeProto {
                            dim: vec![dim("batch"), dim("seq")],
                        }),
                    }),
                    denotation: None,
                }),
                doc_string: None,
            }],
            output: vec![ValueInfoProto {
                name: Some("logits".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = file("onnx-unsupported", "model.onnx", &m.encode_to_vec());
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps, "--seq", "4"],
        &[
            &ps,
            "node 'nms'",
            "op type 'NonMaxSuppression'",
            "plait cannot import",
        ],
    );
}

#[test]
fn onnx_missing_external_data() {
    // The Llama fixture keeps its weights in model.onnx.data; copy only the model.
    let bytes = std::fs::read(fixture("llama_gqa_tiny").join("model.onnx")).expect("fixture");
    let p = file("onnx-no-data", "model.onnx", &bytes);
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps, "--batch", "2", "--seq", "8"],
        &[&ps, "model.onnx.data", "does not exist"],
    );
}

#[test]
fn onnx_seq_longer_than_positions() {
    let p = fixture("gpt2_tiny").join("model.onnx");
    let ps = p.to_string_lossy().to_string();
    expect_error(
        &["inspect", &ps, "--seq", "100"],
        &[
            &ps,
            "sequence length 100 exceeds the 64 positions",
            "at most 64",
        ],
    );
}

/// A config claiming 2^31 layers is refused at once, naming the field and the limit, instead of
/// building a graph of tens of GB.
#[test]
fn absurd_layer_count() {
    let p = file("layers", "config.json", br#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2147483648, "num_attention_heads": 4, "vocab_size": 100}"#);
    let ps = p.to_string_lossy().to_string();
    let t = std::time::Instant::now();
    expect_error(
        &["inspect", &ps],
        &[&ps, "num_hidden_layers = 2147483648", "at most 10000"],
    );
    assert!(t.elapsed().as_secs_f64() < 5.0, "took {:?}", t.elapsed());
}

/// A config whose sizes make weights of 2^80 elements (a `hidden_size` of 2^40) is refused
/// when read, naming the count and the fields, by `inspect` and `compile` alike: its
/// parameter count
/// wrapped around 2^64 (a release build printed 1.07e15 parameters, a debug build panicked)
/// and the search for a GPU count that fits ran for minutes.
#[test]
fn sizes_beyond_64_bit_counts_are_refused_at_once() {
    let p = file("huge", "config.json", br#"{"model_type": "llama", "hidden_size": 1099511627776, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}"#);
    let ps = p.to_string_lossy().to_string();
    let t = std::time::Instant::now();
    let want = [ps.as_str(), "9.671e24 parameters", "2^50", "hidden_size"];
    expect_error(&["inspect", &ps], &want);
    expect_error(
        &[
            "compile",
            &ps,
            "--cluster",
            "dgx-h100",
            "--gpus",
            "8",
            "--global-batch",
            "16",
        ],
        &want,
    );
    assert!(t.elapsed().as_secs_f64() < 5.0, "took {:?}", t.elapsed());
}

/// `--gpus 0` names the rule, not clap's range of a u64.
#[test]
fn zero_gpus() {
    let (code, err) = plait(&[
        "compile",
        "gpt2",
        "--cluster",
        "cpu",
        "--gpus",
        "0",
        "--global-batch",
        "8",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--gpus") && err.contains("must be at least 1"),
        "{err}"
    );
    assert!(!err.contains("18446744073709551615"), "{err}");
}

/// A pin no strategy can satisfy names the rule it breaks and the flags involved.
#[test]
fn impossible_pins_name_the_rule() {
    for (pins, want) in [
        (&["--tp", "3"][..], "--tp 3 does not divide --gpus 8"),
        (
            &["--tp", "8", "--pp", "1"][..],
            "--tp 8 does not divide the model's 12 attention heads",
        ),
        (
            &["--dp", "8", "--micro-batch", "1", "--global-batch", "100"][..],
            "--global-batch 100 is not divisible by dp 8",
        ),
        (&["--pp", "13"][..], "--pp 13 exceeds the model's 12 layers"),
        (&["--dp", "3"][..], "--dp 3 does not divide --gpus 8"),
        (
            &[
                "--dp-sync",
                "local-sgd:8",
                "--grad-compression",
                "int8",
                "--zero",
                "0",
            ][..],
            "local SGD exchanges no gradients to compress",
        ),
        (
            &["--pp", "2", "--stage-layers", "5,5"][..],
            "--stage-layers [5, 5] must be positive and sum to the model's 12 layers",
        ),
        (
            &["--micro-batch", "3"][..],
            "--global-batch 64 is not divisible by --micro-batch 3",
        ),
        // Pins that hold alone but not together are named together.
        (
            &["--schedule", "interleaved", "--pp", "1"][..],
            "no strategy satisfies --pp 1 and --schedule interleaved together",
        ),
        (
            &["--pp", "2", "--virtual-stages", "7"][..],
            "no strategy satisfies --virtual-stages 7 with the other pins",
        ),
        // A pin the target engine cannot run is named with the engine's reason.
        (
            &["--target", "deepspeed", "--tp", "2"][..],
            "--target deepspeed: no strategy with --tp 2 is one it runs (DeepSpeed's \
             configuration has no Megatron tensor parallelism)",
        ),
        // Megatron-LM states no even default split of 12 layers into 2 x 5 chunks.
        (
            &["--target", "megatron", "--pp", "2", "--virtual-stages", "5"][..],
            "--target megatron: no strategy with --virtual-stages 5 is one it runs \
             (Megatron-LM gives every interleaved chunk the same layers: 12 layers do not \
             split into pp x virtual stages = 10 chunks)",
        ),
        // Context parallelism that splits neither the GPUs nor the sequence, and a precision
        // the GPU has no peak for, are named (every candidate failed, and the search called
        // the model out of memory "by 0.0 GiB").
        (&["--cp", "3"][..], "--cp 3 does not divide --gpus 8"),
        (
            &["--cp", "4", "--seq", "1020"][..],
            "--cp 4 needs the sequence (1020 tokens) divisible by 2 x cp = 8",
        ),
        (
            &["--precision", "fp8"][..],
            "--precision fp8: the A100-SXM4-80GB has no fp8 support",
        ),
        (
            &["--target", "megatron", "--grad-compression", "int8"][..],
            "--target megatron: no strategy with --grad-compression int8 is one it runs",
        ),
        (
            &["--target", "deepspeed", "--pp", "2", "--zero", "3"][..],
            "no strategy with --pp 2 and --zero 3 is one it runs (DeepSpeed's pipeline engine \
             runs ZeRO-0 or ZeRO-1, not ZeRO-3)",
        ),
    ] {
        let mut args = vec![
            "compile",
            "gpt2",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "8",
        ];
        if !pins.contains(&"--global-batch") {
            args.extend(["--global-batch", "64"]);
        }
        args.extend(pins);
        expect_error(&args, &[want]);
    }
}

/// Out of memory, the advice is the smallest GPU count that does fit (a search, not the model
/// states' bound): Mixtral 8x7B does not fit on 8 H100 and the advice is 16, on which it fits.
#[test]
fn out_of_memory_advises_a_count_that_fits() {
    let args = [
        "compile",
        "mixtral-8x7b",
        "--cluster",
        "dgx-h100",
        "--global-batch",
        "64",
        "--gpus",
    ];
    let (code, err) = plait(&[&args[..], &["8"]].concat());
    assert_eq!(code, 2, "{err}");
    let advised = err
        .split("use ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no GPU count advised: {err}"));
    assert!(advised > 8, "{err}");
    let n = advised.to_string();
    let fits = Command::new(env!("CARGO_BIN_EXE_plait"))
        .args([&args[..], &[n.as_str()]].concat())
        .output()
        .expect("plait runs");
    assert!(
        fits.status.success(),
        "{advised} GPUs do not fit: {}",
        String::from_utf8_lossy(&fits.stderr)
    );
}
