//! Event-by-event simulation of one training iteration's pipeline schedule.
//!
//! Each device runs its list of (chunk, micro-batch, forward|backward) tasks in schedule order;
//! a forward waits for the previous chunk's forward of the same micro-batch plus the
//! point-to-point transfer, a backward for the next chunk's backward plus the transfer. So stage
//! imbalance (embedding and head on the end stages) and p2p latency appear in the result, not
//! only the closed-form bubble (p − 1)/m.
//!
//! Schedules: GPipe (all forwards, then all backwards); 1F1B (PipeDream-Flush: p − d − 1 warm-up
//! forwards on device d, then one forward / one backward); interleaved 1F1B over v chunks per
//! device (Narayanan et al. SC'21, Megatron-LM's `forward_backward_pipelining_with_interleaving`:
//! warm-up (p − d − 1)·2 + (v − 1)·p forwards, virtual micro-batch k runs chunk (k / p) mod v).

use crate::strategy::Schedule;

/// Durations of one chunk (a contiguous group of layers on one device) per micro-batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChunkCost {
    pub fwd: f64,
    pub bwd: f64,
    /// Seconds to send this chunk's output activation to the next chunk (and the gradient back).
    pub p2p: f64,
    /// Activation bytes one micro-batch leaves on the device until its backward.
    pub activation_bytes: f64,
    /// Bytes the chunk's backward holds besides what is in flight, live only while it runs:
    /// activations (a layer rebuilt under full recompute, the logits' gradient) and model
    /// states (a ZeRO-3 layer's gathered parameters and unreduced gradient).
    pub working: WorkingSet,
}

/// Transient bytes of one chunk's backward (see [`ChunkCost::working`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkingSet {
    pub activations: f64,
    pub states: f64,
}

/// What the simulation found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// Finish time of each device's last task.
    pub device_finish: Vec<f64>,
    /// Busy seconds of each device.
    pub device_busy: Vec<f64>,
    /// Peak bytes each device holds for activations: in flight plus the working set of the
    /// task running at that moment.
    pub device_peak_activations: Vec<f64>,
    /// The model-state part of the working set at each device's peak (counted in
    /// `device_peak_activations`).
    pub device_peak_working_states: Vec<f64>,
    /// Most micro-batch chunks in flight on each device.
    pub device_peak_in_flight: Vec<u32>,
    /// Every task: (device, chunk, micro-batch, is_forward, start, end).
    pub tasks: Vec<Task>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Task {
    pub device: u32,
    pub chunk: u32,
    pub micro_batch: u32,
    pub forward: bool,
    pub start: f64,
    pub end: f64,
}

/// The (chunk, micro-batch, forward) order device `d` of `p` runs, with `v` chunks per device.
pub fn device_order(schedule: Schedule, p: u32, v: u32, m: u32, d: u32) -> Vec<(u32, u32, bool)> {
    let mut out = Vec::with_capacity((2 * m * v) as usize);
    match schedule {
        Schedule::Gpipe => {
            out.extend((0..m).map(|i| (d, i, true)));
            out.extend((0..m).map(|i| (d, i, false)));
        }
        Schedule::OneFOneB => {
            let warm = (p - d - 1).min(m);
            out.extend((0..warm).map(|i| (d, i, true)));
            for i in 0..m - warm {
                out.push((d, warm + i, true));
                out.push((d, i, false));
            }
            out.extend((m - warm..m).map(|i| (d, i, false)));
        }
        Schedule::Interleaved => {
            let total = m * v;
            let virt = |k: u32, forward: bool| {
                let local = (k / p) % v;
                let local = if forward { local } else { v - 1 - local };
                let mb = (k / (p * v)) * p + k % p;
                (local * p + d, mb, forward)
            };
            let warm = ((p - d - 1) * 2 + (v - 1) * p).min(total);
            out.extend((0..warm).map(|k| virt(k, true)));
            for i in 0..total - warm {
                out.push(virt(warm + i, true));
                out.push(virt(i, false));
            }
            out.extend((total - warm..total).map(|k| virt(k, false)));
        }
    }
    out
}

/// Simulates `m` micro-batches through `chunks` (pipeline order; chunk c on device c mod p).
pub fn simulate(schedule: Schedule, p: u32, m: u32, chunks: &[ChunkCost]) -> Timeline {
    simulate_with(schedule, p, m, chunks, false)
}

