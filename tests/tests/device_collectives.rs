//! The executor's collectives on device buffers (`runtime::exec::on_device`): every layout it
//! arranges on the device around flat collectives (flat pieces truncated or zero-padded, axis
//! pieces, all-to-all, reshard) equals the host path (`exec::collective::run`) bit for bit, on
//! emulated devices whose collectives are the threads communicator's, with nothing staged
//! through the host.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use codegen::program::CollectiveOp;
use runtime::backend::conformance::tensor;
use runtime::exec::collective::{Members, run};
use runtime::exec::on_device;
use runtime::{Backend, Communicator, ThreadComm};
use tests::emulator::emulator_with_collectives;

/// A collective, its axis, and its input and output shapes.
type Case = (CollectiveOp, Option<u8>, Vec<usize>, Vec<usize>);

/// The cases for a group of `n`.
fn cases(n: usize) -> Vec<Case> {
    let per = 10usize.div_ceil(n);
    vec![
        (CollectiveOp::AllReduce, None, vec![3, 5], vec![3, 5]),
        (CollectiveOp::AllGather, None, vec![per], vec![10]),
        (
            CollectiveOp::AllGather,
            Some(1),
            vec![2, 3, 4],
            vec![2, 3 * n, 4],
        ),
        (CollectiveOp::AllGather, Some(0), vec![2, 3], vec![2 * n, 3]),
        (CollectiveOp::ReduceScatter, None, vec![10], vec![per]),
        (
            CollectiveOp::ReduceScatter,
            Some(1),
            vec![2, 3 * n, 4],
            vec![2, 3, 4],
        ),
        (
            CollectiveOp::ReduceScatter,
            Some(0),
            vec![2 * n, 3],
            vec![2, 3],
        ),
        (CollectiveOp::AllToAll, None, vec![4 * n], vec![4 * n]),
        (
            CollectiveOp::Reshard { from: 1 },
            Some(2),
            vec![2, 3, 4 * n],
            vec![2, 3 * n, 4],
        ),
        (
            CollectiveOp::Reshard { from: 2 },
            Some(0),
            vec![2 * n, 3, 4],
            vec![2, 3, 4 * n],
        ),
    ]
}

#[test]
fn every_device_layout_equals_the_host_collective() {
    for n in [2usize, 3] {
        ThreadComm::run(n, Duration::from_secs(60), |c| {
            let b = emulator_with_collectives(32);
            for (k, (op, axis, in_shape, out_shape)) in cases(n).into_iter().enumerate() {
                let what = format!(
                    "{} axis {axis:?} {in_shape:?} → {out_shape:?}, group of {n}",
                    op.name()
                );
                let x = tensor(&in_shape, (100 * k + c.rank()) as u64);
                let out_len: usize = out_shape.iter().product();
                let want = run(Members::Group(&c), op, axis, &x.data, &in_shape, out_len).unwrap();
                let xb = b.upload(&x).unwrap();
                let before = b.transfer_stats().unwrap();
                let axis = axis.map(usize::from);
                let y = on_device::run(&b, &c, op, axis, &xb, &in_shape, &out_shape)
                    .unwrap_or_else(|| panic!("{what}: no device path"))
                    .unwrap();
                let moved = b.transfer_stats().unwrap().since(before);
                assert_eq!(
                    (moved.host_ops, moved.uploads, moved.downloads),
                    (0, 0, 0),
                    "{what}: staged through the host"
                );
                let got = b.download(&y).unwrap();
                assert_eq!(got.shape, out_shape, "{what}");
                assert_eq!(got.data, want, "{what}");
            }
        })
        .unwrap();
    }
}
