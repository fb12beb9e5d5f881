//! plait's fast CPU kernels: forward and backward of every IR op in f32, a multi-threaded
//! matmul, and AdamW — each checked against `ir::interp`, the f64 reference interpreter.
//!
//! The runtime calls three functions on local shard shapes:
//! - [`forward`]`(kind, inputs, binding)` — one tensor per result, like `ir::interp::apply`;
//!   `Grad` and `AdamW` ops run through it too.
//! - [`backward`]`(kind, xs, dys)` — one gradient per operand (`None` for ids and targets),
//!   like `ir::interp::vjp`.
//! - [`adamw`]`(cfg, param, grad, m, v, step)` — the optimizer update in place.
//!
//! Semantics are the interpreter's exactly, including its conventions (fully masked softmax
//! rows are zero, top-k ties go to the lower expert, dropout's mask is
//! `ir::interp::dropout_keep`). Numerics: f32 storage; matrix products accumulate in f32
//! inside sgemm; pointwise ops compute in f64 and round once; every reduction (softmax and
//! norm statistics, cross-entropy, bias/broadcast/embedding gradient sums) accumulates in f64,
//! so results do not depend on how a reduction was split across devices beyond f32 rounding.
//! [`context_forward`] runs the position-dependent ops on one rank's share of the sequence
//! under context parallelism. [`exec::evaluate`] runs a whole graph on the kernels. [`forward_with`] / [`backward_with`]
//! choose how matrix products accumulate ([`Accumulate`]: f64 makes a product's rounding
//! independent of how its contraction was split, for reproducible tensor parallelism), and
//! [`linear_partial`] / [`linear_input_grad_partial`] give a tensor-parallel rank's partial
//! sums unrounded.

mod accumulate;
mod attention;
mod backward;
mod context;
pub mod device;
mod dropout;
mod elementwise;
mod embedding;
mod error;
pub mod exec;
mod forward;
mod gemm;
mod layout;
mod loss;
mod matmul;
mod moe;
mod norm;
mod optim;
mod reduce;
mod rotary;
mod shape;
mod softmax;
mod tensor;
mod vocab;

pub use accumulate::Accumulate;
pub use backward::backward;
pub use context::{Chunks, context_forward, context_forward_with};
pub use error::KernelError;
pub use forward::forward;
pub use matmul::{linear_input_grad_partial, linear_partial};
pub use optim::{adamw, adamw_frozen_variance};
pub use tensor::Tensor32;
pub use vocab::{
    shard_embedding, shard_embedding_grad, shard_loss_combine, shard_loss_grad, shard_loss_stats,
};

/// `c[m,n] = a[m,k] · b[k,n]`, all row-major and contiguous: the fast matmul on its own, for
/// benchmarks and callers outside the op set.
pub fn sgemm(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), KernelError> {
    gemm::gemm(
        1.0,
        gemm::Mat::rm(a, 0, m, k),
        gemm::Mat::rm(b, 0, k, n),
        0.0,
        gemm::MatMut::rm(c, 0, m, n),
    )
}

/// [`forward`] with matrix products accumulating as `acc` says.
pub fn forward_with(
    kind: &ir::OpKind,
    inputs: &[&Tensor32],
    binding: ir::Binding,
    acc: Accumulate,
) -> Result<Vec<Tensor32>, KernelError> {
    accumulate::scoped(acc, || forward(kind, inputs, binding))
}

/// [`backward`] with matrix products accumulating as `acc` says.
pub fn backward_with(
    kind: &ir::OpKind,
    xs: &[&Tensor32],
    dys: &[&Tensor32],
    acc: Accumulate,
) -> Result<Vec<Option<Tensor32>>, KernelError> {
    accumulate::scoped(acc, || backward(kind, xs, dys))
}