/// Micro-batches beyond which [`simulate`] extrapolates a 1F1B schedule's steady state
/// instead of running every task (published runs have at most a few hundred a step; a global
/// batch of 720,720 sequences on 8 GPUs gave thousands to each of a search's 1,500 candidates).
pub const EXTRAPOLATED_MICRO_BATCHES: u32 = 1024;

/// The deepest pipeline [`simulate`] extrapolates: checked against running every task up to
/// 64 stages of uneven chunks; a 304-stage interleaved one settled later than its short runs
/// showed (3 % off), so deeper pipelines run every task.
pub const EXTRAPOLATED_MAX_STAGES: u32 = 64;

/// Like [`simulate`], also recording every task when `record` is set (for traces).
pub fn simulate_with(
    schedule: Schedule,
    p: u32,
    m: u32,
    chunks: &[ChunkCost],
    record: bool,
) -> Timeline {
    if !record
        && schedule != Schedule::Gpipe
        && m > EXTRAPOLATED_MICRO_BATCHES
        && p <= EXTRAPOLATED_MAX_STAGES
    {
        let v = (chunks.len() as u32 / p.max(1)).max(1);
        let short = steady_from(p, v);
        if short + 2 * p.max(1) < m
            && let Some(t) = extrapolated(schedule, p, m, short, chunks)
        {
            return t;
        }
    }
    run_tasks(schedule, p, m, chunks, record)
}

/// A micro-batch count, a multiple of `p`, whose schedule reaches the steady state past the
/// first device's warm-up ((p − 1)·2 + (v − 1)·p virtual micro-batches, interleaved; fewer
/// for 1F1B) by a group of `p`, and no fewer than half the extrapolation threshold.
fn steady_from(p: u32, v: u32) -> u32 {
    let group = p.max(1);
    let warm_up = (2 * (group - 1) + (v - 1) * group).div_ceil(v.max(1)) + group;
    warm_up.max(EXTRAPOLATED_MICRO_BATCHES / 2).div_ceil(group) * group
}

/// A long 1F1B schedule from shorter ones: past its warm-up every device repeats the same
/// pattern each `p` micro-batches (Megatron's interleaving advances in groups of `p`), so each
/// device's finish grows by the same step per group; busy time is linear in `m`, and the
/// in-flight peaks are reached in the warm-up. `None` where three short runs do not yet grow
/// by equal steps (then every task is run). Equal to running every task (the tests), but for
/// interleaving over a count that is no multiple of `p`, whose partial last group it prices
/// within a group's step.
fn extrapolated(
    schedule: Schedule,
    p: u32,
    m: u32,
    short: u32,
    chunks: &[ChunkCost],
) -> Option<Timeline> {
    let group = p.max(1);
    let [a, b, c] = [0, 1, 2].map(|k| run_tasks(schedule, p, short + k * group, chunks, false));
    // Steady only where the next group adds what the last did, on every device: a deep
    // pipeline of uneven chunks may still be settling.
    let step = |x: &[f64], y: &[f64]| -> Vec<f64> { x.iter().zip(y).map(|(x, y)| y - x).collect() };
    let (first, second) = (
        step(&a.device_finish, &b.device_finish),
        step(&b.device_finish, &c.device_finish),
    );
    let settled = first
        .iter()
        .zip(&second)
        .zip(&c.device_finish)
        .all(|((s, t), end)| (s - t).abs() <= 1e-9 * end.abs().max(1.0));
    if !settled {
        return None;
    }
    let groups = f64::from(m - short) / f64::from(group);
    let grow = |x: &[f64], y: &[f64]| -> Vec<f64> {
        x.iter().zip(y).map(|(x, y)| x + (y - x) * groups).collect()
    };
    Some(Timeline {
        device_finish: grow(&a.device_finish, &b.device_finish),
        device_busy: grow(&a.device_busy, &b.device_busy),
        ..c
    })
}

