//! plait's runtime: where per-rank programs run. See docs/architecture.md.
//!
//! - [`backend`]: the [`Backend`] trait (buffers, ops, AdamW, host transfers), with
//!   [`CpuBackend`] over the `kernels` crate and [`CudaBackend`] behind the `cuda` feature.
//! - [`comm`]: the [`Communicator`] trait (collectives, groups, send/recv, all with
//!   deadlines), with [`ThreadComm`] (ranks as threads) and `comm::mpi::MpiComm` behind the
//!   `mpi` feature.
//! - [`profile`]: measures this machine (matmul rate, memory bandwidth, the threads
//!   communicator's α and β) and writes a cluster description for the planner.

pub mod backend;
pub mod comm;
mod error;
pub mod profile;

pub use backend::{Backend, CpuBackend, CudaBackend, CudaBuffer};
pub use comm::{Communicator, DEFAULT_TIMEOUT, MAX_TAG, ThreadComm};
pub use error::RuntimeError;
