//! The importer's state while walking the ONNX graph: which values are constants, which are IR
//! values, and how a constant becomes an IR value when data-dependent code needs it.
//!
//! A constant that derives from a trainable initializer (a float initializer of rank >= 1) is
//! turned into IR by replaying the nodes that computed it, so weights stay parameters (GPT-2's
//! tied `lm_head.weight` is read through a folded Transpose; the position table through a
//! folded Gather). Replay stops at ops the IR cannot express (Cos, Sin, Range...): what they
//! compute is a table derived from shapes, so it becomes a buffer and the initializers behind
//! it (rotary `inv_freq`) do not count as parameters.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use ir::{DType, Graph, OpKind, Shape, TensorType, ValueId, Weights};

use super::node::NodeRef;
use super::proto::NodeProto;
use super::value::{Const, Elem};
use crate::ImportError;

/// How many nodes a constant's replay may nest before it is kept as a buffer instead.
const MAX_REPLAY_DEPTH: usize = 64;

/// A node result: folded, or computed by the IR graph.
#[derive(Clone, Debug)]
pub enum Val {
    Const(Const),
    Ir(ValueId),
}

#[derive(Debug)]
pub struct Importer<'a> {
    pub file: &'a Path,
    pub opset: i64,
    pub nodes: &'a [NodeProto],
    /// Value name to the index of the node that produces it.
    pub producer: HashMap<&'a str, usize>,
    pub consts: HashMap<String, Const>,
    /// Constants computed from a trainable initializer (including those initializers).
    pub weight_dep: HashSet<String>,
    /// Float initializers of rank >= 1: parameters if the IR graph ends up reading them.
    pub trainable: HashSet<String>,
    pub ir: HashMap<String, ValueId>,
    pub graph: Graph,
    pub weights: Weights,
    /// Values of IR values that hold constants (buffers, scalars), for the pattern matchers.
    pub known: HashMap<ValueId, Const>,
    /// Nodes being lowered, so replaying constants cannot recurse forever on a cyclic file.
    lowering: HashSet<usize>,
}