fn run_tasks(schedule: Schedule, p: u32, m: u32, chunks: &[ChunkCost], record: bool) -> Timeline {
    let n_chunks = chunks.len() as u32;
    let v = (n_chunks / p.max(1)).max(1);
    let orders: Vec<_> = (0..p).map(|d| device_order(schedule, p, v, m, d)).collect();
    let idx = |c: u32, mb: u32| (c * m + mb) as usize;
    let mut fwd_done = vec![f64::NAN; (n_chunks * m) as usize];
    let mut bwd_done = vec![f64::NAN; (n_chunks * m) as usize];
    let mut next = vec![0usize; p as usize];
    let mut free = vec![0.0f64; p as usize];
    let mut busy = vec![0.0f64; p as usize];
    let mut held = vec![0.0f64; p as usize];
    let mut peak = vec![0.0f64; p as usize];
    let mut peak_states = vec![0.0f64; p as usize];
    let mut in_flight = vec![0u32; p as usize];
    let mut peak_in_flight = vec![0u32; p as usize];
    let mut tasks = Vec::with_capacity(if record {
        orders.iter().map(Vec::len).sum()
    } else {
        0
    });
    // Forwards flow to higher devices and backwards to lower ones; sweeping the devices up and
    // down in turn lets a wave of either cross the whole pipeline in one sweep. Every task's
    // times follow from its dependencies alone, so the sweep order changes no result, only how
    // many sweeps it takes (one per device per micro-batch with upward sweeps only).
    let mut upward = true;
    loop {
        let mut progressed = false;
        let mut finished = true;
        let sweep: Vec<usize> = if upward {
            (0..p as usize).collect()
        } else {
            (0..p as usize).rev().collect()
        };
        upward = !upward;
        for d in sweep {
            while let Some(&(c, mb, forward)) = orders[d].get(next[d]) {
                finished = false;
                let ready = if forward {
                    if c == 0 {
                        Some(0.0)
                    } else {
                        let t = fwd_done[idx(c - 1, mb)];
                        (!t.is_nan()).then(|| t + chunks[(c - 1) as usize].p2p)
                    }
                } else if c + 1 == n_chunks {
                    let t = fwd_done[idx(c, mb)];
                    (!t.is_nan()).then_some(t)
                } else {
                    let t = bwd_done[idx(c + 1, mb)];
                    (!t.is_nan()).then(|| t + chunks[c as usize].p2p)
                };
                let Some(ready) = ready else { break };
                let cost = &chunks[c as usize];
                let start = free[d].max(ready);
                let dur = if forward { cost.fwd } else { cost.bwd };
                let end = start + dur;
                free[d] = end;
                busy[d] += dur;
                if forward {
                    fwd_done[idx(c, mb)] = end;
                    held[d] += cost.activation_bytes;
                    in_flight[d] += 1;
                    if held[d] > peak[d] {
                        (peak[d], peak_states[d]) = (held[d], 0.0);
                    }
                    peak_in_flight[d] = peak_in_flight[d].max(in_flight[d]);
                } else {
                    bwd_done[idx(c, mb)] = end;
                    let w = cost.working;
                    let during = held[d] + w.activations + w.states;
                    if during > peak[d] {
                        (peak[d], peak_states[d]) = (during, w.states);
                    }
                    held[d] -= cost.activation_bytes;
                    in_flight[d] = in_flight[d].saturating_sub(1);
                }
                if record {
                    tasks.push(Task {
                        device: d as u32,
                        chunk: c,
                        micro_batch: mb,
                        forward,
                        start,
                        end,
                    });
                }
                next[d] += 1;
                progressed = true;
            }
        }
        if finished || !progressed {
            break;
        }
    }
    Timeline {
        device_finish: free,
        device_busy: busy,
        device_peak_activations: peak,
        device_peak_working_states: peak_states,
        device_peak_in_flight: peak_in_flight,
        tasks,
    }
}

