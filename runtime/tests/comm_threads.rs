//! The threads communicator: the conformance suite on several group sizes and subgroups,
//! bit-identical reductions across runs, and deadlines that name the missing rank.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use runtime::comm::conformance::{check_all, rank_data};
use runtime::{Communicator, RuntimeError, ThreadComm};

const LENS: [usize; 5] = [0, 1, 7, 64, 1001];
const LONG: Duration = Duration::from_secs(30);

#[test]
fn every_collective_matches_the_sequential_reference() {
    for n in 1..=5 {
        let results = ThreadComm::run(n, LONG, |c| check_all(&c, &LENS)).unwrap();
        for (r, res) in results.into_iter().enumerate() {
            res.unwrap_or_else(|e| panic!("size {n}, rank {r}: {e}"));
        }
    }
}

#[test]
fn subgroups_run_the_suite_independently_and_concurrently() {
    let results = ThreadComm::run(6, LONG, |c| {
        let me = c.rank();
        let parity: Vec<usize> = (0..6).filter(|r| r % 2 == me % 2).collect();
        let g = c.group(&parity)?;
        assert_eq!(g.world_ranks(), parity.as_slice());
        check_all(&g, &LENS).map_err(|e| RuntimeError::Profile {
            message: e.to_string(),
        })?;
        // A reordered group of everyone: group rank i is world rank 5 - i.
        let rev: Vec<usize> = (0..6).rev().collect();
        let r = c.group(&rev)?;
        assert_eq!(r.rank(), 5 - me);
        check_all(&r, &LENS[..4]).map_err(|e| RuntimeError::Profile {
            message: e.to_string(),
        })?;
        // The same members twice make two independent groups.
        let again = c.group(&parity)?;
        let mut x = vec![me as f32];
        again.all_reduce_sum(&mut x)?;
        g.barrier()?;
        Ok::<f32, RuntimeError>(x[0])
    })
    .unwrap();
    for (r, res) in results.into_iter().enumerate() {
        let want = if r % 2 == 0 { 6.0 } else { 9.0 };
        assert_eq!(res.unwrap(), want, "rank {r}");
    }
}

#[test]
fn bad_groups_are_refused() {
    let comms = ThreadComm::world(4);
    let c = &comms[1];
    for (ranks, why) in [
        (vec![], "empty"),
        (vec![0, 4], "does not exist"),
        (vec![1, 1], "twice"),
        (vec![0, 2], "not a member"),
    ] {
        let err = c.group(&ranks).unwrap_err();
        assert!(err.to_string().contains(why), "{ranks:?}: {err}");
    }
}

#[test]
fn reductions_are_bit_identical_across_runs() {
    let run = || {
        ThreadComm::run(4, LONG, |c| {
            let mut x = rank_data(c.rank(), 4096, 9);
            c.all_reduce_sum(&mut x).map(|()| x)
        })
        .unwrap()
    };
    let first = run();
    for _ in 0..5 {
        assert_eq!(run(), first);
    }
    // Every rank holds the same bits.
    let ranks: Vec<Vec<u32>> = first
        .into_iter()
        .map(|x| x.unwrap().iter().map(|v| v.to_bits()).collect())
        .collect();
    assert!(ranks.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn messages_are_matched_by_tag_not_arrival_order() {
    let out = ThreadComm::run(2, LONG, |c| {
        if c.rank() == 0 {
            c.send(&[1.0], 1, 7)?;
            c.send(&[2.0, 2.0], 1, 3)?;
            Ok(vec![])
        } else {
            let (mut three, mut seven) = (vec![0.0; 2], vec![0.0; 1]);
            c.recv(&mut three, 0, 3)?;
            c.recv(&mut seven, 0, 7)?;
            Ok::<_, RuntimeError>([three, seven].concat())
        }
    })
    .unwrap();
    assert_eq!(out[1].as_ref().unwrap(), &vec![2.0, 2.0, 1.0]);
}

#[test]
fn bad_arguments_are_errors() {
    let comms = ThreadComm::world(2);
    let c = &comms[0];
    let mut small = vec![0.0; 3];
    assert!(matches!(
        c.all_gather(&[1.0, 2.0], &mut small),
        Err(RuntimeError::BadLength { .. })
    ));
    assert!(matches!(
        c.broadcast(&mut small, 2),
        Err(RuntimeError::BadRank { .. })
    ));
    assert!(matches!(
        c.send(&small, 1, runtime::MAX_TAG + 1),
        Err(RuntimeError::BadTag { .. })
    ));
    assert!(matches!(
        c.all_to_all(&small, &mut small.clone()),
        Err(RuntimeError::BadLength { .. })
    ));
}

#[test]
fn a_rank_that_never_arrives_is_named_within_the_timeout() {
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let results = ThreadComm::run(4, timeout, |c| {
        if c.rank() == 3 {
            return None; // never calls the collective
        }
        let t = Instant::now();
        let mut x = vec![1.0f32; 8];
        Some((c.all_reduce_sum(&mut x), t.elapsed()))
    })
    .unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    for (r, res) in results.into_iter().take(3).enumerate() {
        let (res, took) = res.unwrap();
        let err = res.unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("rank 3 (world rank 3)"), "rank {r}: {msg}");
        assert!(took < Duration::from_secs(3), "rank {r} took {took:?}");
        if let RuntimeError::Timeout { missing, group, .. } = &err {
            assert_eq!(missing, &vec![3]);
            assert_eq!(group, &vec![0, 1, 2, 3]);
        }
    }
}

#[test]
fn a_missing_sender_is_named_and_the_world_is_poisoned_after() {
    let results = ThreadComm::run(3, Duration::from_millis(200), |c| {
        match c.rank() {
            0 => {
                let mut x = [0.0f32; 2];
                let first = c.recv(&mut x, 2, 5).unwrap_err();
                // Everything fails fast once a rank has timed out.
                let t = Instant::now();
                let later = c.barrier().unwrap_err();
                (first.to_string(), later.to_string(), t.elapsed())
            }
            _ => (String::new(), String::new(), Duration::ZERO),
        }
    })
    .unwrap();
    let (first, later, took) = &results[0];
    assert!(
        first.contains("recv timed out") && first.contains("rank 2 (world rank 2)"),
        "{first}"
    );
    assert!(
        later.contains("failed earlier") && later.contains("rank 2"),
        "{later}"
    );
    assert!(*took < Duration::from_millis(100));
}

#[test]
fn mismatched_collectives_are_reported() {
    let results = ThreadComm::run(2, Duration::from_secs(5), |c| {
        let mut x = vec![0.0f32; 4];
        if c.rank() == 0 {
            c.all_reduce_sum(&mut x)
        } else {
            c.broadcast(&mut x, 0)
        }
    })
    .unwrap();
    let msgs: Vec<String> = results
        .into_iter()
        .map(|r| r.unwrap_err().to_string())
        .collect();
    assert!(msgs.iter().any(|m| m.contains("mismatch")), "{msgs:?}");
}

#[test]
fn the_default_timeout_is_30_seconds_and_configurable() {
    let mut comms = ThreadComm::world(2);
    assert_eq!(comms[0].timeout(), Duration::from_secs(30));
    comms[0].set_timeout(Duration::from_millis(5));
    let g = comms[0].group(&[0, 1]).unwrap();
    assert_eq!(g.timeout(), Duration::from_millis(5));
}
