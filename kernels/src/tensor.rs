//! `Tensor32`: the dense row-major f32 tensor every kernel reads and writes.
//!
//! Integer data (token ids, targets, positions, the optimizer step) is stored as exact f32
//! whole numbers, as the reference interpreter stores it in f64: f32 holds every integer up to
//! 2²⁴ = 16 777 216 exactly, beyond any vocabulary or step count we train with, and one element
//! type keeps the runtime's buffers uniform. Kernels that read indices check they are whole and
//! in range ([`KernelError::BadIndex`]).

use crate::KernelError;

/// A dense row-major tensor of f32.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor32 {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// The most elements one tensor may hold; larger requests are errors, not allocation aborts.
pub(crate) const MAX_ELEMENTS: usize = 1 << 34;

/// Element count of `shape`, refusing overflow and absurd sizes.
pub(crate) fn numel(shape: &[usize]) -> Result<usize, KernelError> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| KernelError::TooLarge {
            shape: shape.to_vec(),
        })
}

impl Tensor32 {
    /// A tensor of `shape` holding `data`, checking that the data fills the shape.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor32, KernelError> {
        if numel(&shape)? != data.len() {
            return Err(KernelError::Malformed {
                shape,
                len: data.len(),
            });
        }
        Ok(Tensor32 { shape, data })
    }

    pub fn zeros(shape: &[usize]) -> Result<Tensor32, KernelError> {
        Ok(Tensor32 {
            shape: shape.to_vec(),
            data: vec![0.0; numel(shape)?],
        })
    }

    pub fn scalar(x: f32) -> Tensor32 {
        Tensor32 {
            shape: vec![],
            data: vec![x],
        }
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Rounds an interpreter tensor to f32 (integers below 2²⁴ convert exactly).
    pub fn from_ir(t: &ir::Tensor) -> Tensor32 {
        Tensor32 {
            shape: t.shape.clone(),
            data: t.data.iter().map(|&x| x as f32).collect(),
        }
    }

    /// Widens to an interpreter tensor (exact).
    pub fn to_ir(&self) -> ir::Tensor {
        ir::Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| f64::from(x)).collect(),
        }
    }

    /// Requires that the data fills the shape (the fields are public, so callers could hand in
    /// anything; kernels index on the strength of this check).
    pub(crate) fn check(&self) -> Result<(), KernelError> {
        let want = self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if want != Some(self.data.len()) {
            return Err(KernelError::Malformed {
                shape: self.shape.clone(),
                len: self.data.len(),
            });
        }
        Ok(())
    }
}

impl From<&ir::Tensor> for Tensor32 {
    fn from(t: &ir::Tensor) -> Tensor32 {
        Tensor32::from_ir(t)
    }
}

impl From<&Tensor32> for ir::Tensor {
    fn from(t: &Tensor32) -> ir::Tensor {
        t.to_ir()
    }
}
