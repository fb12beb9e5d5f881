//! NCCL collectives on [`CudaBuffer`]s (feature `cuda`; cudarc loads `libnccl` at run time).
//! A launched run's ranks open one communicator: rank 0 makes NCCL's unique id and the
//! [`crate::comm::rendezvous`] carries it to the others at `MASTER_ADDR:MASTER_PORT`, as
//! torchrun's store does; then every collective runs on the device, on the backend's stream.
//!
//! Sums are NCCL's: their order depends on its ring or tree, so a sum's rounding may differ
//! from the threads and MPI communicators' rank-order sums (within f32 rounding, not bit
//! for bit).
//!
//! Not measured yet: no GPU has run this file (issue 15 stays open until one has).

use std::time::Duration;

use cudarc::nccl::{Comm, Id, ReduceOp};

use super::CudaBuffer;
use super::cuda::CudaBackend;
use crate::RuntimeError;
use crate::launch::Launch;

/// One rank's NCCL communicator over a launched run's world.
pub struct NcclComm {
    comm: Comm,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.comm.rank())
            .field("world_size", &self.comm.world_size())
            .finish_non_exhaustive()
    }
}

fn nccl_err(op: &'static str) -> impl FnOnce(cudarc::nccl::result::NcclError) -> RuntimeError {
    move |e| RuntimeError::Cuda {
        op,
        message: format!("NCCL: {e:?}"),
    }
}

/// Whether NCCL's library can be loaded (cudarc panics on first use otherwise).
fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the NCCL library by its candidate names.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::nccl::sys::is_culib_present()
    }
}

impl NcclComm {
    /// Opens this rank's communicator on `backend`'s device: rank 0's id shared over the
    /// rendezvous within `timeout`.
    pub fn init(
        backend: &CudaBackend,
        launch: &Launch,
        timeout: Duration,
    ) -> Result<NcclComm, RuntimeError> {
        if !nccl_present() {
            return Err(RuntimeError::NoCudaDevice {
                reason: "the NCCL library (libnccl.so.2) is not installed".into(),
            });
        }
        let mine = if launch.rank == 0 {
            let id = Id::new().map_err(nccl_err("ncclGetUniqueId"))?;
            Some(id.internal().map(|c| c as u8).to_vec())
        } else {
            None
        };
        let bytes = crate::comm::rendezvous::share_id(launch, mine.as_deref(), timeout)?;
        let internal: [std::ffi::c_char; 128] = bytes
            .get(..128)
            .and_then(|b| <[u8; 128]>::try_from(b).ok())
            .map(|b| b.map(|u| u as std::ffi::c_char))
            .ok_or_else(|| RuntimeError::Mismatch {
                op: "rendezvous",
                rank: launch.rank,
                detail: format!("rank 0 sent {} bytes, not NCCL's 128-byte id", bytes.len()),
            })?;
        // NCCL initialises on the thread's current context: make it this backend's device.
        backend
            .device()
            .stream
            .context()
            .bind_to_thread()
            .map_err(super::cuda::cuda_err("bind context"))?;
        let comm = Comm::from_rank(
            backend.device().stream.clone(),
            launch.rank,
            launch.world_size,
            Id::uninit(internal),
        )
        .map_err(nccl_err("ncclCommInitRank"))?;
        Ok(NcclComm { comm })
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// Element-wise sum over the world, in place.
    pub fn all_reduce_sum(&self, buf: &mut CudaBuffer) -> Result<(), RuntimeError> {
        let mut view = buf.mem.data.slice_mut(..buf.len);
        self.comm
            .all_reduce_in_place(&mut view, &ReduceOp::Sum)
            .map_err(nccl_err("ncclAllReduce"))?;
        Ok(())
    }

    /// `recv` = every rank's `send`, concatenated in rank order.
    pub fn all_gather(&self, send: &CudaBuffer, recv: &mut CudaBuffer) -> Result<(), RuntimeError> {
        crate::comm::check_len("all_gather", "recv", recv.len, send.len * self.world_size())?;
        let src = send.mem.data.slice(..send.len);
        let mut dst = recv.mem.data.slice_mut(..recv.len);
        self.comm
            .all_gather(&src, &mut dst)
            .map_err(nccl_err("ncclAllGather"))?;
        Ok(())
    }

    /// `recv` = chunk `rank` of the sum of every rank's `send`.
    pub fn reduce_scatter_sum(
        &self,
        send: &CudaBuffer,
        recv: &mut CudaBuffer,
    ) -> Result<(), RuntimeError> {
        crate::comm::check_len(
            "reduce_scatter",
            "send",
            send.len,
            recv.len * self.world_size(),
        )?;
        let src = send.mem.data.slice(..send.len);
        let mut dst = recv.mem.data.slice_mut(..recv.len);
        self.comm
            .reduce_scatter(&src, &mut dst, &ReduceOp::Sum)
            .map_err(nccl_err("ncclReduceScatter"))?;
        Ok(())
    }

    /// Copies `root`'s `buf` into every rank's.
    pub fn broadcast(&self, buf: &mut CudaBuffer, root: usize) -> Result<(), RuntimeError> {
        crate::comm::check_rank("broadcast", root, self.world_size())?;
        let mut view = buf.mem.data.slice_mut(..buf.len);
        self.comm
            .broadcast_in_place(&mut view, root as i32)
            .map_err(nccl_err("ncclBroadcast"))?;
        Ok(())
    }

    /// Sends `buf` to rank `dest` (matched by the peer's [`NcclComm::recv`] in order).
    pub fn send(&self, buf: &CudaBuffer, dest: usize) -> Result<(), RuntimeError> {
        crate::comm::check_rank("send", dest, self.world_size())?;
        let src = buf.mem.data.slice(..buf.len);
        self.comm
            .send(&src, dest as i32)
            .map_err(nccl_err("ncclSend"))
    }

    /// Receives the next message from rank `src` into `buf`.
    pub fn recv(&self, buf: &mut CudaBuffer, src: usize) -> Result<(), RuntimeError> {
        crate::comm::check_rank("recv", src, self.world_size())?;
        let mut dst = buf.mem.data.slice_mut(..buf.len);
        self.comm
            .recv(&mut dst, src as i32)
            .map_err(nccl_err("ncclRecv"))?;
        Ok(())
    }
}
