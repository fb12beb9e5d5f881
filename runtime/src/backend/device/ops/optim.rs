//! AdamW in place on the device (`adamw.cu`), with the per-step scalars of
//! `kernels::adamw_frozen_variance` computed here in f64.

use ir::AdamWConfig;

use super::{Buf, pointwise_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, DeviceBuffer, GemmPrecision, KernelArg};

pub(in crate::backend::device) fn adamw<D: Device>(
    b: &DeviceBackend<D>,
    cfg: &AdamWConfig,
    [param, m, v]: [&mut Buf<D>; 3],
    grad: &Buf<D>,
    step: u64,
    frozen_after: Option<u64>,
) -> Result<(), RuntimeError> {
    if !fits(param, [grad, &*m, &*v], step) {
        // The CPU kernel names what is wrong.
        return crate::backend::adamw_on_host(b, cfg, [param, m, v], grad, step, frozen_after);
    }
    let n = param.len;
    let block = b.device.block_size();
    let (kernel, g) = grad_words(grad, ["adamw_step", "adamw_step_bf16g"]);
    let mut args = vec![
        KernelArg::Out(&mut param.mem),
        KernelArg::Out(&mut m.mem),
        KernelArg::Out(&mut v.mem),
        KernelArg::In(g),
        size(n),
    ];
    args.extend(scalars(cfg, step, frozen_after));
    // Each thread updates two elements (adamw.cu).
    b.device.launch(
        kernel,
        pointwise_grid(block, n.div_ceil(2)),
        block,
        &mut args,
    )
}

/// [`adamw`] that also writes the updated parameter into `copy` (allocated here where it is
/// `None`), and its bf16 twin where a bf16 GEMM will read it (a matrix, bf16 products): one
/// launch for a program's `AdamW` and the `Copy` of the master weight to its compute copy
/// after it. `false`: shapes this kernel does not take, nothing done.
pub(in crate::backend::device) fn adamw_copy<D: Device>(
    b: &DeviceBackend<D>,
    cfg: &AdamWConfig,
    [param, m, v]: [&mut Buf<D>; 3],
    grad: &Buf<D>,
    (step, frozen_after): (u64, Option<u64>),
    copy: &mut Option<Buf<D>>,
) -> Result<bool, RuntimeError> {
    let n = param.len;
    if !fits(param, [grad, &*m, &*v], step) || copy.as_ref().is_some_and(|c| c.len != n) {
        return Ok(false);
    }
    let mut out = match copy.take() {
        Some(c) => c,
        None => b.alloc(&param.shape)?,
    };
    b.written(&mut out)?;
    let twin = b.gemm_precision == GemmPrecision::Bf16 && out.shape.len() >= 2;
    let mut words = twin
        .then(|| b.device.alloc(n.div_ceil(2).max(1)))
        .transpose()?;
    let block = b.device.block_size();
    let (kernel, g) = grad_words(grad, ["adamw_step_copy", "adamw_step_copy_bf16g"]);
    let mut args = vec![
        KernelArg::Out(&mut param.mem),
        KernelArg::Out(&mut m.mem),
        KernelArg::Out(&mut v.mem),
        KernelArg::Out(&mut out.mem),
        words.as_mut().map_or(KernelArg::Null, KernelArg::Out),
        KernelArg::In(g),
        size(n),
    ];
    args.extend(scalars(cfg, step, frozen_after));
    // Each thread updates a pair of neighbours (adamw.cu).
    let launched = b.device.launch(
        kernel,
        pointwise_grid(block, n.div_ceil(2)),
        block,
        &mut args,
    );
    drop(args);
    if let Some(w) = words
        && let Err(w) = out.bf16.set(w)
    {
        b.device.release(w);
    }
    *copy = Some(out);
    launched.map(|()| true)
}

/// The kernel of `[f32 gradient, gradient as words]` and what it reads: the gradient's exact
/// bf16 words where it has them (held in the stash until the update, it comes back as words
/// alone: [`crate::Backend::adamw_reads_grad_words`]), else its f32 values.
fn grad_words<'g, M>(
    grad: &'g DeviceBuffer<M>,
    [f32_kernel, words_kernel]: [&'static str; 2],
) -> (&'static str, &'g M) {
    match grad.exact_bf16() {
        Some(w) => (words_kernel, w),
        None => (f32_kernel, &grad.mem),
    }
}

/// Whether the device kernels take this update: a step counted from 1, and the gradient and
/// both moments shaped as the parameter.
fn fits<M>(param: &DeviceBuffer<M>, others: [&DeviceBuffer<M>; 3], step: u64) -> bool {
    step > 0 && others.iter().all(|t| t.shape == param.shape)
}

/// The kernels' per-step scalars (`ADAMW_ARGS` in adamw.cu), in f64.
fn scalars<'a, M>(
    cfg: &AdamWConfig,
    step: u64,
    frozen_after: Option<u64>,
) -> [KernelArg<'a, M>; 8] {
    let t = i32::try_from(step).unwrap_or(i32::MAX);
    let frozen = frozen_after.is_some_and(|f| step > f);
    let t_frozen = frozen_after.map_or(t, |f| t.min(i32::try_from(f).unwrap_or(i32::MAX)));
    let bias1 = 1.0 - cfg.beta1.powi(t);
    [
        KernelArg::F64(cfg.beta1),
        KernelArg::F64(cfg.beta2),
        KernelArg::F64(cfg.eps),
        KernelArg::F64(cfg.lr / bias1),
        KernelArg::F64(1.0 - cfg.lr * cfg.weight_decay),
        KernelArg::F64((1.0 - cfg.beta2.powi(t)).sqrt()),
        KernelArg::F64((1.0 - cfg.beta2.powi(t_frozen)).sqrt()),
        KernelArg::I32(i32::from(frozen)),
    ]
}
