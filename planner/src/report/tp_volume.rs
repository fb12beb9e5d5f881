//! The tensor-parallel rows of the communication table as the sharding extraction lays out
//! the collectives (the layout codegen lowers, [`crate::layer_tp`]), where the plan's
//! prediction priced them so; Megatron-LM's rule ([`super::volume`]) prices the rest. A
//! layout that gathers weights rather than activations, or re-splits attention with an
//! all-to-all, is then listed as the program runs it, not as the rule would.

use std::collections::BTreeMap;

use crate::cost::comm::Collective;
use crate::estimate::{LayerTpComm, Predicted};
use crate::hardware::Cluster;
use crate::layer_tp::{LayerTp, OuterTp, layer_tp, outer_tp};
use crate::model::ModelInfo;
use crate::sharding_costs::{collective_of, traffic_scale};
use crate::strategy::{Recompute, Strategy};

/// Which tensor-parallel collectives the table reads off the extraction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpSource {
    /// The layers'.
    pub layers: bool,
    /// The embedding's and the head's.
    pub outer: bool,
}

impl TpSource {
    /// Megatron-LM's rule for all of them.
    pub const RULES: TpSource = TpSource {
        layers: false,
        outer: false,
    };

    /// As `predicted` says its collectives were priced.
    pub fn of(predicted: &Predicted) -> TpSource {
        let extracted = |c: &Option<LayerTpComm>| {
            c.as_ref()
                .is_some_and(|c| c.source == LayerTpComm::EXTRACTION)
        };
        TpSource {
            layers: extracted(&predicted.layer_tp_comm),
            outer: extracted(&predicted.embedding_tp_comm) && extracted(&predicted.head_tp_comm),
        }
    }
}

/// The extractions the table reads: one per run of identical layers (`None`: by the rule),
/// and one of the ops outside the layers.
pub(super) struct TpLayouts {
    pub runs: Vec<Option<LayerTp>>,
    pub outer: Option<OuterTp>,
    /// Bytes moved per byte an extraction lists.
    scale: f64,
}

impl TpLayouts {
    pub fn of(info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy, src: TpSource) -> TpLayouts {
        let split = s.tp > 1;
        TpLayouts {
            runs: info
                .runs()
                .iter()
                .map(|r| (split && src.layers).then(|| layer_tp(r.info, cluster, s).ok())?)
                .collect(),
            outer: (split && src.outer)
                .then(|| outer_tp(info, cluster, s).ok())
                .flatten(),
            scale: traffic_scale(info, cluster, s),
        }
    }
}

/// Calls per iteration by collective, payload and buffer.
#[derive(Default)]
pub(super) struct TpTally(BTreeMap<(&'static str, &'static str, u64), (Collective, u64)>);

impl TpTally {
    /// The collectives of `t` for `layers` layers of `mb` micro-batches: each per micro-batch
    /// (a forward one again in the backward under full recomputation), a parameter
    /// gradient's once per step.
    pub fn add(&mut self, t: &LayerTp, layers: u64, mb: u64, recompute: Recompute) {
        for c in t.calls.iter() {
            let passes = if c.forward && recompute == Recompute::Full {
                2
            } else {
                1
            };
            let calls = if c.per_step { 1 } else { mb * passes };
            let kind = collective_of(c.kind);
            let key = (c.kind.name(), c.payload, c.bytes.to_bits());
            self.0.entry(key).or_insert((kind, 0)).1 += calls * layers;
        }
    }

    /// `(collective, payload, calls, buffer bytes)` per row, the buffers at the run's
    /// precision.
    pub fn rows(
        self,
        layouts: &TpLayouts,
    ) -> impl Iterator<Item = (Collective, &'static str, u64, f64)> {
        let scale = layouts.scale;
        self.0
            .into_iter()
            .map(move |((_, payload, bytes), (kind, calls))| {
                (kind, payload, calls, f64::from_bits(bytes) * scale)
            })
    }
}
