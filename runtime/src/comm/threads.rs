//! The threads communicator: ranks are threads of one process, collectives meet in shared
//! memory.
//!
//! Every collective is one *round* on a shared board, keyed by the group and the group's
//! collective counter: each rank deposits a copy of its contribution, waits (on a condition
//! variable, with the deadline) until every rank of the group has deposited, then computes its
//! own result from the contributions in rank order. The last rank to read a round removes it.
//! Point-to-point messages go through per-(group, source, destination, tag) FIFO mailboxes;
//! `send` never blocks.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::reduce::sum_in_rank_order;
use super::{
    Communicator, DEFAULT_TIMEOUT, check_group, check_len, check_rank, check_tag, chunk_len,
};
use crate::RuntimeError;

/// One rank (thread) of a group of threads.
#[derive(Debug)]
pub struct ThreadComm {
    shared: Arc<Shared>,
    /// World ranks of the members, in group-rank order.
    members: Vec<usize>,
    rank: usize,
    /// The group's id on the board.
    id: u64,
    /// Collectives this rank has entered in this group.
    seq: Cell<u64>,
    timeout: Duration,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    rounds: HashMap<(u64, u64), Round>,
    /// (group, source rank, destination rank, tag) → messages in order.
    mail: HashMap<(u64, usize, usize, u32), VecDeque<Vec<f32>>>,
    /// (members, instance) → group id.
    group_ids: HashMap<(Vec<usize>, u64), u64>,
    /// (creating world rank, members) → groups with these members it has created.
    instances: HashMap<(usize, Vec<usize>), u64>,
    /// The first failure; every later operation reports it.
    poisoned: Option<String>,
}

/// What a collective call is: ranks must agree on it.
#[derive(Debug, Clone, PartialEq)]
struct Sig {
    op: &'static str,
    len: usize,
    root: usize,
}

