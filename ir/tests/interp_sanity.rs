//! The interpreter against hand-computed values for a few ops.

use std::collections::BTreeMap;

use ir::interp::{Env, evaluate};
use ir::{Binding, DType, Graph, OpKind, Shape, Tensor, TensorType, Weights};

const BIND: Binding = Binding { batch: 1, seq: 1 };

/// Evaluates `kind` on parameter operands with the given values; returns its first result.
fn run(kind: OpKind, operands: &[(&[usize], &[f64])]) -> Tensor {
    let mut g = Graph::new("t");
    let mut weights = Weights::new();
    let mut ins = Vec::new();
    for (i, (shape, data)) in operands.iter().enumerate() {
        let name = format!("x{i}");
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        ins.push(g.push_source(
            OpKind::Param { name: name.clone() },
            TensorType::new(DType::F32, Shape::fixed(&dims)),
            None,
        ));
        weights.insert(name, Tensor::new(shape.to_vec(), data.to_vec()));
    }
    let out = g.push_op(kind, ins, None).expect("well-typed op");
    let inputs = BTreeMap::new();
    let env = Env {
        weights: &weights,
        inputs: &inputs,
        binding: BIND,
    };
    evaluate(&g, &env).expect("evaluates").value(out[0]).clone()
}

fn close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
    }
}

fn sm2(a: f64, b: f64) -> [f64; 2] {
    let (ea, eb) = (a.exp(), b.exp());
    [ea / (ea + eb), eb / (ea + eb)]
}

#[test]
fn causal_softmax_masks_future_keys() {
    let y = run(
        OpKind::Softmax { causal: true },
        &[(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0])],
    );
    let r1 = sm2(3.0, 4.0);
    close(&y.data, &[1.0, 0.0, r1[0], r1[1]]);
    let y = run(OpKind::Softmax { causal: false }, &[(&[2], &[1.0, 2.0])]);
    close(&y.data, &sm2(1.0, 2.0));
}

#[test]
fn causal_softmax_aligns_queries_with_the_last_keys() {
    // One query over three keys sees all of them (as when decoding with a cache).
    let y = run(
        OpKind::Softmax { causal: true },
        &[(&[1, 3], &[0.0, 0.0, 0.0])],
    );
    close(&y.data, &[1.0 / 3.0; 3]);
}

#[test]
fn attention_one_head_by_hand() {
    let q: &[f64] = &[1.0, 2.0];
    let k: &[f64] = &[0.0, 1.0];
    let v: &[f64] = &[10.0, 20.0];
    let attn = |causal| OpKind::Attention {
        heads: 1,
        kv_heads: 1,
        scale: 0.5,
        causal,
        softcap: None,
        sinks: false,
        window: None,
        chunk: None,
    };
    let y = run(
        attn(false),
        &[(&[1, 2, 1], q), (&[1, 2, 1], k), (&[1, 2, 1], v)],
    );
    let (p0, p1) = (sm2(0.0, 0.5), sm2(0.0, 1.0));
    close(
        &y.data,
        &[10.0 * p0[0] + 20.0 * p0[1], 10.0 * p1[0] + 20.0 * p1[1]],
    );
    let y = run(
        attn(true),
        &[(&[1, 2, 1], q), (&[1, 2, 1], k), (&[1, 2, 1], v)],
    );
    close(&y.data, &[10.0, 10.0 * p1[0] + 20.0 * p1[1]]);
}

#[test]
fn grouped_query_heads_share_kv_heads() {
    // Two query heads of width 1 over one kv head: both read the same keys and values.
    let q: &[f64] = &[1.0, -1.0, 2.0, 0.5];
    let k: &[f64] = &[0.0, 1.0];
    let v: &[f64] = &[10.0, 20.0];
    let y = run(
        OpKind::Attention {
            heads: 2,
            kv_heads: 1,
            scale: 1.0,
            causal: false,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        },
        &[(&[1, 2, 2], q), (&[1, 2, 1], k), (&[1, 2, 1], v)],
    );
    let o = |qv: f64| {
        let p = sm2(0.0, qv);
        10.0 * p[0] + 20.0 * p[1]
    };
    close(&y.data, &[o(1.0), o(-1.0), o(2.0), o(0.5)]);
}

/// A sink is one more logit per head that reads no value: with every score zero, each of the
/// n visible keys weighs 1 / (n + e^sink), as transformers' gpt-oss concatenates it.
#[test]
fn attention_sinks_take_a_share_of_each_row() {
    let q: &[f64] = &[0.0; 4];
    let k: &[f64] = &[0.3, -0.7];
    let v: &[f64] = &[10.0, 20.0];
    let sinks: &[f64] = &[0.0, 2.0];
    let y = run(
        OpKind::Attention {
            heads: 2,
            kv_heads: 1,
            scale: 1.0,
            causal: true,
            softcap: None,
            sinks: true,
            window: None,
            chunk: None,
        },
        &[
            (&[1, 2, 2], q),
            (&[1, 2, 1], k),
            (&[1, 2, 1], v),
            (&[2], sinks),
        ],
    );
    let row = |n: f64, sink: f64, sum: f64| sum / (n + f64::exp(sink));
    close(
        &y.data,
        &[
            row(1.0, 0.0, 10.0),
            row(1.0, 2.0, 10.0),
            row(2.0, 0.0, 30.0),
            row(2.0, 2.0, 30.0),
        ],
    );
}

