//! Bad operands are errors, never panics: wrong arity, mismatched shapes, malformed tensors,
//! out-of-range ids and attributes, for every op kind.

use ir::{AdamWConfig, Binding, Dim, OpKind};
use kernels::{KernelError, Tensor32};

const BIND: Binding = Binding { batch: 2, seq: 3 };

fn t(shape: &[usize]) -> Tensor32 {
    let n = shape.iter().product();
    Tensor32 {
        shape: shape.to_vec(),
        data: (0..n).map(|i| i as f32 * 0.1).collect(),
    }
}

fn all_kinds() -> Vec<OpKind> {
    vec![
        OpKind::Embedding,
        OpKind::MatMul,
        OpKind::Linear { bias: true },
        OpKind::Add,
        OpKind::Div,
        OpKind::Exp,
        OpKind::Gelu { tanh: false },
        OpKind::ReduceSum,
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: true,
        },
        OpKind::RmsNorm { eps: 1e-6 },
        OpKind::Softmax { causal: true },
        OpKind::Attention {
            heads: 3,
            kv_heads: 2,
            scale: 1.0,
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        },
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
        OpKind::Rotary {
            heads: 2,
            theta: 1e4,
            scaling: Default::default(),
        },
        OpKind::Reshape {
            shape: vec![Dim::Fixed(7)],
        },
        OpKind::Expand {
            shape: vec![Dim::Fixed(2), Dim::Fixed(9)],
        },
        OpKind::Transpose { perm: vec![0, 0] },
        OpKind::Split {
            axis: 5,
            sizes: vec![1],
        },
        OpKind::Concat { axis: 3 },
        OpKind::Slice {
            axis: 0,
            start: 2,
            end: 9,
        },
        OpKind::Dropout { p: 1.5, seed: 1 },
        OpKind::CrossEntropy,
        OpKind::TopKRouter {
            experts: 4,
            k: 9,
            routing: Default::default(),
            bias: false,
        },
        OpKind::MoeExperts {
            experts: 2,
            form: Default::default(),
        },
        OpKind::AdamW(AdamWConfig::default()),
        OpKind::Grad {
            of: Box::new(OpKind::MatMul),
            wrt: vec![0, 7],
        },
        OpKind::Param { name: "w".into() },
    ]
}

#[test]
fn bad_operands_are_errors() {
    let operand_sets: Vec<Vec<Tensor32>> = vec![
        vec![],
        vec![t(&[2, 3])],
        vec![t(&[2, 3]), t(&[4, 5])],
        vec![t(&[2, 3, 4]), t(&[5]), t(&[4])],
        vec![t(&[2, 3]), t(&[2, 3]), t(&[2, 3]), t(&[2, 3]), t(&[2, 3])],
        vec![
            Tensor32 {
                shape: vec![2, 2],
                data: vec![1.0],
            },
            t(&[2]),
        ],
        vec![t(&[]), t(&[0])],
    ];
    let mut errors = 0;
    for kind in all_kinds() {
        for ops in &operand_sets {
            let refs: Vec<&Tensor32> = ops.iter().collect();
            // Either outcome is fine; a panic fails the test.
            if kernels::forward(&kind, &refs, BIND).is_err() {
                errors += 1;
            }
            let _ = kernels::backward(&kind, &refs, &refs[..refs.len().min(1)]);
        }
    }
    assert!(errors > 100, "most combinations are rejected, got {errors}");
}

#[test]
fn errors_are_structured() {
    let ids = Tensor32 {
        shape: vec![2],
        data: vec![1.0, 7.5],
    };
    let err = kernels::forward(&OpKind::Embedding, &[&t(&[4, 3]), &ids], BIND);
    assert!(
        matches!(
            err,
            Err(KernelError::BadIndex {
                op: "embedding",
                bound: 4,
                ..
            })
        ),
        "{err:?}"
    );
    let err = kernels::forward(&OpKind::MatMul, &[&t(&[2, 3])], BIND);
    assert!(
        matches!(
            err,
            Err(KernelError::Arity {
                op: "matmul",
                want: 2,
                got: 1
            })
        ),
        "{err:?}"
    );
    let bad = Tensor32 {
        shape: vec![3],
        data: vec![0.0],
    };
    assert!(matches!(
        kernels::forward(&OpKind::Exp, &[&bad], BIND),
        Err(KernelError::Malformed { .. })
    ));
    let mut p = t(&[3]);
    let (mut m, mut v) = (t(&[3]), t(&[3]));
    let err = kernels::adamw(&AdamWConfig::default(), &mut p, &t(&[4]), &mut m, &mut v, 1);
    assert!(
        matches!(err, Err(KernelError::Shape { op: "adamw", .. })),
        "{err:?}"
    );
    assert!(kernels::adamw(&AdamWConfig::default(), &mut p, &t(&[3]), &mut m, &mut v, 0).is_err());
}
