//! A parallelization strategy: the knobs `plait estimate` takes and the search chooses.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::model::ModelInfo;
use crate::precision::Precision;

/// The most micro-batches one iteration of one pipeline may have (global batch over
/// dp × micro-batch): the largest published runs have a few hundred; the schedule's simulation
/// holds a task per micro-batch and chunk.
pub const MAX_MICRO_BATCHES: u64 = 1 << 16;

/// Activation recomputation (Korthikanti et al. 2022).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every activation the backward pass needs.
    None,
    /// Recompute only the attention core (the `5as/h` terms), keep the rest.
    Selective,
    /// Keep only each layer's input; recompute the whole layer in the backward pass.
    Full,
}

/// Pipeline schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// All forwards, then all backwards (Huang et al. 2019).
    Gpipe,
    /// One-forward-one-backward (PipeDream-Flush; Narayanan et al. 2021).
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// 1F1B over `v` model chunks per device (Narayanan et al. SC'21).
    Interleaved,
}

macro_rules! named_enum {
    ($t:ty, $($v:ident => $s:literal),+) => {
        impl $t {
            pub fn name(self) -> &'static str {
                match self { $(<$t>::$v => $s),+ }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.to_ascii_lowercase().as_str() {
                    $($s => Ok(<$t>::$v),)+
                    _ => Err(format!("unknown value `{s}`; expected one of: {}", [$($s),+].join(", "))),
                }
            }
        }
    };
}

named_enum!(Recompute, None => "none", Selective => "selective", Full => "full");
named_enum!(Schedule, Gpipe => "gpipe", OneFOneB => "1f1b", Interleaved => "interleaved");

/// One complete strategy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Strategy {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Sequences per iteration, over all data-parallel replicas.
    pub global_batch: u64,
    pub seq: u64,
    /// ZeRO stage 0–3 (Rajbhandari et al. SC'20).
    pub zero: u8,
    pub recompute: Recompute,
    pub schedule: Schedule,
    /// Model chunks per device (interleaved schedule; 1 otherwise).
    pub virtual_stages: u32,
    pub sequence_parallel: bool,
    pub precision: Precision,
    /// Attention kernel the runtime uses (not a parallelization choice; default materialized).
    #[serde(default)]
    pub attention: crate::cost::compute::AttentionKernel,
    /// Whether the runtime fuses element-wise kernels (not a parallelization choice; the
    /// cluster's default, fused on GPU clusters; plans written before it existed mean eager).
    #[serde(default)]
    pub kernels: crate::cost::compute::Kernels,
    /// Decoder layers per pipeline stage (per virtual stage when interleaved), if not even.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_layers: Option<Vec<u32>>,
    /// Context-parallel degree: the sequence split over `cp` ranks, attention as Megatron's
    /// ring over them (1 = off; plans written before it existed).
    #[serde(default = "one")]
    pub cp: u32,
    /// Expert-parallel degree: each routed-expert layer's experts split over `ep` of the
    /// data-parallel ranks (Megatron-Core's `--expert-model-parallel-size`), tokens dispatched
    /// to them by its all-gather dispatcher; 1 = off (plans written before it existed).
    #[serde(default = "one")]
    pub ep: u32,
    /// The engine that runs the plan (what it fuses and overlaps).
    #[serde(default)]
    pub engine: crate::engine::Engine,
    /// What runs beside compute: the engine's profile unless set otherwise (plans written
    /// before engines were modelled read as [`crate::engine::Overlap::LEGACY`]).
    #[serde(default)]
    pub overlap: crate::engine::Overlap,
    /// How data-parallel replicas exchange gradients (compressed, or local SGD): the user's
    /// convergence trade, never searched (plain unless set).
    #[serde(default, skip_serializing_if = "crate::dp_comm::DpComm::is_plain")]
    pub dp_comm: crate::dp_comm::DpComm,
}

fn one() -> u32 {
    1
}

