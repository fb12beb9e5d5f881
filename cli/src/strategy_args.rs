//! The strategy flags shared by `estimate` (all required) and, later, `compile` (optional pins).

use clap::Args;
use planner::{Precision, Recompute, Schedule, Strategy};

/// On/off switch for flags like `--sequence-parallel on`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// A count of at least one (`--gpus 0` says so, not clap's `not in 1..18446744073709551615`).
fn at_least_one(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a whole number")),
    }
}

/// A positive token count, in plain or scientific notation (`300e9`).
pub(crate) fn parse_tokens(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && (1.0..=MAX_TRAIN_TOKENS).contains(&t) => Ok(t),
        _ => Err(format!(
            "`{s}` is not a token count (a positive number up to 1e18, such as 300e9)"
        )),
    }
}

/// The most tokens `--train-tokens` takes: 10⁵ times the largest published pre-training runs
/// (Llama 3: 15.6e12 tokens, 2024); beyond it the days and costs print as hundreds of digits.
const MAX_TRAIN_TOKENS: f64 = 1e18;

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// A cluster preset (see `plait clusters`) or a cluster TOML file (docs/hardware.md).
    #[arg(long)]
    pub cluster: String,
    /// Number of GPUs to use.
    #[arg(long, value_parser = at_least_one)]
    pub gpus: u64,
    /// Sequences per iteration, over all data-parallel replicas.
    #[arg(long, value_parser = at_least_one)]
    pub global_batch: u64,
    /// Tokens to train on (e.g. 300e9): adds days, GPU-hours, energy (board power x GPUs x
    /// time x the cluster's PUE) and, with a price in the cluster file, cost.
    #[arg(long, value_parser = parse_tokens)]
    pub train_tokens: Option<f64>,
    /// Sequence length (default: the model's context length, at most 8192).
    #[arg(long, value_parser = at_least_one)]
    pub seq: Option<u64>,
}

#[derive(Args, Debug, Clone)]
pub struct StrategyArgs {
    /// Tensor-parallel degree.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub tp: Option<u32>,
    /// Pipeline-parallel degree (stages).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub pp: Option<u32>,
    /// Data-parallel degree.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub dp: Option<u32>,
    /// Sequences per micro-batch.
    #[arg(long, value_parser = at_least_one)]
    pub micro_batch: Option<u64>,
    /// ZeRO stage 0-3 (compile: searched unless given; estimate: 0 unless given).
    #[arg(long)]
    pub zero: Option<u8>,
    /// Activation recomputation: none, selective or full (compile: searched unless given;
    /// estimate: none unless given).
    #[arg(long)]
    pub recompute: Option<Recompute>,
    /// Pipeline schedule: gpipe, 1f1b or interleaved (compile: searched unless given;
    /// estimate: 1f1b unless given).
    #[arg(long)]
    pub schedule: Option<Schedule>,
    /// Model chunks per device for the interleaved schedule (compile: searched unless given;
    /// estimate: 2 when interleaved).
    #[arg(long)]
    pub virtual_stages: Option<u32>,
    /// Sequence parallelism (with tensor parallelism; off at tp 1, as Megatron-LM turns it off)
    /// (compile: searched unless given; estimate: off unless given).
    #[arg(long)]
    pub sequence_parallel: Option<Switch>,
    /// Numeric precision: fp32, bf16, fp16, fp8 (Transformer Engine, delayed scaling) or
    /// fp8-tensorwise (per-tensor current scaling) (default: bf16 on GPUs that have it).
    #[arg(long)]
    pub precision: Option<Precision>,
    /// Attention kernel: fused (FlashAttention, what GPU training stacks run) or materialized
    /// (scores in memory: Megatron-LM 2021-22, plait's CPU kernels) [default: the cluster's;
    /// fused on A100/H100/H200, materialized on V100 and `cpu`].
    #[arg(long)]
    pub attention: Option<planner::cost::compute::AttentionKernel>,
    /// Element-wise kernels of the runtime: eager (one kernel per op, as plait's CPU runtime)
    /// or fused (point-wise chains as one kernel, Megatron-LM's fused kernels) [default: the
    /// cluster's; fused on GPU clusters, eager on `cpu`].
    #[arg(long)]
    pub kernels: Option<planner::cost::compute::Kernels>,
    /// Context-parallel degree: the sequence split over N ranks, attention as Megatron's ring
    /// (KV passed around, overlapped with the attention blocks) [default: 1; the search tries
    /// 2, 4 and 8 for sequences of 8192 tokens and more].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub cp: Option<u32>,
    /// Expert-parallel degree for mixture-of-experts models: each layer's experts split over N
    /// of the data-parallel ranks (N divides dp and the expert count), tokens dispatched with
    /// Megatron-Core's all-gather dispatcher [default: 1; the search tries every such N].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub ep: Option<u32>,
    /// The engine that runs the plan, which decides what is fused and overlapped: megatron
    /// (Megatron-Core as NeMo runs it), torchtitan (FSDP2) or deepspeed (ZeRO)
    /// [default: megatron].
    #[arg(long)]
    pub engine: Option<planner::engine::Engine>,
    /// Decoder layers per pipeline stage, comma-separated (default: as even as possible).
    #[arg(long, value_delimiter = ',')]
    pub stage_layers: Option<Vec<u32>>,
    /// Price the data-parallel gradient exchange compressed, as `plait run` runs it: none,
    /// bf16, int8 (a scale per 256 elements, with error feedback) or topk:FRACTION (index and
    /// value of the largest entries); none unless given. Needs ZeRO-0; never searched: what it does to convergence is
    /// the user's trade.
    #[arg(long)]
    pub grad_compression: Option<planner::dp_comm::GradCompression>,
    /// Price data-parallel synchronisation as sync (every step) or local-sgd:H (no gradient
    /// exchange; parameters averaged every H steps); sync unless given. Needs ZeRO-0; never
    /// searched.
    #[arg(long)]
    pub dp_sync: Option<planner::dp_comm::DpSync>,
}

