//! plait's runtime: where per-rank programs run. See docs/architecture.md.
//!
//! - [`backend`]: the [`Backend`] trait (buffers, ops, AdamW, host transfers), with
//!   [`CpuBackend`] over the `kernels` crate and [`CudaBackend`] behind the `cuda` feature.
//! - [`comm`]: the [`Communicator`] trait (collectives, groups, send/recv, all with
//!   deadlines), with [`ThreadComm`] (ranks as threads) and `comm::mpi::MpiComm` behind the
//!   `mpi` feature.
//! - [`exec`]: the executor of one rank's `plait-program/1` template.
//! - [`launch`]: this process's rank, world size, local rank and master address, as torchrun,
//!   `mpirun` or `srun` set them.
//! - [`data`]: training tokens and each step's global batch; [`train`]: training loops.
//! - [`checkpoint`]: per-rank safetensors shards and a JSON index; resumes under any layout.
//! - [`profile`]: measures this machine (matmul rate, memory bandwidth, the threads
//!   communicator's α and β) and writes a cluster description for the planner.

pub mod backend;
pub mod checkpoint;
pub mod comm;
pub mod data;
mod error;
pub mod exec;
pub mod launch;
pub mod profile;
pub mod train;

pub use backend::{
    Backend, CpuBackend, CudaBackend, CudaBuffer, Device, DeviceBackend, DeviceBuffer, Gemm,
    GemmPrecision, TransferStats,
};
pub use comm::{Communicator, DEFAULT_TIMEOUT, MAX_TAG, ThreadComm};
pub use error::RuntimeError;
