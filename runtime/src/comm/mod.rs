//! Communicators: the collectives and point-to-point messages between ranks.
//!
//! [`Communicator`] is one rank's handle on a group. Every operation has a deadline (the
//! communicator's [`Communicator::timeout`], [`DEFAULT_TIMEOUT`] unless set): a rank that does
//! not arrive makes the others fail with [`RuntimeError::Timeout`] naming it, never a silent
//! hang. After a timeout or a mismatch the communicator (and every group made from it) is
//! unusable: later calls fail with [`RuntimeError::Poisoned`].
//!
//! **Reduction order.** Sums add the ranks' contributions in group-rank order, element by
//! element: `((x₀ + x₁) + x₂) + …` in f32, starting from rank 0's value. Every rank gets the
//! same bits, on every run, and the same bits as one process summing the contributions in
//! that order; the threads and MPI communicators agree.
//!
//! **Layouts.** `all_gather` and `all_to_all` concatenate per-rank chunks in group-rank order;
//! `reduce_scatter` gives group rank `r` the `r`-th equal chunk of the sum.
//!
//! **Groups.** [`Communicator::group`] makes a subgroup from a list of this communicator's
//! ranks (group rank `i` is `ranks[i]`). It exchanges no messages: every member must create
//! the same groups with the same lists in the same order, and non-members do not take part.
//!
//! Implementations: [`ThreadComm`] (ranks are threads of one process, shared memory),
//! [`TcpComm`] (one process per rank, connected over TCP: launches without MPI, such as
//! torchrun's) and, behind the `mpi` feature, `MpiComm` (one process per rank under `mpirun`). [`rendezvous`]
//! carries rank 0's NCCL id to every rank of a torchrun launch.

pub mod conformance;
mod counted;
#[cfg(feature = "mpi")]
pub mod mpi;
pub(crate) mod reduce;
pub mod rendezvous;
pub mod tcp;
mod threads;

use std::time::Duration;

use crate::RuntimeError;

pub use counted::Counted;
pub use tcp::TcpComm;
pub use threads::ThreadComm;

/// The deadline of every communicator operation unless set otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest user tag for [`Communicator::send`] / [`Communicator::recv`].
pub const MAX_TAG: u32 = (1 << 15) - 1;

/// One rank's handle on a group of ranks.
pub trait Communicator: std::fmt::Debug {
    /// This rank's index in the group, `0..size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the group.
    fn size(&self) -> usize;

    /// The group's members as world ranks, in group-rank order.
    fn world_ranks(&self) -> &[usize];

    /// The deadline of each operation.
    fn timeout(&self) -> Duration;

    /// Sets the deadline of each later operation (groups created afterwards inherit it).
    fn set_timeout(&mut self, timeout: Duration);

    /// A subgroup of `ranks` (ranks of this group; the caller must be one of them).
    fn group(&self, ranks: &[usize]) -> Result<Self, RuntimeError>
    where
        Self: Sized;

    /// Element-wise sum over the group, in place, in rank order (see the module doc).
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), RuntimeError>;

    /// `recv` = every rank's `send`, concatenated in rank order (`recv.len() = size · send.len()`).
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError>;

    /// `recv` = chunk `rank` of the rank-order sum of every rank's `send`
    /// (`send.len() = size · recv.len()`).
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError>;

    /// Copies `root`'s `buf` into every rank's `buf`.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), RuntimeError>;

    /// Chunk `j` of `send` goes to rank `j`; chunk `i` of `recv` comes from rank `i`
    /// (`send.len() = recv.len()`, a multiple of `size`).
    fn all_to_all(&self, send: &[f32], recv: &mut [f32]) -> Result<(), RuntimeError>;

    /// Sends `buf` to rank `dest` with `tag` (`0..=MAX_TAG`); messages with the same source,
    /// destination and tag arrive in order. Buffered: returns once the data is copied, without
    /// waiting for the receive (MPI delivers it while this rank waits in a later operation, or
    /// when the communicator is dropped).
    fn send(&self, buf: &[f32], dest: usize, tag: u32) -> Result<(), RuntimeError>;

    /// Receives the next message from rank `src` with `tag` into `buf` (its length must match).
    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<(), RuntimeError>;

    /// Returns once every rank of the group has called it.
    fn barrier(&self) -> Result<(), RuntimeError>;
}

/// Checks a subgroup's rank list against a group of `size` in which the caller is `me`;
/// returns the caller's rank in the subgroup.
pub(crate) fn check_group(ranks: &[usize], size: usize, me: usize) -> Result<usize, RuntimeError> {
    let bad = |reason: String| RuntimeError::BadGroup {
        ranks: ranks.to_vec(),
        size,
        reason,
    };
    if ranks.is_empty() {
        return Err(bad("the list is empty".into()));
    }
    for (i, &r) in ranks.iter().enumerate() {
        if r >= size {
            return Err(bad(format!("rank {r} does not exist")));
        }
        if ranks[..i].contains(&r) {
            return Err(bad(format!("rank {r} is listed twice")));
        }
    }
    ranks
        .iter()
        .position(|&r| r == me)
        .ok_or_else(|| bad(format!("the caller (rank {me}) is not a member")))
}

/// Checks `got == want` for a buffer length.
pub(crate) fn check_len(
    op: &'static str,
    what: &'static str,
    got: usize,
    want: usize,
) -> Result<(), RuntimeError> {
    if got == want {
        Ok(())
    } else {
        Err(RuntimeError::BadLength {
            op,
            what,
            got,
            want,
        })
    }
}

/// Checks a peer rank.
pub(crate) fn check_rank(op: &'static str, rank: usize, size: usize) -> Result<(), RuntimeError> {
    if rank < size {
        Ok(())
    } else {
        Err(RuntimeError::BadRank { op, rank, size })
    }
}

/// Checks a user tag.
pub(crate) fn check_tag(op: &'static str, tag: u32) -> Result<(), RuntimeError> {
    if tag <= MAX_TAG {
        Ok(())
    } else {
        Err(RuntimeError::BadTag {
            op,
            tag,
            max: MAX_TAG,
        })
    }
}

/// Checks that a length splits into `size` equal chunks; returns the chunk length.
pub(crate) fn chunk_len(
    op: &'static str,
    what: &'static str,
    len: usize,
    size: usize,
) -> Result<usize, RuntimeError> {
    if size > 0 && len.is_multiple_of(size) {
        Ok(len / size)
    } else {
        Err(RuntimeError::BadLength {
            op,
            what,
            got: len,
            want: len.next_multiple_of(size.max(1)),
        })
    }
}
