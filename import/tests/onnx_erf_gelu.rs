//! The exact GELU, `0.5 · x · (1 + erf(x / √2))`, written out in ONNX primitives (Erf has no IR
//! counterpart) imports as one `gelu` op in both common arrangements.

use std::collections::BTreeMap;
use std::path::PathBuf;

use import::import_onnx;
use import::onnx::proto::{
    Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto, data_type,
};
use ir::{Binding, Tensor};
use prost::Message;

fn scalar(name: &str, x: f32) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(data_type::FLOAT),
        float_data: vec![x],
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        name: Some(format!("{op}_{output}")),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

fn model(gelu: Vec<NodeProto>) -> ModelProto {
    let dim = |p: &str| Dimension {
        dim_param: Some(p.into()),
        ..Default::default()
    };
    let table = TensorProto {
        name: Some("emb".into()),
        dims: vec![16, 4],
        data_type: Some(data_type::FLOAT),
        float_data: (0..64).map(|i| (i as f32 - 32.0) / 10.0).collect(),
        ..Default::default()
    };
    let mut nodes = vec![node("Gather", &["emb", "input_ids"], "h")];
    nodes.extend(gelu);
    ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(20),
        }],
        graph: Some(GraphProto {
            node: nodes,
            initializer: vec![
                table,
                scalar("sqrt2", std::f32::consts::SQRT_2),
                scalar("inv_sqrt2", std::f32::consts::FRAC_1_SQRT_2),
                scalar("one", 1.0),
                scalar("half", 0.5),
            ],
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
    }
}

/// erf by its Maclaurin series (|x| < 3.3 here, where 60 terms are plenty).
fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..60 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * std::f64::consts::FRAC_2_SQRT_PI
}

fn check(test: &str, gelu: Vec<NodeProto>) {
    let dir = std::env::temp_dir().join(format!("plait-onnx-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path: PathBuf = dir.join("model.onnx");
    std::fs::write(&path, model(gelu).encode_to_vec()).expect("write model");
    let imported = import_onnx(&path, 1, 16).expect("erf-GELU model imports");
    let h: BTreeMap<String, usize> = imported.graph.histogram().into_iter().collect();
    assert_eq!(
        h,
        // The importer attaches the next-token loss to every `[batch, seq, vocab]` output.
        BTreeMap::from([
            ("cross_entropy".into(), 1),
            ("embedding".into(), 1),
            ("gelu".into(), 1)
        ])
    );
    let ids = Tensor::new(vec![1, 16], (0..16).map(f64::from).collect());
    // The importer attaches a next-token loss; only the logits are checked here.
    let targets = Tensor::new(vec![1, 16], vec![0.0; 16]);
    let inputs = BTreeMap::from([
        ("input_ids".to_string(), ids),
        ("targets".to_string(), targets),
    ]);
    let env = ir::interp::Env {
        weights: &imported.weights,
        inputs: &inputs,
        binding: Binding { batch: 1, seq: 16 },
    };
    let eval = ir::interp::evaluate(&imported.graph, &env).expect("interpreter runs");
    let got = eval.output("logits").expect("logits");
    for (i, &y) in got.data.iter().enumerate() {
        let x = f64::from((i as f32 - 32.0) / 10.0);
        let want = 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2));
        assert!((y - want).abs() < 1e-6, "gelu({x}) = {y}, want {want}");
    }
}

#[test]
fn div_sqrt2_then_half_at_the_end() {
    check(
        "erf_gelu_div",
        vec![
            node("Div", &["h", "sqrt2"], "u"),
            node("Erf", &["u"], "e"),
            node("Add", &["e", "one"], "a"),
            node("Mul", &["h", "a"], "m"),
            node("Mul", &["m", "half"], "logits"),
        ],
    );
}

#[test]
fn mul_inv_sqrt2_with_half_first() {
    check(
        "erf_gelu_mul",
        vec![
            node("Mul", &["h", "half"], "hh"),
            node("Mul", &["h", "inv_sqrt2"], "u"),
            node("Erf", &["u"], "e"),
            node("Add", &["one", "e"], "a"),
            node("Mul", &["hh", "a"], "logits"),
        ],
    );
}

#[test]
fn erf_alone_on_data_is_an_error_naming_the_node() {
    let dir = std::env::temp_dir().join(format!("plait-onnx-{}-erf_alone", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.onnx");
    let m = model(vec![node("Erf", &["h"], "logits")]);
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let err = import_onnx(&path, 1, 4).unwrap_err().to_string();
    assert!(
        err.contains("model.onnx") && err.contains("Erf_logits"),
        "{err}"
    );
}
