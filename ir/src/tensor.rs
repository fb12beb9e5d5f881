//! Dense host tensors for the reference interpreter and for weights carried by importers.

use std::collections::BTreeMap;

/// A dense row-major tensor of f64 (integers such as token ids are stored exactly as f64).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f64>) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }

    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: vec![0.0; shape.iter().product()],
        }
    }

    pub fn scalar(x: f64) -> Tensor {
        Tensor {
            shape: vec![],
            data: vec![x],
        }
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Largest absolute elementwise difference; `None` when shapes differ.
    pub fn max_abs_diff(&self, other: &Tensor) -> Option<f64> {
        (self.shape == other.shape).then(|| {
            self.data
                .iter()
                .zip(&other.data)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max)
        })
    }
}

/// Named tensors: parameter and buffer values by their `param`/`buffer` names.
pub type Weights = BTreeMap<String, Tensor>;
