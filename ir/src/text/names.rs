//! Text names of values: `%N`, numbered in definition order along the execution order.
//!
//! The printer and the verifier share this numbering, so a verifier message such as
//! `%12 = linear` points at the line the printer writes for that op.

use crate::graph::{Graph, OpId, ValueId};

/// Text numbers of a graph's values; values not reached from the execution order have none.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    numbers: Vec<Option<u32>>,
}

impl Names {
    pub(crate) fn new(graph: &Graph) -> Names {
        let mut numbers = vec![None; graph.num_values()];
        let mut next = 0u32;
        for &o in graph.order() {
            if o.index() >= graph.num_ops() {
                continue;
            }
            for &v in &graph.op(o).results {
                if let Some(slot @ None) = numbers.get_mut(v.index()) {
                    *slot = Some(next);
                    next = next.saturating_add(1);
                }
            }
        }
        Names { numbers }
    }

    /// Writes [`Names::value`] without building a string (the printer's many operands).
    pub(crate) fn write(&self, f: &mut impl std::fmt::Write, v: ValueId) -> std::fmt::Result {
        match self.numbers.get(v.index()).copied().flatten() {
            Some(n) => write!(f, "%{n}"),
            None => write!(f, "%?{}", v.0),
        }
    }

    /// `%N`, or `%?id` (which does not parse) for a value the order does not define.
    pub(crate) fn value(&self, v: ValueId) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write(&mut s, v);
        s
    }

    /// The op as the head of its text line: `%3, %4 = split`, or just `grad` with no results.
    pub(crate) fn op_head(&self, graph: &Graph, o: OpId) -> String {
        if o.index() >= graph.num_ops() {
            return format!("{o} (no such op)");
        }
        let op = graph.op(o);
        let results: Vec<String> = op.results.iter().map(|&v| self.value(v)).collect();
        if results.is_empty() {
            op.kind.mnemonic().to_string()
        } else {
            format!("{} = {}", results.join(", "), op.kind.mnemonic())
        }
    }
}
