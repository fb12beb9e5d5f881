//! NCCL collectives on [`CudaMem`] (feature `cuda`; cudarc loads `libnccl` at run time): the
//! [`Collectives`] of a [`super::CudaBackend`] whose ranks each have their own GPU. One NCCL
//! communicator per host group, opened the first time the group runs a collective: member 0
//! makes NCCL's unique id and the group's host communicator broadcasts it (each byte as an
//! f32), as torch.distributed's store carries it to its process groups; opening therefore
//! fails with the host communicator's timeout, naming the rank that never came.
//!
//! Sums are NCCL's: their order depends on its ring or tree, so a sum's rounding may differ
//! from the threads and MPI communicators' rank-order sums (within f32 rounding, not bit
//! for bit).
//!
//! Not measured yet: no GPU has run this file (issue 15 stays open until one has). NCCL
//! refuses two ranks on one GPU, so `train` attaches it only when each rank of a node has its
//! own GPU; otherwise the collectives stage through the host communicator.

use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use cudarc::nccl::{Comm, Id, ReduceOp};

use super::CudaMem;
use super::collectives::{Collectives, DeviceCollective};
use crate::{Communicator, RuntimeError};

fn nccl_err(op: &'static str) -> impl FnOnce(cudarc::nccl::result::NcclError) -> RuntimeError {
    move |e| RuntimeError::Cuda {
        op,
        message: format!("NCCL: {e:?}"),
    }
}

/// Whether NCCL's library can be loaded (cudarc panics on first use otherwise).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the NCCL library by its candidate names.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::nccl::sys::is_culib_present()
    }
}

/// An NCCL communicator that may move between threads: NCCL allows a communicator to be used
/// from any thread as long as no two calls on it overlap, which [`NcclCollectives`]'s lock
/// ensures.
#[derive(Debug)]
struct SharedComm(Comm);

// SAFETY: see the type's doc; every use of the inner communicator holds `NcclCollectives`'
// mutex.
#[allow(unsafe_code)]
unsafe impl Send for SharedComm {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for SharedComm {}

/// NCCL on one rank's GPU, on its own stream, one communicator per group (keyed by its world
/// ranks).
#[derive(Debug)]
pub struct NcclCollectives {
    stream: Arc<CudaStream>,
    comms: Mutex<HashMap<Vec<usize>, SharedComm>>,
}

impl NcclCollectives {
    /// Collectives on `backend`'s stream: `NoCudaDevice` without the NCCL library.
    pub fn on(backend: &super::CudaBackend) -> Result<NcclCollectives, RuntimeError> {
        if !nccl_present() {
            return Err(RuntimeError::NoCudaDevice {
                reason: "the NCCL library (libnccl.so.2) is not installed".into(),
            });
        }
        // A communication stream of its own: cudarc records each buffer's last write and
        // reads per stream and makes the other stream wait for them, so a collective overlaps
        // the compute that does not touch its buffers (the data-parallel reduction the
        // backward of the layers below), as the cost model assumes.
        let stream = backend
            .device()
            .stream
            .fork()
            .map_err(super::cuda::cuda_err("fork the communication stream"))?;
        Ok(NcclCollectives {
            stream,
            comms: Mutex::default(),
        })
    }

