//! Why the plan chose what it chose, in sentences derived from numbers: the plan's own
//! prediction, its communication volumes, and counterfactual estimates (the same strategy with
//! one knob changed: no TP, no pipeline, no ZeRO, no recomputation, SP toggled), each costed by
//! the cost model rather than asserted.

use crate::cost::comm::mesh;
use crate::cost::memory::state_bytes;
use crate::estimate::{Estimate, estimate};
use crate::model::ModelInfo;
use crate::plan::Plan;
use crate::strategy::{Recompute, Schedule, Strategy};

use super::volume::{StageVolume, stage_local_split};

/// `1.23 GiB`, `456.7 MiB`, `12.0 KiB`.
pub fn size(bytes: f64) -> String {
    let kib = 1024.0;
    let (v, unit) = if bytes >= kib * kib * kib {
        (bytes / (kib * kib * kib), "GiB")
    } else if bytes >= kib * kib {
        (bytes / (kib * kib), "MiB")
    } else {
        (bytes / kib, "KiB")
    };
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else if v >= 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

/// `1.2 ms`, `0.043 s`.
pub fn secs(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// `1 micro-batch`, `4 micro-batches`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

struct Ctx<'a, 'g> {
    plan: &'a Plan,
    info: &'a ModelInfo<'g>,
    base: &'a Estimate,
    cap: f64,
}

impl Ctx<'_, '_> {
    /// The plan's strategy with `f` applied, estimated; `None` when it is not a valid strategy.
    fn variant(&self, f: impl FnOnce(&mut Strategy)) -> Option<Estimate> {
        let mut t = self.plan.strategy.clone();
        f(&mut t);
        if t.pp != self.plan.strategy.pp || t.virtual_stages != self.plan.strategy.virtual_stages {
            t.stage_layers = None;
        }
        estimate(self.info, &self.plan.cluster, self.plan.gpus, &t).ok()
    }

    /// `would not fit: stage 0 would need 93.1 GiB of 80.0 GiB` or `would be 7.1 % slower`.
    fn outcome(&self, alt: &Estimate) -> String {
        if !alt.predicted.fits {
            let worst = alt
                .predicted
                .stages
                .iter()
                .max_by(|a, b| a.peak_memory_bytes.total_cmp(&b.peak_memory_bytes));
            return match worst {
                Some(st) => format!(
                    "would not fit: stage {} would need {} of {}, {} too much",
                    st.stage,
                    size(st.peak_memory_bytes),
                    size(self.cap),
                    size(st.peak_memory_bytes - self.cap)
                ),
                None => "would not fit".into(),
            };
        }
        let t0 = self.base.predicted.iteration_time_s;
        let rel = 100.0 * (alt.predicted.iteration_time_s / t0 - 1.0);
        if rel.abs() < 0.05 {
            format!(
                "would be as fast ({} per iteration)",
                secs(alt.predicted.iteration_time_s)
            )
        } else if rel > 0.0 {
            format!("would be {rel:.1} % slower")
        } else {
            format!("would be {:.1} % faster", -rel)
        }
    }
}

/// ` (the search's best kept plan with TP 2 x PP 1: 3.8 % slower)`, when one was kept.
fn kept(plan: &Plan, base: &Estimate, tp: u32, pp: u32) -> String {
    let t0 = base.predicted.iteration_time_s;
    plan.alternatives
        .iter()
        .find(|a| a.fits && a.strategy.tp == tp && a.strategy.pp == pp)
        .map(|a| {
            let rel = 100.0 * (a.iteration_time_s / t0 - 1.0);
            format!(
                " (the best plan the search kept with TP {tp} x PP {pp} is {:.1} % {})",
                rel.abs(),
                if rel >= 0.0 { "slower" } else { "faster" }
            )
        })
        .unwrap_or_default()
}

/// What the tensor-parallel rows move, by collective in order of first appearance:
/// `activation reduce-scatters and all-gathers` where they move activations alone, else e.g.
/// `all-gathers (activations, weights) and reduce-scatters (weight gradients)`.
fn tp_collectives<'a>(rows: impl Iterator<Item = &'a super::volume::VolumeRow>) -> String {
    let mut by_kind: Vec<(String, Vec<&str>)> = Vec::new();
    for r in rows {
        let kind = format!("{}s", r.collective);
        match by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, p)) if !p.contains(&r.payload.as_str()) => p.push(&r.payload),
            Some(_) => {}
            None => by_kind.push((kind, vec![&r.payload])),
        }
    }
    let activations_only = by_kind.iter().all(|(_, p)| p == &["activations"]);
    let items: Vec<String> = by_kind
        .iter()
        .map(|(k, p)| match activations_only {
            true => k.clone(),
            false => format!("{k} ({})", p.join(", ")),
        })
        .collect();
    let listed = match items.as_slice() {
        [] => "collectives".to_string(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    };
    match activations_only {
        true => format!("activation {listed}"),
        false => listed,
    }
}

