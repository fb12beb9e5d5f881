//! AdamW in place on the device (`adamw.cu`), with the per-step scalars of
//! `kernels::adamw_frozen_variance` computed here in f64.

use ir::AdamWConfig;

use super::{Buf, pointwise_grid, size};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, KernelArg};

pub(in crate::backend::device) fn adamw<D: Device>(
    b: &DeviceBackend<D>,
    cfg: &AdamWConfig,
    [param, m, v]: [&mut Buf<D>; 3],
    grad: &Buf<D>,
    step: u64,
    frozen_after: Option<u64>,
) -> Result<(), RuntimeError> {
    let same = |t: &Buf<D>| t.shape == param.shape;
    if step == 0 || !same(grad) || !same(m) || !same(v) {
        // The CPU kernel names what is wrong.
        return crate::backend::adamw_on_host(b, cfg, [param, m, v], grad, step, frozen_after);
    }
    let t = i32::try_from(step).unwrap_or(i32::MAX);
    let frozen = frozen_after.is_some_and(|f| step > f);
    let t_frozen = frozen_after.map_or(t, |f| t.min(i32::try_from(f).unwrap_or(i32::MAX)));
    let bias1 = 1.0 - cfg.beta1.powi(t);
    let n = param.len;
    let block = b.device.block_size();
    b.device.launch(
        "adamw_step",
        // Each thread updates two elements (adamw.cu).
        pointwise_grid(block, n.div_ceil(2)),
        block,
        &mut [
            KernelArg::Out(&mut param.mem),
            KernelArg::Out(&mut m.mem),
            KernelArg::Out(&mut v.mem),
            KernelArg::In(&grad.mem),
            size(n),
            KernelArg::F64(cfg.beta1),
            KernelArg::F64(cfg.beta2),
            KernelArg::F64(cfg.eps),
            KernelArg::F64(cfg.lr / bias1),
            KernelArg::F64(1.0 - cfg.lr * cfg.weight_decay),
            KernelArg::F64((1.0 - cfg.beta2.powi(t)).sqrt()),
            KernelArg::F64((1.0 - cfg.beta2.powi(t_frozen)).sqrt()),
            KernelArg::I32(i32::from(frozen)),
        ],
    )
}
