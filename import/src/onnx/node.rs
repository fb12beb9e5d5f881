//! A node together with what error messages need: the file, a printable name, attributes.

use std::path::Path;

use super::proto::{AttributeProto, NodeProto, TensorProto};
use crate::ImportError;

/// One ONNX node while it is being folded or lowered.
#[derive(Clone, Copy, Debug)]
pub struct NodeRef<'a> {
    pub file: &'a Path,
    pub node: &'a NodeProto,
    pub index: usize,
}

impl<'a> NodeRef<'a> {
    /// The node's name, or a stand-in naming its position and first output (names are optional).
    pub fn name(&self) -> String {
        match self.node.name.as_deref() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => format!(
                "#{} (output '{}')",
                self.index,
                self.node.output.first().map_or("", String::as_str)
            ),
        }
    }

    pub fn op(&self) -> &'a str {
        self.node.op_type.as_deref().unwrap_or("")
    }

    pub fn domain(&self) -> &'a str {
        self.node.domain.as_deref().unwrap_or("")
    }

    pub fn bad(&self, reason: impl Into<String>) -> ImportError {
        ImportError::BadNode {
            file: self.file.to_path_buf(),
            node: self.name(),
            op_type: self.op().to_string(),
            reason: reason.into(),
        }
    }

    /// Error for an input that must fold to a constant but depends on the model input.
    pub fn not_constant(&self, slot: usize, role: &str) -> ImportError {
        ImportError::NotConstant {
            file: self.file.to_path_buf(),
            node: self.name(),
            op_type: self.op().to_string(),
            input: self.input(slot).unwrap_or("").to_string(),
            role: role.to_string(),
        }
    }

    /// The name of input `slot`, `None` when absent (omitted optional inputs are empty names).
    pub fn input(&self, slot: usize) -> Option<&'a str> {
        self.node
            .input
            .get(slot)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        self.node
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
    }

    pub fn attr_i(&self, name: &str) -> Option<i64> {
        self.attr(name).and_then(|a| a.i)
    }

    pub fn attr_f(&self, name: &str) -> Option<f64> {
        self.attr(name).and_then(|a| a.f).map(f64::from)
    }

    pub fn attr_ints(&self, name: &str) -> Option<&'a [i64]> {
        self.attr(name).map(|a| a.ints.as_slice())
    }

    pub fn attr_floats(&self, name: &str) -> Option<&'a [f32]> {
        self.attr(name).map(|a| a.floats.as_slice())
    }

    pub fn attr_s(&self, name: &str) -> Option<String> {
        self.attr(name)
            .and_then(|a| a.s.as_deref())
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }

    pub fn attr_t(&self, name: &str) -> Option<&'a TensorProto> {
        self.attr(name).and_then(|a| a.t.as_ref())
    }

    /// Normalizes a possibly negative axis against `rank`.
    pub fn axis(&self, axis: i64, rank: usize) -> Result<usize, ImportError> {
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        if (0..r).contains(&a) {
            Ok(a as usize)
        } else {
            Err(self.bad(format!("axis {axis} is out of range for rank {rank}")))
        }
    }

    /// Like [`NodeRef::axis`] for ops such as Unsqueeze whose axes index the output rank.
    pub fn axes(&self, axes: &[i64], rank: usize) -> Result<Vec<usize>, ImportError> {
        let mut out = axes
            .iter()
            .map(|&a| self.axis(a, rank))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_unstable();
        if out.windows(2).any(|w| w.first() == w.get(1)) {
            return Err(self.bad(format!("axes {axes:?} repeat an axis")));
        }
        Ok(out)
    }
}