impl StrategyArgs {
    /// The data-parallel exchange the flags ask for.
    pub fn dp_comm(&self) -> planner::dp_comm::DpComm {
        planner::dp_comm::DpComm {
            grad_compression: self.grad_compression.unwrap_or_default(),
            dp_sync: self.dp_sync.unwrap_or_default(),
        }
    }

    /// A complete strategy on `cluster`; every missing required knob is named in the error.
    pub fn complete(
        &self,
        cluster: &planner::Cluster,
        global_batch: u64,
        seq: u64,
    ) -> anyhow::Result<Strategy> {
        let mut missing = Vec::new();
        if self.tp.is_none() {
            missing.push("--tp");
        }
        if self.pp.is_none() {
            missing.push("--pp");
        }
        if self.dp.is_none() {
            missing.push("--dp");
        }
        if self.micro_batch.is_none() {
            missing.push("--micro-batch");
        }
        if !missing.is_empty() {
            anyhow::bail!(
                "estimate needs {} (a complete strategy)",
                missing.join(", ")
            );
        }
        let schedule = self.schedule.unwrap_or(Schedule::OneFOneB);
        let engine = self.engine.unwrap_or_default();
        let zero = self.zero.unwrap_or(0);
        Ok(Strategy {
            tp: self.tp.unwrap_or(1),
            pp: self.pp.unwrap_or(1),
            dp: self.dp.unwrap_or(1),
            micro_batch: self.micro_batch.unwrap_or(1),
            global_batch,
            seq,
            zero,
            recompute: self.recompute.unwrap_or(Recompute::None),
            schedule,
            virtual_stages: self
                .virtual_stages
                .unwrap_or(if schedule == Schedule::Interleaved {
                    2
                } else {
                    1
                }),
            // Off at tp 1, as Megatron-LM turns it off (nothing to split the sequence over).
            sequence_parallel: self.sequence_parallel == Some(Switch::On)
                && self.tp.unwrap_or(1) > 1,
            precision: self
                .precision
                .unwrap_or_else(|| planner::search::engine_default_precision(cluster, engine)),
            stage_layers: self.stage_layers.clone(),
            attention: self
                .attention
                .unwrap_or_else(|| cluster.default_attention()),
            kernels: self
                .kernels
                .unwrap_or_else(|| cluster.engine_kernels(engine)),
            cp: self.cp.unwrap_or(1),
            ep: self.ep.unwrap_or(1),
            engine,
            overlap: engine.overlap(zero),
            dp_comm: self.dp_comm(),
        })
    }
}
