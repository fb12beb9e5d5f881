//! Training precision: which peak the matmuls run at and how many bytes each state takes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Numeric precision of a training run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32 (the CPU runtime; small models).
    Fp32,
    /// bf16 compute, fp32 master weights and Adam moments (mixed precision).
    Bf16,
    /// fp16 compute, fp32 master weights and Adam moments (mixed precision, loss scaling).
    Fp16,
    /// fp8 matmuls (Transformer-Engine style) with bf16 weights/activations and fp32 states:
    /// TE's default delayed scaling (scales from an amax history).
    Fp8,
    /// The same with per-tensor current scaling (Megatron's `--fp8-recipe tensorwise`): each
    /// scale from the tensor's own amax, an extra pass before each cast.
    #[serde(rename = "fp8-tensorwise")]
    Fp8Tensorwise,
}

impl Precision {
    pub const ALL: [Precision; 5] = [
        Precision::Fp32,
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
        Precision::Fp8Tensorwise,
    ];

    /// Whether the GEMMs run in FP8 (either scaling recipe).
    pub fn is_fp8(self) -> bool {
        matches!(self, Precision::Fp8 | Precision::Fp8Tensorwise)
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8 => "fp8",
            Precision::Fp8Tensorwise => "fp8-tensorwise",
        }
    }

    /// Bytes per parameter of the weights used in compute.
    pub fn weight_bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 4.0,
            _ => 2.0,
        }
    }

    /// Bytes per parameter of the gradients: the compute dtype's, as NVIDIA's performance
    /// recipes behind the published H100 runs reduce them (NeMo-Framework-Launcher's
    /// `optim.grad_sync_dtype=bf16`) and as `plait export` configures the engines, whose own
    /// defaults under bf16 accumulate them in fp32 (Megatron-LM without `--grad-reduce-in-bf16`,
    /// DeepSpeed without `data_types.grad_accum_dtype`; torchtitan's FSDP2 always reduces in
    /// fp32 but keeps no separate 16-bit weights, the same 16 bytes a parameter at ZeRO-3).
    pub fn grad_bytes(self) -> f64 {
        self.weight_bytes()
    }

    /// Bytes per parameter of optimizer state: Adam's m and v in fp32, plus an fp32 master copy
    /// under mixed precision (the K = 12 of Rajbhandari et al., SC'20).
    pub fn optimizer_bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 8.0,
            _ => 12.0,
        }
    }

    /// Bytes per activation element (Korthikanti et al. count 16-bit activations).
    pub fn activation_bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 4.0,
            _ => 2.0,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s.to_ascii_lowercase())
            .ok_or_else(|| {
                format!("unknown precision `{s}`; expected fp32, bf16, fp16, fp8 or fp8-tensorwise")
            })
    }
}
