//! Training engines: what the software that runs a plan fuses and overlaps.
//!
//! Two plans with the same mesh run at different speeds on different engines: whether the
//! data-parallel gradient reduction hides behind the backward, whether the distributed
//! optimizer's weight all-gather hides behind the next forward, whether tensor-parallel
//! collectives are pipelined with their GEMMs, which element-wise kernels are fused. Each
//! engine's profile is the engine's default behaviour in the configuration its own recipes
//! use, with the flags cited in docs/cost-model.md ("Engine profiles"). `plait export` writes
//! the same profile out as the engine's flags.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cost::compute::Kernels;
use crate::strategy::{Schedule, Strategy};

/// The engine a plan is run on (`--engine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// Megatron-Core as NeMo and Megatron-Bridge run it.
    #[default]
    Megatron,
    /// torchtitan (FSDP2, PyTorch-native tensor and pipeline parallelism).
    Torchtitan,
    /// DeepSpeed (ZeRO).
    Deepspeed,
}

impl Engine {
    pub const ALL: [Engine; 3] = [Engine::Megatron, Engine::Torchtitan, Engine::Deepspeed];

    /// The engine as its users name it, for messages.
    pub fn engine_name(self) -> &'static str {
        match self {
            Engine::Megatron => "Megatron-LM",
            Engine::Torchtitan => "torchtitan",
            Engine::Deepspeed => "DeepSpeed",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Engine::Megatron => "megatron",
            Engine::Torchtitan => "torchtitan",
            Engine::Deepspeed => "deepspeed",
        }
    }

    /// Parameters whose 16-bit copies (gathered weights, then their whole gradients) are live
    /// at once under ZeRO-3 (under ZeRO-2 the gradients only) while a layer of `layer_params`
    /// parameters runs: FSDP2
    /// (torchtitan wraps each transformer block) and Megatron-FSDP gather and reduce-scatter a
    /// whole layer; DeepSpeed gathers submodule by submodule up to `stage3_max_live_parameters`
    /// and reduces gradients in buckets of `reduce_bucket_size` elements (defaults 1e9 and 5e8,
    /// DeepSpeed's ZeRO configuration docs).
    pub fn zero3_working_params(self, layer_params: f64) -> (f64, f64) {
        match self {
            Engine::Megatron | Engine::Torchtitan => (layer_params, layer_params),
            Engine::Deepspeed => (
                layer_params.min(DEEPSPEED_MAX_LIVE_PARAMETERS),
                layer_params.min(DEEPSPEED_REDUCE_BUCKET_SIZE),
            ),
        }
    }

    /// [`Engine::runs`] of `s` on a model of `layers` layers, where the strategy leaves the
    /// split to the search: Megatron-LM's interleaved chunks all hold the same layers, so 32
    /// layers in 14 chunks cannot run whatever the split (a 1F1B split with an uneven middle
    /// can: the search moves the remainder to the first and last stages).
    pub fn runs_on(self, s: &Strategy, layers: u32) -> Result<(), String> {
        self.runs(s)?;
        let chunks = s.chunks();
        if self == Engine::Megatron
            && s.virtual_stages > 1
            && s.stage_layers.is_none()
            && !layers.is_multiple_of(chunks)
        {
            return Err(format!(
                "Megatron-LM gives every interleaved chunk the same layers: {layers} layers do \
                 not split into pp x virtual stages = {chunks} chunks"
            ));
        }
        Ok(())
    }

    /// Whether the engine can run `s`, or the rule it breaks. The rules, each from the engine:
    /// - Megatron-LM (core_v0.15.0): pipelines run 1F1B or interleaved 1F1B only
    ///   (`forward_backward_pipelining_{without,with}_interleaving` in
    ///   `megatron/core/pipeline_parallel/schedules.py`); ZeRO-1 is the distributed optimizer
    ///   and ZeRO-2/3 are Megatron-FSDP (`--data-parallel-sharding-strategy optim_grads` /
    ///   `optim_grads_params`), which does not combine with pipeline parallelism.
    /// - torchtitan (0.3.0): data parallelism is DDP (`data_parallel_replicate_degree`) or
    ///   FSDP2 (`data_parallel_shard_degree`), i.e. ZeRO-0, ZeRO-3, or ZeRO-2 with
    ///   `fsdp_reshard_after_forward never`; there is no optimizer-only sharding (ZeRO-1), and
    ///   training runs in bfloat16 or float32 (`--training.mixed-precision-param`).
    /// - DeepSpeed: ZeRO-2 and ZeRO-3 do not run with its pipeline engine, which has one
    ///   1F1B-style schedule (`TrainSchedule`); its configuration has no Megatron-style tensor,
    ///   sequence or context parallelism, no Transformer Engine FP8, and its activation
    ///   checkpointing is per layer (no selective recomputation).
    /// - Every engine: data parallelism exchanges plain gradients every step. plait's
    ///   compressed exchanges and local SGD are its runtime's own (`plait run`); Megatron-LM's
    ///   `--grad-reduce-in-bf16` and DeepSpeed's `communication_data_type` reduce in bf16 on
    ///   NCCL, which is not the encode-exchange-decode plait prices.
    pub fn runs(self, s: &Strategy) -> Result<(), String> {
        let pipelined = s.pp > 1;
        if !s.dp_comm.is_plain() {
            return Err(format!(
                "{} exchanges plain gradients every step: {} is plait's own runtime's \
                 exchange (`plait run`)",
                self.engine_name(),
                s.dp_comm.flags()
            ));
        }
        match self {
            Engine::Megatron if pipelined && s.schedule == Schedule::Gpipe => {
                Err("Megatron-LM has no GPipe schedule (1F1B and interleaved 1F1B)".into())
            }
            Engine::Megatron if pipelined && s.zero >= 2 => Err(format!(
                "Megatron-FSDP (ZeRO-{}) does not run with pipeline parallelism",
                s.zero
            )),
            Engine::Megatron if pipelined && s.stage_layers.is_some() => megatron_split(
                s.stage_layers.as_deref().unwrap_or(&[]),
                s.virtual_stages > 1,
            ),
            Engine::Torchtitan if s.zero == 1 && s.dp * s.cp > 1 => {
                Err("torchtitan has no optimizer-only sharding (ZeRO-1): DDP or FSDP2".into())
            }
            Engine::Torchtitan
                if matches!(
                    s.precision,
                    crate::precision::Precision::Fp16
                        | crate::precision::Precision::Fp8
                        | crate::precision::Precision::Fp8Tensorwise
                ) =>
            {
                Err(format!(
                    "torchtitan trains in bfloat16 or float32, not {}{}",
                    s.precision,
                    if s.precision.is_fp8() {
                        " (plait's fp8 is Transformer Engine's; torchtitan's float8 is torchao's)"
                    } else {
                        ""
                    }
                ))
            }
            Engine::Deepspeed if pipelined && s.zero >= 2 => Err(format!(
                "DeepSpeed's pipeline engine runs ZeRO-0 or ZeRO-1, not ZeRO-{}",
                s.zero
            )),
            Engine::Deepspeed if pipelined && s.schedule != Schedule::OneFOneB => {
                Err("DeepSpeed's pipeline engine has one 1F1B-style schedule".into())
            }
            Engine::Deepspeed if s.sequence_parallel && s.tp > 1 => {
                Err("DeepSpeed has no Megatron-style sequence parallelism".into())
            }
            Engine::Deepspeed if s.cp > 1 => {
                Err("DeepSpeed has no ring-attention context parallelism".into())
            }
            Engine::Deepspeed if s.tp > 1 => {
                Err("DeepSpeed's configuration has no Megatron tensor parallelism".into())
            }
            Engine::Deepspeed if s.precision.is_fp8() => {
                Err("DeepSpeed's configuration has no Transformer Engine FP8".into())
            }
            Engine::Deepspeed if s.recompute == crate::strategy::Recompute::Selective => {
                Err("DeepSpeed checkpoints whole layers (no selective recomputation)".into())
            }
            _ => Ok(()),
        }
    }

    /// Whether the engine holds the logits' gradient, during the head's backward, in the
    /// plan's compute dtype beside the fp32 logits it kept (else in fp32). Megatron-Core's
    /// vocabulary-parallel cross-entropy writes the gradient in place into the fp32 softmax
    /// its forward saved (`grad_input = softmax` in
    /// `megatron/core/tensor_parallel/cross_entropy.py`), so the one new buffer is the cast
    /// back through `logits.float()` to the head's 16-bit dtype. PyTorch's `cross_entropy` on
    /// `.float()` logits (torchtitan, DeepSpeed's models) allocates a new fp32 gradient.
    pub fn logits_grad_in_compute_dtype(self) -> bool {
        matches!(self, Engine::Megatron)
    }

    /// Whether the tensor-parallel overlap the engine turns on runs for `info`'s model.
    /// Megatron-Core turns Transformer Engine's userbuffer overlap off for the whole model
    /// (the config is shared) once a linear layer's buffer is not one of qkv, proj, fc1 and
    /// fc2 (`TELinear.__init__`, core_v0.15.0), as latent attention's down-projections are.
    pub fn tp_overlap_runs(self, info: &crate::model::ModelInfo<'_>) -> bool {
        !(self == Engine::Megatron && info.latent.is_some())
    }

    /// What the engine overlaps, for a plan at ZeRO stage `zero`.
    pub fn overlap(self, zero: u8) -> Overlap {
        match self {
            // `--overlap-grad-reduce`, `--overlap-param-gather` (with the distributed
            // optimizer) and `--tp-comm-overlap` (Transformer Engine userbuffers), as the
            // NeMo / Megatron-Bridge performance recipes set them; p2p overlap is on by default
            // (`--no-overlap-p2p-communication` turns it off).
            Engine::Megatron => Overlap {
                grad_reduce: true,
                param_gather: true,
                tp_comm: true,
                zero3_prefetch: true,
                zero3_gb_per_s: None,
            },
            // FSDP2 overlaps its reduce-scatter with the backward and prefetches the next
            // layer's all-gather; async tensor parallelism is off by default
            // (`compile.enable_async_tensor_parallel = false` in torchtitan 0.3.0).
            Engine::Torchtitan => Overlap {
                grad_reduce: true,
                param_gather: zero >= 3,
                tp_comm: false,
                zero3_prefetch: true,
                zero3_gb_per_s: None,
            },
            // `overlap_comm` defaults to true for stage 3 and false otherwise
            // (deepspeed/runtime/zero/config.py); DeepSpeed has no tensor-parallel overlap.
            Engine::Deepspeed => Overlap {
                grad_reduce: zero >= 3,
                param_gather: zero >= 3,
                tp_comm: false,
                zero3_prefetch: true,
                zero3_gb_per_s: None,
            },
        }
    }

    /// The element-wise kernels the engine runs by default: Megatron-Core's fused kernels
    /// (Transformer Engine); torchtitan and DeepSpeed run PyTorch eager unless compiled
    /// (`compile.enable = false` by default in torchtitan 0.3.0).
    pub fn kernels(self) -> Kernels {
        match self {
            Engine::Megatron => Kernels::Fused,
            Engine::Torchtitan | Engine::Deepspeed => Kernels::Eager,
        }
    }
}