fn rows_of<'a>(
    v: &'a StageVolume,
    par: &str,
) -> impl Iterator<Item = &'a super::volume::VolumeRow> {
    v.rows.iter().filter(move |r| r.parallelism == par)
}

/// What expert parallelism does in the plan and what the plan would be without it.
fn expert_parallel_line(cx: &Ctx<'_, '_>, s: &crate::strategy::Strategy) -> Option<String> {
    if s.ep <= 1 {
        return None;
    }
    let experts = cx.info.experts;
    let saved = cx.info.expert_params() as f64 / f64::from(s.tp * s.pp)
        * (1.0 - 1.0 / f64::from(s.ep))
        * cx.base.strategy.precision.weight_bytes();
    let mut line = format!(
        "EP {}: each layer's {experts} experts split over {} of the data-parallel ranks ({} per GPU; {} less of expert weights per GPU), tokens gathered to them and their outputs reduce-scattered back ({} of dispatch per iteration on the critical stage, not overlapped).",
        s.ep,
        s.ep,
        experts / u64::from(s.ep),
        size(saved),
        secs(cx.base.predicted.time.ep_comm)
    );
    if let Some(e) = cx.variant(|t| t.ep = 1) {
        line += &format!(
            " Without EP (experts on every rank), all else equal, the plan {}.",
            cx.outcome(&e)
        );
    }
    Some(line)
}