/// A window of 2 keys: with every score zero, query i averages the values of keys i − 1 and i
/// (transformers' sliding-window mask, `q_idx − kv_idx < sliding_window`); query 0 sees only
/// key 0. A window as long as the sequence is the causal mask.
#[test]
fn a_sliding_window_hides_keys_before_it() {
    let q: &[f64] = &[0.0; 4];
    let k: &[f64] = &[0.5, -1.0, 2.0, 0.25];
    let v: &[f64] = &[10.0, 20.0, 40.0, 80.0];
    let attention = |window| OpKind::Attention {
        heads: 1,
        kv_heads: 1,
        scale: 1.0,
        causal: true,
        softcap: None,
        sinks: false,
        window,
        chunk: None,
    };
    let operands = [(&[1, 4, 1][..], q), (&[1, 4, 1], k), (&[1, 4, 1], v)];
    let y = run(attention(Some(2)), &operands);
    close(&y.data, &[10.0, 15.0, 30.0, 60.0]);
    let causal = run(attention(None), &operands);
    close(&run(attention(Some(4)), &operands).data, &causal.data);
    close(&causal.data, &[10.0, 15.0, 70.0 / 3.0, 37.5]);
}

/// Chunks of 2 keys (Llama 4's `attention_chunk_size`, transformers' chunked causal mask
/// `q_idx // chunk == kv_idx // chunk`): with every score zero, queries 0 and 1 average keys
/// 0..=q, queries 2 and 3 only keys from 2 on.
#[test]
fn chunked_attention_sees_its_own_chunk() {
    let q: &[f64] = &[0.0; 4];
    let k: &[f64] = &[0.5, -1.0, 2.0, 0.25];
    let v: &[f64] = &[10.0, 20.0, 40.0, 80.0];
    let attention = OpKind::Attention {
        heads: 1,
        kv_heads: 1,
        scale: 1.0,
        causal: true,
        softcap: None,
        sinks: false,
        window: None,
        chunk: Some(2),
    };
    let operands = [(&[1, 4, 1][..], q), (&[1, 4, 1], k), (&[1, 4, 1], v)];
    close(&run(attention, &operands).data, &[10.0, 15.0, 40.0, 60.0]);
}

#[test]
fn rotary_is_identity_at_position_zero_and_rotates_half_after() {
    let x: Vec<f64> = (1..=8).map(f64::from).collect();
    // [B=1, S=2, heads=1 * d=4]: position 0 unchanged; position 1 turns pair (c, c+2) by θ^(−c/2).
    let y = run(
        OpKind::Rotary {
            heads: 1,
            theta: 100.0,
            scaling: Default::default(),
        },
        &[(&[1, 2, 4], &x)],
    );
    close(&y.data[..4], &x[..4]);
    let (a0, a1) = (1.0f64, 100f64.powf(-0.5));
    let want = [
        5.0 * a0.cos() - 7.0 * a0.sin(),
        6.0 * a1.cos() - 8.0 * a1.sin(),
        7.0 * a0.cos() + 5.0 * a0.sin(),
        8.0 * a1.cos() + 6.0 * a1.sin(),
    ];
    close(&y.data[4..], &want);
}

#[test]
fn layernorm_and_rmsnorm_by_hand() {
    let x: &[f64] = &[1.0, 2.0, 3.0];
    let y = run(
        OpKind::LayerNorm {
            eps: 0.0,
            bias: true,
        },
        &[
            (&[3], x),
            (&[3], &[1.0, 2.0, 1.0]),
            (&[3], &[0.0, 0.0, 1.0]),
        ],
    );
    let s = (2.0f64 / 3.0).sqrt();
    close(&y.data, &[-1.0 / s, 0.0, 1.0 / s + 1.0]);
    let y = run(
        OpKind::RmsNorm { eps: 0.0 },
        &[(&[3], x), (&[3], &[1.0, 1.0, 2.0])],
    );
    let r = (14.0f64 / 3.0).sqrt();
    close(&y.data, &[1.0 / r, 2.0 / r, 6.0 / r]);
}