/// A 1F1B split of `layers` over `pp` stages Megatron-LM can state: the middle stages even,
/// the remainder on the first and last (`--decoder-first/last-pipeline-num-layers`), where
/// the even default would put it on the first stages, which Megatron cannot say.
pub fn megatron_split_of(layers: u32, pp: u32) -> Vec<u32> {
    let pp = pp.max(1);
    let (base, rest) = (layers / pp, layers % pp);
    let mut split = vec![base; pp as usize];
    split[0] += rest.div_ceil(2);
    if let Some(last) = split.last_mut() {
        *last += rest / 2;
    }
    split
}

/// Megatron-LM's pipeline split: every chunk the same number of layers but the first and the
/// last (`--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers`), which
/// the interleaved schedule does not take (`--num-layers-per-virtual-pipeline-stage`: every
/// chunk the same).
fn megatron_split(layers: &[u32], interleaved: bool) -> Result<(), String> {
    let n = layers.len();
    let inner = if n > 2 { &layers[1..n - 1] } else { layers };
    let even = inner.first().copied().unwrap_or(0);
    let uneven_inner = n > 2 && inner.iter().any(|&l| l != even);
    let uneven_ends = layers.first() != Some(&even) || layers.last() != Some(&even);
    if uneven_inner || (interleaved && uneven_ends) {
        return Err(format!(
            "Megatron-LM splits the layers evenly over its pipeline chunks but the first and \
             last, and evenly over interleaved chunks ({layers:?} layers)"
        ));
    }
    Ok(())
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Engine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Engine::ALL
            .into_iter()
            .find(|e| e.name() == s.to_ascii_lowercase())
            .ok_or_else(|| {
                format!("unknown engine `{s}`; expected megatron, torchtitan or deepspeed")
            })
    }
}

