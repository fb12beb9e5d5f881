//! The tensor graph: typed ids, tables keyed by them, and an execution order kept apart from
//! the dataflow (as in cranelift: passes may reorder without touching operands).

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::op::{OpKind, infer_types};
use crate::types::{Binding, TensorType};

/// A value (one tensor) defined by exactly one op result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

/// An op (one node of the graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl OpId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op{}", self.0)
    }
}

/// Where a value comes from: result `index` of op `op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueDef {
    pub op: OpId,
    pub index: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueData {
    pub ty: TensorType,
    pub def: ValueDef,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpData {
    pub kind: OpKind,
    pub inputs: Vec<ValueId>,
    pub results: Vec<ValueId>,
    /// Which repeated layer (transformer block) this op belongs to, if any.
    pub layer: Option<u32>,
}

/// A tensor graph: forward model or training step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub name: String,
    values: Vec<ValueData>,
    ops: Vec<OpData>,
    /// Execution order; every op appears exactly once (the verifier checks it).
    order: Vec<OpId>,
    /// Named results of the graph (`logits`, `loss`, updated parameters...).
    pub outputs: Vec<(String, ValueId)>,
    /// Name of the repeated block (`decoder_layer`) whose instances are tagged by `OpData::layer`.
    pub block_name: Option<String>,
    /// Layers at which the block's structure changes, ascending, each ≥ 1: layer `l` is
    /// structurally identical to the first layer of its run (the largest start ≤ `l`, else
    /// layer 0). Empty for a uniform block; DeepSeek-V3's three dense layers before its
    /// mixture-of-experts layers: `[3]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kind_starts: Vec<u32>,
}

