//! Library code must not panic on any input: every kernel and VJP is fed random, mostly
//! ill-shaped operands (wrong ranks, empty axes, out-of-range ids, wrong counts) and may only
//! return errors.

use ir::interp::{apply, vjp};
use ir::testing::Rng;
use ir::{AdamWConfig, Binding, Dim, OpKind, Tensor};

fn kinds() -> Vec<OpKind> {
    let d = |v: &[u64]| v.iter().map(|&x| Dim::Fixed(x)).collect::<Vec<_>>();
    vec![
        OpKind::Embedding,
        OpKind::MatMul,
        OpKind::Linear { bias: false },
        OpKind::Linear { bias: true },
        OpKind::Add,
        OpKind::Div,
        OpKind::Exp,
        OpKind::Pow { exponent: 0.0 },
        OpKind::Gelu { tanh: false },
        OpKind::ReduceMean,
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: true,
        },
        OpKind::RmsNorm { eps: 1e-5 },
        OpKind::Softmax { causal: true },
        OpKind::Attention {
            heads: 2,
            kv_heads: 1,
            scale: 1.0,
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        },
        OpKind::Attention {
            heads: 3,
            kv_heads: 2,
            scale: 1.0,
            causal: false,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        },
        OpKind::Rotary {
            heads: 1,
            theta: 10.0,
            scaling: Default::default(),
        },
        OpKind::Reshape { shape: d(&[2, 2]) },
        OpKind::Expand { shape: d(&[2, 2]) },
        OpKind::Transpose { perm: vec![1, 0] },
        OpKind::Transpose { perm: vec![0, 0] },
        OpKind::Split {
            axis: 1,
            sizes: vec![1, 1],
        },
        OpKind::Concat { axis: 1 },
        OpKind::Slice {
            axis: 0,
            start: 2,
            end: 1,
        },
        OpKind::Slice {
            axis: 1,
            start: 0,
            end: 2,
        },
        OpKind::Dropout { p: 0.5, seed: 1 },
        OpKind::Dropout { p: 1.5, seed: 1 },
        OpKind::CrossEntropy,
        OpKind::TopKRouter {
            experts: 2,
            k: 1,
            routing: Default::default(),
            bias: false,
        },
        OpKind::TopKRouter {
            experts: 2,
            k: 3,
            routing: Default::default(),
            bias: false,
        },
        OpKind::MoeExperts {
            experts: 2,
            form: Default::default(),
        },
        OpKind::AdamW(AdamWConfig::default()),
        OpKind::Grad {
            of: Box::new(OpKind::Split {
                axis: 0,
                sizes: vec![1, 1],
            }),
            wrt: vec![0, 3],
        },
        OpKind::Input { name: "x".into() },
    ]
}

fn random_tensor(rng: &mut Rng) -> Tensor {
    let rank = rng.below(4) as usize;
    let shape: Vec<usize> = (0..rank).map(|_| rng.below(4) as usize).collect();
    let n: usize = shape.iter().product();
    // Small integers so index operands are sometimes valid, sometimes not.
    let data = (0..n).map(|_| rng.below(5) as f64 - 1.0).collect();
    let mut t = Tensor { shape, data };
    if rng.below(10) == 0 {
        t.data.push(0.5); // malformed: data longer than the shape
    }
    t
}

#[test]
fn kernels_never_panic_on_random_operands() {
    let mut rng = Rng::new(99);
    let bind = Binding { batch: 2, seq: 2 };
    let mut ok = 0;
    for kind in kinds() {
        for _ in 0..1000 {
            let n = rng.below(6) as usize;
            let xs: Vec<Tensor> = (0..n).map(|_| random_tensor(&mut rng)).collect();
            let refs: Vec<&Tensor> = xs.iter().collect();
            if apply(&kind, &refs, bind).is_ok() {
                ok += 1;
            }
            let split = rng.below(n as u64 + 1) as usize;
            let _ = vjp(&kind, &refs[..split], &refs[split..]);
        }
    }
    // Some random cases are well-formed, so the kernels were exercised past validation.
    assert!(ok > 100, "only {ok} successful applications");
}