/// DeepSpeed's `stage3_max_live_parameters` default: parameters gathered at once under ZeRO-3.
pub const DEEPSPEED_MAX_LIVE_PARAMETERS: f64 = 1e9;
/// DeepSpeed's `reduce_bucket_size` default: gradient elements reduced at a time.
pub const DEEPSPEED_REDUCE_BUCKET_SIZE: f64 = 5e8;

/// The rate at which DeepSpeed's ZeRO-3 of early 2021 gathered parameters, bytes of gathered
/// 16-bit parameters per GPU per second: on one 8×A100 NVLink node (p4d), a 5.1B-parameter BERT
/// took 480 ms per forward under ZeRO-3 against 60 ms under ZeRO-2 (DeepSpeed 0.3.16,
/// deepspeedai/DeepSpeed #1174): 10.2 GB gathered in the 420 ms difference, 24.3 GB/s, an eighth
/// of what NCCL reaches on that NVLink. The cause was the implementation: each all-gather
/// synchronized the device and copied its result out (#1188, which halved the overhead in
/// June 2021). The SC'21 ZeRO-3 runs (Narayanan et al., Table 2) used that DeepSpeed.
pub const DEEPSPEED_2021_ZERO3_GATHER_GB_PER_S: f64 = 10.2 / 0.42;

