//! The MPI communicator (feature `mpi`): one process per rank, launched with
//! `mpirun -np N plait ...` (as root: `mpirun --allow-run-as-root --oversubscribe -np N ...`).
//!
//! Collectives are built on the deadline-checked messages of [`p2p`] rather than MPI's own
//! collectives, which can neither time out nor say who is missing:
//! - `all_gather`, `all_to_all`, `reduce_scatter`: `n − 1` pairwise exchange steps (at step
//!   `s` send to `rank + s`, receive from `rank − s`);
//! - `all_reduce`: a reduce-scatter over `n` near-equal chunks then an all-gather (each rank
//!   sums its chunk in rank order, so the result is bit-identical to the threads
//!   communicator's and to a sequential rank-order sum);
//! - `broadcast`: the root sends to every rank; `barrier`: an empty all-gather.
//!
//! Tagged sends are buffered (they return at once; the message is delivered while this rank
//! waits in a later operation, or when the communicator is dropped), as the threads
//! communicator's are.
//!
//! A rank that stops taking part makes its peers fail with [`RuntimeError::Timeout`] naming it
//! within the deadline. A rank whose process dies is also reported by `mpirun` itself, which
//! by default ends the job.

mod p2p;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use mpi::environment::Universe;
use mpi::topology::{Communicator as _, SimpleCommunicator};

use self::p2p::{Channel, Failure, Outbox};
use super::reduce::sum_in_rank_order;
use super::{
    Communicator, DEFAULT_TIMEOUT, check_group, check_len, check_rank, check_tag, chunk_len,
};
use crate::RuntimeError;

/// The MPI environment of this process: initialise it once, keep it alive while communicating
/// (MPI is finalised when it and every communicator made from it are dropped).
pub struct MpiWorld {
    inner: Rc<Inner>,
}

struct Inner {
    world: SimpleCommunicator,
    /// Finalises MPI when dropped (after `world`).
    _universe: Universe,
    poisoned: RefCell<Option<String>>,
    /// Group tag codes in use → (members, instance).
    codes: RefCell<HashMap<u32, (Vec<usize>, u64)>>,
    /// Members → groups with these members created so far.
    instances: RefCell<HashMap<Vec<usize>, u64>>,
    /// Buffered sends not yet delivered (every group's).
    outbox: Outbox,
    /// How long dropping the world waits to deliver them (the latest deadline set).
    flush_timeout: Cell<Duration>,
}

impl Drop for Inner {
    /// Delivers the buffered sends before MPI is finalised, unless a failure poisoned the
    /// communicator (the receivers then report this rank themselves).
    fn drop(&mut self) {
        let deadline = Instant::now() + self.flush_timeout.get();
        let mut polls = 0;
        while self.poisoned.borrow().is_none()
            && !self.outbox.is_empty()
            && Instant::now() < deadline
            && self.outbox.progress(&self.world).is_ok()
        {
            p2p::pause(&mut polls);
        }
    }
}

impl std::fmt::Debug for MpiWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiWorld")
            .field("rank", &self.inner.world.rank())
            .field("size", &self.inner.world.size())
            .finish()
    }
}

impl MpiWorld {
    /// Initialises MPI; an error if it is already initialised.
    pub fn init() -> Result<MpiWorld, RuntimeError> {
        let universe = mpi::initialize().ok_or(RuntimeError::Mpi {
            op: "init",
            message: "MPI is already initialised in this process".into(),
        })?;
        let world = universe.world();
        Ok(MpiWorld {
            inner: Rc::new(Inner {
                world,
                _universe: universe,
                poisoned: RefCell::new(None),
                codes: RefCell::new(HashMap::new()),
                instances: RefCell::new(HashMap::new()),
                outbox: Outbox::default(),
                flush_timeout: Cell::new(DEFAULT_TIMEOUT),
            }),
        })
    }

