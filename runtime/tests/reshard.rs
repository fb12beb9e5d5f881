//! `reshard`: a tensor split along one axis over the group, re-split along another by one
//! all-to-all, equals cutting the whole tensor along the new axis; and resharding back
//! restores each rank's original piece.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use program::CollectiveOp;
use runtime::exec::collective::{Members, run};
use runtime::exec::layout::part;
use runtime::{Communicator, ThreadComm};

/// A [2, 6, 4] tensor whose elements are their flat indices.
const SHAPE: [usize; 3] = [2, 6, 4];

fn whole() -> Vec<f32> {
    (0..SHAPE.iter().product::<usize>())
        .map(|i| i as f32)
        .collect()
}

#[test]
fn reshard_moves_the_split_and_back() {
    for size in [1usize, 2] {
        let out = ThreadComm::run(size, Duration::from_secs(10), |c| {
            let (n, r) = (c.size(), c.rank());
            // Split along the sequence (axis 1), re-split along the last axis.
            let mine = part(&whole(), &SHAPE, 1, n, r).unwrap();
            let local = [SHAPE[0], SHAPE[1] / n, SHAPE[2]];
            let op = CollectiveOp::Reshard { from: 1 };
            let moved = run(Members::Group(&c), op, Some(2), &mine, &local, mine.len()).unwrap();
            let moved_shape = [SHAPE[0], SHAPE[1], SHAPE[2] / n];
            let back = CollectiveOp::Reshard { from: 2 };
            let again = run(
                Members::Group(&c),
                back,
                Some(1),
                &moved,
                &moved_shape,
                mine.len(),
            )
            .unwrap();
            (mine, moved, again)
        })
        .unwrap();
        for (r, (mine, moved, again)) in out.iter().enumerate() {
            assert_eq!(
                moved,
                &part(&whole(), &SHAPE, 2, size, r).unwrap(),
                "rank {r} of {size}"
            );
            assert_eq!(again, mine, "rank {r} of {size}: back to its piece");
        }
    }
}
