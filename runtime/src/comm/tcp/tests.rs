use std::time::Duration;

use super::{TcpComm, connect_at};
use crate::RuntimeError;
use crate::comm::Communicator;
use crate::comm::conformance::check_all;

/// A port free a moment ago (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_or(29_517, |a| a.port())
}

/// `world` ranks as threads, each its own TCP endpoint meeting at a fresh port, running `f`.
fn ranks<T: Send>(
    world: usize,
    timeout: Duration,
    f: impl Fn(TcpComm) -> T + Sync,
) -> Vec<Result<T, RuntimeError>> {
    let port = free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let f = &f;
                s.spawn(move || connect_at("127.0.0.1", port, r, world, timeout).map(f))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::Profile {
                        message: "a rank panicked".into(),
                    })
                })
            })
            .collect()
    })
}

#[test]
fn three_ranks_over_tcp_pass_the_conformance_suite_and_so_do_their_groups() {
    let outs = ranks(3, Duration::from_secs(20), |c| {
        check_all(&c, &[0, 1, 7, 1000, 70_000]).map_err(|e| e.to_string())?;
        // A group of two in reverse order (its rank 0 is world rank 2), made twice: two
        // groups with their own messages; world rank 1 takes no part.
        if c.rank() != 1 {
            for _ in 0..2 {
                let g = c.group(&[2, 0]).map_err(|e| e.to_string())?;
                assert_eq!(g.world_ranks(), [2, 0]);
                check_all(&g, &[3, 64]).map_err(|e| e.to_string())?;
            }
        }
        c.barrier().map_err(|e| e.to_string())
    });
    for (r, o) in outs.into_iter().enumerate() {
        assert!(matches!(o, Ok(Ok(()))), "rank {r}: {o:?}");
    }
}

#[test]
fn one_rank_needs_no_network() {
    let c =
        connect_at("127.0.0.1", 1, 0, 1, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
    check_all(&c, &[0, 5]).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_rank_that_never_arrives_is_named() {
    // Rank 1 of 2 is never started: rank 0 gives up at its deadline naming it.
    let port = free_port();
    let got = connect_at("127.0.0.1", port, 0, 2, Duration::from_millis(300));
    match got {
        Err(RuntimeError::Timeout {
            op: "connect",
            missing,
            ..
        }) => assert_eq!(missing, [1]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_peer_that_does_not_answer_is_named_and_the_world_is_poisoned() {
    let outs = ranks(2, Duration::from_secs(10), |mut c| {
        if c.rank() == 1 {
            // Takes no part; holds its end open past rank 0's deadline.
            std::thread::sleep(Duration::from_millis(600));
            return None;
        }
        c.set_timeout(Duration::from_millis(200));
        let first = c.all_reduce_sum(&mut [1.0]);
        let after = c.barrier();
        Some((first, after))
    });
    let mut outs = outs.into_iter();
    match outs.next() {
        Some(Ok(Some((
            Err(RuntimeError::Timeout { missing, .. }),
            Err(RuntimeError::Poisoned { .. }),
        )))) => {
            assert_eq!(missing, [1]);
        }
        other => panic!("{other:?}"),
    }
}
