//! Finding the repeated layers of an untagged graph by structural hashing.
//!
//! 1. Each compute (non-source) op gets a local signature: its kind with attributes (but no
//!    dropout seed: each layer draws its own mask), its result types, and per operand either
//!    the source kind and type (names ignored, so each layer's own parameters look alike) or
//!    just the type of a computed value.
//! 2. Along the execution order, every stretch that repeats with some period is a candidate:
//!    `N` consecutive copies of `L` ops with equal signatures. Candidates are ranked by ops
//!    covered (`N·L`), then by more copies; so twelve layers win over six pairs of layers.
//! 3. Within a periodic stretch the copies may start at several offsets (a layer could be read
//!    as starting after its first norm); the offset where the copies read the fewest computed
//!    values from outside themselves wins, since at a true layer boundary only the residual
//!    stream crosses.
//! 4. A candidate is accepted only if its copies pass the verifier's structural identity
//!    (invariant 8d) once each copy owns the sources only it reads. Sources read by several
//!    copies or from outside them (a causal mask, a rotary table) stay untagged.

use std::collections::{HashMap, HashSet};

use crate::blocks::structure::{self, LayerView};
use crate::graph::{Graph, OpId, ValueId};
use crate::text::KindText;
use crate::text::names::Names;
use crate::verify::{lookup, well_formed};

/// How many ranked candidates are validated before giving up.
const MAX_CANDIDATES: usize = 16;

/// Tags the ops of the repeated layers of `graph` with layer indices `0..N` in execution
/// order, sets `block_name`, and returns N.
///
/// Existing tags and block name are discarded first. When nothing repeats, the graph is left
/// untagged and the result is 1 (or 0 when the graph has no compute ops or fails invariants
/// 1–3 of [`crate::verify`]). Layers must be contiguous in the execution order, as in a
/// forward graph; cost is quadratic in the number of compute ops.
pub fn detect_repeated_layers(graph: &mut Graph, block_name: &str) -> usize {
    let all: Vec<OpId> = graph.op_ids().collect();
    for o in all {
        graph.op_mut(o).layer = None;
    }
    graph.block_name = None;
    if !well_formed(graph) {
        return 0;
    }
    let Some(views) = find_layers(graph) else {
        let has_compute = graph.order().iter().any(|&o| !graph.op(o).kind.is_source());
        return usize::from(has_compute);
    };
    for (k, view) in views.iter().enumerate() {
        let tag = u32::try_from(k).ok();
        for &o in view.compute.iter().chain(&view.sources) {
            graph.op_mut(o).layer = tag;
        }
    }
    graph.block_name = Some(block_name.to_string());
    views.len()
}

/// N consecutive copies of `period` ops, somewhere in the periodic stretch
/// `start..start + span` of the compute ops.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    start: usize,
    span: usize,
    period: usize,
    copies: usize,
}

struct Finder<'a> {
    g: &'a Graph,
    names: Names,
    /// Compute ops in execution order.
    compute: Vec<OpId>,
    /// Index of each compute op in `compute`.
    index: HashMap<OpId, usize>,
    /// Readers of each value.
    uses: crate::graph::Uses,
    /// Source ops in execution order.
    sources: Vec<OpId>,
}

fn find_layers(g: &Graph) -> Option<Vec<LayerView>> {
    let (sources, compute): (Vec<OpId>, Vec<OpId>) =
        g.order().iter().partition(|&&o| g.op(o).kind.is_source());
    let f = Finder {
        g,
        names: Names::new(g),
        index: compute.iter().enumerate().map(|(i, &o)| (o, i)).collect(),
        compute,
        uses: g.uses(),
        sources,
    };
    let signatures = f.signatures();
    for c in candidates(&signatures).into_iter().take(MAX_CANDIDATES) {
        if let Some(views) = f.try_candidate(c) {
            return Some(views);
        }
        // The first or last copy may differ (say, layer 0 reads the embedding differently):
        // one copy fewer gives a whole period more room to place the copies.
        if c.copies > 2 {
            let fewer = Candidate {
                copies: c.copies - 1,
                ..c
            };
            if let Some(views) = f.try_candidate(fewer) {
                return Some(views);
            }
        }
    }
    None
}

