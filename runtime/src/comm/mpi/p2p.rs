//! Point-to-point messages with deadlines over MPI, the building block of every MPI
//! collective.
//!
//! MPI's own blocking calls cannot time out, and a pending nonblocking send cannot be
//! abandoned safely, so every message follows a receiver-first handshake:
//!
//! 1. the receiver posts a nonblocking receive into its buffer, then sends a tiny *ready*
//!    token `[length, op]` to the sender (eager: it never blocks);
//! 2. the sender polls (`MPI_Improbe`) for that token until its deadline, checks that the
//!    lengths and operations agree, then sends the data with a blocking send, which completes
//!    because the matching receive is already posted;
//! 3. the receiver polls its receive (`MPI_Test`) until its deadline; on timeout it cancels
//!    the receive (receives can always be cancelled) and reports the sender.
//!
//! A peer that never arrives is thus named by whoever waits for it, within the deadline, and
//! no request outlives its call.
//!
//! **Buffered user sends.** A user `send` must not wait for its receiver (the executor's
//! programs assume buffered sends: in 1F1B both pipeline neighbours send before they
//! receive). It copies the data into the [`Outbox`] and returns; every wait loop of this
//! process (and dropping the communicator) calls [`Outbox::progress`], which answers the ready
//! tokens that have arrived for queued messages, oldest first per peer and tag. (One race is left: a receiver that times out just after its
//! token was consumed leaves the sender's blocking send waiting; the receiver's error still
//! names the sender and a timed-out communicator is dead anyway.)
//!
//! **Tags.** `tag = code << 17 | kind << 15 | user`: `code` (13 bits, non-zero for subgroups)
//! identifies the group, `kind` tells user data, user tokens, collective data and collective
//! tokens apart, `user` is the user's tag (15 bits). The largest tag, 2³⁰ − 1, is within
//! Open MPI's and MPICH's `MPI_TAG_UB` (2³¹ − 1).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Communicator as _, SimpleCommunicator};

/// What a message carries, which picks its tag pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Channel {
    User(u32),
    Collective,
}

pub(super) fn tags(code: u32, channel: Channel) -> (i32, i32) {
    let (data_kind, user) = match channel {
        Channel::User(t) => (0u32, t),
        Channel::Collective => (2u32, 0),
    };
    let data = (code << 17) | (data_kind << 15) | user;
    let ready = (code << 17) | ((data_kind + 1) << 15) | user;
    (data as i32, ready as i32)
}

/// Why a message did not go through.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Failure {
    /// The peer (a world rank) did not arrive before the deadline.
    TimedOut,
    /// The peer is in a different operation or expects a different length.
    Disagree {
        my_len: usize,
        my_op: u64,
        peer_len: usize,
        peer_op: u64,
    },
}

/// Waits a little between polls: spin briefly, then yield, then sleep (ranks may share cores).
pub(super) fn pause(polls: &mut u32) {
    *polls += 1;
    if *polls < 64 {
        std::hint::spin_loop();
    } else if *polls < 4096 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// A message queued by a buffered send.
#[derive(Debug)]
struct Queued {
    peer: i32,
    tags: (i32, i32),
    op: u64,
    data: Vec<f32>,
}

/// Buffered sends not yet delivered, oldest first.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    queue: RefCell<VecDeque<Queued>>,
}