impl Strategy {
    /// Context parallelism's own constraints (Megatron-Core's ring attention).
    fn validate_cp(&self, model: &ModelInfo) -> Result<(), PlanError> {
        if self.cp <= 1 {
            return Ok(());
        }
        let err = |c: String| Err(PlanError::invalid(c));
        // The load-balanced causal split gives each rank two of 2·cp sequence chunks.
        if !self.seq.is_multiple_of(2 * u64::from(self.cp)) {
            return err(format!(
                "context parallelism needs seq {} divisible by 2 x cp = {}",
                self.seq,
                2 * self.cp
            ));
        }
        if self.sequence_parallel
            && !(self.seq / u64::from(self.cp)).is_multiple_of(u64::from(self.tp))
        {
            return err(format!(
                "sequence parallelism with cp {} needs seq / cp = {} divisible by tp {}",
                self.cp,
                self.seq / u64::from(self.cp),
                self.tp
            ));
        }
        if self.attention != crate::cost::compute::AttentionKernel::Fused {
            return err(
                "context parallelism runs fused (flash) attention blocks around the ring: use \
                 --attention fused"
                    .into(),
            );
        }
        if model.static_seq {
            return err(
                "context parallelism needs a model with a symbolic sequence length; this one is \
                 static-shaped (an ONNX import): use --cp 1, or plan the model's config.json"
                    .into(),
            );
        }
        if let crate::dp_comm::DpSync::LocalSgd { every } = self.dp_comm.dp_sync {
            return err(format!(
                "local SGD (local-sgd:{every}) lets each rank step on its own gradient, but with \
                 context parallelism a rank holds only its chunks' share of each sequence's: use \
                 --dp-sync sync or --cp 1"
            ));
        }
        Ok(())
    }

    /// Expert parallelism's own constraints: the experts and the data-parallel ranks divide
    /// into `ep` groups.
    fn validate_ep(&self, model: &ModelInfo) -> Result<(), PlanError> {
        if self.ep <= 1 {
            return Ok(());
        }
        let err = |c: String| Err(PlanError::invalid(c));
        if model.experts == 0 {
            return err(format!(
                "--ep {} needs a mixture-of-experts model; this one has no routed experts: use --ep 1",
                self.ep
            ));
        }
        if !model.experts.is_multiple_of(u64::from(self.ep)) {
            return err(format!(
                "{} experts do not split evenly over ep {}: pick an ep that divides them",
                model.experts, self.ep
            ));
        }
        if !self.dp.is_multiple_of(self.ep) {
            return err(format!(
                "expert-parallel ranks are data-parallel ranks (Megatron-Core): ep {} must divide dp {}",
                self.ep, self.dp
            ));
        }
        if self.cp > 1 {
            return err(
                "expert parallelism together with context parallelism is not modelled yet: use \
                 --cp 1 or --ep 1"
                    .into(),
            );
        }
        Ok(())
    }

    /// Data-parallel ranks holding the same experts (the expert-data-parallel group).
    pub fn expert_replicas(&self) -> u64 {
        self.grad_replicas() / u64::from(self.ep.max(1))
    }

