//! The verifier: checks every invariant of a [`Graph`] and reports all violations, each with
//! its location (`op7: %7 = linear: ...`, values named as [`crate::text::print`] names them).
//!
//! # Invariants
//!
//! 1. **Order.** Every id in the execution order names an existing op, and every op appears in
//!    the order exactly once.
//! 2. **Results.** Every op has as many results as its kind defines
//!    ([`crate::OpKind::result_count`]); every result id exists and that value's `def` is
//!    (this op, this result index); every value is listed as a result by the op and index its
//!    `def` names (no orphan values).
//! 3. **Operands and dominance.** Every operand id exists, and for an op in the execution
//!    order, the op defining each operand comes strictly earlier in it (an op never reads its
//!    own result).
//! 4. **Sources.** `input`, `param`, `buffer` and `state` take no operands (their single result
//!    is checked by 2; their type is declared, not inferred).
//! 5. **Types.** For every other op, `scalar` and `iota` included, [`crate::infer_types`] on
//!    the operand types succeeds (its message is reported verbatim) and gives exactly the
//!    declared result types. Skipped for an op with a nonexistent operand (reported by 3).
//! 6. **Source names.** Names of `input`, `param`, `buffer` and `state` ops are unique within
//!    each kind (a param and a buffer may share a name).
//! 7. **Outputs.** Every output refers to an existing value; output names are unique.
//! 8. **Layers.**
//!    - 8a. If any op carries a layer tag, `block_name` is set.
//!    - 8b. If `block_name` is set, some op carries a layer tag.
//!    - 8c. Tags are dense: with N = largest tag + 1, every layer `0..N` has a compute
//!      (non-source) op in the execution order.
//!    - 8d. Every layer k ≥ 1 is structurally identical to the first layer of its run
//!      (layer 0, or the largest of `kind_starts` ≤ k, which are ascending, ≥ 1 and below the
//!      layer count: the block may change structure, as DeepSeek-V3's dense layers give way to
//!      mixture-of-experts layers). Below, "layer 0" is that first layer. A layer's *compute ops*
//!      are its tagged non-source ops in execution order; its *own sources* are its tagged
//!      source ops. Layer k matches layer 0 when it has as many compute ops, and position by
//!      position: the kinds are equal (attributes included, except a `dropout`'s `seed`, also
//!      inside `grad{of=dropout}`: each layer draws its own mask; an `attention`'s `window`:
//!      Gemma 2 and gpt-oss alternate sliding-window and full layers; a `rotary`'s `theta`
//!      and `scaling`: Gemma 3's and OLMo 3's windowed layers rotate by their own), the result types are equal, the
//!      operand counts are equal, and each operand is of the same class: *internal* (result
//!      r of the layer's compute op at position q, with the same q and r), *own source* (the
//!      source kinds equal up to their names, the types equal, and layer k's own sources map
//!      one-to-one onto layer 0's), or *external* (anything else, with the same type). Layer
//!      k has as many own sources as layer 0 and its compute ops read every one of them.
//!
//!    8c and 8d need well-formed ids, so they run only when 1–3 hold.
//!
//! Errors are collected, never short-circuited: one verification lists everything wrong.

mod error;
pub(crate) mod lookup;

use std::collections::{BTreeMap, HashMap};

pub use error::{ErrorKind, Location, VerifyError, VerifyErrors};

use crate::blocks::structure::{self, LayerView};
use crate::graph::{Graph, OpId, ValueDef};
use crate::op::{OpKind, infer_types};
use crate::text::names::Names;
use crate::types::TensorType;

/// Checks every invariant listed in the module doc; returns all violations.
pub fn verify(graph: &Graph) -> Result<(), VerifyErrors> {
    let mut v = Verifier::new(graph);
    v.check_order();
    v.check_results();
    v.check_operands();
    let well_formed = v.errors.is_empty();
    v.check_types();
    v.check_source_names();
    v.check_outputs();
    v.check_layers(well_formed);
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(VerifyErrors { errors: v.errors })
    }
}

/// Whether invariants 1–3 hold, so every id in the graph can be looked up safely.
pub(crate) fn well_formed(graph: &Graph) -> bool {
    let mut v = Verifier::new(graph);
    v.check_order();
    v.check_results();
    v.check_operands();
    v.errors.is_empty()
}

struct Verifier<'a> {
    g: &'a Graph,
    names: Names,
    /// First position of each op in the execution order.
    position: Vec<Option<usize>>,
    errors: Vec<VerifyError>,
}