/// A builder error: the op that could not be added and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot add {op}: {reason}")]
pub struct BuildError {
    pub op: String,
    pub reason: String,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    pub fn value(&self, v: ValueId) -> &ValueData {
        &self.values[v.index()]
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.index()].ty
    }

    pub fn op(&self, o: OpId) -> &OpData {
        &self.ops[o.index()]
    }

    pub fn op_mut(&mut self, o: OpId) -> &mut OpData {
        &mut self.ops[o.index()]
    }

    pub fn num_values(&self) -> usize {
        self.values.len()
    }

    pub fn num_ops(&self) -> usize {
        self.ops.len()
    }

    /// Ops in execution order.
    pub fn order(&self) -> &[OpId] {
        &self.order
    }

    pub fn set_order(&mut self, order: Vec<OpId>) {
        self.order = order;
    }

    /// All op ids, in creation order.
    pub fn op_ids(&self) -> impl Iterator<Item = OpId> + '_ {
        (0..self.ops.len() as u32).map(OpId)
    }

    pub fn value_ids(&self) -> impl Iterator<Item = ValueId> + '_ {
        (0..self.values.len() as u32).map(ValueId)
    }

    /// The op defining `v`.
    pub fn def_op(&self, v: ValueId) -> OpId {
        self.values[v.index()].def.op
    }

    /// Adds an op whose result types are given (no inference, no checks): the parser and
    /// source ops use this; the verifier checks the result later.
    pub fn push_op_typed(
        &mut self,
        kind: OpKind,
        inputs: Vec<ValueId>,
        result_types: Vec<TensorType>,
        layer: Option<u32>,
    ) -> OpId {
        let op = OpId(self.ops.len() as u32);
        let results = result_types
            .into_iter()
            .enumerate()
            .map(|(i, ty)| {
                let v = ValueId(self.values.len() as u32);
                self.values.push(ValueData {
                    ty,
                    def: ValueDef {
                        op,
                        index: i as u32,
                    },
                });
                v
            })
            .collect();
        self.ops.push(OpData {
            kind,
            inputs,
            results,
            layer,
        });
        self.order.push(op);
        op
    }

    /// Adds an op, inferring its result types; fails if the operands do not fit the op.
    pub fn push_op(
        &mut self,
        kind: OpKind,
        inputs: Vec<ValueId>,
        layer: Option<u32>,
    ) -> Result<Vec<ValueId>, BuildError> {
        if let Some(bad) = inputs.iter().find(|v| v.index() >= self.values.len()) {
            return Err(BuildError {
                op: kind.mnemonic().into(),
                reason: format!("operand {bad} is not defined"),
            });
        }
        let tys: Vec<&TensorType> = inputs.iter().map(|&v| self.ty(v)).collect();
        let out = infer_types(&kind, &tys).map_err(|reason| BuildError {
            op: kind.mnemonic().into(),
            reason,
        })?;
        let op = self.push_op_typed(kind, inputs, out, layer);
        Ok(self.op(op).results.clone())
    }

    /// Adds a source op (input, param, buffer, state) of the given type.
    pub fn push_source(&mut self, kind: OpKind, ty: TensorType, layer: Option<u32>) -> ValueId {
        let op = self.push_op_typed(kind, vec![], vec![ty], layer);
        self.op(op).results[0]
    }

    pub fn add_output(&mut self, name: impl Into<String>, v: ValueId) {
        self.outputs.push((name.into(), v));
    }

    pub fn output(&self, name: &str) -> Option<ValueId> {
        self.outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
    }

    /// Trainable parameters in order: (name, value).
    pub fn params(&self) -> Vec<(String, ValueId)> {
        self.order
            .iter()
            .filter_map(|&o| match &self.op(o).kind {
                OpKind::Param { name } => Some((name.clone(), self.op(o).results[0])),
                _ => None,
            })
            .collect()
    }

    /// Total trainable parameter count (parameters must have fixed shapes).
    pub fn param_count(&self) -> u64 {
        self.params()
            .iter()
            .map(|&(_, v)| self.ty(v).shape.fixed_numel().unwrap_or(0))
            .sum()
    }

    /// Uses of every value: op ids that read it, in execution order.
    pub fn uses(&self) -> Uses {
        Uses::of(self)
    }

    /// Number of distinct layer tags (repeated-block instances).
    pub fn num_layers(&self) -> u32 {
        self.ops
            .iter()
            .filter_map(|o| o.layer)
            .max()
            .map_or(0, |m| m + 1)
    }

    /// The first layer of the run `layer` belongs to ([`Graph::kind_starts`]): the layer it is
    /// structurally identical to.
    pub fn kind_start(&self, layer: u32) -> u32 {
        self.kind_starts
            .iter()
            .copied()
            .take_while(|&s| s <= layer)
            .last()
            .unwrap_or(0)
    }

    /// Every layer's ops in execution order, indexed by layer: one pass over the graph, where
    /// [`Graph::layer_ops`] of each layer would pass over it once per layer.
    pub fn ops_by_layer(&self) -> Vec<Vec<OpId>> {
        let mut by_layer = vec![Vec::new(); self.num_layers() as usize];
        for &o in &self.order {
            if let Some(ops) = self.op(o).layer.and_then(|l| by_layer.get_mut(l as usize)) {
                ops.push(o);
            }
        }
        by_layer
    }

    /// Ops of one layer, in execution order.
    pub fn layer_ops(&self, layer: u32) -> Vec<OpId> {
        self.order
            .iter()
            .copied()
            .filter(|&o| self.op(o).layer == Some(layer))
            .collect()
    }

    /// Histogram of op mnemonics (compute and layout ops only, sources excluded).
    pub fn histogram(&self) -> Vec<(String, usize)> {
        let mut h: HashMap<String, usize> = HashMap::new();
        for &o in &self.order {
            let k = &self.op(o).kind;
            if !k.is_source() {
                let name = match k {
                    OpKind::Grad { of, .. } => format!("grad.{}", of.mnemonic()),
                    _ => k.mnemonic().to_string(),
                };
                *h.entry(name).or_default() += 1;
            }
        }
        let mut v: Vec<_> = h.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Bytes of all values under a binding (a crude upper bound on live memory).
    pub fn total_value_bytes(&self, b: Binding) -> u64 {
        self.values.iter().map(|v| v.ty.bytes(b)).sum()
    }

    /// Replaces every use of `from` by `to` (operands and outputs).
    pub fn replace_uses(&mut self, from: ValueId, to: ValueId) {
        for op in &mut self.ops {
            for v in &mut op.inputs {
                if *v == from {
                    *v = to;
                }
            }
        }
        for (_, v) in &mut self.outputs {
            if *v == from {
                *v = to;
            }
        }
    }

    /// Removes ops whose results are not needed by any output, then compacts the tables so
    /// ids stay dense. Returns the number of ops removed.
    pub fn remove_dead_ops(&mut self) -> usize {
        let mut live = vec![false; self.ops.len()];
        let mut stack: Vec<OpId> = self.outputs.iter().map(|&(_, v)| self.def_op(v)).collect();
        while let Some(o) = stack.pop() {
            if std::mem::replace(&mut live[o.index()], true) {
                continue;
            }
            for &v in &self.op(o).inputs {
                stack.push(self.def_op(v));
            }
        }
        let removed = live.iter().filter(|l| !**l).count();
        if removed == 0 {
            return 0;
        }
        self.compact(|o| live[o.index()]);
        removed
    }

    /// Rebuilds the tables keeping only ops for which `keep` holds, in execution order.
    fn compact(&mut self, keep: impl Fn(OpId) -> bool) {
        let old = std::mem::take(self);
        let mut new = Graph {
            name: old.name.clone(),
            block_name: old.block_name.clone(),
            kind_starts: old.kind_starts.clone(),
            ..Graph::default()
        };
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        for &o in &old.order {
            if !keep(o) {
                continue;
            }
            let data = old.op(o);
            let inputs = data.inputs.iter().map(|v| map[v]).collect();
            let tys = data.results.iter().map(|&v| old.ty(v).clone()).collect();
            let no = new.push_op_typed(data.kind.clone(), inputs, tys, data.layer);
            for (a, b) in data.results.iter().zip(new.op(no).results.clone()) {
                map.insert(*a, b);
            }
        }
        new.outputs = old
            .outputs
            .iter()
            .map(|(n, v)| (n.clone(), map[v]))
            .collect();
        *self = new;
    }
}