/// Which communication runs beside compute (on a cluster whose collectives can: NCCL's own
/// stream, `comm_overlaps_compute`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Overlap {
    /// Data-parallel gradient reduction, bucketed, behind the last micro-batch's backward.
    pub grad_reduce: bool,
    /// The distributed optimizer's weight all-gather behind the next iteration's forward
    /// (ZeRO-1/2); ZeRO-3 gathers prefetched a layer ahead.
    pub param_gather: bool,
    /// Tensor-parallel all-gathers and reduce-scatters pipelined with the GEMMs next to them.
    pub tp_comm: bool,
    /// ZeRO-3 gathers prefetched a layer ahead, behind the previous layer's compute (FSDP's
    /// and DeepSpeed's prefetch); without it a layer waits for its gathers.
    #[serde(default = "yes")]
    pub zero3_prefetch: bool,
    /// A measured ceiling on the engine's ZeRO-3 parameter gathers and gradient
    /// reduce-scatters, GB/s of parameters per GPU, where the engine's own implementation and
    /// not the network sets their speed (absent: NCCL's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero3_gb_per_s: Option<f64>,
}

impl Overlap {
    /// What plait costed before engines were modelled (and what Megatron-LM ran in 2021, the
    /// SC'21 runs): the gradient reduction overlapped, ZeRO-3 gathers prefetched, nothing else.
    pub const LEGACY: Overlap = Overlap {
        grad_reduce: true,
        param_gather: false,
        tp_comm: false,
        zero3_prefetch: true,
        zero3_gb_per_s: None,
    };

    /// DeepSpeed's ZeRO-3 as the SC'21 runs used it (early 2021): gathers at
    /// [`DEEPSPEED_2021_ZERO3_GATHER_GB_PER_S`], each one synchronous ("the async version is not
    /// async at all, because each all_gather calls torch.cuda.synchronize()", #1188), so no
    /// prefetch.
    pub const DEEPSPEED_2021: Overlap = Overlap {
        zero3_prefetch: false,
        zero3_gb_per_s: Some(DEEPSPEED_2021_ZERO3_GATHER_GB_PER_S),
        ..Overlap::LEGACY
    };
}

fn yes() -> bool {
    true
}

impl Default for Overlap {
    fn default() -> Self {
        Overlap::LEGACY
    }
}

#[cfg(test)]
mod tests {
    use super::{megatron_split, megatron_split_of};

    /// What `plait export --to megatron` can say (`pipeline_args`): the first and last chunk
    /// may differ from the rest, but not under the interleaved schedule, and the inner ones
    /// never.
    #[test]
    fn megatron_split_of_puts_the_remainder_on_the_ends() {
        assert_eq!(megatron_split_of(80, 6), vec![14, 13, 13, 13, 13, 14]);
        assert_eq!(megatron_split_of(34, 5), vec![8, 6, 6, 6, 8]);
        assert_eq!(megatron_split_of(33, 5), vec![8, 6, 6, 6, 7]);
        assert_eq!(megatron_split_of(7, 2), vec![4, 3]);
        for (layers, pp) in [(80, 6), (34, 5), (33, 5), (7, 2), (96, 16)] {
            let split = megatron_split_of(layers, pp);
            assert_eq!(split.iter().sum::<u32>(), layers);
            assert!(megatron_split(&split, false).is_ok(), "{split:?}");
        }
    }

    #[test]
    fn megatron_splits_evenly_but_the_ends_and_interleaved_chunks_evenly() {
        assert!(megatron_split(&[1, 3, 3, 1], false).is_ok());
        assert!(megatron_split(&[1, 3, 3, 1], true).is_err());
        assert!(megatron_split(&[2, 2, 2, 2], true).is_ok());
        assert!(megatron_split(&[2, 3, 2, 2], false).is_err());
        assert!(megatron_split(&[4, 5], false).is_ok());
    }
}
