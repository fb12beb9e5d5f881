//! `TcpComm`: ranks as processes connected over TCP, for runs a launcher starts without MPI
//! (torchrun, `srun`): every pair of ranks holds one connection, set up through rank 0 at the
//! launch's master address (`setup`). Collectives gather to the group's first rank, which sums
//! in group-rank order and sends the result back, so every rank gets the bits a sequential sum
//! gives (the module contract of [`super`]); all-to-all and tagged messages go straight to
//! their peer. Every receive has the communicator's deadline, and a rank that does not answer
//! in time is named ([`RuntimeError::Timeout`]); after a failure every group of the world is
//! poisoned.

mod link;
mod setup;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::reduce::sum_in_rank_order;
use super::{
    Communicator, DEFAULT_TIMEOUT, MAX_TAG, check_group, check_len, check_rank, check_tag,
};
use crate::RuntimeError;
use link::{Link, RecvError};

pub use setup::{connect, connect_at};

/// Tags of the collectives' own messages, past every user tag.
const TAG_REDUCE: u32 = MAX_TAG + 1;
const TAG_RESULT: u32 = MAX_TAG + 2;
const TAG_ALL_TO_ALL: u32 = MAX_TAG + 3;
const TAG_BROADCAST: u32 = MAX_TAG + 4;

/// The world's connections, shared by every group made from it.
#[derive(Debug)]
struct Net {
    /// One link per world rank (`Local` for `me`).
    links: Vec<Link>,
    /// Why the world stopped, after a timeout or a broken link.
    poisoned: Mutex<Option<String>>,
}

/// One rank's handle on a group of processes connected over TCP.
#[derive(Debug)]
pub struct TcpComm {
    net: Arc<Net>,
    /// The group's members as world ranks, in group-rank order.
    ranks: Vec<usize>,
    /// This rank's index in `ranks`.
    rank: usize,
    /// The group's id on the wire (the world's is 0).
    id: u64,
    timeout: Duration,
    /// Groups made from this one, by member list: how many (a list made twice is two groups).
    made: Mutex<HashMap<Vec<usize>, u64>>,
}

impl TcpComm {
    fn world(me: usize, links: Vec<Link>) -> TcpComm {
        let size = links.len();
        TcpComm {
            net: Arc::new(Net {
                links,
                poisoned: Mutex::new(None),
            }),
            ranks: (0..size).collect(),
            rank: me,
            id: 0,
            timeout: DEFAULT_TIMEOUT,
            made: Mutex::new(HashMap::new()),
        }
    }

    fn check_poison(&self, op: &'static str) -> Result<(), RuntimeError> {
        let reason = self.net.poisoned.lock().ok().and_then(|p| p.clone());
        match reason {
            Some(reason) => Err(RuntimeError::Poisoned { op, reason }),
            None => Ok(()),
        }
    }

    fn poison(&self, why: String) {
        if let Ok(mut p) = self.net.poisoned.lock() {
            p.get_or_insert(why);
        }
    }

    fn send_to(
        &self,
        op: &'static str,
        to: usize,
        tag: u32,
        data: &[f32],
    ) -> Result<(), RuntimeError> {
        let world = self.ranks[to];
        self.net.links[world]
            .send(self.id, tag, data)
            .map_err(|reason| {
                let reason = format!("world rank {world}: {reason}");
                self.poison(reason.clone());
                RuntimeError::Poisoned { op, reason }
            })
    }

    fn recv_from(
        &self,
        op: &'static str,
        from: usize,
        tag: u32,
        started: Instant,
    ) -> Result<Vec<f32>, RuntimeError> {
        let world = self.ranks[from];
        let deadline = started + self.timeout;
        self.net.links[world]
            .recv(self.id, tag, deadline)
            .map_err(|e| {
                let err = match e {
                    RecvError::TimedOut => RuntimeError::Timeout {
                        op,
                        rank: self.rank,
                        group: self.ranks.clone(),
                        missing: vec![from],
                        after: started.elapsed(),
                    },
                    RecvError::Closed(why) => RuntimeError::Poisoned {
                        op,
                        reason: format!("the connection to world rank {world} broke: {why}"),
                    },
                };
                self.poison(err.to_string());
                err
            })
    }

    /// A received message of the length the operation expects.
    fn recv_len(
        &self,
        op: &'static str,
        from: usize,
        tag: u32,
        len: usize,
        started: Instant,
    ) -> Result<Vec<f32>, RuntimeError> {
        let m = self.recv_from(op, from, tag, started)?;
        check_len(op, "received buffer", m.len(), len)?;
        Ok(m)
    }

