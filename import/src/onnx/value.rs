//! Constant tensors as the folder sees them: an element class, a shape and f64 data.
//!
//! Everything is f64 because the IR's reference tensors are f64 and every integer the folder
//! meets (shapes, indices, positions) is far below 2^53.

use std::rc::Rc;

use ir::DType;

use super::proto::data_type as dt;

/// Element class of a constant: what casts, comparisons and the IR type need to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Float(DType),
    Int,
    Bool,
}

impl Elem {
    /// The class of an ONNX `TensorProto.DataType`, or `None` for types plait does not read
    /// (strings, complex, 8-bit floats).
    pub fn from_onnx(code: i32) -> Option<Elem> {
        Some(match code {
            dt::FLOAT => Elem::Float(DType::F32),
            dt::FLOAT16 => Elem::Float(DType::F16),
            dt::BFLOAT16 => Elem::Float(DType::Bf16),
            dt::DOUBLE => Elem::Float(DType::F64),
            dt::UINT8
            | dt::INT8
            | dt::UINT16
            | dt::INT16
            | dt::INT32
            | dt::INT64
            | dt::UINT32
            | dt::UINT64 => Elem::Int,
            dt::BOOL => Elem::Bool,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::Float(_))
    }

    /// The IR element type a runtime value of this class gets (indices and masks are i64).
    pub fn dtype(self) -> DType {
        match self {
            Elem::Float(d) => d,
            Elem::Int | Elem::Bool => DType::I64,
        }
    }

    /// Converts a value into this class the way ONNX `Cast` does (truncation toward zero for
    /// integers, nonzero for booleans).
    pub fn cast(self, x: f64) -> f64 {
        match self {
            Elem::Float(_) => x,
            Elem::Int => x.trunc(),
            Elem::Bool => f64::from(u8::from(x != 0.0)),
        }
    }
}

/// A constant tensor. Data is shared so layout-preserving folds (Identity, Reshape) are free.
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    pub elem: Elem,
    pub shape: Vec<usize>,
    pub data: Rc<Vec<f64>>,
}

impl Const {
    /// Builds a constant; callers guarantee `data.len()` equals the product of `shape`.
    pub fn new(elem: Elem, shape: Vec<usize>, data: Vec<f64>) -> Const {
        Const {
            elem,
            shape,
            data: Rc::new(data),
        }
    }

    pub fn scalar(elem: Elem, x: f64) -> Const {
        Const::new(elem, vec![], vec![x])
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The single element of a one-element tensor.
    pub fn single(&self) -> Option<f64> {
        match self.data.as_slice() {
            [x] => Some(*x),
            _ => None,
        }
    }

    /// The values as i64 (shapes, axes, indices); `None` when one is not an integer.
    /// Huge values (Slice's "to the end" sentinel INT64_MAX) saturate, which keeps their meaning.
    pub fn ints(&self) -> Option<Vec<i64>> {
        self.data
            .iter()
            .map(|&x| (x.is_finite() && x.fract() == 0.0).then_some(x as i64))
            .collect()
    }

    pub fn to_tensor(&self) -> ir::Tensor {
        ir::Tensor::new(self.shape.clone(), self.data.as_ref().clone())
    }
}

/// Product of dimensions with overflow and size checks.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}
