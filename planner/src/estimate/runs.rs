//! One representative layer of each run of identical layers ([`ModelInfo::runs`]): its
//! tensor-parallel prices, its work, its seconds under ZeRO-3, what it keeps and what its
//! backward holds at once. A block that repeats one structure has one run.

use super::setup::Setup;
use super::work::{Pricer, TpPrices};
use super::{
    ActivationPolicy, ExpertDispatch, Mode, Transients, Work, layer_activation_bytes, layer_shape,
    stages,
};
use crate::model::ModelInfo;

pub(super) struct RunCost {
    pub prices: TpPrices,
    pub work: Work,
    /// One layer's forward and backward seconds per micro-batch once ZeRO-3 gathers its
    /// parameters, and the seconds that adds.
    pub fwd: f64,
    pub bwd: f64,
    pub zero3: f64,
    /// One layer's kept activation bytes per micro-batch.
    pub act: f64,
    pub transients: Transients,
}

impl RunCost {
    pub fn new(
        cx: &Setup<'_, '_>,
        mode: Mode<'_>,
        run: &ModelInfo<'_>,
        policy: &ActivationPolicy,
    ) -> RunCost {
        let (g, s) = (cx.g, cx.s);
        // Each run is priced as the program lays it out: the plan records one extraction per
        // run, lowered or (all of them) replaced by the rules.
        let prices = TpPrices::of_run(cx, mode, run);
        let pricer = Pricer {
            cx,
            ring: cx.cp_ring(),
            ep: ExpertDispatch::new(
                g,
                run,
                cx.cluster,
                &cx.m,
                cx.b,
                s.precision.activation_bytes(),
            ),
        };
        let work = pricer.work(
            &run.layer_ops,
            &run.layer_groups,
            prices.layer_times,
            &|o| prices.layer_layout(cx, o),
        );
        let shape = layer_shape(g, run);
        let act = layer_activation_bytes(&shape, cx.b.seq as f64, cx.b.batch as f64, policy);
        let (fwd, bwd, zero3) = stages::zero3_layer(cx, run, &work);
        let transients = Transients::new(g, run, s, &shape, policy, cx.b);
        RunCost {
            prices,
            work,
            fwd,
            bwd,
            zero3,
            act,
            transients,
        }
    }
}

/// `per_layer` of a layer averaged over the model's layers (exactly the one run's where the
/// block repeats one structure).
pub(super) fn mean_per_layer(
    info: &ModelInfo<'_>,
    runs: &[RunCost],
    per_layer: impl Fn(&RunCost) -> f64,
) -> f64 {
    if runs.len() == 1 {
        return per_layer(&runs[0]);
    }
    let total: f64 = info
        .runs()
        .iter()
        .zip(runs)
        .map(|(r, c)| f64::from(r.count) * per_layer(c))
        .sum();
    total / f64::from(info.layers.max(1))
}