/// The explanation, one sentence per decision.
pub fn why(
    plan: &Plan,
    info: &ModelInfo<'_>,
    base: &Estimate,
    comm: &[StageVolume],
) -> Vec<String> {
    let s = &plan.strategy;
    let cap = plan.cluster.memory_bytes();
    let cx = Ctx {
        plan,
        info,
        base,
        cap,
    };
    let p = &base.predicted;
    let gpn = u64::from(plan.cluster.gpus_per_node);
    let m = mesh(
        &plan.cluster,
        u64::from(s.tp),
        u64::from(s.dp),
        u64::from(s.pp),
    );
    // The fullest stage and the stage that finishes last.
    let peak = p
        .stages
        .iter()
        .max_by(|a, b| a.peak_memory_bytes.total_cmp(&b.peak_memory_bytes))
        .cloned()
        .unwrap_or_default();
    let critical = p
        .stages
        .iter()
        .max_by(|a, b| a.finish_s.total_cmp(&b.finish_s))
        .map_or(0, |st| st.stage as usize);
    let vol = comm.get(critical);
    let mut out = Vec::new();

    let nodes = plan.gpus.div_ceil(gpn);
    out.push(format!(
        "{} GPUs on {} node{} of {}: TP {} x PP {} x DP {}.",
        plan.gpus,
        nodes,
        if nodes == 1 { "" } else { "s" },
        gpn,
        s.tp,
        s.pp,
        s.dp
    ));

    // Tensor parallelism.
    if s.tp > 1 {
        let (bytes, t, link) = vol
            .map(|v| {
                rows_of(v, "tp").fold((0.0, 0.0, String::new()), |a, r| {
                    (a.0 + r.bytes_per_gpu, a.1 + r.seconds, r.link.name.clone())
                })
            })
            .unwrap_or_default();
        let kind = vol.map_or_else(String::new, |v| tp_collectives(rows_of(v, "tp")));
        let place = if m.tp.nodes <= 1 {
            "inside one node"
        } else {
            "across nodes"
        };
        let mut line = format!(
            "TP {} splits every layer over {} GPUs {place}, so its {kind} run on {link}: {} per GPU per iteration, {} of collectives.",
            s.tp,
            s.tp,
            size(bytes),
            secs(t)
        );
        if let Some(e) = cx.variant(|t| {
            t.dp *= t.tp;
            t.tp = 1;
            t.sequence_parallel = false;
        }) {
            line += &format!(
                " Without TP (DP {}), all else equal, the plan {}{}.",
                s.dp * s.tp,
                cx.outcome(&e),
                kept(plan, base, 1, s.pp)
            );
        }
        out.push(line);
    } else {
        let mut line =
            "No tensor parallelism: every GPU runs whole layers, with no per-layer collectives."
                .to_string();
        if s.dp.is_multiple_of(2)
            && let Some(e) = cx.variant(|t| {
                t.dp /= 2;
                t.tp = 2;
            })
        {
            line += &format!(
                " TP 2 (DP {}), all else equal, {}{}.",
                s.dp / 2,
                cx.outcome(&e),
                kept(plan, base, 2, s.pp)
            );
        }
        out.push(line);
    }

    if let Some(line) = expert_parallel_line(&cx, s) {
        out.push(line);
    }

    // Pipeline.
    if s.pp > 1 {
        let whole = state_bytes(
            info.params() as f64 / f64::from(s.tp),
            f64::from(s.dp * s.pp * s.cp.max(1)),
            s.zero,
            s.precision,
        );
        let states = whole.weights + whole.grads + whole.optimizer;
        let cf = cx.variant(|t| {
            t.dp *= t.pp;
            t.pp = 1;
            t.schedule = Schedule::OneFOneB;
            t.virtual_stages = 1;
        });
        let line = match cf {
            Some(e) if !e.predicted.fits => format!(
                "Pipeline depth {} because a GPU holding all {} layers would need {} of {} ({} of model states alone).",
                s.pp,
                info.layers,
                size(e.predicted.peak_memory_bytes),
                size(cap),
                size(states)
            ),
            Some(e) => format!(
                "Pipeline depth {}: without a pipeline (DP {}), all else equal, the plan {}{}.",
                s.pp,
                s.dp * s.pp,
                cx.outcome(&e),
                kept(plan, base, s.tp, 1)
            ),
            None if states > cap => format!(
                "Pipeline depth {} because a GPU holding all {} layers would need {} of model states, more than its {}.",
                s.pp,
                info.layers,
                size(states),
                size(cap)
            ),
            None => format!("Pipeline depth {}.", s.pp),
        };
        out.push(line);
        let mb = s.micro_batches() as f64;
        let v = f64::from(s.virtual_stages);
        let pf = f64::from(s.pp);
        let closed = (pf - 1.0) / (v * mb + pf - 1.0);
        let sched = match s.schedule {
            Schedule::Interleaved => format!(
                "The interleaved schedule ({} chunks per stage)",
                s.virtual_stages
            ),
            Schedule::OneFOneB => "The 1F1B schedule".into(),
            Schedule::Gpipe => "The GPipe schedule".into(),
        };
        let mut line = format!(
            "{sched} with {} per pipeline leaves a bubble of {:.1} % of the iteration (the uniform-stage closed form (p-1)/(v*m+p-1) gives {:.1} %).",
            plural(s.micro_batches(), "micro-batch", "micro-batches"),
            100.0 * p.bubble_fraction,
            100.0 * closed
        );
        if s.schedule == Schedule::Interleaved
            && let Some(e) = cx.variant(|t| {
                t.schedule = Schedule::OneFOneB;
                t.virtual_stages = 1;
            })
        {
            line += &format!(" Plain 1F1B {}.", cx.outcome(&e));
        }
        out.push(line);
        if let Some(split) = &s.stage_layers
            && split.iter().any(|&l| l != split[0])
        {
            out.push(format!(
                    "Layers are split {split:?} rather than evenly, so the end stages, which also run the embedding and the head, do not hold the pipeline back."
                ));
        }
    } else {
        let mut line = format!(
            "No pipeline: every GPU holds all {} layers ({} of model states), so there is no pipeline bubble.",
            info.layers,
            size(peak.memory.weights + peak.memory.grads + peak.memory.optimizer)
        );
        if s.dp.is_multiple_of(2)
            && info.layers >= 2
            && let Some(e) = cx.variant(|t| {
                t.dp /= 2;
                t.pp = 2;
            })
        {
            line += &format!(
                " PP 2 (DP {}), all else equal, {}{}.",
                s.dp / 2,
                cx.outcome(&e),
                kept(plan, base, s.tp, 2)
            );
        }
        out.push(line);
    }

    // Data parallelism and ZeRO.
    if s.dp > 1 {
        let (bytes, t, link) = vol
            .map(|v| {
                rows_of(v, "dp").fold((0.0, 0.0, String::new()), |a, r| {
                    (a.0 + r.bytes_per_gpu, a.1 + r.seconds, r.link.name.clone())
                })
            })
            .unwrap_or_default();
        let place = if m.dp.nodes <= 1 {
            "inside one node"
        } else {
            "across nodes"
        };
        let what = if s.pp > 1 { "each stage" } else { "the model" };
        out.push(format!(
            "DP {} replicates {what} {} times {place}; synchronising them moves {} per GPU per iteration over {link} ({} of collectives, {} of it exposed on the critical stage {critical}).",
            s.dp,
            s.dp,
            size(bytes),
            secs(t),
            secs(p.time.dp_comm)
        ));
        if let Some(x) = &p.dp_exchange {
            out.push(format!(
                "The exchange runs as --grad-compression {} --dp-sync {}: {} per GPU per step instead of the plain {} ({:.1}x less), {} instead of {} before overlap; what it does to convergence is the user's trade (plait prices it and picks it only among the modes `compile --search-dp-comm` names).",
                x.grad_compression,
                x.dp_sync,
                size(x.bytes_per_step),
                size(x.plain_bytes_per_step),
                x.plain_bytes_per_step / x.bytes_per_step.max(f64::MIN_POSITIVE),
                secs(x.exchange_s),
                secs(x.plain_exchange_s)
            ));
        }
        let (dense, experts) = stage_local_split(info, s, peak.stage);
        let states = |zero: u8| {
            // ZeRO shards over dp × cp, as the estimate prices it.
            let replicas = f64::from(s.dp * s.cp.max(1));
            let mut x = state_bytes(dense, replicas, zero, s.precision);
            let expert_replicas = replicas / f64::from(s.ep.max(1));
            x.add(&state_bytes(experts, expert_replicas, zero, s.precision));
            x
        };
        let none = states(0);
        let total = |x: &crate::cost::memory::StateBytes| x.weights + x.grads + x.optimizer;
        if s.zero >= 1 {
            let now = states(s.zero);
            let what = match s.zero {
                1 => "optimizer states",
                2 => "optimizer states and gradients",
                _ => "optimizer states, gradients and weights",
            };
            let mut line = format!(
                "ZeRO-{} shards the {what} over the {} data-parallel ranks, saving {} per GPU on stage {}.",
                s.zero,
                s.dp,
                size(total(&none) - total(&now)),
                peak.stage
            );
            if let Some(e) = cx.variant(|t| t.zero = 0) {
                line += &format!(" Without ZeRO the plan {}.", cx.outcome(&e));
            }
            out.push(line);
        } else {
            let one = states(1);
            let mut line = format!(
                "No ZeRO: every data-parallel rank keeps the full optimizer states ({} per GPU on stage {}), which fit.",
                size(none.optimizer),
                peak.stage
            );
            if let Some(e) = cx.variant(|t| t.zero = 1) {
                line += &format!(
                    " ZeRO-1 would save {} per GPU and {}.",
                    size(total(&none) - total(&one)),
                    cx.outcome(&e).trim_start_matches("would ")
                );
            }
            out.push(line);
        }
    } else {
        out.push("No data parallelism: one replica, so no gradient synchronisation.".into());
    }

    // Recomputation.
    let acts = peak.memory.activations;
    match s.recompute {
        Recompute::None => out.push(format!(
            "No recomputation: activations take {} on stage {} ({} in flight), and the stage's total of {} leaves {} free of {}.",
            size(acts),
            peak.stage,
            plural(u64::from(peak.micro_batches_in_flight), "micro-batch chunk", "micro-batch chunks"),
            size(peak.peak_memory_bytes),
            size(cap - peak.peak_memory_bytes),
            size(cap)
        )),
        r => {
            let name = if r == Recompute::Full {
                "Full"
            } else {
                "Selective"
            };
            let cf = cx.variant(|t| t.recompute = Recompute::None);
            let line = match cf {
                Some(e) if !e.predicted.fits => {
                    let st = e
                        .predicted
                        .stages
                        .iter()
                        .max_by(|a, b| a.peak_memory_bytes.total_cmp(&b.peak_memory_bytes))
                        .cloned()
                        .unwrap_or_default();
                    format!(
                        "{name} recomputation because without it activations would take {} on stage {} and the stage would exceed {} by {}; recomputing costs {:.1} TFLOP/s of hardware work per GPU.",
                        size(st.memory.activations),
                        st.stage,
                        size(cap),
                        size(st.peak_memory_bytes - cap),
                        p.hardware_tflops_per_gpu - p.model_tflops_per_gpu
                    )
                }
                Some(e) => format!(
                    "{name} recomputation keeps activations at {} on stage {}; without it they would take {} and the plan {}.",
                    size(acts),
                    peak.stage,
                    size(
                        e.predicted
                            .stages
                            .get(peak.stage as usize)
                            .map_or(0.0, |st| st.memory.activations)
                    ),
                    cx.outcome(&e)
                ),
                None => format!(
                    "{name} recomputation keeps activations at {} on stage {}.",
                    size(acts),
                    peak.stage
                ),
            };
            out.push(line);
        }
    }

    // Sequence parallelism.
    if s.tp > 1 {
        let on = s.sequence_parallel;
        if let Some(e) = cx.variant(|t| t.sequence_parallel = !on) {
            let theirs = e
                .predicted
                .stages
                .get(peak.stage as usize)
                .map_or(0.0, |st| st.memory.activations);
            out.push(if on {
                format!(
                    "Sequence parallelism splits the residual-stream activations {} ways (stage {}: {} instead of {}); without it the plan {}.",
                    s.tp,
                    peak.stage,
                    size(acts),
                    size(theirs),
                    cx.outcome(&e)
                )
            } else {
                format!(
                    "Sequence parallelism is off; turning it on would cut stage {}'s activations from {} to {} and the plan {}.",
                    peak.stage,
                    size(acts),
                    size(theirs),
                    cx.outcome(&e)
                )
            });
        }
    }

    out.push(format!(
        "Predicted: {} per iteration, {:.1} model TFLOP/s per GPU, MFU {:.1} % of the {} peak.",
        secs(p.iteration_time_s),
        p.model_tflops_per_gpu,
        100.0 * p.mfu,
        s.precision
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(size(3.2 * (1u64 << 30) as f64), "3.20 GiB");
        assert_eq!(size(150.0 * (1u64 << 20) as f64), "150 MiB");
        assert_eq!(size(2048.0), "2.00 KiB");
        assert_eq!(secs(0.0431), "43.1 ms");
        assert_eq!(secs(2.5e-4), "250 µs");
        assert_eq!(secs(1.5), "1.500 s");
    }
}
