//! Tensor types: element type and shape, with symbolic batch and sequence dimensions.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    Bf16,
    F16,
    /// 8-bit float (E4M3); storage only in the interpreter, which computes in f64.
    Fp8,
    F64,
    /// Token ids and other integer indices.
    I64,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::Bf16,
        DType::F16,
        DType::Fp8,
        DType::F64,
        DType::I64,
    ];

    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::Fp8 => 1,
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        !matches!(self, DType::I64)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::Fp8 => "fp8",
            DType::F64 => "f64",
            DType::I64 => "i64",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A symbolic dimension, bound to a number only when a concrete batch/sequence is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Sym {
    /// Batch size (sequences per micro-batch).
    Batch,
    /// Sequence length (tokens per sequence).
    Seq,
}

impl Sym {
    pub fn name(self) -> &'static str {
        match self {
            Sym::Batch => "B",
            Sym::Seq => "S",
        }
    }
}

/// One dimension of a shape: a known size, or a symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    Fixed(u64),
    Sym(Sym),
}

impl Dim {
    pub fn fixed(self) -> Option<u64> {
        match self {
            Dim::Fixed(n) => Some(n),
            Dim::Sym(_) => None,
        }
    }

    /// The size under a binding of the symbols.
    pub fn eval(self, b: Binding) -> u64 {
        match self {
            Dim::Fixed(n) => n,
            Dim::Sym(Sym::Batch) => b.batch,
            Dim::Sym(Sym::Seq) => b.seq,
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::Fixed(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s.name()),
        }
    }
}

/// Values for the symbolic dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Binding {
    pub batch: u64,
    pub seq: u64,
}

/// A tensor shape (row-major; the last dimension is contiguous).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    pub fn of(dims: &[Dim]) -> Shape {
        Shape(dims.to_vec())
    }

    pub fn fixed(dims: &[u64]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    pub fn last(&self) -> Option<Dim> {
        self.0.last().copied()
    }

    /// Concrete sizes under a binding.
    pub fn eval(&self, b: Binding) -> Vec<u64> {
        self.0.iter().map(|d| d.eval(b)).collect()
    }

    /// Number of elements under a binding.
    pub fn numel(&self, b: Binding) -> u64 {
        self.0.iter().map(|d| d.eval(b)).product()
    }

    /// Number of elements if every dimension is fixed.
    pub fn fixed_numel(&self) -> Option<u64> {
        self.0.iter().map(|d| d.fixed()).product()
    }

    pub fn is_symbolic(&self) -> bool {
        self.0.iter().any(|d| matches!(d, Dim::Sym(_)))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Element type and shape of one value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType { dtype, shape }
    }

    /// Bytes under a binding.
    pub fn bytes(&self, b: Binding) -> u64 {
        self.shape.numel(b) * self.dtype.size_bytes()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
