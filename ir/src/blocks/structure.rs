//! Structural identity of layers, shared by the verifier (invariant 8d) and block detection.
//!
//! Two layers are identical when their compute ops match position by position in kind,
//! attributes, result types and operand wiring; parameters are matched by kind and type, not
//! by identity, and a dropout's seed is per instance like a parameter's name (see
//! [`crate::verify`] for the full definition).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::graph::{Graph, OpId, ValueId};
use crate::op::OpKind;
use crate::text::KindText;
use crate::text::names::Names;
use crate::verify::lookup;

/// One layer instance: its compute (non-source) ops in execution order, and its own sources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LayerView {
    pub(crate) compute: Vec<OpId>,
    pub(crate) sources: Vec<OpId>,
}

/// Where and why a layer differs from the reference layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mismatch {
    /// The op of the compared layer at fault, when one is.
    pub(crate) op: Option<OpId>,
    pub(crate) detail: String,
}

/// The layers as tagged, keyed by tag; ops outside the execution order are left out.
pub(crate) fn views_from_tags(g: &Graph) -> BTreeMap<u32, LayerView> {
    let mut views: BTreeMap<u32, LayerView> = BTreeMap::new();
    for &o in g.order() {
        let Some(op) = lookup::op(g, o) else { continue };
        if let Some(layer) = op.layer {
            let view = views.entry(layer).or_default();
            if op.kind.is_source() {
                view.sources.push(o);
            } else {
                view.compute.push(o);
            }
        }
    }
    views
}

/// How an operand relates to the layer reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Result `index` of the layer's compute op at `position`.
    Internal {
        position: usize,
        index: u32,
    },
    /// One of the layer's own sources.
    Own(OpId),
    External,
}

/// A layer with lookup tables for classifying its operands.
struct Indexed {
    position: HashMap<OpId, usize>,
    own: HashSet<OpId>,
}

impl Indexed {
    fn new(view: &LayerView) -> Indexed {
        Indexed {
            position: view
                .compute
                .iter()
                .enumerate()
                .map(|(i, &o)| (o, i))
                .collect(),
            own: view.sources.iter().copied().collect(),
        }
    }

    fn classify(&self, g: &Graph, v: ValueId) -> Class {
        let Some(def) = lookup::value(g, v).map(|d| d.def) else {
            return Class::External;
        };
        if let Some(&position) = self.position.get(&def.op) {
            Class::Internal {
                position,
                index: def.index,
            }
        } else if self.own.contains(&def.op) {
            Class::Own(def.op)
        } else {
            Class::External
        }
    }
}

fn describe(g: &Graph, names: &Names, class: Class) -> String {
    match class {
        Class::Internal { position, index } => {
            format!("result {index} of the layer's op {position}")
        }
        Class::Own(o) => match lookup::op(g, o) {
            Some(op) => format!("the layer's own {}", op.kind.mnemonic()),
            None => names.op_head(g, o),
        },
        Class::External => "from outside the layer".into(),
    }
}

/// The mnemonic of a named source (`param`...), whose name does not count structurally.
pub(crate) fn source_class(kind: &OpKind) -> Option<&'static str> {
    match kind {
        OpKind::Input { .. }
        | OpKind::Param { .. }
        | OpKind::Buffer { .. }
        | OpKind::State { .. } => Some(kind.mnemonic()),
        _ => None,
    }
}

