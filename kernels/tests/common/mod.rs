//! Comparing the f32 kernels with the f64 reference interpreter.

#![allow(dead_code)]

use ir::testing::Rng;
use ir::{Binding, OpKind, Tensor};
use kernels::Tensor32;

/// Tolerance of one op, f32 kernels against the f64 reference.
pub const OP_TOL: f64 = 1e-4;

pub const BIND: Binding = Binding { batch: 2, seq: 3 };

/// max|got − want| / max(max|want|, 1e-6): a tensor-wise relative error, so an element that is
/// legitimately ~0 is judged against the tensor's scale rather than against itself.
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|v| v.abs()).fold(1e-6, f64::max);
    diff / scale
}

/// Rounds to f32 and back, so the reference sees exactly the kernels' operands.
pub fn round(t: &Tensor) -> Tensor {
    Tensor32::from_ir(t).to_ir()
}

/// A random tensor, rounded to f32.
pub fn rand(rng: &mut Rng, shape: &[usize]) -> Tensor {
    round(&rng.tensor(shape, 1.0))
}

/// A random tensor with entries in [lo, lo + 1).
pub fn positive(rng: &mut Rng, shape: &[usize], lo: f64) -> Tensor {
    let mut t = rng.tensor(shape, 1.0);
    t.data.iter_mut().for_each(|x| *x = lo + (*x).abs().fract());
    round(&t)
}

/// Random integer ids below `n`.
pub fn ids(rng: &mut Rng, shape: &[usize], n: u64) -> Tensor {
    let len = shape.iter().product();
    Tensor::new(
        shape.to_vec(),
        (0..len).map(|_| rng.below(n) as f64).collect(),
    )
}

/// Runs `kind` forward and backward on both implementations and returns the worst relative
/// error, asserting each is within [`OP_TOL`]. Output gradients are random.
pub fn check(name: &str, kind: &OpKind, operands: &[Tensor], rng: &mut Rng) -> f64 {
    let refs: Vec<&Tensor> = operands.iter().collect();
    let ours: Vec<Tensor32> = operands.iter().map(Tensor32::from_ir).collect();
    let our_refs: Vec<&Tensor32> = ours.iter().collect();

    let want =
        ir::interp::apply(kind, &refs, BIND).unwrap_or_else(|e| panic!("{name}: reference: {e}"));
    let got =
        kernels::forward(kind, &our_refs, BIND).unwrap_or_else(|e| panic!("{name}: kernels: {e}"));
    assert_eq!(got.len(), want.len(), "{name}: result count");
    let mut worst: f64 = 0.0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.shape, w.shape, "{name}: result {i} shape");
        let e = rel_err(&g.to_ir().data, &w.data);
        assert!(
            e <= OP_TOL,
            "{name}: forward result {i} relative error {e:e}"
        );
        worst = worst.max(e);
    }

    if kind.differentiable_inputs().is_empty() && !matches!(kind, OpKind::Concat { .. }) {
        return worst;
    }
    let dys: Vec<Tensor> = want.iter().map(|w| rand(rng, &w.shape)).collect();
    let dy_refs: Vec<&Tensor> = dys.iter().collect();
    let our_dys: Vec<Tensor32> = dys.iter().map(Tensor32::from_ir).collect();
    let our_dy_refs: Vec<&Tensor32> = our_dys.iter().collect();
    let want = ir::interp::vjp(kind, &refs, &dy_refs)
        .unwrap_or_else(|e| panic!("{name}: reference vjp: {e}"));
    let got = kernels::backward(kind, &our_refs, &our_dy_refs)
        .unwrap_or_else(|e| panic!("{name}: kernels vjp: {e}"));
    assert_eq!(got.len(), want.len(), "{name}: gradient count");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        match (g, w) {
            (Some(g), Some(w)) => {
                assert_eq!(g.shape, w.shape, "{name}: gradient {i} shape");
                let e = rel_err(&g.to_ir().data, &w.data);
                assert!(e <= OP_TOL, "{name}: gradient {i} relative error {e:e}");
                worst = worst.max(e);
            }
            (None, None) => {}
            _ => panic!("{name}: gradient {i} present in one implementation only"),
        }
    }
    worst
}
