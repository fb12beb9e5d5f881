//! The CUDA backend's stand-in when plait is built without the `cuda` feature: the same types
//! and constructor, which always fails with [`RuntimeError::NotCompiledWithCudaSupport`], so
//! code that names the CUDA backend compiles everywhere.

use ir::{AdamWConfig, Binding, OpKind};
use kernels::Tensor32;

use super::Backend;
use crate::RuntimeError;

/// The CUDA backend (not compiled in: every constructor fails).
#[derive(Debug)]
pub struct CudaBackend {
    /// Uninhabited: no value of this type can exist without the `cuda` feature.
    never: std::convert::Infallible,
}

/// A buffer in GPU memory (not compiled in).
#[derive(Debug)]
pub struct CudaBuffer {
    never: std::convert::Infallible,
}

impl CudaBackend {
    /// Always [`RuntimeError::NotCompiledWithCudaSupport`] in this build.
    pub fn new(ordinal: usize) -> Result<CudaBackend, RuntimeError> {
        let _ = ordinal;
        Err(RuntimeError::NotCompiledWithCudaSupport)
    }

    /// The backend with its GEMMs in `precision` (no value exists in this build).
    pub fn with_gemm_precision(self, precision: super::GemmPrecision) -> CudaBackend {
        let _ = precision;
        self
    }

    /// The backend whose device waits give up after `limit` (no value exists in this build).
    pub fn with_device_timeout(self, limit: std::time::Duration) -> CudaBackend {
        let _ = limit;
        self
    }

    /// What the device reports of itself (no value exists in this build).
    pub fn properties(&self) -> super::DeviceProperties {
        match self.never {}
    }

    /// Number of visible CUDA devices: always an error in this build.
    pub fn device_count() -> Result<usize, RuntimeError> {
        Err(RuntimeError::NotCompiledWithCudaSupport)
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> String {
        match self.never {}
    }

    fn zeros(&self, _: &[usize]) -> Result<CudaBuffer, RuntimeError> {
        match self.never {}
    }

    fn shape<'b>(&self, _: &'b CudaBuffer) -> &'b [usize] {
        match self.never {}
    }

    fn upload(&self, _: &Tensor32) -> Result<CudaBuffer, RuntimeError> {
        match self.never {}
    }

    fn download(&self, buffer: &CudaBuffer) -> Result<Tensor32, RuntimeError> {
        match buffer.never {}
    }

    fn forward(
        &self,
        _: &OpKind,
        _: &[&CudaBuffer],
        _: Binding,
    ) -> Result<Vec<CudaBuffer>, RuntimeError> {
        match self.never {}
    }

    fn backward(
        &self,
        _: &OpKind,
        _: &[&CudaBuffer],
        _: &[&CudaBuffer],
    ) -> Result<Vec<Option<CudaBuffer>>, RuntimeError> {
        match self.never {}
    }

    fn adamw(
        &self,
        _: &AdamWConfig,
        _: &mut CudaBuffer,
        _: &CudaBuffer,
        _: &mut CudaBuffer,
        _: &mut CudaBuffer,
        _: u64,
    ) -> Result<(), RuntimeError> {
        match self.never {}
    }

    fn sgemm(&self, _: &CudaBuffer, _: &CudaBuffer) -> Result<CudaBuffer, RuntimeError> {
        match self.never {}
    }
}
