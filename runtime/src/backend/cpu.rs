//! The CPU backend: buffers are host [`Tensor32`]s and every op is a `kernels` call.

use ir::{AdamWConfig, Binding, OpKind};
use kernels::{Accumulate, Tensor32};

use super::{Backend, sgemm_dims};
use crate::RuntimeError;

/// Host memory and the `kernels` crate.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend {
    accumulate: Accumulate,
}

impl CpuBackend {
    /// sgemm matrix products (the fast default).
    pub fn new() -> CpuBackend {
        CpuBackend::default()
    }

    /// Reproducible mode: matrix products accumulate in f64 and round once, and
    /// tensor-parallel partial sums are carried in f64 until their reduction, so that a
    /// product's rounding hardly depends on how tensor parallelism split its contraction and
    /// a tensor-parallel run trains to one device's parameters (within 1e-5 in
    /// `tests/tests/equivalence.rs`; other gradient sums, such as data-parallel ones, stay
    /// f32 sums in rank order). Slower: f64 matrix products.
    pub fn reproducible() -> CpuBackend {
        CpuBackend {
            accumulate: Accumulate::F64,
        }
    }
}

impl Backend for CpuBackend {
    type Buffer = Tensor32;

    fn name(&self) -> String {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mode = match self.accumulate {
            Accumulate::F32 => "",
            Accumulate::F64 => ", reproducible",
        };
        format!("cpu ({threads} threads{mode})")
    }

    fn zeros(&self, shape: &[usize]) -> Result<Tensor32, RuntimeError> {
        Tensor32::zeros(shape).map_err(RuntimeError::kernel("zeros"))
    }

    fn shape<'b>(&self, buffer: &'b Tensor32) -> &'b [usize] {
        &buffer.shape
    }

    fn upload(&self, host: &Tensor32) -> Result<Tensor32, RuntimeError> {
        Tensor32::new(host.shape.clone(), host.data.clone()).map_err(RuntimeError::kernel("upload"))
    }

    fn upload_owned(&self, host: Tensor32) -> Result<Tensor32, RuntimeError> {
        Tensor32::new(host.shape, host.data).map_err(RuntimeError::kernel("upload"))
    }

    fn download(&self, buffer: &Tensor32) -> Result<Tensor32, RuntimeError> {
        Ok(buffer.clone())
    }

    fn forward(
        &self,
        kind: &OpKind,
        inputs: &[&Tensor32],
        binding: Binding,
    ) -> Result<Vec<Tensor32>, RuntimeError> {
        kernels::forward_with(kind, inputs, binding, self.accumulate)
            .map_err(RuntimeError::kernel(kind.mnemonic()))
    }

    fn backward(
        &self,
        kind: &OpKind,
        xs: &[&Tensor32],
        dys: &[&Tensor32],
    ) -> Result<Vec<Option<Tensor32>>, RuntimeError> {
        kernels::backward_with(kind, xs, dys, self.accumulate)
            .map_err(RuntimeError::kernel(kind.mnemonic()))
    }

    fn adamw(
        &self,
        cfg: &AdamWConfig,
        param: &mut Tensor32,
        grad: &Tensor32,
        m: &mut Tensor32,
        v: &mut Tensor32,
        step: u64,
    ) -> Result<(), RuntimeError> {
        kernels::adamw(cfg, param, grad, m, v, step).map_err(RuntimeError::kernel("adamw"))
    }

    fn wide_partial_sums(&self) -> bool {
        self.accumulate == Accumulate::F64
    }

    fn partial_sum(
        &self,
        kind: &OpKind,
        inputs: &[&Tensor32],
        output: usize,
    ) -> Result<Option<Vec<f64>>, RuntimeError> {
        if self.accumulate != Accumulate::F64 {
            return Ok(None);
        }
        let err = RuntimeError::kernel(kind.mnemonic());
        match (kind, inputs) {
            (OpKind::Linear { bias: false }, [x, w]) if output == 0 => {
                kernels::linear_partial(x, w).map(Some).map_err(err)
            }
            (OpKind::Grad { of, wrt }, [_, w, .., g])
                if matches!(**of, OpKind::Linear { .. }) && wrt.get(output) == Some(&0) =>
            {
                kernels::linear_input_grad_partial(w, g)
                    .map(Some)
                    .map_err(err)
            }
            _ => Ok(None),
        }
    }

    fn sgemm(&self, a: &Tensor32, b: &Tensor32) -> Result<Tensor32, RuntimeError> {
        let (m, k, n) = sgemm_dims(&a.shape, &b.shape)?;
        let mut c = self.zeros(&[m, n])?;
        kernels::sgemm(&a.data, &b.data, &mut c.data, m, k, n)
            .map_err(RuntimeError::kernel("sgemm"))?;
        Ok(c)
    }
}
