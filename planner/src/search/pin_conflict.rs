//! Why the pinned knobs leave no strategy to price, said with the flags that conflict: each
//! pin is dropped in turn, and those whose dropping lets strategies through are the ones that
//! cannot hold together (`--schedule interleaved` with `--pp 1`); under `--target`, the
//! engine's own reasons for refusing what the pins leave (`--target deepspeed --tp 2`).

use super::{Pins, SearchRequest, candidates};
use crate::Cluster;
use crate::model::ModelInfo;

/// How to leave one knob to the search again.
type Unpin = fn(&mut Pins);

/// The pins that narrow the candidates, each as its flag and value and how to drop it.
fn pinned(p: &Pins) -> Vec<(String, Unpin)> {
    let mut out: Vec<(String, Unpin)> = Vec::new();
    let mut add = |flag: String, unpin: Unpin| out.push((flag, unpin));
    if let Some(x) = p.tp {
        add(format!("--tp {x}"), |p| p.tp = None);
    }
    if let Some(x) = p.pp {
        add(format!("--pp {x}"), |p| p.pp = None);
    }
    if let Some(x) = p.dp {
        add(format!("--dp {x}"), |p| p.dp = None);
    }
    if let Some(x) = p.cp {
        add(format!("--cp {x}"), |p| p.cp = None);
    }
    if let Some(x) = p.ep {
        add(format!("--ep {x}"), |p| p.ep = None);
    }
    if let Some(x) = p.micro_batch {
        add(format!("--micro-batch {x}"), |p| p.micro_batch = None);
    }
    if let Some(x) = p.schedule {
        add(format!("--schedule {x}"), |p| p.schedule = None);
    }
    if let Some(x) = p.virtual_stages {
        add(format!("--virtual-stages {x}"), |p| p.virtual_stages = None);
    }
    if let Some(x) = p.zero {
        add(format!("--zero {x}"), |p| p.zero = None);
    }
    if let Some(x) = p.recompute {
        add(format!("--recompute {x}"), |p| p.recompute = None);
    }
    if !p.dp_comm.is_plain() {
        add(p.dp_comm.flags(), |p| {
            p.dp_comm = crate::dp_comm::DpComm::default();
        });
    }
    if let Some(x) = p.precision {
        add(format!("--precision {x}"), |p| p.precision = None);
    }
    if let Some(x) = p.sequence_parallel {
        let on = if x { "on" } else { "off" };
        add(format!("--sequence-parallel {on}"), |p| {
            p.sequence_parallel = None;
        });
    }
    out
}

/// Why no strategy satisfies the pins, naming the flags; `None` when no single pin explains it.
pub(super) fn explain(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    req: &SearchRequest,
) -> Option<String> {
    let all_pins = pinned(&req.pins);
    let lone = all_pins.len() == 1;
    let culprits: Vec<String> = all_pins
        .into_iter()
        .filter(|(_, unpin)| {
            let mut r = req.clone();
            unpin(&mut r.pins);
            !candidates(info, cluster, &r).is_empty()
        })
        .map(|(flag, _)| flag)
        .collect();
    let pins = match culprits.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        many => Some(many.join(" and ")),
    };
    match (engine_refusal(info, cluster, req), pins) {
        (Some(why), Some(pins)) => Some(format!(
            "--target {}: no strategy with {pins} is one it runs ({why}); change {} or the \
             --target",
            req.pins.engine.unwrap_or_default(),
            if culprits.len() == 1 {
                "it"
            } else {
                "one of them"
            }
        )),
        (Some(why), None) => Some(format!(
            "--target {}: no way to split {} GPUs is one it runs ({why}); change the pins, \
             use fewer GPUs or a larger --global-batch, or change the --target",
            req.pins.engine.unwrap_or_default(),
            req.gpus
        )),
        (None, Some(pins)) if lone => Some(format!(
            "no strategy satisfies {pins} for this model on {} GPUs with global batch {}: \
             change or drop it",
            req.gpus, req.global_batch
        )),
        (None, Some(pins)) if culprits.len() == 1 => Some(format!(
            "no strategy satisfies {pins} with the other pins (without it some do): change or \
             drop it"
        )),
        (None, Some(pins)) => Some(format!(
            "no strategy satisfies {pins} together (dropping any one of them leaves some): \
             change or drop one of them"
        )),
        (None, None) => None,
    }
}

/// Under `--target`, the engine's reason for refusing the first strategy the pins allow
/// without it (the simplest: fewest pipeline stages, 1F1B, ZeRO-0, no recomputation).
fn engine_refusal(info: &ModelInfo<'_>, cluster: &Cluster, req: &SearchRequest) -> Option<String> {
    if !req.pins.target {
        return None;
    }
    let mut untargeted = req.clone();
    untargeted.pins.target = false;
    let engine = req.pins.engine.unwrap_or_default();
    candidates(info, cluster, &untargeted)
        .first()
        .and_then(|s| engine.runs_on(s, info.layers).err())
}