/// Equal kinds, except that named sources may differ in name.
pub(crate) fn same_kind_up_to_name(a: &OpKind, b: &OpKind) -> bool {
    match (source_class(a), source_class(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// `kind` with every per-instance attribute cleared: a dropout's `seed` (also inside `grad`),
/// which each layer picks for itself as it names its own parameters, an attention's sliding
/// `window` and `chunk` (Gemma 2 and gpt-oss alternate windowed and full layers, Llama 4
/// chunked and full ones: the same ops, shapes and parameters, a different mask) and a rotary embedding's base and scaling (Gemma 3's and
/// OLMo 3's windowed layers rotate by their own).
pub(crate) fn instance_neutral(kind: &OpKind) -> OpKind {
    match kind {
        OpKind::Dropout { p, .. } => OpKind::Dropout { p: *p, seed: 0 },
        OpKind::Attention { .. } => kind.clone().with_mask(crate::KeyMask::CAUSAL),
        OpKind::Rotary { heads, .. } => OpKind::Rotary {
            heads: *heads,
            theta: 0.0,
            scaling: crate::RopeScaling::None,
        },
        OpKind::Grad { of, wrt } => OpKind::Grad {
            of: Box::new(instance_neutral(of)),
            wrt: wrt.clone(),
        },
        other => other.clone(),
    }
}

/// Equal kinds up to per-instance attributes ([`instance_neutral`]).
pub(crate) fn same_kind_up_to_instance(a: &OpKind, b: &OpKind) -> bool {
    match (a, b) {
        (
            OpKind::Dropout { .. }
            | OpKind::Attention { .. }
            | OpKind::Rotary { .. }
            | OpKind::Grad { .. },
            _,
        ) => instance_neutral(a) == instance_neutral(b),
        _ => a == b,
    }
}

/// Checks that `other` is structurally identical to `reference` (invariant 8d).
pub(crate) fn compare(
    g: &Graph,
    names: &Names,
    reference: &LayerView,
    other: &LayerView,
) -> Result<(), Mismatch> {
    let fail = |op: Option<OpId>, detail: String| Err(Mismatch { op, detail });
    if reference.compute.len() != other.compute.len() {
        let detail = format!(
            "it has {} compute ops, that layer has {}",
            other.compute.len(),
            reference.compute.len()
        );
        return fail(other.compute.first().copied(), detail);
    }
    let (r, k) = (Indexed::new(reference), Indexed::new(other));
    // Own sources of `other` to those of `reference`, and back: must stay one-to-one.
    let mut fwd: HashMap<OpId, OpId> = HashMap::new();
    let mut back: HashMap<OpId, OpId> = HashMap::new();
    for (position, (&ro, &ko)) in reference.compute.iter().zip(&other.compute).enumerate() {
        let (Some(rop), Some(kop)) = (lookup::op(g, ro), lookup::op(g, ko)) else {
            return fail(Some(ko), "its ops are not in the graph".into());
        };
        let here = Some(ko);
        if !same_kind_up_to_instance(&rop.kind, &kop.kind) {
            let detail = format!(
                "op {position} is {}, that layer has {} ({})",
                KindText(&kop.kind),
                KindText(&rop.kind),
                names.op_head(g, ro)
            );
            return fail(here, detail);
        }
        let types = |op: &crate::graph::OpData| -> Vec<Option<String>> {
            op.results
                .iter()
                .map(|&v| lookup::value(g, v).map(|d| d.ty.to_string()))
                .collect()
        };
        if types(rop) != types(kop) {
            let detail = format!(
                "op {position} result types differ from those of that layer's {}",
                names.op_head(g, ro)
            );
            return fail(here, detail);
        }
        if rop.inputs.len() != kop.inputs.len() {
            let detail = format!(
                "op {position} has {} operands, that layer's {} has {}",
                kop.inputs.len(),
                names.op_head(g, ro),
                rop.inputs.len()
            );
            return fail(here, detail);
        }
        for (i, (&rv, &kv)) in rop.inputs.iter().zip(&kop.inputs).enumerate() {
            let (rc, kc) = (r.classify(g, rv), k.classify(g, kv));
            let same = match (rc, kc) {
                (Class::Internal { .. }, Class::Internal { .. }) => rc == kc,
                (Class::Own(rs), Class::Own(ks)) => {
                    let fits = match (lookup::op(g, rs), lookup::op(g, ks)) {
                        (Some(a), Some(b)) => same_kind_up_to_name(&a.kind, &b.kind),
                        _ => false,
                    };
                    let fwd_ok = *fwd.entry(ks).or_insert(rs) == rs;
                    let back_ok = *back.entry(rs).or_insert(ks) == ks;
                    fits && fwd_ok && back_ok && same_type(g, rv, kv)
                }
                (Class::External, Class::External) => same_type(g, rv, kv),
                _ => false,
            };
            if !same {
                let detail = format!(
                    "operand {i} of op {position} ({}, {}) does not match that layer's ({} in {}, {})",
                    names.value(kv),
                    describe(g, names, kc),
                    names.value(rv),
                    names.op_head(g, ro),
                    describe(g, names, rc)
                );
                return fail(here, detail);
            }
        }
    }
    if let Some(&unread) = other.sources.iter().find(|s| !fwd.contains_key(s)) {
        let detail = "this source is tagged with the layer but its compute ops do not read it";
        return fail(Some(unread), detail.into());
    }
    if other.sources.len() != reference.sources.len() {
        let detail = format!(
            "it has {} own sources, that layer has {}",
            other.sources.len(),
            reference.sources.len()
        );
        return fail(other.compute.first().copied(), detail);
    }
    Ok(())
}

fn same_type(g: &Graph, a: ValueId, b: ValueId) -> bool {
    match (lookup::value(g, a), lookup::value(g, b)) {
        (Some(x), Some(y)) => x.ty == y.ty,
        _ => false,
    }
}