/// Every periodic stretch with at least two copies, best first.
fn candidates(sig: &[u32]) -> Vec<Candidate> {
    let m = sig.len();
    let mut out = Vec::new();
    for period in 1..=m / 2 {
        let mut t = 0;
        while t + period < m {
            if sig[t] != sig[t + period] {
                t += 1;
                continue;
            }
            let start = t;
            while t + period < m && sig[t] == sig[t + period] {
                t += 1;
            }
            let span = t - start + period;
            let copies = span / period;
            if copies >= 2 {
                out.push(Candidate {
                    start,
                    span,
                    period,
                    copies,
                });
            }
        }
    }
    out.sort_by(|a, b| {
        (b.copies * b.period)
            .cmp(&(a.copies * a.period))
            .then(b.copies.cmp(&a.copies))
            .then(a.period.cmp(&b.period))
            .then(a.start.cmp(&b.start))
    });
    out
}

impl Finder<'_> {
    /// Local signatures of the compute ops, interned to small integers.
    fn signatures(&self) -> Vec<u32> {
        let g = self.g;
        let mut interned: HashMap<String, u32> = HashMap::new();
        let mut out = Vec::with_capacity(self.compute.len());
        for &o in &self.compute {
            let op = g.op(o);
            let mut key = KindText(&structure::instance_neutral(&op.kind)).to_string();
            for &r in &op.results {
                key.push_str(&format!(" -> {}", g.ty(r)));
            }
            for &v in &op.inputs {
                let def = g.op(g.def_op(v));
                if def.kind.is_source() {
                    let kind = match structure::source_class(&def.kind) {
                        Some(mnemonic) => mnemonic.to_string(),
                        None => KindText(&def.kind).to_string(),
                    };
                    key.push_str(&format!(" <- {kind} {}", g.ty(v)));
                } else {
                    key.push_str(&format!(" <- {}", g.ty(v)));
                }
            }
            let next = u32::try_from(interned.len()).unwrap_or(u32::MAX);
            out.push(*interned.entry(key).or_insert(next));
        }
        out
    }

    /// Tries every placement of the copies within the stretch, fewest cut edges first.
    fn try_candidate(&self, c: Candidate) -> Option<Vec<LayerView>> {
        let covered = c.copies.checked_mul(c.period)?;
        let slack = c.span.checked_sub(covered)?;
        let mut starts: Vec<(usize, usize)> = (c.start..=c.start + slack)
            .map(|s| (self.cut_edges(s, c.period, c.copies), s))
            .collect();
        starts.sort_unstable();
        starts
            .into_iter()
            .find_map(|(_, s)| self.validate(s, c.period, c.copies))
    }

    /// The copy a compute op falls in, if any.
    fn copy_of(&self, o: OpId, start: usize, period: usize, copies: usize) -> Option<usize> {
        let i = *self.index.get(&o)?;
        let k = i.checked_sub(start)? / period;
        (k < copies).then_some(k)
    }

    /// Computed values each copy reads from outside itself, summed over the copies.
    fn cut_edges(&self, start: usize, period: usize, copies: usize) -> usize {
        let g = self.g;
        let end = (start + period * copies).min(self.compute.len());
        let mut crossing: HashSet<(Option<usize>, ValueId)> = HashSet::new();
        for &o in self.compute.get(start..end).unwrap_or_default() {
            let here = self.copy_of(o, start, period, copies);
            for &v in &g.op(o).inputs {
                let d = g.def_op(v);
                if !g.op(d).kind.is_source() && self.copy_of(d, start, period, copies) != here {
                    crossing.insert((here, v));
                }
            }
        }
        crossing.len()
    }

    /// The layers for this placement, if every copy is structurally identical to the first.
    fn validate(&self, start: usize, period: usize, copies: usize) -> Option<Vec<LayerView>> {
        let mut views: Vec<LayerView> = (0..copies)
            .map(|k| {
                let from = start + k * period;
                let compute = self.compute.get(from..from + period).map(<[OpId]>::to_vec);
                compute.map(|compute| LayerView {
                    compute,
                    sources: Vec::new(),
                })
            })
            .collect::<Option<_>>()?;
        for &s in &self.sources {
            let readers = lookup::op(self.g, s)?
                .results
                .iter()
                .flat_map(|v| self.uses.get(v.index()).into_iter().flatten());
            let mut owner = None;
            let mut shared = false;
            for &u in readers {
                match (self.copy_of(u, start, period, copies), owner) {
                    (None, _) => shared = true,
                    (Some(k), None) => owner = Some(k),
                    (Some(k), Some(o)) => shared |= k != o,
                }
            }
            if let (Some(k), false) = (owner, shared) {
                views.get_mut(k)?.sources.push(s);
            }
        }
        let (first, rest) = views.split_first()?;
        rest.iter()
            .all(|v| structure::compare(self.g, &self.names, first, v).is_ok())
            .then_some(views)
    }
}