impl Outbox {
    /// Queues `data` for `peer` (a world rank).
    pub(super) fn push(&self, peer: i32, tags: (i32, i32), op: u64, data: Vec<f32>) {
        self.queue.borrow_mut().push_back(Queued {
            peer,
            tags,
            op,
            data,
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.borrow().is_empty()
    }

    /// Delivers every queued message whose receiver is ready (the oldest one per peer and tag:
    /// MPI keeps the order of messages with the same source and tag); never waits. An error
    /// names the peer whose receive disagrees (the message is dropped).
    pub(super) fn progress(&self, world: &SimpleCommunicator) -> Result<(), (i32, Failure)> {
        let mut queue = self.queue.borrow_mut();
        let mut seen: Vec<(i32, i32)> = Vec::new();
        let mut i = 0;
        while i < queue.len() {
            let m = &queue[i];
            if seen.contains(&(m.peer, m.tags.0)) {
                i += 1;
                continue;
            }
            seen.push((m.peer, m.tags.0));
            let p = world.process_at_rank(m.peer);
            match ready(&p, m.tags, m.op, &m.data) {
                None => i += 1,
                Some(Ok(())) => {
                    queue.remove(i);
                }
                Some(Err(f)) => {
                    let peer = m.peer;
                    queue.remove(i);
                    return Err((peer, f));
                }
            }
        }
        Ok(())
    }
}

/// If `p`'s ready token for `tags` has arrived: checks it and sends `data` (`None`: not yet).
fn ready(
    p: &mpi::topology::Process<'_>,
    (data_tag, ready_tag): (i32, i32),
    op: u64,
    data: &[f32],
) -> Option<Result<(), Failure>> {
    let (msg, _) = p.immediate_matched_probe_with_tag(ready_tag)?;
    let mut token = [0u64; 2];
    msg.matched_receive_into(&mut token[..]);
    let (peer_len, peer_op) = (usize::try_from(token[0]).unwrap_or(usize::MAX), token[1]);
    if peer_len != data.len() || peer_op != op {
        return Some(Err(Failure::Disagree {
            my_len: data.len(),
            my_op: op,
            peer_len,
            peer_op,
        }));
    }
    // Completes: the receive is posted before the token is sent.
    p.send_with_tag(data, data_tag);
    Some(Ok(()))
}

/// Waits for `peer`'s ready token and sends `data` to it, delivering queued messages while it
/// waits.
pub(super) fn send(
    world: &SimpleCommunicator,
    outbox: &Outbox,
    peer: i32,
    tags: (i32, i32),
    op: u64,
    data: &[f32],
    deadline: Instant,
) -> Result<(), (i32, Failure)> {
    let p = world.process_at_rank(peer);
    let mut polls = 0;
    loop {
        if let Some(r) = ready(&p, tags, op, data) {
            return r.map_err(|f| (peer, f));
        }
        outbox.progress(world)?;
        if Instant::now() >= deadline {
            return Err((peer, Failure::TimedOut));
        }
        pause(&mut polls);
    }
}

/// Receives into `buf` from `src` while also sending `out` to `dest` (`None`: receive only):
/// the receive is posted and announced first, so that ranks exchanging in a cycle never wait
/// on each other.
pub(super) fn exchange(
    world: &SimpleCommunicator,
    outbox: &Outbox,
    tags: (i32, i32),
    op: u64,
    out: Option<(i32, &[f32])>,
    (src, buf): (i32, &mut [f32]),
    deadline: Instant,
) -> Result<(), (i32, Failure)> {
    let (data_tag, ready_tag) = tags;
    let src_p = world.process_at_rank(src);
    let token = [buf.len() as u64, op];
    mpi::request::scope(|scope| {
        let mut req = src_p.immediate_receive_into_with_tag(scope, buf, data_tag);
        src_p.send_with_tag(&token[..], ready_tag);
        if let Some((dest, data)) = out
            && let Err(e) = send(world, outbox, dest, tags, op, data, deadline)
        {
            req.cancel();
            req.wait_without_status();
            return Err(e);
        }
        let mut polls = 0;
        loop {
            match req.test() {
                Ok(_) => return Ok(()),
                Err(pending) => req = pending,
            }
            if let Err(e) = outbox.progress(world) {
                req.cancel();
                req.wait_without_status();
                return Err(e);
            }
            if Instant::now() >= deadline {
                req.cancel();
                req.wait_without_status();
                return Err((src, Failure::TimedOut));
            }
            pause(&mut polls);
        }
    })
}