impl<'a> Importer<'a> {
    pub fn new(file: &'a Path, opset: i64, nodes: &'a [NodeProto], name: &str) -> Importer<'a> {
        let mut producer = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            for o in &n.output {
                if !o.is_empty() {
                    producer.insert(o.as_str(), i);
                }
            }
        }
        Importer {
            file,
            opset,
            nodes,
            producer,
            consts: HashMap::new(),
            weight_dep: HashSet::new(),
            trainable: HashSet::new(),
            ir: HashMap::new(),
            graph: Graph::new(name),
            weights: Weights::new(),
            known: HashMap::new(),
            lowering: HashSet::new(),
        }
    }

    pub fn node(&self, index: usize) -> Option<NodeRef<'a>> {
        self.nodes.get(index).map(|node| NodeRef {
            file: self.file,
            node,
            index,
        })
    }

    /// Records the results of node `n`.
    pub fn store(&mut self, n: &NodeRef<'_>, outs: Vec<Val>, weight_dep: bool) {
        for (name, v) in n.node.output.iter().zip(outs) {
            if name.is_empty() {
                continue;
            }
            match v {
                Val::Const(c) => {
                    if weight_dep {
                        self.weight_dep.insert(name.clone());
                    }
                    self.consts.insert(name.clone(), c);
                }
                Val::Ir(v) => {
                    self.ir.insert(name.clone(), v);
                }
            }
        }
    }

    /// The IR value for `name`, turning a constant into IR if needed.
    pub fn materialize(&mut self, n: &NodeRef<'_>, name: &str) -> Result<ValueId, ImportError> {
        if let Some(&v) = self.ir.get(name) {
            return Ok(v);
        }
        let Some(c) = self.consts.get(name).cloned() else {
            return Err(ImportError::UndefinedValue {
                file: self.file.to_path_buf(),
                node: n.name(),
                op_type: n.op().to_string(),
                value: name.to_string(),
            });
        };
        if self.trainable.contains(name) {
            let v = self.param(name, &c);
            self.ir.insert(name.to_string(), v);
            return Ok(v);
        }
        let replay = self
            .producer
            .get(name)
            .copied()
            .filter(|i| self.weight_dep.contains(name) && !self.lowering.contains(i))
            // Deep replays would recurse deeply; the folded value serves just as well.
            .filter(|_| self.lowering.len() < MAX_REPLAY_DEPTH)
            .filter(|&i| super::lower::lowerable(self.nodes.get(i)));
        // A failed replay is not an error: the folded value is still exact.
        if let Some(i) = replay
            && self.lower_node(i).is_ok()
            && let Some(&v) = self.ir.get(name)
        {
            // Pattern matchers read tables (rotary cos/sin) through this.
            self.known.insert(v, c);
            return Ok(v);
        }
        let v = self.constant(name, &c);
        self.ir.insert(name.to_string(), v);
        Ok(v)
    }

    /// Lowers node `i` to IR (inputs are materialized as needed) and records its results.
    pub fn lower_node(&mut self, i: usize) -> Result<(), ImportError> {
        let Some(n) = self.node(i) else {
            return Ok(());
        };
        self.lowering.insert(i);
        let r = super::lower::lower(self, &n);
        self.lowering.remove(&i);
        let outs = r?;
        self.store(&n, outs, false);
        Ok(())
    }

    fn param(&mut self, name: &str, c: &Const) -> ValueId {
        let ty = TensorType::new(c.elem.dtype(), fixed(&c.shape));
        self.weights.insert(name.to_string(), c.to_tensor());
        self.graph.push_source(
            OpKind::Param {
                name: name.to_string(),
            },
            ty,
            None,
        )
    }

    /// An IR value holding constant `c`: a literal, positions, or a named buffer.
    pub fn constant(&mut self, name: &str, c: &Const) -> ValueId {
        let v = self.constant_inner(name, c);
        self.known.insert(v, c.clone());
        v
    }

    fn constant_inner(&mut self, name: &str, c: &Const) -> ValueId {
        let dtype = c.elem.dtype();
        if let (Some(x), true) = (c.single(), c.elem.is_float()) {
            let s = self.literal(x, dtype);
            return self.reshaped(s, &c.shape);
        }
        // Position ids 0..n (GPT-2's learned position lookup) need no stored tensor.
        let len = c.numel();
        let is_iota = c.elem == Elem::Int
            && len > 1
            && c.shape.iter().filter(|&&d| d != 1).count() == 1
            && c.data.iter().enumerate().all(|(i, &x)| x == i as f64);
        if is_iota {
            let iota = self.graph.push_source(
                OpKind::Iota {
                    len: ir::Dim::Fixed(len as u64),
                },
                TensorType::new(DType::I64, Shape::fixed(&[len as u64])),
                None,
            );
            return self.reshaped(iota, &c.shape);
        }
        self.buffer(name, c)
    }

    fn buffer(&mut self, name: &str, c: &Const) -> ValueId {
        let ty = TensorType::new(c.elem.dtype(), fixed(&c.shape));
        self.weights.insert(name.to_string(), c.to_tensor());
        self.graph.push_source(
            OpKind::Buffer {
                name: name.to_string(),
            },
            ty,
            None,
        )
    }

    /// A rank-0 literal of the given float type (the IR's `scalar` op is f32).
    pub fn literal(&mut self, x: f64, dtype: DType) -> ValueId {
        if dtype == DType::F32 {
            let ty = TensorType::new(DType::F32, Shape::scalar());
            let v = self
                .graph
                .push_source(OpKind::Scalar { value: x }, ty, None);
            self.known
                .insert(v, Const::scalar(Elem::Float(DType::F32), x));
            v
        } else {
            let name = format!("literal_{}_{}", dtype.name(), x);
            self.buffer(&name, &Const::scalar(Elem::Float(dtype), x))
        }
    }

    /// `v` reshaped to `dims` when its shape differs (same element count by construction).
    pub fn reshaped(&mut self, v: ValueId, dims: &[usize]) -> ValueId {
        let want = fixed(dims);
        if self.graph.ty(v).shape == want {
            return v;
        }
        let ty = TensorType::new(self.graph.ty(v).dtype, want.clone());
        let op =
            self.graph
                .push_op_typed(OpKind::Reshape { shape: want.0 }, vec![v], vec![ty], None);
        self.graph.op(op).results.first().copied().unwrap_or(v)
    }

    /// Concrete dimensions of an IR value (every dimension is fixed once batch/seq are bound).
    pub fn dims(&self, v: ValueId) -> Vec<usize> {
        self.graph
            .ty(v)
            .shape
            .dims()
            .iter()
            .map(|d| d.fixed().unwrap_or(0) as usize)
            .collect()
    }
}

pub fn fixed(dims: &[usize]) -> Shape {
    Shape(dims.iter().map(|&d| ir::Dim::Fixed(d as u64)).collect())
}
