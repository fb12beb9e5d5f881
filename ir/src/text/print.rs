//! The printer: one line per op in execution order, values renumbered in definition order.

use std::fmt;

use crate::graph::Graph;
use crate::text::kind::{KindText, Quoted};
use crate::text::names::Names;

/// Prints `graph` in the text form described in [`crate::text`].
///
/// Any graph prints without panicking; one that fails [`crate::verify::verify`] may print
/// text that does not parse back (for instance an operand with no definition prints `%?id`).
pub fn print(graph: &Graph) -> String {
    Printer {
        graph,
        names: Names::new(graph),
    }
    .to_string()
}

struct Printer<'a> {
    graph: &'a Graph,
    names: Names,
}

impl fmt::Display for Printer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.graph;
        writeln!(f, "graph {}", Quoted(&g.name))?;
        if let Some(block) = &g.block_name {
            write!(f, "block {}", Quoted(block))?;
            if !g.kind_starts.is_empty() {
                f.write_str(" kind_starts")?;
                for s in &g.kind_starts {
                    write!(f, " {s}")?;
                }
            }
            writeln!(f)?;
        }
        if !g.order().is_empty() {
            writeln!(f)?;
        }
        for &o in g.order() {
            if o.index() >= g.num_ops() {
                writeln!(f, "; {o} is in the execution order but not in the graph")?;
                continue;
            }
            let op = g.op(o);
            if op.results.is_empty() {
                f.write_str("_")?;
            }
            for (i, &v) in op.results.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                self.names.write(f, v)?;
                if v.index() < g.num_values() {
                    write!(f, ": {}", g.ty(v))?;
                }
            }
            write!(f, " = {}", KindText(&op.kind))?;
            for (i, &v) in op.inputs.iter().enumerate() {
                f.write_str(if i == 0 { " " } else { ", " })?;
                self.names.write(f, v)?;
            }
            if let Some(layer) = op.layer {
                write!(f, " @{layer}")?;
            }
            writeln!(f)?;
        }
        if !g.outputs.is_empty() {
            writeln!(f)?;
        }
        for (name, v) in &g.outputs {
            writeln!(f, "output {} = {}", Quoted(name), self.names.value(*v))?;
        }
        Ok(())
    }
}
