//! The one error type of the kernels: what was wrong with the operands, with the op's name.

/// Why a kernel rejected its operands. `op` is the op's mnemonic (`attention`, `adamw`...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("{op} takes {want} operand(s), got {got}")]
    Arity {
        op: &'static str,
        want: usize,
        got: usize,
    },
    /// An operand's shape does not fit the op; `want` describes what was expected.
    #[error("{op}: {what} has shape {got:?}, expected {want}")]
    Shape {
        op: &'static str,
        what: &'static str,
        got: Vec<usize>,
        want: String,
    },
    /// A tensor whose data length disagrees with its own shape.
    #[error("an operand of shape {shape:?} holds {len} elements")]
    Malformed { shape: Vec<usize>, len: usize },
    /// A shape too large to allocate (or whose element count overflows).
    #[error("a tensor of shape {shape:?} is too large")]
    TooLarge { shape: Vec<usize> },
    /// An integer operand (token id, target, step) that is not a whole number in `0..bound`.
    #[error("{op}: {what} {value} is not an index in 0..{bound}")]
    BadIndex {
        op: &'static str,
        what: &'static str,
        value: f32,
        bound: usize,
    },
    /// An attribute value the op cannot use (heads not dividing, dropout p outside [0, 1)...).
    #[error("{op}: {reason}")]
    Attribute { op: &'static str, reason: String },
    /// Source ops are read from the environment, and some ops have no gradient.
    #[error("{op}: {reason}")]
    Unsupported { op: &'static str, reason: String },
}