/// A lower bound on the latest device finish [`simulate`] finds, without simulating.
///
/// Device `d` runs chunks `d, d + p, …`, each `m` times forward and `m` times backward. Its
/// first task (a forward of a chunk at or above `d`) waits for micro-batch 0's forward to cross
/// chunks `0..d`; its last task (a backward of a chunk at or above `d`) is followed by that
/// micro-batch's backward through chunks `d − 1..0`, each pass plus its hand-over. So device
/// `d` finishes no earlier than those two paths plus its own busy time. Exact for equal chunks
/// under 1F1B and GPipe, `(m + p − 1)(f + b)`, the bubble included.
pub fn finish_lower_bound(p: u32, m: u32, chunks: &[ChunkCost]) -> f64 {
    let p = p.max(1) as usize;
    let (mut before_fwd, mut before_bwd) = (0.0f64, 0.0f64);
    let mut bound = 0.0f64;
    for d in 0..p.min(chunks.len()) {
        let busy: f64 = chunks
            .iter()
            .skip(d)
            .step_by(p)
            .map(|c| c.fwd + c.bwd)
            .sum::<f64>()
            * f64::from(m);
        bound = bound.max(before_fwd + busy + before_bwd);
        before_fwd += chunks[d].fwd + chunks[d].p2p;
        before_bwd += chunks[d].bwd + chunks[d].p2p;
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of unequal work and hand-overs (the embedding on the first, the head on the
    /// last, one slower in the middle).
    fn uneven(n: u32) -> Vec<ChunkCost> {
        (0..n)
            .map(|c| ChunkCost {
                fwd: 1.0 + 0.3 * f64::from(c % 3) + if c == n - 1 { 0.9 } else { 0.0 },
                bwd: 2.1 + 0.2 * f64::from(c % 2) + if c == 0 { 0.4 } else { 0.0 },
                p2p: 0.05 * f64::from(c % 4),
                activation_bytes: 1.0 + f64::from(c),
                working: WorkingSet {
                    activations: 0.5,
                    states: 0.25,
                },
            })
            .collect()
    }

    /// A long 1F1B or interleaved schedule extrapolated from two short ones finishes, keeps
    /// busy and peaks as running every task does; one too short to extrapolate (2048 stages,
    /// 1100 micro-batches: the short run's count underflowed) runs every task.
    #[test]
    fn extrapolated_schedules_equal_every_task_run() {
        let deep = uneven(2048);
        assert_eq!(
            simulate(Schedule::OneFOneB, 2048, 1100, &deep),
            run_tasks(Schedule::OneFOneB, 2048, 1100, &deep, false)
        );
        for (schedule, p, v) in [
            (Schedule::OneFOneB, 4, 1),
            (Schedule::OneFOneB, 3, 1),
            (Schedule::Interleaved, 4, 2),
            (Schedule::Interleaved, 2, 3),
            (Schedule::OneFOneB, 16, 1),
            (Schedule::OneFOneB, 64, 1),
            (Schedule::Interleaved, 8, 4),
            (Schedule::Interleaved, 16, 2),
            (Schedule::Interleaved, 64, 2),
            // Deeper than any pipeline extrapolated: every task runs.
            (Schedule::Interleaved, 304, 2),
            (Schedule::OneFOneB, 600, 1),
        ] {
            let chunks = uneven(p * v);
            for m in [EXTRAPOLATED_MICRO_BATCHES + 4 * p, 3000 - 3000 % p] {
                let full = run_tasks(schedule, p, m, &chunks, false);
                let fast = simulate(schedule, p, m, &chunks);
                let close = |x: &[f64], y: &[f64]| {
                    x.iter()
                        .zip(y)
                        .all(|(x, y)| (x - y).abs() <= 1e-9 * x.abs())
                };
                assert!(
                    close(&full.device_finish, &fast.device_finish),
                    "{schedule:?} p {p} v {v} m {m}: {:?} vs {:?}",
                    full.device_finish,
                    fast.device_finish
                );
                assert!(close(&full.device_busy, &fast.device_busy));
                assert_eq!(full.device_peak_activations, fast.device_peak_activations);
                assert_eq!(full.device_peak_in_flight, fast.device_peak_in_flight);
            }
            if p > 8 {
                continue;
            }
            // A count that is no multiple of p: exact for 1F1B, interleaving's last group
            // partial (within 3e-4 here).
            let m = 3001 - 3001 % p + 1;
            let (full, fast) = (
                run_tasks(schedule, p, m, &chunks, false),
                simulate(schedule, p, m, &chunks),
            );
            for (x, y) in full.device_finish.iter().zip(&fast.device_finish) {
                assert!(
                    (x - y).abs() <= 1e-3 * x,
                    "{schedule:?} p {p} v {v} m {m}: {x} vs {y}"
                );
            }
        }
    }

    fn uniform(n: u32, f: f64, b: f64) -> Vec<ChunkCost> {
        (0..n)
            .map(|_| ChunkCost {
                fwd: f,
                bwd: b,
                p2p: 0.0,
                activation_bytes: 1.0,
                working: WorkingSet::default(),
            })
            .collect()
    }

    #[test]
    fn one_f_one_b_matches_the_closed_form_bubble() {
        // Uniform stages, no p2p: iteration = (m + p − 1)(f + b).
        let (p, m) = (4, 8);
        let t = simulate(Schedule::OneFOneB, p, m, &uniform(p, 1.0, 2.0));
        let end = t.device_finish.iter().cloned().fold(0.0, f64::max);
        assert!((end - f64::from(m + p - 1) * 3.0).abs() < 1e-9, "{end}");
        // Stage d holds p − d micro-batches at its peak.
        assert_eq!(t.device_peak_in_flight, vec![4, 3, 2, 1]);
    }

    #[test]
    fn gpipe_holds_every_micro_batch() {
        let t = simulate(Schedule::Gpipe, 2, 6, &uniform(2, 1.0, 2.0));
        assert_eq!(t.device_peak_in_flight, vec![6, 6]);
        let end = t.device_finish.iter().cloned().fold(0.0, f64::max);
        assert!((end - 7.0 * 3.0).abs() < 1e-9, "{end}");
    }

    #[test]
    fn interleaving_shrinks_the_bubble_by_v() {
        // Bubble (p − 1)/(v·m) of the ideal m·(f + b) (Narayanan et al. SC'21).
        let (p, m, v) = (4u32, 8u32, 2u32);
        let f = 1.0 / f64::from(v);
        let t = simulate_with(
            Schedule::Interleaved,
            p,
            m,
            &uniform(p * v, f, 2.0 * f),
            true,
        );
        let end = t.device_finish.iter().cloned().fold(0.0, f64::max);
        let ideal = f64::from(m) * 3.0;
        let bubble = (end - ideal) / ideal;
        let want = f64::from(p - 1) / f64::from(v * m);
        assert!((bubble - want).abs() < 1e-9, "bubble {bubble} vs {want}");
        assert_eq!(t.tasks.len(), (2 * m * v * p) as usize);
    }

    /// The bound never exceeds the simulation (random chunk costs, every schedule, with and
    /// without hand-over times) and equals it for equal chunks under 1F1B.
    #[test]
    fn finish_lower_bound_is_a_bound_and_tight_for_equal_chunks() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut unit = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            0.1 + (x % 1000) as f64 / 1000.0
        };
        for (schedule, v) in [
            (Schedule::OneFOneB, 1),
            (Schedule::Gpipe, 1),
            (Schedule::Interleaved, 2),
            (Schedule::Interleaved, 3),
        ] {
            for p in [1u32, 2, 3, 4, 8] {
                for m in [1u32, 2, 5, 8, 16] {
                    if schedule == Schedule::Interleaved && (p == 1 || m % p != 0) {
                        continue;
                    }
                    let chunks: Vec<ChunkCost> = (0..p * v)
                        .map(|_| ChunkCost {
                            fwd: unit(),
                            bwd: 2.0 * unit(),
                            p2p: 0.1 * unit(),
                            activation_bytes: 1.0,
                            working: WorkingSet::default(),
                        })
                        .collect();
                    let t = simulate(schedule, p, m, &chunks);
                    let finish = t.device_finish.iter().copied().fold(0.0, f64::max);
                    let bound = finish_lower_bound(p, m, &chunks);
                    assert!(
                        bound <= finish * (1.0 + 1e-12),
                        "{schedule:?} v={v} p={p} m={m}: bound {bound} > finish {finish}"
                    );
                }
            }
        }
        for (p, m) in [(2u32, 3u32), (4, 8), (8, 8)] {
            let t = simulate(Schedule::OneFOneB, p, m, &uniform(p, 1.0, 2.0));
            let finish = t.device_finish.iter().copied().fold(0.0, f64::max);
            let bound = finish_lower_bound(p, m, &uniform(p, 1.0, 2.0));
            assert!(
                (bound - finish).abs() < 1e-9,
                "p={p} m={m}: {bound} vs {finish}"
            );
            assert!((bound - f64::from(m + p - 1) * 3.0).abs() < 1e-9);
        }
    }
}
