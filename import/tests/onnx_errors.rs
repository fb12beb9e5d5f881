//! Malformed and unsupported ONNX inputs give structured errors that name the file (and the
//! node), never a panic.

use std::path::{Path, PathBuf};

use import::onnx::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
    TypeProto, TypeProtoTensor, ValueInfoProto, data_type,
};
use import::{ImportError, import_onnx};
use prost::Message;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/onnx")
        .join(name)
}

/// A fresh scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("plait-onnx-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn assert_names(err: &ImportError, parts: &[&str]) {
    let msg = err.to_string();
    eprintln!("{msg}");
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} should mention {p:?}");
    }
}

fn token_input() -> ValueInfoProto {
    let dim = |p: &str| import::onnx::proto::Dimension {
        dim_param: Some(p.into()),
        ..Default::default()
    };
    ValueInfoProto {
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
    }
}

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, initializers: Vec<TensorProto>, output: &str) -> ModelProto {
    ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(20),
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: Some("hand_built".into()),
            initializer: initializers,
            input: vec![token_input()],
            output: vec![ValueInfoProto {
                name: Some(output.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn write(dir: &Path, m: &ModelProto) -> PathBuf {
    let path = dir.join("model.onnx");
    std::fs::write(&path, m.encode_to_vec()).expect("write model");
    path
}

fn embedding_table() -> TensorProto {
    TensorProto {
        name: Some("emb".into()),
        dims: vec![16, 4],
        data_type: Some(data_type::FLOAT),
        float_data: (0..64).map(|i| i as f32 / 64.0).collect(),
        ..Default::default()
    }
}

#[test]
fn missing_file() {
    let path = scratch("missing").join("nope.onnx");
    let err = import_onnx(&path, 1, 4).unwrap_err();
    assert!(matches!(err, ImportError::FileNotFound { .. }), "{err:?}");
    assert_names(&err, &["nope.onnx", "not found"]);
}

#[test]
fn text_file_is_not_a_model() {
    let path = scratch("text").join("notes.onnx");
    std::fs::write(&path, "not an onnx model\n").unwrap();
    let err = import_onnx(&path, 1, 4).unwrap_err();
    assert!(matches!(err, ImportError::Decode { .. }), "{err:?}");
    assert_names(&err, &["notes.onnx", "not a valid ONNX model"]);
}

#[test]
fn truncated_fixture() {
    let bytes = std::fs::read(fixture("gpt2_tiny").join("model.onnx")).unwrap();
    let path = scratch("truncated").join("half.onnx");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = import_onnx(&path, 2, 8).unwrap_err();
    assert!(matches!(err, ImportError::Decode { .. }), "{err:?}");
    assert_names(&err, &["half.onnx", "truncated"]);
}

#[test]
fn every_truncation_of_a_small_model_fails_cleanly() {
    let m = model(
        vec![node("lookup", "Gather", &["emb", "input_ids"], &["logits"])],
        vec![embedding_table()],
        "logits",
    );
    let bytes = m.encode_to_vec();
    let dir = scratch("every_truncation");
    for cut in 0..bytes.len() {
        let path = dir.join("cut.onnx");
        std::fs::write(&path, &bytes[..cut]).unwrap();
        // Any error is fine; a panic or a success with a broken graph is not.
        if let Ok(imported) = import_onnx(&path, 1, 4) {
            assert!(imported.graph.output("logits").is_some());
        }
    }
    assert!(import_onnx(&write(&dir, &m), 1, 4).is_ok());
}

#[test]
fn no_graph() {
    let dir = scratch("no_graph");
    let m = ModelProto {
        ir_version: Some(10),
        ..Default::default()
    };
    let err = import_onnx(&write(&dir, &m), 1, 4).unwrap_err();
    assert!(matches!(err, ImportError::NoGraph { .. }), "{err:?}");
    assert_names(&err, &["model.onnx", "no graph"]);
}

#[test]
fn unsupported_op_names_file_node_and_op() {
    let dir = scratch("unsupported");
    let m = model(
        vec![
            node("lookup", "Gather", &["emb", "input_ids"], &["h"]),
            node("foo", "NonMaxSuppression", &["h"], &["logits"]),
        ],
        vec![embedding_table()],
        "logits",
    );
    let err = import_onnx(&write(&dir, &m), 1, 4).unwrap_err();
    match &err {
        ImportError::UnsupportedOp { node, op_type, .. } => {
            assert_eq!(
                (node.as_str(), op_type.as_str()),
                ("foo", "NonMaxSuppression")
            );
        }
        other => panic!("expected UnsupportedOp, got {other:?}"),
    }
    assert_names(
        &err,
        &[
            "model.onnx",
            "node 'foo'",
            "'NonMaxSuppression'",
            "supported:",
            "MatMul",
        ],
    );
}

#[test]
fn data_dependent_shape_is_reported() {
    let dir = scratch("data_shape");
    let m = model(
        vec![
            node("lookup", "Gather", &["emb", "input_ids"], &["h"]),
            node(
                "reshape_by_ids",
                "Reshape",
                &["h", "input_ids"],
                &["logits"],
            ),
        ],
        vec![embedding_table()],
        "logits",
    );
    let err = import_onnx(&write(&dir, &m), 1, 4).unwrap_err();
    assert!(matches!(err, ImportError::NotConstant { .. }), "{err:?}");
    assert_names(
        &err,
        &[
            "model.onnx",
            "reshape_by_ids",
            "Reshape",
            "input_ids",
            "constant",
        ],
    );
}

#[test]
fn undefined_value_is_reported() {
    let dir = scratch("undefined");
    let m = model(
        vec![node("lookup", "Gather", &["emb", "ghost"], &["logits"])],
        vec![embedding_table()],
        "logits",
    );
    let err = import_onnx(&write(&dir, &m), 1, 4).unwrap_err();
    assert!(matches!(err, ImportError::UndefinedValue { .. }), "{err:?}");
    assert_names(&err, &["model.onnx", "lookup", "ghost"]);
}

/// Copies the Llama fixture (external weights) into a scratch directory.
fn llama_copy(test: &str) -> PathBuf {
    let dir = scratch(test);
    for f in ["model.onnx", "model.onnx.data"] {
        std::fs::copy(fixture("llama_gqa_tiny").join(f), dir.join(f)).expect("copy fixture");
    }
    dir
}

#[test]
fn missing_external_data() {
    let dir = llama_copy("missing_data");
    std::fs::remove_file(dir.join("model.onnx.data")).unwrap();
    let err = import_onnx(&dir.join("model.onnx"), 2, 8).unwrap_err();
    assert!(matches!(err, ImportError::ExternalData { .. }), "{err:?}");
    assert_names(&err, &["model.onnx:", "model.onnx.data", "does not exist"]);
}

#[test]
fn short_external_data() {
    let dir = llama_copy("short_data");
    let data = std::fs::read(dir.join("model.onnx.data")).unwrap();
    std::fs::write(dir.join("model.onnx.data"), &data[..data.len() - 100]).unwrap();
    let err = import_onnx(&dir.join("model.onnx"), 2, 8).unwrap_err();
    assert!(matches!(err, ImportError::ExternalData { .. }), "{err:?}");
    assert_names(&err, &["model.onnx:", "model.onnx.data", "too short"]);
}

#[test]
fn zero_batch_is_rejected() {
    let err = import_onnx(&fixture("gpt2_tiny").join("model.onnx"), 0, 8).unwrap_err();
    assert!(matches!(err, ImportError::BadBinding { .. }), "{err:?}");
}

/// Corrupting bytes of a real model must give an error or a graph, never a panic.
#[test]
fn corrupted_fixture_never_panics() {
    // Llama keeps its weights outside model.onnx, so most corrupted bytes hit graph structure.
    let dir = llama_copy("corrupted");
    let path = dir.join("model.onnx");
    let bytes = std::fs::read(&path).expect("fixture");
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64: deterministic, no dependency.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..4 {
            let i = (next() % b.len() as u64) as usize;
            b[i] = (next() & 0xff) as u8;
        }
        std::fs::write(&path, &b).unwrap();
        let _ = import_onnx(&path, 1, 4);
    }
}
