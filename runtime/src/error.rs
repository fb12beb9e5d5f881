//! The one error type of the runtime: backends, communicators and the machine profile.

use std::time::Duration;

use kernels::KernelError;

/// Why a runtime operation failed. Ranks are group ranks unless a field says `world`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuntimeError {
    /// The CUDA backend was asked for, but this build has no `cuda` feature.
    #[error(
        "this plait was built without CUDA support; rebuild it with `cargo build --release --features cuda` (or use the CPU backend)"
    )]
    NotCompiledWithCudaSupport,
    /// CUDA support is compiled in, but no usable GPU, driver or library was found.
    #[error("no CUDA device available: {reason}")]
    NoCudaDevice { reason: String },
    /// A CUDA driver or cuBLAS call failed.
    #[error("CUDA {op} failed: {message}")]
    Cuda { op: &'static str, message: String },
    /// A device kernel could not be launched or failed (its source is `kernels/cuda`).
    #[error("device kernel `{kernel}` failed: {message}")]
    DeviceLaunch {
        kernel: &'static str,
        message: String,
    },
    /// A kernel rejected its operands.
    #[error("{op}: {source}")]
    Kernel {
        op: &'static str,
        #[source]
        source: KernelError,
    },
    /// A buffer of the wrong size was handed to an operation.
    #[error("{op}: {what} has {got} elements, expected {want}")]
    BadLength {
        op: &'static str,
        what: &'static str,
        got: usize,
        want: usize,
    },
    /// A rank outside the group (or a group that does not contain the caller).
    #[error("{op}: rank {rank} is not in a group of {size}")]
    BadRank {
        op: &'static str,
        rank: usize,
        size: usize,
    },
    /// A subgroup's rank list is unusable.
    #[error("cannot create a group of ranks {ranks:?} from a group of {size}: {reason}")]
    BadGroup {
        ranks: Vec<usize>,
        size: usize,
        reason: String,
    },
    /// A user tag outside what the communicator can carry.
    #[error("{op}: tag {tag} is out of range (tags are 0..={max})")]
    BadTag {
        op: &'static str,
        tag: u32,
        max: u32,
    },
    /// Some ranks of the group did not reach the operation before the deadline.
    #[error(
        "{op} timed out after {after:?} on rank {rank} of group {group:?} (world ranks): {}",
        missing_list(missing, group)
    )]
    Timeout {
        op: &'static str,
        /// The caller's rank in the group.
        rank: usize,
        /// The group's members, as world ranks, in group-rank order.
        group: Vec<usize>,
        /// Group ranks that did not arrive.
        missing: Vec<usize>,
        after: Duration,
    },
    /// The device's queued work did not finish before the deadline (`backend::watchdog`): a
    /// collective on it may be waiting for a rank that died or hung.
    #[error(
        "the GPU's queued work ({op}) did not finish within {after:?}: a collective on it may be \
         waiting for a rank that died or hung"
    )]
    DeviceTimeout { op: &'static str, after: Duration },
    /// A device timeout, and the rank the host network then found missing.
    #[error("{device}; asked over the host network which rank is missing: {host}")]
    DeviceWaitMissing {
        device: Box<RuntimeError>,
        #[source]
        host: Box<RuntimeError>,
    },
    /// The ranks called different collectives (or with different sizes) at the same point.
    #[error("{op} on rank {rank}: collective mismatch, {detail}")]
    Mismatch {
        op: &'static str,
        rank: usize,
        detail: String,
    },
    /// An earlier failure left the communicator unusable.
    #[error("{op}: the communicator failed earlier ({reason})")]
    Poisoned { op: &'static str, reason: String },
    /// MPI could not start or reported an error.
    #[error("MPI {op}: {message}")]
    Mpi { op: &'static str, message: String },
    /// The machine profile could not be measured or written.
    #[error("profile: {message}")]
    Profile { message: String },
    /// A program that cannot run as written (a missing buffer, a shape that does not match).
    #[error("rank {rank}: {what}")]
    Program { rank: u32, what: String },
    /// An instruction failed: where, and why.
    #[error("rank {rank}, {phase} instruction {index} ({instr}): {source}")]
    Instr {
        rank: u32,
        phase: &'static str,
        index: usize,
        instr: &'static str,
        #[source]
        source: Box<RuntimeError>,
    },
    /// A data-parallel exchange mode the program's layout cannot run.
    #[error("{mode} cannot run this program: {reason}")]
    DpComm { mode: String, reason: String },
    /// Training data that cannot be read or used.
    #[error("{path}: {message}")]
    Data { path: String, message: String },
    /// A checkpoint that cannot be written or read.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
    /// A parameter's initial value is missing or has the wrong shape.
    #[error("parameter `{name}`: {message}")]
    Init { name: String, message: String },
    /// The launcher's environment names this process's place wrongly.
    #[error("launcher environment: {var}={value:?} {reason}")]
    Launch {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// The rendezvous at the master address failed (bind, connect, or a peer's message).
    /// (The I/O error is kept as its kind and text: this enum is `Clone` and `PartialEq`.)
    #[error("rendezvous at {addr}: {what}: {message}")]
    Rendezvous {
        addr: String,
        what: String,
        kind: std::io::ErrorKind,
        message: String,
    },
}

fn missing_list(missing: &[usize], group: &[usize]) -> String {
    let names: Vec<String> = missing
        .iter()
        .map(|&r| match group.get(r) {
            Some(w) => format!("rank {r} (world rank {w})"),
            None => format!("rank {r}"),
        })
        .collect();
    let verb = if names.len() == 1 { "was" } else { "were" };
    format!("{} {verb} not there", names.join(", "))
}

impl RuntimeError {
    pub(crate) fn kernel(op: &'static str) -> impl FnOnce(KernelError) -> RuntimeError {
        move |source| RuntimeError::Kernel { op, source }
    }
}
