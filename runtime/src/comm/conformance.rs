//! A conformance suite every [`Communicator`] must pass: each collective against a sequential
//! reference computed locally (every rank can compute every rank's data), bit for bit.
//! The threads tests and the MPI check program (`plait-mpi-check`) both run it.

use super::Communicator;
use super::reduce::sum_in_rank_order;
use crate::RuntimeError;

/// A failed check: what was run and how it differed, or the communicator's error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConformanceError {
    #[error(
        "{check} on rank {rank} of {size}: element {index} is {got}, the reference says {want}"
    )]
    Wrong {
        check: String,
        rank: usize,
        size: usize,
        index: usize,
        got: f32,
        want: f32,
    },
    #[error("{check}: {source}")]
    Comm {
        check: String,
        #[source]
        source: RuntimeError,
    },
}

/// Rank `rank`'s deterministic test data: `len` values with varied magnitudes, so that the
/// order of a sum changes its rounding.
pub fn rank_data(rank: usize, len: usize, seed: u64) -> Vec<f32> {
    let mut s = (rank as u64 + 1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seed.wrapping_mul(0xD1B5_4A32_D192_ED03));
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let unit = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let scale = [1.0f32, 1e-3, 1e3, 0.1][(s & 3) as usize];
            unit * scale
        })
        .collect()
}

fn compare(
    check: &str,
    rank: usize,
    size: usize,
    got: &[f32],
    want: &[f32],
) -> Result<(), ConformanceError> {
    for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.to_bits() != w.to_bits() {
            return Err(ConformanceError::Wrong {
                check: check.into(),
                rank,
                size,
                index,
                got: g,
                want: w,
            });
        }
    }
    Ok(())
}

/// Runs every collective and send/recv on `c` for each buffer length in `lens` and checks the
/// results bit for bit. Every rank of the group must call it with the same `lens`.
pub fn check_all<C: Communicator>(c: &C, lens: &[usize]) -> Result<(), ConformanceError> {
    let (rank, n) = (c.rank(), c.size());
    let comm = |check: &str| {
        let check = check.to_string();
        move |source| ConformanceError::Comm { check, source }
    };
    for (seed, &len) in lens.iter().enumerate() {
        let seed = seed as u64;
        let all: Vec<Vec<f32>> = (0..n).map(|r| rank_data(r, len, seed)).collect();

        let check = format!("all_reduce({len})");
        let mut buf = all[rank].clone();
        c.all_reduce_sum(&mut buf).map_err(comm(&check))?;
        let mut want = vec![0.0; len];
        sum_in_rank_order(&all, &mut want);
        compare(&check, rank, n, &buf, &want)?;

        let check = format!("all_gather({len})");
        let mut got = vec![f32::NAN; len * n];
        c.all_gather(&all[rank], &mut got).map_err(comm(&check))?;
        compare(&check, rank, n, &got, &all.concat())?;

        let check = format!("reduce_scatter({len})");
        let big: Vec<Vec<f32>> = (0..n).map(|r| rank_data(r, len * n, seed + 100)).collect();
        let mut got = vec![f32::NAN; len];
        c.reduce_scatter_sum(&big[rank], &mut got)
            .map_err(comm(&check))?;
        let mine: Vec<&[f32]> = big
            .iter()
            .map(|b| &b[rank * len..(rank + 1) * len])
            .collect();
        let mut want = vec![0.0; len];
        sum_in_rank_order(&mine, &mut want);
        compare(&check, rank, n, &got, &want)?;

        for (root, data) in all.iter().enumerate() {
            let check = format!("broadcast({len}, root {root})");
            let mut buf = if rank == root {
                data.clone()
            } else {
                vec![f32::NAN; len]
            };
            c.broadcast(&mut buf, root).map_err(comm(&check))?;
            compare(&check, rank, n, &buf, data)?;
        }

        let check = format!("all_to_all({len} per pair)");
        let send = &big[rank];
        let mut got = vec![f32::NAN; len * n];
        c.all_to_all(send, &mut got).map_err(comm(&check))?;
        let want: Vec<f32> = (0..n)
            .flat_map(|src| big[src][rank * len..(rank + 1) * len].to_vec())
            .collect();
        compare(&check, rank, n, &got, &want)?;

        // A ring: two tagged messages to the next rank, every rank sending before it receives
        // (sends are buffered) and receiving the second tag first; a single rank sends to
        // itself.
        let check = format!("send/recv({len})");
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let mut got3 = vec![f32::NAN; len];
        let mut got7 = vec![f32::NAN; len];
        let sends = || -> Result<(), RuntimeError> {
            c.send(&big[rank][..len], next, 3)?;
            c.send(&all[rank], next, 7)
        };
        let mut recvs = || -> Result<(), RuntimeError> {
            c.recv(&mut got7, prev, 7)?;
            c.recv(&mut got3, prev, 3)
        };
        sends().map_err(comm(&check))?;
        recvs().map_err(comm(&check))?;
        compare(&check, rank, n, &got3, &big[prev][..len])?;
        compare(&check, rank, n, &got7, &all[prev])?;

        c.barrier().map_err(comm("barrier"))?;
    }
    Ok(())
}