    /// Every rank's `mine` at the group's first rank, combined there by `combine` (given the
    /// parts in group-rank order), the result sent back to all: the rooted pattern of the
    /// reductions and gathers.
    fn rooted(
        &self,
        op: &'static str,
        mine: &[f32],
        out: &mut [f32],
        combine: impl FnOnce(&[Vec<f32>], &mut [f32]),
    ) -> Result<(), RuntimeError> {
        self.check_poison(op)?;
        let started = Instant::now();
        if self.rank != 0 {
            self.send_to(op, 0, TAG_REDUCE, mine)?;
            let result = self.recv_len(op, 0, TAG_RESULT, out.len(), started)?;
            out.copy_from_slice(&result);
            return Ok(());
        }
        let mut parts = vec![mine.to_vec()];
        for r in 1..self.ranks.len() {
            parts.push(self.recv_len(op, r, TAG_REDUCE, mine.len(), started)?);
        }
        combine(&parts, out);
        for r in 1..self.ranks.len() {
            self.send_to(op, r, TAG_RESULT, out)?;
        }
        Ok(())
    }
}

impl Communicator for TcpComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.ranks.len()
    }

    fn world_ranks(&self) -> &[usize] {
        &self.ranks
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn group(&self, ranks: &[usize]) -> Result<Self, RuntimeError> {
        let rank = check_group(ranks, self.ranks.len(), self.rank)?;
        let nth = {
            let mut made = self.made.lock().map_err(|_| RuntimeError::Poisoned {
                op: "group",
                reason: "a rank panicked".into(),
            })?;
            let n = made.entry(ranks.to_vec()).or_insert(0);
            *n += 1;
            *n
        };
        // Every member names the group alike: its parent, its members and which of the
        // parent's groups of those members it is.
        let mut id = 0xcbf2_9ce4_8422_2325u64 ^ self.id.rotate_left(17);
        for x in ranks.iter().map(|&r| r as u64).chain([u64::MAX, nth]) {
            id = (id ^ x).wrapping_mul(0x0100_0000_01b3);
        }
        Ok(TcpComm {
            net: Arc::clone(&self.net),
            ranks: ranks.iter().map(|&r| self.ranks[r]).collect(),
            rank,
            id: id.max(1),
            timeout: self.timeout,
            made: Mutex::new(HashMap::new()),
        })
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), RuntimeError> {
        let mine = buf.to_vec();
        self.rooted("all_reduce", &mine, buf, |parts, out| {
            sum_in_rank_order(parts, out);
        })
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        check_len(
            "all_gather",
            "receive buffer",
            recv.len(),
            send.len() * self.size(),
        )?;
        self.rooted("all_gather", send, recv, |parts, out| {
            out.copy_from_slice(&parts.concat());
        })
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let chunk = super::chunk_len("reduce_scatter", "send buffer", send.len(), self.size())?;
        check_len("reduce_scatter", "receive buffer", recv.len(), chunk)?;
        let mut sum = vec![0.0; send.len()];
        self.rooted("reduce_scatter", send, &mut sum, |parts, out| {
            sum_in_rank_order(parts, out);
        })?;
        recv.copy_from_slice(&sum[self.rank * chunk..(self.rank + 1) * chunk]);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), RuntimeError> {
        check_rank("broadcast", root, self.size())?;
        self.check_poison("broadcast")?;
        if self.rank == root {
            for r in (0..self.size()).filter(|&r| r != root) {
                self.send_to("broadcast", r, TAG_BROADCAST, buf)?;
            }
            return Ok(());
        }
        let m = self.recv_len("broadcast", root, TAG_BROADCAST, buf.len(), Instant::now())?;
        buf.copy_from_slice(&m);
        Ok(())
    }

    fn all_to_all(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let n = self.size();
        let chunk = super::chunk_len("all_to_all", "send buffer", send.len(), n)?;
        check_len("all_to_all", "receive buffer", recv.len(), send.len())?;
        self.check_poison("all_to_all")?;
        let started = Instant::now();
        for r in (0..n).filter(|&r| r != self.rank) {
            self.send_to(
                "all_to_all",
                r,
                TAG_ALL_TO_ALL,
                &send[r * chunk..(r + 1) * chunk],
            )?;
        }
        let me = self.rank;
        recv[me * chunk..(me + 1) * chunk].copy_from_slice(&send[me * chunk..(me + 1) * chunk]);
        for r in (0..n).filter(|&r| r != me) {
            let m = self.recv_len("all_to_all", r, TAG_ALL_TO_ALL, chunk, started)?;
            recv[r * chunk..(r + 1) * chunk].copy_from_slice(&m);
        }
        Ok(())
    }

    fn send(&self, buf: &[f32], dest: usize, tag: u32) -> Result<(), RuntimeError> {
        check_rank("send", dest, self.size())?;
        check_tag("send", tag)?;
        self.check_poison("send")?;
        self.send_to("send", dest, tag, buf)
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<(), RuntimeError> {
        check_rank("recv", src, self.size())?;
        check_tag("recv", tag)?;
        self.check_poison("recv")?;
        let m = self.recv_len("recv", src, tag, buf.len(), Instant::now())?;
        buf.copy_from_slice(&m);
        Ok(())
    }

    fn barrier(&self) -> Result<(), RuntimeError> {
        self.all_reduce_sum(&mut [0.0])
    }
}

#[cfg(test)]
mod tests;
