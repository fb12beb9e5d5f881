//! `collective::run_wide`: a reduction of partial sums carried in f64 rounds once, as the
//! unsplit sum does, where the f32 reduction of f32-rounded partials rounds twice.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use program::CollectiveOp;
use runtime::exec::collective::{Members, run, run_wide};
use runtime::{Communicator, ThreadComm};

/// Two ranks' partial sums whose f32 roundings add to something else than the rounded total:
/// 1 + 2⁻²⁵ rounds to 1 in f32, and 1 + (2⁻²⁵ + 2⁻⁴⁰) stays below half an ulp of 1, but the
/// exact total 1 + 2⁻²⁴ + 2⁻⁴⁰ is past it and rounds up to 1 + 2⁻²³.
fn partials() -> [Vec<f64>; 2] {
    let a = 1.0 + 2f64.powi(-25);
    let b = 2f64.powi(-25) + 2f64.powi(-40);
    [vec![a, 3.0, -2.0, 0.5], vec![b, 1.0, 2.0, 0.25]]
}

fn exact() -> Vec<f32> {
    let [a, b] = partials();
    a.iter().zip(&b).map(|(x, y)| (x + y) as f32).collect()
}

#[test]
fn wide_all_reduce_rounds_once() {
    let out = ThreadComm::run(2, Duration::from_secs(10), |c| {
        let mine = &partials()[c.rank()];
        let wide = run_wide(
            Members::Group(&c),
            CollectiveOp::AllReduce,
            None,
            mine,
            &[4],
            4,
        )
        .unwrap();
        let narrow: Vec<f32> = mine.iter().map(|&v| v as f32).collect();
        let f32_sum = run(
            Members::Group(&c),
            CollectiveOp::AllReduce,
            None,
            &narrow,
            &[4],
            4,
        )
        .unwrap();
        (wide, f32_sum)
    })
    .unwrap();
    for (wide, f32_sum) in &out {
        assert_eq!(wide, &exact());
        assert_ne!(
            f32_sum[0],
            exact()[0],
            "the f32 reduction should round twice"
        );
        assert_eq!(f32_sum[1..], exact()[1..]);
    }
}

#[test]
fn wide_reduce_scatter_keeps_each_ranks_piece() {
    let out = ThreadComm::run(2, Duration::from_secs(10), |c| {
        let mine = &partials()[c.rank()];
        // A [1, 4] tensor split along axis 1, and flat.
        let along = run_wide(
            Members::Group(&c),
            CollectiveOp::ReduceScatter,
            Some(1),
            mine,
            &[1, 4],
            2,
        )
        .unwrap();
        let flat = run_wide(
            Members::Group(&c),
            CollectiveOp::ReduceScatter,
            None,
            mine,
            &[4],
            2,
        )
        .unwrap();
        (along, flat)
    })
    .unwrap();
    let e = exact();
    for (r, (along, flat)) in out.iter().enumerate() {
        assert_eq!(along[..], e[2 * r..2 * r + 2]);
        assert_eq!(flat[..], e[2 * r..2 * r + 2]);
    }
    // A group of one rounds its own value.
    let solo = run_wide::<ThreadComm>(
        Members::Solo,
        CollectiveOp::AllReduce,
        None,
        &[1.0 + 2f64.powi(-30)],
        &[1],
        1,
    )
    .unwrap();
    assert_eq!(solo, vec![1.0]);
}