    /// The communicator of all ranks (`MPI_COMM_WORLD`).
    pub fn communicator(&self) -> MpiComm {
        let n = usize::try_from(self.inner.world.size()).unwrap_or(0);
        let rank = usize::try_from(self.inner.world.rank()).unwrap_or(0);
        MpiComm {
            inner: self.inner.clone(),
            members: (0..n).collect(),
            rank,
            code: 0,
            timeout: DEFAULT_TIMEOUT,
            own: RefCell::new(HashMap::new()),
        }
    }

    /// Ends the whole job (every rank) with `code`: for a rank that cannot go on.
    pub fn abort(&self, code: i32) -> ! {
        self.inner.world.abort(code)
    }
}

/// One rank's handle on a group of MPI processes.
pub struct MpiComm {
    inner: Rc<Inner>,
    members: Vec<usize>,
    rank: usize,
    code: u32,
    timeout: Duration,
    /// Messages this rank sent to itself, by tag.
    own: RefCell<HashMap<u32, VecDeque<Vec<f32>>>>,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("members", &self.members)
            .field("rank", &self.rank)
            .field("code", &self.code)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Operation codes carried in ready tokens, so that mismatched calls are reported.
fn op_code(op: &str) -> u64 {
    op.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

impl MpiComm {
    fn world_rank_of(&self, r: usize) -> i32 {
        self.members
            .get(r)
            .and_then(|&w| i32::try_from(w).ok())
            .unwrap_or(-1)
    }

    fn group_rank_of(&self, world: i32) -> usize {
        self.members
            .iter()
            .position(|&w| i32::try_from(w).ok() == Some(world))
            .unwrap_or(usize::MAX)
    }

    fn check_alive(&self, op: &'static str) -> Result<(), RuntimeError> {
        match &*self.inner.poisoned.borrow() {
            Some(reason) => Err(RuntimeError::Poisoned {
                op,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Turns a message failure into the error, poisoning the communicator.
    fn fail(&self, op: &'static str, peer: i32, f: Failure, start: Instant) -> RuntimeError {
        let err = match f {
            Failure::TimedOut => RuntimeError::Timeout {
                op,
                rank: self.rank,
                group: self.members.clone(),
                missing: vec![self.group_rank_of(peer)],
                after: start.elapsed(),
            },
            Failure::Disagree {
                my_len,
                my_op,
                peer_len,
                peer_op,
            } => RuntimeError::Mismatch {
                op,
                rank: self.rank,
                detail: format!(
                    "world rank {peer} expects {peer_len} elements{} where this rank sends {my_len}",
                    if peer_op == my_op {
                        ""
                    } else {
                        " in a different operation"
                    }
                ),
            },
        };
        let mut poisoned = self.inner.poisoned.borrow_mut();
        if poisoned.is_none() {
            *poisoned = Some(err.to_string());
        }
        err
    }

    /// One collective step: send `out` to group rank `dest` while receiving group rank
    /// `src`'s message into `buf`.
    fn step(
        &self,
        op: &'static str,
        out: Option<(usize, &[f32])>,
        src: usize,
        buf: &mut [f32],
        (start, deadline): (Instant, Instant),
    ) -> Result<(), RuntimeError> {
        let tags = p2p::tags(self.code, Channel::Collective);
        let out = out.map(|(d, data)| (self.world_rank_of(d), data));
        p2p::exchange(
            &self.inner.world,
            &self.inner.outbox,
            tags,
            op_code(op),
            out,
            (self.world_rank_of(src), buf),
            deadline,
        )
        .map_err(|(peer, f)| self.fail(op, peer, f, start))
    }

    fn clock(&self) -> (Instant, Instant) {
        let start = Instant::now();
        (start, start + self.timeout)
    }

    /// Pairwise exchange of variable-size chunks: `send(dest)` goes to each other rank,
    /// `recv(src)` receives each other rank's chunk for this rank.
    fn pairwise<'s>(
        &self,
        op: &'static str,
        send: impl Fn(usize) -> &'s [f32],
        mut recv: impl FnMut(usize) -> &'s mut [f32],
    ) -> Result<(), RuntimeError> {
        let n = self.size();
        let clock = self.clock();
        for s in 1..n {
            let (dest, src) = ((self.rank + s) % n, (self.rank + n - s) % n);
            self.step(op, Some((dest, send(dest))), src, recv(src), clock)?;
        }
        Ok(())
    }
}

/// Boundaries of `n` near-equal chunks of `len` elements.
fn bounds(len: usize, n: usize) -> Vec<usize> {
    (0..=n).map(|j| len * j / n.max(1)).collect()
}

impl Communicator for MpiComm {
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
        self.inner.flush_timeout.set(timeout);
    }

    fn group(&self, ranks: &[usize]) -> Result<MpiComm, RuntimeError> {
        let rank = check_group(ranks, self.size(), self.rank)?;
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let instance = {
            let mut inst = self.inner.instances.borrow_mut();
            let count = inst.entry(members.clone()).or_insert(0);
            *count += 1;
            *count - 1
        };
        let hash = members
            .iter()
            .chain(std::iter::once(&(instance as usize)))
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
                (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
            });
        let code = (hash % 8191) as u32 + 1;
        let mut codes = self.inner.codes.borrow_mut();
        match codes.get(&code) {
            Some(used) if *used != (members.clone(), instance) => {
                return Err(RuntimeError::BadGroup {
                    ranks: ranks.to_vec(),
                    size: self.size(),
                    reason: format!(
                        "its message tags collide with those of group {:?}; create the groups in another order",
                        used.0
                    ),
                });
            }
            _ => {
                codes.insert(code, (members.clone(), instance));
            }
        }
        Ok(MpiComm {
            inner: self.inner.clone(),
            members,
            rank,
            code,
            timeout: self.timeout,
            own: RefCell::new(HashMap::new()),
        })
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), RuntimeError> {
        let op = "all_reduce";
        self.check_alive(op)?;
        let n = self.size();
        let b = bounds(buf.len(), n);
        let me = self.rank;
        // Reduce-scatter: collect every rank's copy of chunk `me`, sum in rank order.
        let mut parts: Vec<Vec<f32>> = (0..n).map(|_| vec![0.0; b[me + 1] - b[me]]).collect();
        parts[me].copy_from_slice(&buf[b[me]..b[me + 1]]);
        {
            let send = &*buf;
            let clock = self.clock();
            for s in 1..n {
                let (dest, src) = ((me + s) % n, (me + n - s) % n);
                let out = &send[b[dest]..b[dest + 1]];
                self.step(op, Some((dest, out)), src, &mut parts[src], clock)?;
            }
        }
        let mut mine = vec![0.0; b[me + 1] - b[me]];
        sum_in_rank_order(&parts, &mut mine);
        // All-gather the summed chunks.
        buf[b[me]..b[me + 1]].copy_from_slice(&mine);
        let mut gathered: Vec<Vec<f32>> = (0..n).map(|j| vec![0.0; b[j + 1] - b[j]]).collect();
        let clock = self.clock();
        for s in 1..n {
            let (dest, src) = ((me + s) % n, (me + n - s) % n);
            self.step(op, Some((dest, &mine)), src, &mut gathered[src], clock)?;
        }
        for (j, g) in gathered.iter().enumerate() {
            if j != me {
                buf[b[j]..b[j + 1]].copy_from_slice(g);
            }
        }
        Ok(())
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let op = "all_gather";
        self.check_alive(op)?;
        let (n, len) = (self.size(), send.len());
        check_len(op, "recv", recv.len(), len * n)?;
        recv[self.rank * len..(self.rank + 1) * len].copy_from_slice(send);
        let mut slots: Vec<Option<&mut [f32]>> = if len == 0 {
            (0..n).map(|_| Some(&mut [][..])).collect()
        } else {
            recv.chunks_mut(len).map(Some).collect()
        };
        self.pairwise(op, |_| send, |src| slots[src].take().unwrap_or(&mut []))
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let op = "reduce_scatter";
        self.check_alive(op)?;
        let (n, len, me) = (self.size(), recv.len(), self.rank);
        check_len(op, "send", send.len(), len * n)?;
        let mut parts: Vec<Vec<f32>> = (0..n).map(|_| vec![0.0; len]).collect();
        parts[me].copy_from_slice(&send[me * len..(me + 1) * len]);
        {
            let mut slots: Vec<Option<&mut [f32]>> =
                parts.iter_mut().map(|p| Some(p.as_mut_slice())).collect();
            self.pairwise(
                op,
                |dest| &send[dest * len..(dest + 1) * len],
                |src| slots[src].take().unwrap_or(&mut []),
            )?;
        }
        sum_in_rank_order(&parts, recv);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), RuntimeError> {
        let op = "broadcast";
        self.check_alive(op)?;
        check_rank(op, root, self.size())?;
        let (start, deadline) = self.clock();
        let tags = p2p::tags(self.code, Channel::Collective);
        if self.rank == root {
            for r in (0..self.size()).filter(|&r| r != root) {
                let peer = self.world_rank_of(r);
                let world = &self.inner.world;
                p2p::send(
                    world,
                    &self.inner.outbox,
                    peer,
                    tags,
                    op_code(op),
                    buf,
                    deadline,
                )
                .map_err(|(peer, f)| self.fail(op, peer, f, start))?;
            }
            Ok(())
        } else {
            self.step(op, None, root, buf, (start, deadline))
        }
    }

    fn all_to_all(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError> {
        let op = "all_to_all";
        self.check_alive(op)?;
        check_len(op, "recv", recv.len(), send.len())?;
        let (n, me) = (self.size(), self.rank);
        let chunk = chunk_len(op, "send", send.len(), n)?;
        recv[me * chunk..(me + 1) * chunk].copy_from_slice(&send[me * chunk..(me + 1) * chunk]);
        let mut slots: Vec<Option<&mut [f32]>> = if chunk == 0 {
            (0..n).map(|_| Some(&mut [][..])).collect()
        } else {
            recv.chunks_mut(chunk).map(Some).collect()
        };
        self.pairwise(
            op,
            |dest| &send[dest * chunk..(dest + 1) * chunk],
            |src| slots[src].take().unwrap_or(&mut []),
        )
    }

    fn send(&self, buf: &[f32], dest: usize, tag: u32) -> Result<(), RuntimeError> {
        let op = "send";
        self.check_alive(op)?;
        check_rank(op, dest, self.size())?;
        check_tag(op, tag)?;
        if dest == self.rank {
            self.own
                .borrow_mut()
                .entry(tag)
                .or_default()
                .push_back(buf.to_vec());
            return Ok(());
        }
        let peer = self.world_rank_of(dest);
        let tags = p2p::tags(self.code, Channel::User(tag));
        let outbox = &self.inner.outbox;
        outbox.push(peer, tags, op_code("p2p"), buf.to_vec());
        outbox
            .progress(&self.inner.world)
            .map_err(|(peer, f)| self.fail(op, peer, f, Instant::now()))
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<(), RuntimeError> {
        let op = "recv";
        self.check_alive(op)?;
        check_rank(op, src, self.size())?;
        check_tag(op, tag)?;
        if src == self.rank {
            let msg = self
                .own
                .borrow_mut()
                .get_mut(&tag)
                .and_then(VecDeque::pop_front);
            let Some(msg) = msg else {
                return Err(self.fail(
                    op,
                    self.world_rank_of(src),
                    Failure::TimedOut,
                    Instant::now(),
                ));
            };
            check_len(op, "message", msg.len(), buf.len())?;
            buf.copy_from_slice(&msg);
            return Ok(());
        }
        let (start, deadline) = self.clock();
        let tags = p2p::tags(self.code, Channel::User(tag));
        p2p::exchange(
            &self.inner.world,
            &self.inner.outbox,
            tags,
            op_code("p2p"),
            None,
            (self.world_rank_of(src), buf),
            deadline,
        )
        .map_err(|(peer, f)| self.fail(op, peer, f, start))
    }

    fn barrier(&self) -> Result<(), RuntimeError> {
        let op = "barrier";
        self.check_alive(op)?;
        self.pairwise(op, |_| &[], |_| &mut [])
    }
}
