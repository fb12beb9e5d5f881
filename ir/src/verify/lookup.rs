//! Checked table lookups: `Graph::value` and `Graph::op` index directly, and the verifier and
//! block detection must not panic on ids that point nowhere.

use crate::graph::{Graph, OpData, OpId, ValueData, ValueId};

pub(crate) fn value(g: &Graph, v: ValueId) -> Option<&ValueData> {
    (v.index() < g.num_values()).then(|| g.value(v))
}

pub(crate) fn op(g: &Graph, o: OpId) -> Option<&OpData> {
    (o.index() < g.num_ops()).then(|| g.op(o))
}