#[test]
fn cross_entropy_is_the_mean_nll() {
    let mut g = Graph::new("ce");
    let logits = g.push_source(
        OpKind::Param { name: "l".into() },
        TensorType::new(DType::F32, Shape::fixed(&[2, 2])),
        None,
    );
    let targets = g.push_source(
        OpKind::Input { name: "t".into() },
        TensorType::new(DType::I64, Shape::fixed(&[2])),
        None,
    );
    let loss = g
        .push_op(OpKind::CrossEntropy, vec![logits, targets], None)
        .unwrap()[0];
    let weights = Weights::from([(
        "l".to_string(),
        Tensor::new(vec![2, 2], vec![0.0, 1.0, 2.0, 2.0]),
    )]);
    let inputs = BTreeMap::from([("t".to_string(), Tensor::new(vec![2], vec![1.0, 0.0]))]);
    let env = Env {
        weights: &weights,
        inputs: &inputs,
        binding: BIND,
    };
    let got = evaluate(&g, &env).unwrap().value(loss).data[0];
    let want = (-(sm2(0.0, 1.0)[1].ln()) + 2f64.ln()) / 2.0;
    assert!((got - want).abs() < 1e-12);
}

#[test]
fn topk_router_softmaxes_the_chosen_logits() {
    // x = [1], w = [[1, 3, 2, 3]] → logits 1, 3, 2, 3; k = 2 picks experts 1 and 3 (tie kept).
    let y = run(
        OpKind::TopKRouter {
            experts: 4,
            k: 2,
            routing: Default::default(),
            bias: false,
        },
        &[(&[1, 1], &[1.0]), (&[1, 4], &[1.0, 3.0, 2.0, 3.0])],
    );
    close(&y.data, &[0.0, 0.5, 0.0, 0.5]);
    // With k = 1 the tie between experts 1 and 3 goes to the lower index.
    let y = run(
        OpKind::TopKRouter {
            experts: 4,
            k: 1,
            routing: Default::default(),
            bias: false,
        },
        &[(&[1, 1], &[1.0]), (&[1, 4], &[1.0, 3.0, 2.0, 3.0])],
    );
    close(&y.data, &[0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn dropout_scales_survivors_and_is_deterministic() {
    let x = vec![1.0; 1000];
    let y = run(OpKind::Dropout { p: 0.25, seed: 7 }, &[(&[1000], &x)]);
    let kept = y.data.iter().filter(|&&v| v != 0.0).count();
    assert!((700..800).contains(&kept), "kept {kept}");
    assert!(
        y.data
            .iter()
            .all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-15)
    );
    for (i, &v) in y.data.iter().enumerate() {
        assert_eq!(v != 0.0, ir::interp::dropout_keep(7, i as u64, 0.25));
    }
    let again = run(OpKind::Dropout { p: 0.25, seed: 7 }, &[(&[1000], &x)]);
    assert_eq!(y, again);
}

#[test]
fn missing_and_misshapen_sources_are_errors() {
    let mut g = Graph::new("t");
    g.push_source(
        OpKind::Param { name: "w".into() },
        TensorType::new(DType::F32, Shape::fixed(&[2])),
        None,
    );
    let inputs = BTreeMap::new();
    let empty = Weights::new();
    let env = Env {
        weights: &empty,
        inputs: &inputs,
        binding: BIND,
    };
    assert!(matches!(
        evaluate(&g, &env),
        Err(ir::interp::InterpError::Missing { .. })
    ));
    let wrong = Weights::from([("w".to_string(), Tensor::new(vec![3], vec![0.0; 3]))]);
    let env = Env {
        weights: &wrong,
        ..env
    };
    assert!(matches!(
        evaluate(&g, &env),
        Err(ir::interp::InterpError::ShapeMismatch { .. })
    ));
    let bad = Weights::from([(
        "w".to_string(),
        Tensor {
            shape: vec![2],
            data: vec![0.0; 5],
        },
    )]);
    let env = Env {
        weights: &bad,
        ..env
    };
    assert!(matches!(
        evaluate(&g, &env),
        Err(ir::interp::InterpError::Malformed { .. })
    ));
}

#[test]
fn out_of_range_ids_are_errors() {
    let mut g = Graph::new("t");
    let table = g.push_source(
        OpKind::Param { name: "w".into() },
        TensorType::new(DType::F32, Shape::fixed(&[3, 2])),
        None,
    );
    let ids = g.push_source(
        OpKind::Input { name: "ids".into() },
        TensorType::new(DType::I64, Shape::fixed(&[2])),
        None,
    );
    g.push_op(OpKind::Embedding, vec![table, ids], None)
        .expect("well-typed");
    let weights = Weights::from([("w".to_string(), Tensor::new(vec![3, 2], vec![0.0; 6]))]);
    for bad in [3.0, -1.0, 0.5] {
        let inputs = BTreeMap::from([("ids".to_string(), Tensor::new(vec![2], vec![0.0, bad]))]);
        let env = Env {
            weights: &weights,
            inputs: &inputs,
            binding: BIND,
        };
        assert!(matches!(
            evaluate(&g, &env),
            Err(ir::interp::InterpError::Invalid { .. })
        ));
    }
}
