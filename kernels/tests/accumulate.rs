//! f64 accumulation makes a matrix product's rounding independent of how its contraction is
//! split: the sum of two halves' unrounded partial products (what a tensor-parallel all-reduce
//! of `linear_partial`s computes) rounds to exactly the whole product of one device, where
//! sgemm's f32 partial sums, rounded before they are added, do not.

#![allow(clippy::unwrap_used)]

mod common;

use common::rand;
use ir::testing::Rng;
use ir::{Binding, OpKind};
use kernels::{Accumulate, Tensor32, backward_with, forward_with};

const BIND: Binding = Binding { batch: 1, seq: 1 };

fn t(rng: &mut Rng, shape: &[usize]) -> Tensor32 {
    Tensor32::from_ir(&rand(rng, shape))
}

/// Columns `[lo, hi)` of a row-major `[rows, cols]` tensor.
fn cols(x: &Tensor32, lo: usize, hi: usize) -> Tensor32 {
    let c = x.shape[1];
    let data = x
        .data
        .chunks(c)
        .flat_map(|r| r[lo..hi].iter().copied())
        .collect();
    Tensor32::new(vec![x.shape[0], hi - lo], data).unwrap()
}

/// Rows `[lo, hi)` of a row-major `[rows, cols]` tensor.
fn rows(x: &Tensor32, lo: usize, hi: usize) -> Tensor32 {
    let c = x.shape[1];
    Tensor32::new(vec![hi - lo, c], x.data[lo * c..hi * c].to_vec()).unwrap()
}

fn linear(x: &Tensor32, w: &Tensor32, acc: Accumulate) -> Tensor32 {
    forward_with(&OpKind::Linear { bias: false }, &[x, w], BIND, acc)
        .unwrap()
        .remove(0)
}

fn mismatches(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

#[test]
fn split_contraction_rounds_like_the_whole_in_f64() {
    let mut rng = Rng::new(11);
    let (m, k, n) = (64, 256, 48);
    let (x, w) = (t(&mut rng, &[m, k]), t(&mut rng, &[k, n]));
    let whole = linear(&x, &w, Accumulate::F64);
    // Two row-parallel ranks: x's columns and w's rows split in half.
    let h = k / 2;
    let p0 = kernels::linear_partial(&cols(&x, 0, h), &rows(&w, 0, h)).unwrap();
    let p1 = kernels::linear_partial(&cols(&x, h, k), &rows(&w, h, k)).unwrap();
    let reduced: Vec<f32> = p0.iter().zip(&p1).map(|(a, b)| (a + b) as f32).collect();
    assert_eq!(mismatches(&reduced, &whole.data), 0);
    // The whole product in f64 mode is the unrounded product rounded once.
    let full = kernels::linear_partial(&x, &w).unwrap();
    let once: Vec<f32> = full.iter().map(|&v| v as f32).collect();
    assert_eq!(once, whole.data);
    // In f32, the halves' rounded sums added differ from the whole in many elements.
    let f32_whole = linear(&x, &w, Accumulate::F32);
    let a = linear(&cols(&x, 0, h), &rows(&w, 0, h), Accumulate::F32);
    let b = linear(&cols(&x, h, k), &rows(&w, h, k), Accumulate::F32);
    let added: Vec<f32> = a.data.iter().zip(&b.data).map(|(p, q)| p + q).collect();
    let off = mismatches(&added, &f32_whole.data);
    assert!(off > m * n / 10, "{off} of {} differ in f32", m * n);
}

#[test]
fn column_parallel_input_gradient_partials_add_up_exactly() {
    let mut rng = Rng::new(12);
    let (m, k, n) = (32, 48, 192);
    let (x, w, g) = (
        t(&mut rng, &[m, k]),
        t(&mut rng, &[k, n]),
        t(&mut rng, &[m, n]),
    );
    let kind = OpKind::Linear { bias: false };
    let whole = backward_with(&kind, &[&x, &w], &[&g], Accumulate::F64).unwrap();
    let dx = whole[0].as_ref().unwrap();
    // Two column-parallel ranks: w's and g's columns split in half.
    let h = n / 2;
    let parts: Vec<Vec<f64>> = [(0, h), (h, n)]
        .iter()
        .map(|&(lo, hi)| {
            kernels::linear_input_grad_partial(&cols(&w, lo, hi), &cols(&g, lo, hi)).unwrap()
        })
        .collect();
    let reduced: Vec<f32> = parts[0]
        .iter()
        .zip(&parts[1])
        .map(|(a, b)| (a + b) as f32)
        .collect();
    assert_eq!(mismatches(&reduced, &dx.data), 0);
    // The weight gradient does not depend on the mode's split property but must still agree
    // with sgemm's to f32 rounding.
    let f32_grads = backward_with(&kind, &[&x, &w], &[&g], Accumulate::F32).unwrap();
    let (a, b) = (whole[1].as_ref().unwrap(), f32_grads[1].as_ref().unwrap());
    let worst = a
        .data
        .iter()
        .zip(&b.data)
        .map(|(p, q)| (p - q).abs() / p.abs().max(1.0))
        .fold(0f32, f32::max);
    assert!(
        worst < 1e-5,
        "f64 and f32 weight gradients differ by {worst}"
    );
}

#[test]
fn a_bias_is_added_after_rounding_the_product() {
    // One device's biased linear must round as a row-parallel one does: the reduced product
    // rounded, then the bias added in a separate rounding.
    let mut rng = Rng::new(13);
    let (x, w, b) = (
        t(&mut rng, &[16, 64]),
        t(&mut rng, &[64, 24]),
        t(&mut rng, &[24]),
    );
    let biased = forward_with(
        &OpKind::Linear { bias: true },
        &[&x, &w, &b],
        BIND,
        Accumulate::F64,
    )
    .unwrap()
    .remove(0);
    let product = linear(&x, &w, Accumulate::F64);
    let added: Vec<f32> = product
        .data
        .chunks(24)
        .flat_map(|r| r.iter().zip(&b.data).map(|(p, q)| p + q))
        .collect();
    assert_eq!(added, biased.data);
}