#[derive(Debug)]
struct Round {
    sig: Sig,
    slots: Vec<Option<Arc<Vec<f32>>>>,
    taken: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ThreadComm {
    /// The `n` ranks of a new world, one per thread to be (move each into its thread).
    pub fn world(n: usize) -> Vec<ThreadComm> {
        let shared = Arc::new(Shared::default());
        let members: Vec<usize> = (0..n).collect();
        {
            let mut st = shared.lock();
            st.group_ids.insert((members.clone(), 0), 0);
            // The world is instance 0 of its member list: a subgroup of every rank is another.
            for r in 0..n {
                st.instances.insert((r, members.clone()), 1);
            }
        }
        (0..n)
            .map(|rank| ThreadComm {
                shared: shared.clone(),
                members: members.clone(),
                rank,
                id: 0,
                seq: Cell::new(0),
                timeout: DEFAULT_TIMEOUT,
            })
            .collect()
    }

    /// Runs `f` on `n` ranks, each in its own scoped thread with the given timeout, and
    /// returns their results in rank order. A rank whose thread panicked is reported as
    /// [`RuntimeError::Poisoned`].
    pub fn run<T, F>(n: usize, timeout: Duration, f: F) -> Result<Vec<T>, RuntimeError>
    where
        T: Send,
        F: Fn(ThreadComm) -> T + Sync,
    {
        let comms = ThreadComm::world(n);
        let f = &f;
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut c| {
                    c.set_timeout(timeout);
                    s.spawn(move || f(c))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(rank, h)| {
                    h.join().map_err(|_| RuntimeError::Poisoned {
                        op: "run",
                        reason: format!("the thread of rank {rank} panicked"),
                    })
                })
                .collect()
        })
    }

    fn world_rank(&self) -> usize {
        self.members.get(self.rank).copied().unwrap_or(self.rank)
    }

    fn timeout_error(&self, op: &'static str, missing: Vec<usize>, start: Instant) -> RuntimeError {
        RuntimeError::Timeout {
            op,
            rank: self.rank,
            group: self.members.clone(),
            missing,
            after: start.elapsed(),
        }
    }

    /// Marks the world failed (the first failure wins) and wakes every waiting rank.
    fn poison(&self, st: &mut State, err: &RuntimeError) {
        if st.poisoned.is_none() {
            st.poisoned = Some(err.to_string());
        }
        self.shared.changed.notify_all();
    }

    /// One collective round: deposits `mine`, waits for every rank's contribution and returns
    /// them in rank order.
    fn exchange(&self, sig: Sig, mine: Vec<f32>) -> Result<Vec<Arc<Vec<f32>>>, RuntimeError> {
        let op = sig.op;
        let n = self.members.len();
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let key = (self.id, seq);
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut st = self.shared.lock();
        if let Some(reason) = &st.poisoned {
            return Err(RuntimeError::Poisoned {
                op,
                reason: reason.clone(),
            });
        }
        let round = st.rounds.entry(key).or_insert_with(|| Round {
            sig: sig.clone(),
            slots: vec![None; n],
            taken: 0,
        });
        if round.sig != sig {
            let err = RuntimeError::Mismatch {
                op,
                rank: self.rank,
                detail: format!(
                    "collective #{seq} of group {:?}: this rank called {op} with {} elements \
                     (root {}), another called {} with {} elements (root {})",
                    self.members, sig.len, sig.root, round.sig.op, round.sig.len, round.sig.root
                ),
            };
            self.poison(&mut st, &err);
            return Err(err);
        }
        if let Some(slot) = round.slots.get_mut(self.rank) {
            *slot = Some(Arc::new(mine));
        }
        self.shared.changed.notify_all();
        loop {
            let Some(round) = st.rounds.get_mut(&key) else {
                return Err(RuntimeError::Poisoned {
                    op,
                    reason: "the round disappeared from the board".into(),
                });
            };
            let missing: Vec<usize> = (0..n).filter(|&r| round.slots[r].is_none()).collect();
            if missing.is_empty() {
                let parts: Vec<Arc<Vec<f32>>> = round.slots.iter().flatten().cloned().collect();
                round.taken += 1;
                if round.taken == n {
                    st.rounds.remove(&key);
                }
                return Ok(parts);
            }
            let now = Instant::now();
            if let Some(reason) = &st.poisoned {
                return Err(RuntimeError::Poisoned {
                    op,
                    reason: reason.clone(),
                });
            }
            if now >= deadline {
                let err = self.timeout_error(op, missing, start);
                self.poison(&mut st, &err);
                return Err(err);
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn world_ranks(&self) -> &[usize] {
        &self.members
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn group(&self, ranks: &[usize]) -> Result<ThreadComm, RuntimeError> {
        let rank = check_group(ranks, self.size(), self.rank)?;
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let mut st = self.shared.lock();
        let count = st
            .instances
            .entry((self.world_rank(), members.clone()))
            .or_insert(0);
        let instance = *count;
        *count += 1;
        let next = st.group_ids.len() as u64;
        let id = *st
            .group_ids
            .entry((members.clone(), instance))
            .or_insert(next);
        Ok(ThreadComm {
            shared: self.shared.clone(),
            members,
            rank,
            id,
            seq: Cell::new(0),
            timeout: self.timeout,
        })
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), RuntimeError> {
        let sig = Sig {
            op: "all_reduce",
            len: buf.len(),
            root: 0,
        };
        let parts = self.exchange(sig, buf.to_vec())?;
        let parts: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
        sum_in_rank_order(&parts, buf);
        Ok(())
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let op = "all_gather";
        check_len(op, "recv", recv.len(), send.len() * self.size())?;
        let sig = Sig {
            op,
            len: send.len(),
            root: 0,
        };
        let parts = self.exchange(sig, send.to_vec())?;
        for (dst, p) in recv.chunks_mut(send.len().max(1)).zip(&parts) {
            dst.copy_from_slice(p);
        }
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let op = "reduce_scatter";
        check_len(op, "send", send.len(), recv.len() * self.size())?;
        let sig = Sig {
            op,
            len: recv.len(),
            root: 0,
        };
        let parts = self.exchange(sig, send.to_vec())?;
        let (lo, hi) = (self.rank * recv.len(), (self.rank + 1) * recv.len());
        let mine: Vec<&[f32]> = parts.iter().map(|p| &p[lo..hi]).collect();
        sum_in_rank_order(&mine, recv);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), RuntimeError> {
        let op = "broadcast";
        check_rank(op, root, self.size())?;
        let sig = Sig {
            op,
            len: buf.len(),
            root,
        };
        let mine = if self.rank == root {
            buf.to_vec()
        } else {
            Vec::new()
        };
        let parts = self.exchange(sig, mine)?;
        if self.rank != root {
            buf.copy_from_slice(&parts[root]);
        }
        Ok(())
    }

    fn all_to_all(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let op = "all_to_all";
        check_len(op, "recv", recv.len(), send.len())?;
        let chunk = chunk_len(op, "send", send.len(), self.size())?;
        let sig = Sig {
            op,
            len: send.len(),
            root: 0,
        };
        let parts = self.exchange(sig, send.to_vec())?;
        let (lo, hi) = (self.rank * chunk, (self.rank + 1) * chunk);
        for (dst, p) in recv.chunks_mut(chunk.max(1)).zip(&parts) {
            dst.copy_from_slice(&p[lo..hi]);
        }
        Ok(())
    }

    fn send(&self, buf: &[f32], dest: usize, tag: u32) -> Result<(), RuntimeError> {
        let op = "send";
        check_rank(op, dest, self.size())?;
        check_tag(op, tag)?;
        let mut st = self.shared.lock();
        if let Some(reason) = &st.poisoned {
            return Err(RuntimeError::Poisoned {
                op,
                reason: reason.clone(),
            });
        }
        st.mail
            .entry((self.id, self.rank, dest, tag))
            .or_default()
            .push_back(buf.to_vec());
        self.shared.changed.notify_all();
        Ok(())
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<(), RuntimeError> {
        let op = "recv";
        check_rank(op, src, self.size())?;
        check_tag(op, tag)?;
        let key = (self.id, src, self.rank, tag);
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut st = self.shared.lock();
        loop {
            if let Some(reason) = &st.poisoned {
                return Err(RuntimeError::Poisoned {
                    op,
                    reason: reason.clone(),
                });
            }
            if let Some(msg) = st.mail.get_mut(&key).and_then(VecDeque::pop_front) {
                check_len(op, "message", msg.len(), buf.len())?;
                buf.copy_from_slice(&msg);
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let err = self.timeout_error(op, vec![src], start);
                self.poison(&mut st, &err);
                return Err(err);
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn barrier(&self) -> Result<(), RuntimeError> {
        let sig = Sig {
            op: "barrier",
            len: 0,
            root: 0,
        };
        self.exchange(sig, Vec::new()).map(|_| ())
    }
}