    /// This rank's communicator on `group`: rank 0's unique id broadcast over the group.
    fn open_comm(&self, group: &dyn Communicator) -> Result<Comm, RuntimeError> {
        let mut bytes = vec![0f32; 128];
        if group.rank() == 0 {
            let id = Id::new().map_err(nccl_err("ncclGetUniqueId"))?;
            for (b, &c) in bytes.iter_mut().zip(id.internal()) {
                *b = f32::from(c as u8);
            }
        }
        group.broadcast(&mut bytes, 0)?;
        let mut internal = [0 as c_char; 128];
        for (c, &b) in internal.iter_mut().zip(&bytes) {
            *c = b as u8 as c_char;
        }
        // NCCL initialises on the thread's current context: make it this rank's device.
        self.stream
            .context()
            .bind_to_thread()
            .map_err(super::cuda::cuda_err("bind context"))?;
        Comm::from_rank(
            self.stream.clone(),
            group.rank(),
            group.size(),
            Id::uninit(internal),
        )
        .map_err(nccl_err("ncclCommInitRank"))
    }
}

impl NcclCollectives {
    /// The communicators, locked.
    fn comms(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<Vec<usize>, SharedComm>>, RuntimeError> {
        self.comms.lock().map_err(|_| RuntimeError::Poisoned {
            op: "nccl communicators",
            reason: "a thread panicked while holding them".into(),
        })
    }

    /// Runs `f` on this rank's communicator of `group`, opened first if it is not yet.
    fn with_comm<T>(
        &self,
        group: &dyn Communicator,
        f: impl FnOnce(&Comm) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let mut comms = self.comms()?;
        let key = group.world_ranks().to_vec();
        if !comms.contains_key(&key) {
            let comm = self.open_comm(group)?;
            comms.insert(key.clone(), SharedComm(comm));
        }
        match comms.get(&key) {
            Some(SharedComm(comm)) => f(comm),
            None => Err(RuntimeError::Poisoned {
                op: "nccl communicators",
                reason: "a communicator vanished".into(),
            }),
        }
    }
}

impl Collectives<CudaMem> for NcclCollectives {
    fn run(
        &self,
        group: &dyn Communicator,
        op: DeviceCollective,
        input: &CudaMem,
        len: usize,
        output: &mut CudaMem,
    ) -> Result<(), RuntimeError> {
        self.with_comm(group, |comm| {
            if op == DeviceCollective::AllToAll {
                return all_to_all(comm, input, output, len);
            }
            let src = input.data.slice(..len);
            let mut dst = output.data.slice_mut(..op.out_len(len, group.size()));
            let sum = ReduceOp::Sum;
            let status = match op {
                DeviceCollective::AllReduce => comm
                    .all_reduce(&src, &mut dst, &sum)
                    .map_err(nccl_err("ncclAllReduce")),
                DeviceCollective::AllGather => comm
                    .all_gather(&src, &mut dst)
                    .map_err(nccl_err("ncclAllGather")),
                DeviceCollective::ReduceScatter => comm
                    .reduce_scatter(&src, &mut dst, &sum)
                    .map_err(nccl_err("ncclReduceScatter")),
                // Handled above, as grouped point-to-point pieces.
                DeviceCollective::AllToAll => return Ok(()),
            };
            status.map(|_| ())
        })
    }

    fn open(&self, group: &dyn Communicator) -> Result<(), RuntimeError> {
        self.with_comm(group, |_| Ok(()))
    }

    /// Drops every communicator: cudarc's `Comm` calls `ncclCommAbort` as it drops, which
    /// stops the kernels of collectives still waiting for a peer.
    fn abort(&self) {
        if let Ok(mut comms) = self.comms() {
            comms.clear();
        }
    }

    fn exchange(
        &self,
        world: &dyn Communicator,
        sends: &[(&CudaMem, usize, usize)],
        recvs: &mut [(&mut CudaMem, usize, usize)],
    ) -> Result<(), RuntimeError> {
        self.with_comm(world, |comm| {
            let mut group = comm.group();
            for (buf, len, peer) in sends {
                group
                    .send(buf.data.slice(..*len), *peer as i32)
                    .map_err(nccl_err("ncclSend"))?;
            }
            for (buf, len, peer) in recvs.iter_mut() {
                group
                    .recv(buf.data.slice_mut(..*len), *peer as i32)
                    .map_err(nccl_err("ncclRecv"))?;
            }
            Ok(())
        })
    }
}

/// NCCL has no all-to-all call: point-to-point pieces in `size` rounds, round `k` a group of
/// this rank's send to member `rank + k` and receive from member `rank − k` (every round a
/// permutation of the members, so each group's partner posts the matching pair in the same
/// round and none waits on another's).
fn all_to_all(
    comm: &Comm,
    input: &CudaMem,
    output: &mut CudaMem,
    len: usize,
) -> Result<(), RuntimeError> {
    let (size, rank) = (comm.world_size().max(1), comm.rank());
    let piece = len / size;
    for k in 0..size {
        let (to, from) = ((rank + k) % size, (rank + size - k) % size);
        let send = input.data.slice(to * piece..(to + 1) * piece);
        let recv = output.data.slice_mut(from * piece..(from + 1) * piece);
        let mut group = comm.group();
        group.send(send, to as i32).map_err(nccl_err("ncclSend"))?;
        group
            .recv(recv, from as i32)
            .map_err(nccl_err("ncclRecv"))?;
    }
    Ok(())
}
