//! Time, GPU-hours, energy and money to train on a number of tokens with one plan.
//!
//! Days = tokens / (tokens per second) / 86 400, the plan's predicted steady-state rate
//! (Narayanan et al. SC'21 §5.1 estimate the same way: 8·T·P / (n·X) with X the achieved
//! FLOP/s per GPU). Energy = the GPUs' board power at full load (datasheet maximum, the
//! cluster file's `gpu.board_power_w`) × GPUs × time × the data center's PUE (`pue`, default
//! [`crate::hardware::DEFAULT_PUE`]): an upper bound for the GPUs, leaving out CPUs, memory and
//! network switches, which PUE does not cover. Cost = GPU-hours × the cluster file's
//! `price_per_gpu_hour`, when it gives one.

use serde::{Deserialize, Serialize};

use crate::hardware::Cluster;

/// What training on `tokens` tokens takes with a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingRun {
    pub tokens: f64,
    pub iterations: f64,
    pub days: f64,
    pub gpu_hours: f64,
    /// Facility energy, kWh (absent when the cluster file gives no board power).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_kwh: Option<f64>,
    /// GPU-hours × the cluster's price per GPU-hour (absent without a price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    pub pue: f64,
}

/// Training `tokens` tokens at `tokens_per_s` on `gpus` GPUs of `cluster`, one iteration
/// taking `iteration_s` seconds.
pub fn training_run(
    cluster: &Cluster,
    gpus: u64,
    tokens_per_s: f64,
    iteration_s: f64,
    tokens: f64,
) -> TrainingRun {
    let seconds = tokens / tokens_per_s;
    let gpu_hours = gpus as f64 * seconds / 3600.0;
    let pue = cluster.pue();
    TrainingRun {
        tokens,
        iterations: seconds / iteration_s,
        days: seconds / 86_400.0,
        gpu_hours,
        energy_kwh: cluster
            .gpu
            .board_power_w
            .map(|w| w * gpu_hours * pue / 1000.0),
        cost: cluster.price_per_gpu_hour.map(|p| p * gpu_hours),
        pue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SC'21 §5.1: GPT-3 175B on 1024 A100 at 140 TFLOP/s per GPU, 300B tokens, ≈ 34 days
    /// (8·T·P / (n·X)); fed the rate that formula implies, the arithmetic must agree.
    #[test]
    fn days_follow_the_rate() {
        let c = Cluster::load("dgx-a100-80gb").unwrap_or_else(|e| panic!("{e}"));
        let (t, p, n, x) = (300e9, 175e9, 1024.0, 140e12);
        let tokens_per_s = n * x / (8.0 * p);
        let run = training_run(&c, 1024, tokens_per_s, 1.0, t);
        let paper_days = 8.0 * t * p / (n * x) / 86_400.0;
        assert!((run.days - paper_days).abs() < 1e-9);
        assert!((run.days - 34.0).abs() / 34.0 < 0.01, "{}", run.days);
        // 400 W A100s, PUE 1.59: energy = 0.4 kW × GPU-hours × 1.59.
        let kwh = run.energy_kwh.unwrap_or_default();
        assert!((kwh - 0.4 * run.gpu_hours * 1.59).abs() < 1e-6);
        assert!(run.cost.is_none());
    }
}