/// Each value's readers ([`Graph::uses`]), in execution order: one flat list with an offset per
/// value, so a graph of many layers costs two passes and two allocations, not one list per value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Uses {
    /// `readers[start[v]..start[v + 1]]` are value v's readers.
    start: Vec<u32>,
    readers: Vec<OpId>,
}

impl Uses {
    fn of(g: &Graph) -> Uses {
        let n = g.values.len();
        let mut start = vec![0u32; n + 1];
        let inputs = || {
            g.order
                .iter()
                .flat_map(|&o| g.op(o).inputs.iter().map(move |&v| (o, v)))
        };
        for (_, v) in inputs() {
            if v.index() < n {
                start[v.index() + 1] += 1;
            }
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut readers = vec![OpId(0); start[n] as usize];
        for (o, v) in inputs() {
            if v.index() < n {
                let slot = &mut next[v.index()];
                readers[*slot as usize] = o;
                *slot += 1;
            }
        }
        Uses { start, readers }
    }

    /// The ops that read value `v` (empty for a value not in the graph).
    pub fn of_value(&self, v: ValueId) -> &[OpId] {
        self.get(v.index()).unwrap_or(&[])
    }

    /// The readers of the value with index `i`, `None` past the graph's values.
    pub fn get(&self, i: usize) -> Option<&[OpId]> {
        let (a, b) = (*self.start.get(i)?, *self.start.get(i + 1)?);
        Some(&self.readers[a as usize..b as usize])
    }

    /// Readers per value, by value index.
    pub fn iter(&self) -> impl Iterator<Item = &[OpId]> {
        (0..self.start.len().saturating_sub(1)).filter_map(|i| self.get(i))
    }
}

impl std::ops::Index<usize> for Uses {
    type Output = [OpId];
    fn index(&self, i: usize) -> &[OpId] {
        self.get(i).unwrap_or(&[])
    }
}

#[cfg(test)]
mod uses_tests {
    use crate::testing::{TinyConfig, tiny_llama};

    /// The compressed table lists, for every value, exactly the ops whose inputs name it, in
    /// execution order (an operand read twice by one op is listed twice), as scanning every
    /// op's operands for it does.
    #[test]
    fn uses_lists_each_values_readers_in_order() {
        let g = tiny_llama(&TinyConfig::llama()).unwrap();
        let uses = g.uses();
        let mut checked = 0;
        for v in g.value_ids() {
            let scanned: Vec<_> = g
                .order()
                .iter()
                .flat_map(|&o| {
                    g.op(o)
                        .inputs
                        .iter()
                        .filter(move |&&i| i == v)
                        .map(move |_| o)
                })
                .collect();
            assert_eq!(uses.of_value(v), scanned.as_slice(), "{v}");
            assert_eq!(&uses[v.index()], scanned.as_slice());
            checked += usize::from(!scanned.is_empty());
        }
        assert!(checked > 10, "the graph has readers to check");
        assert_eq!(uses.iter().count(), g.num_values());
        assert!(uses.get(g.num_values()).is_none());
    }
}
