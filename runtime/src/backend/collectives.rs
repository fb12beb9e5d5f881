//! Collectives on a backend's own buffers: NCCL on CUDA buffers, so that a step's tensor- and
//! data-parallel reductions never stage through host memory. The executor asks its backend
//! ([`crate::Backend::device_collective`]) first and stages through the host
//! ([`crate::Communicator`] on host slices) only where the backend has no device path.
//!
//! The primitives are flat: the executor arranges layouts (axis pieces, padding) on the device
//! with the backend's own ops.

use crate::{Communicator, RuntimeError};

/// A flat collective over a group's members, one buffer in and one out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceCollective {
    /// The element-wise sum; as many elements out as in.
    AllReduce,
    /// Every member's buffer, concatenated in rank order: `size` times the elements.
    AllGather,
    /// Piece `rank` of the element-wise sum (the input's elements a multiple of `size`).
    ReduceScatter,
    /// Piece `j` of the input to member `j`; piece `i` of the output from member `i` (as many
    /// elements out as in, a multiple of `size`).
    AllToAll,
}

impl DeviceCollective {
    /// The elements out of `len` in over a group of `size`.
    pub fn out_len(self, len: usize, size: usize) -> usize {
        match self {
            DeviceCollective::AllReduce | DeviceCollective::AllToAll => len,
            DeviceCollective::AllGather => len * size,
            DeviceCollective::ReduceScatter => len / size.max(1),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceCollective::AllReduce => "all_reduce",
            DeviceCollective::AllGather => "all_gather",
            DeviceCollective::ReduceScatter => "reduce_scatter",
            DeviceCollective::AllToAll => "all_to_all",
        }
    }
}

/// A device's collectives: runs `op` of `len` elements of `input` into `output` (sized by
/// [`DeviceCollective::out_len`]) over the members of `group`, the rank's host communicator
/// on that group (which opens the device communicator the first time the group is used:
/// every member reaches its first collective at the same instruction).
pub trait Collectives<M>: std::fmt::Debug + Send + Sync {
    fn run(
        &self,
        group: &dyn Communicator,
        op: DeviceCollective,
        input: &M,
        len: usize,
        output: &mut M,
    ) -> Result<(), RuntimeError>;

    /// Opens the device communicator of `group` now (every member calls it together): the
    /// world's, before point-to-point messages, which only two members take part in.
    fn open(&self, group: &dyn Communicator) -> Result<(), RuntimeError>;

    /// One group of point-to-point messages over `world`, as NCCL runs a group: every send
    /// (`buf`, elements, destination) and receive (`buf`, elements, source) of it in flight
    /// together, the group done once all are. Messages between a pair match in issue order
    /// (NCCL has no tags), and a send is done only once its receiver has it: pipeline stages
    /// that each send and then receive must do both in one group (Megatron-LM's batched
    /// send/receive), or both wait on their send.
    fn exchange(
        &self,
        world: &dyn Communicator,
        sends: &[(&M, usize, usize)],
        recvs: &mut [(&mut M, usize, usize)],
    ) -> Result<(), RuntimeError>;

    /// Abandons every device communicator after a device timeout (`backend::watchdog`), so
    /// that collectives stuck waiting for a lost rank stop; later collectives fail or reopen.
    fn abort(&self) {}
}