impl<'a> Verifier<'a> {
    fn new(g: &'a Graph) -> Verifier<'a> {
        let mut position = vec![None; g.num_ops()];
        for (i, o) in g.order().iter().enumerate() {
            if let Some(slot @ None) = position.get_mut(o.index()) {
                *slot = Some(i);
            }
        }
        Verifier {
            g,
            names: Names::new(g),
            position,
            errors: Vec::new(),
        }
    }

    fn at_op(&mut self, op: OpId, kind: ErrorKind) {
        let head = self.names.op_head(self.g, op);
        self.errors.push(VerifyError {
            location: Location::Op { op, head },
            kind,
        });
    }

    fn at(&mut self, location: Location, kind: ErrorKind) {
        self.errors.push(VerifyError { location, kind });
    }

    /// Invariant 1.
    fn check_order(&mut self) {
        let mut times = vec![0usize; self.g.num_ops()];
        for (position, &op) in self.g.order().iter().enumerate() {
            match times.get_mut(op.index()) {
                Some(t) => *t += 1,
                None => self.at(
                    Location::Graph,
                    ErrorKind::UnknownOpInOrder { position, op },
                ),
            }
        }
        for (o, &t) in self.g.op_ids().zip(&times) {
            match t {
                1 => {}
                0 => self.at_op(o, ErrorKind::MissingFromOrder),
                times => self.at_op(o, ErrorKind::RepeatedInOrder { times }),
            }
        }
    }

    /// Invariant 2.
    fn check_results(&mut self) {
        let g = self.g;
        for o in g.op_ids() {
            let op = g.op(o);
            let expected = op.kind.result_count();
            if op.results.len() != expected {
                let kind = ErrorKind::ResultCount {
                    mnemonic: op.kind.mnemonic(),
                    expected,
                    found: op.results.len(),
                };
                self.at_op(o, kind);
            }
            for (index, &value) in op.results.iter().enumerate() {
                let Some(data) = lookup::value(g, value) else {
                    self.at_op(o, ErrorKind::UnknownResult { index, value });
                    continue;
                };
                let def = data.def;
                if def
                    != (ValueDef {
                        op: o,
                        index: index as u32,
                    })
                {
                    let kind = ErrorKind::DefMismatch {
                        index,
                        value: self.names.value(value),
                        def_op: def.op,
                        def_index: def.index,
                    };
                    self.at_op(o, kind);
                }
            }
        }
        for value in g.value_ids() {
            let def = g.value(value).def;
            let listed = lookup::op(g, def.op)
                .and_then(|op| op.results.get(def.index as usize))
                .is_some_and(|&r| r == value);
            if !listed {
                let kind = ErrorKind::OrphanValue {
                    def_op: def.op,
                    def_index: def.index,
                };
                self.at(Location::Value { value }, kind);
            }
        }
    }

    /// Invariant 3.
    fn check_operands(&mut self) {
        let g = self.g;
        for o in g.op_ids() {
            let here = self.position.get(o.index()).copied().flatten();
            for (index, &value) in g.op(o).inputs.iter().enumerate() {
                let Some(data) = lookup::value(g, value) else {
                    self.at_op(o, ErrorKind::UndefinedOperand { index, value });
                    continue;
                };
                let def_op = data.def.op;
                if lookup::op(g, def_op).is_none() {
                    continue; // an orphan value, reported by invariant 2
                }
                match (self.position.get(def_op.index()).copied().flatten(), here) {
                    // An op missing from the order is reported once, not once per operand.
                    (_, None) => {}
                    (None, Some(_)) => {
                        let kind = ErrorKind::UnorderedOperand {
                            index,
                            value: self.names.value(value),
                            def_op,
                        };
                        self.at_op(o, kind);
                    }
                    (Some(d), Some(h)) if d >= h => {
                        let kind = ErrorKind::UseBeforeDef {
                            index,
                            value: self.names.value(value),
                            def: format!("{def_op} ({})", self.names.op_head(g, def_op)),
                        };
                        self.at_op(o, kind);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Invariants 4 and 5.
    fn check_types(&mut self) {
        let g = self.g;
        for o in g.op_ids() {
            let op = g.op(o);
            if matches!(
                op.kind,
                OpKind::Input { .. }
                    | OpKind::Param { .. }
                    | OpKind::Buffer { .. }
                    | OpKind::State { .. }
            ) {
                if !op.inputs.is_empty() {
                    self.at_op(
                        o,
                        ErrorKind::SourceOperands {
                            count: op.inputs.len(),
                        },
                    );
                }
                continue;
            }
            let inputs: Option<Vec<&TensorType>> = op
                .inputs
                .iter()
                .map(|&v| lookup::value(g, v).map(|d| &d.ty))
                .collect();
            let Some(inputs) = inputs else { continue };
            match infer_types(&op.kind, &inputs) {
                Err(message) => self.at_op(o, ErrorKind::Inference { message }),
                // A count mismatch is reported by invariant 2.
                Ok(inferred) if inferred.len() == op.results.len() => {
                    for (index, (&r, inferred)) in op.results.iter().zip(inferred).enumerate() {
                        let Some(declared) = lookup::value(g, r).map(|d| &d.ty) else {
                            continue;
                        };
                        if *declared != inferred {
                            let kind = ErrorKind::ResultType {
                                index,
                                mnemonic: op.kind.mnemonic(),
                                declared: declared.clone(),
                                inferred,
                            };
                            self.at_op(o, kind);
                        }
                    }
                }
                Ok(_) => {}
            }
        }
    }

    /// Invariant 6.
    fn check_source_names(&mut self) {
        let g = self.g;
        let mut first: HashMap<(&'static str, &str), OpId> = HashMap::new();
        for o in g.op_ids() {
            let kind = &g.op(o).kind;
            let name = match kind {
                OpKind::Input { name }
                | OpKind::Param { name }
                | OpKind::Buffer { name }
                | OpKind::State { name } => name,
                _ => continue,
            };
            match first.get(&(kind.mnemonic(), name.as_str())) {
                Some(&f) => {
                    let kind = ErrorKind::DuplicateSourceName {
                        kind: kind.mnemonic(),
                        name: name.clone(),
                        first: format!("{f} ({})", self.names.op_head(g, f)),
                    };
                    self.at_op(o, kind);
                }
                None => {
                    first.insert((kind.mnemonic(), name), o);
                }
            }
        }
    }

    /// Invariant 7.
    fn check_outputs(&mut self) {
        let g = self.g;
        for (i, (name, value)) in g.outputs.iter().enumerate() {
            let location = || Location::Output { name: name.clone() };
            if lookup::value(g, *value).is_none() {
                self.at(location(), ErrorKind::OutputUndefined { value: *value });
            }
            if g.outputs[..i].iter().any(|(n, _)| n == name) {
                self.at(location(), ErrorKind::DuplicateOutput);
            }
        }
    }

    /// Invariant 8.
    fn check_layers(&mut self, well_formed: bool) {
        let g = self.g;
        let tagged = g.op_ids().filter(|&o| g.op(o).layer.is_some()).count();
        match (&g.block_name, tagged) {
            (None, t) if t > 0 => {
                self.at(Location::Graph, ErrorKind::LayersWithoutBlock { tagged })
            }
            (Some(block), 0) => {
                let kind = ErrorKind::BlockWithoutLayers {
                    block: block.clone(),
                };
                self.at(Location::Graph, kind);
            }
            _ => {}
        }
        if !well_formed || tagged == 0 {
            return;
        }
        let views: BTreeMap<u32, LayerView> = structure::views_from_tags(g);
        // Not `Graph::num_layers`: a tag of u32::MAX would overflow its `max + 1`.
        let layers = views.keys().next_back().map_or(0, |&m| u64::from(m) + 1);
        // Stops at the first gap, so a huge tag costs no more than the layers that exist.
        let missing = (0..=u32::MAX)
            .take_while(|&l| u64::from(l) < layers)
            .find(|l| views.get(l).is_none_or(|v| v.compute.is_empty()));
        if let Some(layer) = missing {
            self.at(Location::Graph, ErrorKind::EmptyLayer { layer, layers });
        }
        let starts = &g.kind_starts;
        let ascending = starts.windows(2).all(|w| w[0] < w[1]);
        if !starts.is_empty()
            && (!ascending || starts[0] == 0 || u64::from(starts[starts.len() - 1]) >= layers)
        {
            let kind = ErrorKind::KindStarts {
                starts: starts.clone(),
                layers,
            };
            self.at(Location::Graph, kind);
            return;
        }
        // An empty layer is already reported by 8c; comparing it would only repeat that.
        for (&layer, view) in views.range(1..).filter(|(_, v)| !v.compute.is_empty()) {
            let first = g.kind_start(layer);
            let Some(reference) = views.get(&first).filter(|_| first != layer) else {
                continue;
            };
            if let Err(m) = structure::compare(g, &self.names, reference, view) {
                let kind = ErrorKind::LayerStructure {
                    layer,
                    reference: first,
                    detail: m.detail,
                };
                match m.op {
                    Some(op) => self.at_op(op, kind),
                    None => self.at(Location::Graph, kind),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