    pub fn gpus(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.pp) * u64::from(self.dp) * u64::from(self.cp)
    }

    /// Ranks that hold the same weights and reduce their gradients together: the data- and
    /// context-parallel ranks (Megatron reduces gradients over dp × cp).
    pub fn grad_replicas(&self) -> u64 {
        u64::from(self.dp) * u64::from(self.cp)
    }

    /// Tokens of one sequence on one rank (the sequence split over the context-parallel group).
    pub fn local_seq(&self) -> u64 {
        self.seq / u64::from(self.cp.max(1))
    }

    /// Micro-batches per iteration per pipeline.
    pub fn micro_batches(&self) -> u64 {
        self.global_batch / (u64::from(self.dp) * self.micro_batch)
    }

    /// Number of model chunks (pipeline stages × virtual stages).
    pub fn chunks(&self) -> u32 {
        self.pp * self.virtual_stages
    }

    /// Layers of each model chunk, in pipeline order (chunk c lives on device c mod pp).
    pub fn chunk_layers(&self, layers: u32) -> Vec<u32> {
        if let Some(s) = &self.stage_layers {
            return s.clone();
        }
        let n = self.chunks();
        (0..n)
            .map(|i| layers / n + u32::from(i < layers % n))
            .collect()
    }

    /// Checks every constraint, naming the first one that fails.
    ///
    /// The pipeline schedule is simulated task by task (`cost::pipeline`), so the micro-batches
    /// of one iteration are bounded ([`MAX_MICRO_BATCHES`]), far above any published run's.
    pub fn validate(&self, model: &ModelInfo, gpus: u64) -> Result<(), PlanError> {
        let err = |c: String| Err(PlanError::invalid(c));
        if self.tp == 0 || self.pp == 0 || self.dp == 0 || self.cp == 0 || self.ep == 0 {
            return err("tp, pp, dp, cp and ep must each be at least 1".into());
        }
        if self.gpus() != gpus {
            let cp = if self.cp > 1 {
                format!(" x cp {}", self.cp)
            } else {
                String::new()
            };
            return err(format!(
                "tp x pp x dp{} = {} x {} x {}{cp} = {} must equal the {gpus} GPUs (--gpus; in a \
                 plan, its `gpus` field)",
                if self.cp > 1 { " x cp" } else { "" },
                self.tp,
                self.pp,
                self.dp,
                self.gpus()
            ));
        }
        self.validate_cp(model)?;
        self.validate_ep(model)?;
        if let Some(why) = self.dp_comm.conflict() {
            return err(why);
        }
        if !self.dp_comm.is_plain() && self.zero > 0 {
            return err(format!(
                "--grad-compression {} --dp-sync {} run at ZeRO-0 (a compressed exchange is an all-reduce; local SGD keeps each replica's whole optimizer state), not at ZeRO-{}: pass --zero 0",
                self.dp_comm.grad_compression, self.dp_comm.dp_sync, self.zero
            ));
        }
        if self.micro_batch == 0 || self.global_batch == 0 || self.seq == 0 {
            return err("micro-batch, global batch and sequence length must be positive".into());
        }
        if !self
            .global_batch
            .is_multiple_of(u64::from(self.dp) * self.micro_batch)
        {
            return err(format!(
                "global batch {} must be divisible by dp x micro-batch = {} x {} = {}",
                self.global_batch,
                self.dp,
                self.micro_batch,
                u64::from(self.dp) * self.micro_batch
            ));
        }
        if self.micro_batches() > MAX_MICRO_BATCHES {
            return err(format!(
                "global batch {} over dp x micro-batch = {} is {} micro-batches per iteration \
                 and pipeline; plait schedules at most {MAX_MICRO_BATCHES}: raise the \
                 micro-batch or the data-parallel degree, or lower the global batch",
                self.global_batch,
                u64::from(self.dp) * self.micro_batch,
                self.micro_batches()
            ));
        }
        if !model.heads.is_multiple_of(u64::from(self.tp)) {
            return err(format!(
                "attention heads {} are not divisible by tp {}",
                model.heads, self.tp
            ));
        }
        if !model.kv_heads.is_multiple_of(u64::from(self.tp))
            && u64::from(self.tp) % model.kv_heads != 0
        {
            return err(format!(
                "key/value heads {} and tp {} must divide one another",
                model.kv_heads, self.tp
            ));
        }
        if self.zero > 3 {
            return err(format!(
                "ZeRO stage {} does not exist (0, 1, 2 or 3)",
                self.zero
            ));
        }
        if self.virtual_stages == 0 {
            return err("virtual stages must be at least 1".into());
        }
        if self.schedule != Schedule::Interleaved && self.virtual_stages != 1 {
            return err(format!(
                "--virtual-stages {} needs --schedule interleaved",
                self.virtual_stages
            ));
        }
        if self.schedule == Schedule::Interleaved {
            if self.pp < 2 {
                return err("the interleaved schedule needs pp >= 2".into());
            }
            if self.virtual_stages < 2 {
                return err("the interleaved schedule needs --virtual-stages >= 2".into());
            }
            if !self.micro_batches().is_multiple_of(u64::from(self.pp)) {
                return err(format!(
                    "the interleaved schedule needs micro-batches ({}) divisible by pp ({})",
                    self.micro_batches(),
                    self.pp
                ));
            }
        }
        if u64::from(self.chunks()) > u64::from(model.layers) {
            return err(format!(
                "{} layers cannot fill pp x virtual stages = {} x {} = {} stages",
                model.layers,
                self.pp,
                self.virtual_stages,
                self.chunks()
            ));
        }
        if let Some(s) = &self.stage_layers {
            if s.len() != self.chunks() as usize {
                return err(format!(
                    "stage layers list {} entries, expected pp x virtual stages = {}",
                    s.len(),
                    self.chunks()
                ));
            }
            if s.iter().sum::<u32>() != model.layers || s.contains(&0) {
                return err(format!(
                    "stage layers {s:?} must be positive and sum to the model's {} layers",
                    model.layers
                ));
            }
        }
        if self.sequence_parallel && !self.seq.is_multiple_of(u64::from(self.tp)) {
            return err(format!(
                "sequence parallelism needs seq {} divisible by tp {}",
                self.seq, self.tp
            ));
        }
        if self.sequence_parallel && model.static_seq {
            return err(
                "sequence parallelism needs a model with a symbolic sequence length; this one \
                 is static-shaped (an ONNX import): use --sequence-parallel off, or plan the \
                 model's config.json"
                    .to_string(),
            );
        }
        if self.seq > model.max_seq {
            return err(format!(
                "sequence length {} exceeds the model's {} positions",
                self.seq, model.max_seq
            ));
        }
        Ok(())
    }
}
