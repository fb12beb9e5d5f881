//! Megatron-LM (`pretrain_gpt.py`, core_v0.15.0): the argument list that builds the plan's
//! model and runs its strategy with the overlap the `megatron` engine profile prices.
//!
//! Every flag and choice is one of `megatron/training/arguments.py` at that tag (the list in
//! `data/engines/megatron-lm-core_v0.15.0-arguments.tsv`, checked by `planner/tests/export.rs`).

use ir::RopeScaling;

use super::arch::{Architecture, Latent, Positions};
use crate::error::PlanError;
use crate::plan::Plan;
use crate::precision::Precision;
use crate::strategy::{Recompute, Schedule};

pub const VERSION: &str = "core_v0.15.0";
const ENGINE: &str = "Megatron-LM";

fn refuse(feature: impl Into<String>, limit: &str) -> PlanError {
    PlanError::Unexportable {
        engine: ENGINE,
        feature: feature.into(),
        limit: limit.into(),
    }
}

fn push(args: &mut Vec<String>, flag: &str, value: impl ToString) {
    args.push(flag.into());
    args.push(value.to_string());
}

fn flag(args: &mut Vec<String>, flag: &str) {
    args.push(flag.into());
}

/// The rotary rescaling as Megatron-Core applies it: Llama 3.1's (`--use-rope-scaling`, its
/// bands fixed at 1 and 4 over 8192 positions) or position interpolation by an integer
/// factor (`--rotary-seq-len-interpolation-factor`).
fn rope_scaling_args(scaling: RopeScaling, args: &mut Vec<String>) -> Result<(), PlanError> {
    match scaling {
        RopeScaling::None => Ok(()),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max: 8192.0,
        } => {
            flag(args, "--use-rope-scaling");
            push(args, "--rope-scaling-factor", factor);
            Ok(())
        }
        RopeScaling::Linear { factor } if factor.fract() == 0.0 && factor >= 1.0 => {
            push(args, "--rotary-seq-len-interpolation-factor", factor as u64);
            Ok(())
        }
        other => Err(refuse(
            format!("rope scaling {other:?}"),
            "it rescales rotary frequencies as Llama 3.1 does (bands 1 and 4 over 8192 \
             positions) or by an integer position interpolation factor",
        )),
    }
}

/// Megatron-Core's `--no-rope-freq` for the layers that do not rotate: n where every n-th
/// layer is NoPE and the layers come in whole periods (`TransformerConfig` repeats
/// `[0] * (n − 1) + [1]`), else the list of 1s (skip) and 0s, one per layer.
fn no_rope_freq(nope: &[bool]) -> String {
    let layers = nope.len();
    let period = (1..=layers).find(|&n| {
        layers.is_multiple_of(n)
            && nope
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (i + 1).is_multiple_of(n))
    });
    match period {
        Some(n) => n.to_string(),
        None => {
            let flags: Vec<&str> = nope.iter().map(|&x| if x { "1" } else { "0" }).collect();
            format!("[{}]", flags.join(","))
        }
    }
}

/// The model's arguments: layers, widths, heads, positions, norm, MLP, vocabulary, dropout.
fn model_args(a: &Architecture, seq: u64, args: &mut Vec<String>) -> Result<(), PlanError> {
    push(args, "--num-layers", a.layers);
    push(args, "--hidden-size", a.hidden);
    push(args, "--ffn-hidden-size", a.dense_ffn.unwrap_or(a.ffn));
    push(args, "--num-attention-heads", a.heads);
    if let Some(l) = &a.latent {
        latent_args(l, args);
    } else if a.head_dim * a.heads != a.hidden {
        // Heads whose width is not hidden / heads (Qwen3, Mistral-Nemo, Gemma).
        push(args, "--kv-channels", a.head_dim);
    }
    if a.qk_norm {
        // Megatron-Core's q/k norm per head, of the `--normalization` type.
        flag(args, "--qk-layernorm");
    }
    if a.kv_heads != a.heads {
        flag(args, "--group-query-attention");
        push(args, "--num-query-groups", a.kv_heads);
    }
    if let Some(w) = a.window {
        // Megatron-Core's window is (keys to the left, keys to the right) beside the query
        // itself; transformers' `sliding_window` counts the query among its keys.
        push(
            args,
            "--window-size",
            format!("{},0", w.keys.saturating_sub(1)),
        );
        if let Some(n) = w.full_every {
            // Layer numbers from 1: every n-th attends to every earlier key.
            push(args, "--window-attn-skip-freq", n);
        }
    }
    push(args, "--seq-length", seq);
    match a.positions {
        Positions::Learned { rows } => {
            push(args, "--position-embedding-type", "learned_absolute");
            push(args, "--max-position-embeddings", rows);
        }
        Positions::Rotary { theta, scaling } => {
            push(args, "--position-embedding-type", "rope");
            push(args, "--rotary-base", theta.round() as u64);
            if a.rotary_share < 1.0 {
                // Nemotron's partial rotary: the first share of each head turns.
                push(args, "--rotary-percent", a.rotary_share);
            }
            push(args, "--max-position-embeddings", seq);
            match &a.latent {
                Some(l) => latent_rope_args(l, scaling, args)?,
                None => rope_scaling_args(scaling, args)?,
            }
            if !a.nope.is_empty() {
                push(args, "--no-rope-freq", no_rope_freq(&a.nope));
            }
        }
    }
    push(
        args,
        "--normalization",
        if a.rms_norm { "RMSNorm" } else { "LayerNorm" },
    );
    push(args, "--norm-epsilon", a.norm_eps);
    if a.swiglu {
        flag(args, "--swiglu");
    }
    if a.squared_relu {
        flag(args, "--squared-relu");
    }
    match (a.qkv_bias, a.other_bias) {
        (true, true) if a.all_other_bias => {}
        (true, true) => {
            return Err(refuse(
                "biases on some of the output and MLP projections only (attention_bias without \
                 mlp_bias)",
                "`--add-bias-linear` biases every linear layer, `--add-qkv-bias` q, k and v's",
            ));
        }
        // Qwen2's biases on q, k and v alone.
        (true, false) => {
            flag(args, "--disable-bias-linear");
            flag(args, "--add-qkv-bias");
        }
        (false, false) => flag(args, "--disable-bias-linear"),
        (false, true) => {
            return Err(refuse(
                "biases on the output and MLP projections but not on q, k and v",
                "`--disable-bias-linear` drops every bias, `--add-qkv-bias` adds q, k and v's",
            ));
        }
    }
    if !a.tied {
        flag(args, "--untie-embeddings-and-output-weights");
    }
    push(args, "--attention-dropout", a.dropout);
    push(args, "--hidden-dropout", a.dropout);
    // The exact vocabulary: Megatron pads it to a multiple of this × tp, which plait's
    // vocabulary-parallel split also needs.
    // Megatron's NullTokenizer reserves one id past `--vocab-size` for end-of-document.
    push(args, "--tokenizer-type", "NullTokenizer");
    push(args, "--vocab-size", a.vocab.saturating_sub(1));
    push(args, "--make-vocab-size-divisible-by", 1);
    if a.experts > 0 {
        push(args, "--num-experts", a.experts);
        push(args, "--moe-ffn-hidden-size", a.ffn);
        push(args, "--moe-router-topk", a.experts_per_token);
        if let Some(f) = a.shared_expert_ffn {
            push(args, "--moe-shared-expert-intermediate-size", f);
        }
        if !a.moe_layers.is_empty() {
            push(args, "--moe-layer-freq", moe_layer_pattern(&a.moe_layers));
        }
    }
    Ok(())
}

/// Megatron's `moe_freq_type` list expression for runs of dense (0) and expert (1) layers:
/// DeepSeek-V3's `([0]*3+[1]*58)`.
fn moe_layer_pattern(runs: &[(bool, u32)]) -> String {
    let terms: Vec<String> = runs
        .iter()
        .map(|&(experts, n)| format!("[{}]*{n}", u8::from(experts)))
        .collect();
    format!("({})", terms.join("+"))
}

/// Multi-head latent attention (Megatron-Core's MLA), its latent norms by `--qk-layernorm`
/// (in MLA the norms of the query and key/value latents).
fn latent_args(l: &Latent, args: &mut Vec<String>) {
    flag(args, "--multi-latent-attention");
    if let Some(r) = l.q_lora_rank {
        push(args, "--q-lora-rank", r);
    }
    push(args, "--kv-lora-rank", l.kv_lora_rank);
    push(args, "--qk-head-dim", l.qk_head_dim);
    push(args, "--qk-pos-emb-head-dim", l.qk_pos_emb_head_dim);
    push(args, "--v-head-dim", l.v_head_dim);
    flag(args, "--qk-layernorm");
}

/// YaRN's `get_mscale` (DeepSeek's and Megatron-Core's `_yarn_get_mscale`): 0.1·m·ln(s) + 1.
fn yarn_mscale_log(factor: f64) -> f64 {
    0.1 * factor.ln()
}

/// Six significant decimals: the mscales are recovered from the graph's products of them.
fn decimal(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Latent attention's rotary as Megatron-Core's MLA states it: plain (`--rope-type rope`,
/// the softmax scale 1/√(q head width)), or YaRN with the factor and both mscales. MLA's
/// YaRN keeps `beta_fast` 32, `beta_slow` 1 and 4096 original positions (its config's
/// defaults, which no argument sets); the softmax scale is mscale(factor, mscale_all_dim)²
/// / √(q head width) and the rotary's cos/sin are multiplied by mscale(factor, mscale) /
/// mscale(factor, mscale_all_dim) (`multi_latent_attention.py`, `YarnRotaryEmbedding`), so
/// both mscales are read back from the graph's scale and rotary factor.
fn latent_rope_args(
    l: &Latent,
    scaling: RopeScaling,
    args: &mut Vec<String>,
) -> Result<(), PlanError> {
    let scale_squared = l.softmax_scale * (l.q_head_dim() as f64).sqrt();
    match scaling {
        RopeScaling::None if (scale_squared - 1.0).abs() < 1e-6 => {
            push(args, "--rope-type", "rope");
            // Megatron's fused rope for MLA takes only YaRN (`MLATransformerConfig`), and
            // the fusion is on unless turned off.
            flag(args, "--no-rope-fusion");
            Ok(())
        }
        RopeScaling::Yarn {
            factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max: 4096.0,
            attention_factor,
            truncate: true,
        } if factor > 1.0 && scale_squared > 0.0 => {
            let all_dim = scale_squared.sqrt();
            push(args, "--rope-type", "yarn");
            push(args, "--rotary-scaling-factor", factor);
            push(
                args,
                "--mscale",
                decimal((attention_factor * all_dim - 1.0) / yarn_mscale_log(factor)),
            );
            push(
                args,
                "--mscale-all-dim",
                decimal((all_dim - 1.0) / yarn_mscale_log(factor)),
            );
            Ok(())
        }
        other => Err(refuse(
            format!(
                "latent attention with rope scaling {other:?} and softmax scale {}",
                l.softmax_scale
            ),
            "its MLA rotary is plain (scale 1/sqrt(head width)) or YaRN over 4096 original \
             positions with beta_fast 32 and beta_slow 1",
        )),
    }
}

/// The router's scoring as Megatron-Core's `topk_routing_with_score_function` does it:
/// softmax of the top-k logits (Mixtral) by default, of all logits with `--moe-router-pre-softmax`
/// (unnormalized shares); sigmoid scores always renormalized when k > 1; a group limit scoring
/// each group by its best k / group-topk experts.
fn router_args(a: &Architecture, args: &mut Vec<String>) -> Result<(), PlanError> {
    let r = a.routing;
    let k = a.experts_per_token;
    if r.sigmoid {
        if !r.normalize && k > 1 {
            return Err(refuse(
                "unnormalized sigmoid routing weights",
                "its sigmoid router renormalizes the top-k weights",
            ));
        }
        push(args, "--moe-router-score-function", "sigmoid");
    } else if !r.normalize {
        flag(args, "--moe-router-pre-softmax");
    }
    if r.groups > 1 {
        // transformers scores a group by its best two experts (DeepSeek-V3) or its best one
        // (DeepSeek-V2); Megatron by its best k / group-topk (integer division).
        if k / r.groups_kept != r.group_top {
            return Err(refuse(
                format!(
                    "group-limited routing that scores a group by its best {} expert(s) with \
                     top-k {k} over {} groups",
                    r.group_top, r.groups_kept
                ),
                "it scores a group by its best top-k / group-topk experts",
            ));
        }
        push(args, "--moe-router-num-groups", r.groups);
        push(args, "--moe-router-group-topk", r.groups_kept);
    }
    if let Some(f) = a.routed_scale {
        // Megatron-Core multiplies the top-k weights by it, after any renormalization.
        push(args, "--moe-router-topk-scaling-factor", f);
    }
    Ok(())
}

/// The pipeline's stage split: even, or with only the first and last stage different
/// (`--decoder-first/last-pipeline-num-layers`).
fn pipeline_args(plan: &Plan, args: &mut Vec<String>) -> Result<(), PlanError> {
    let s = &plan.strategy;
    push(args, "--pipeline-model-parallel-size", s.pp);
    let layers: Vec<u32> = plan
        .chunks
        .iter()
        .map(|c| c.layers[1] - c.layers[0])
        .collect();
    let n = layers.len();
    let inner = if n > 2 {
        &layers[1..n - 1]
    } else {
        &layers[..]
    };
    let even = inner.first().copied().unwrap_or(0);
    let uneven = |feature: String| {
        refuse(
            feature,
            "only the first and last stage may differ; `plait compile --target megatron` plans \
             a split it runs",
        )
    };
    if inner.iter().any(|&l| l != even) && n > 2 {
        return Err(uneven(format!("pipeline chunks of {layers:?} layers")));
    }
    let (first, last) = (layers[0], layers[n - 1]);
    if s.pp > 1 && (first != even || last != even) {
        if s.virtual_stages > 1 {
            return Err(uneven(format!(
                "interleaved chunks of {layers:?} layers (uneven first or last)"
            )));
        }
        push(args, "--decoder-first-pipeline-num-layers", first);
        push(args, "--decoder-last-pipeline-num-layers", last);
    }
    match s.schedule {
        Schedule::Gpipe if s.pp > 1 => {
            return Err(refuse(
                "the GPipe schedule",
                "it runs 1F1B and interleaved 1F1B; `plait compile --target megatron` plans \
                 one of those",
            ));
        }
        Schedule::Interleaved if s.virtual_stages > 1 => {
            push(args, "--num-layers-per-virtual-pipeline-stage", even);
        }
        _ => {}
    }
    Ok(())
}

/// Data-parallel sharding: the distributed optimizer (ZeRO-1) or Megatron-FSDP (ZeRO-2/3,
/// without pipelining), with the overlap the engine profile assumes.
fn sharding_args(plan: &Plan, args: &mut Vec<String>) -> Result<(), PlanError> {
    let s = &plan.strategy;
    match s.zero {
        0 => {}
        1 => flag(args, "--use-distributed-optimizer"),
        z if s.pp > 1 => {
            return Err(refuse(
                format!("ZeRO-{z} with a pipeline of {} stages", s.pp),
                "Megatron-FSDP does not run with pipeline parallelism",
            ));
        }
        z => {
            // As Megatron-Bridge's FSDP recipes set it: Megatron-FSDP over the distributed
            // optimizer.
            flag(args, "--use-distributed-optimizer");
            flag(args, "--use-megatron-fsdp");
            push(
                args,
                "--data-parallel-sharding-strategy",
                if z == 2 {
                    "optim_grads"
                } else {
                    "optim_grads_params"
                },
            );
        }
    }
    if s.dp * s.cp > 1 {
        flag(args, "--overlap-grad-reduce");
        if s.zero == 1 {
            flag(args, "--overlap-param-gather");
        }
    }
    Ok(())
}

/// The precision flags. Under `--bf16` Megatron-LM accumulates and reduces the gradients in
/// fp32 unless `--grad-reduce-in-bf16` (`megatron/training/arguments.py`), 2 bytes a parameter
/// more than the plan's memory holds: plait keeps them in the compute dtype
/// ([`Precision::grad_bytes`]), as NVIDIA's performance recipes behind the published H100 runs
/// reduce them (NeMo-Framework-Launcher's `optim.grad_sync_dtype=bf16`), so the launch says so.
fn precision_args(p: Precision, args: &mut Vec<String>) {
    match p {
        Precision::Fp32 => {}
        Precision::Fp16 => flag(args, "--fp16"),
        Precision::Bf16 => {
            flag(args, "--bf16");
            flag(args, "--grad-reduce-in-bf16");
        }
        // Transformer Engine's hybrid (E4M3 forward, E5M2 backward) delayed scaling, as plait's
        // fp8 prices it.
        Precision::Fp8 => {
            flag(args, "--bf16");
            flag(args, "--grad-reduce-in-bf16");
            push(args, "--fp8-format", "hybrid");
            push(args, "--fp8-recipe", "delayed");
        }
        Precision::Fp8Tensorwise => {
            flag(args, "--bf16");
            flag(args, "--grad-reduce-in-bf16");
            push(args, "--fp8-format", "hybrid");
            push(args, "--fp8-recipe", "tensorwise");
        }
    }
}

/// The argument list of `pretrain_gpt.py` for `plan`, whose model is `arch`.
/// Whether Megatron-LM's arguments can state the model at `seq`, whatever the strategy: the
/// model and router arguments [`args`] starts with.
pub(super) fn states_model(arch: &Architecture, seq: u64) -> Result<(), PlanError> {
    let mut scratch = Vec::new();
    model_args(arch, seq, &mut scratch)?;
    if arch.experts > 0 {
        router_args(arch, &mut scratch)?;
    }
    Ok(())
}

pub fn args(plan: &Plan, arch: &Architecture) -> Result<Vec<String>, PlanError> {
    let s = &plan.strategy;
    if !s.dp_comm.is_plain() {
        return Err(refuse(
            s.dp_comm.flags(),
            "it exchanges plain gradients every step; the plan's exchange is plait's own \
             runtime's (`plait run`): compile without --grad-compression and --dp-sync",
        ));
    }
    let mut args = Vec::new();
    model_args(arch, s.seq, &mut args)?;
    if arch.experts > 0 {
        router_args(arch, &mut args)?;
    }
    push(&mut args, "--tensor-model-parallel-size", s.tp);
    if s.sequence_parallel && s.tp > 1 {
        flag(&mut args, "--sequence-parallel");
        // Transformer Engine's userbuffer overlap needs sequence parallelism; Megatron turns
        // it off for a model with latent attention (`Engine::tp_overlap_runs`), so it is not
        // asked for there, nor priced.
        if arch.latent.is_none() {
            flag(&mut args, "--tp-comm-overlap");
        }
    }
    pipeline_args(plan, &mut args)?;
    if s.cp > 1 {
        push(&mut args, "--context-parallel-size", s.cp);
    }
    if arch.experts > 0 {
        // Experts split over ep data-parallel ranks, tokens dispatched by all-gather (what
        // plait prices and lowers); each expert's FFN split over the tensor-parallel group.
        push(&mut args, "--expert-model-parallel-size", s.ep);
        push(&mut args, "--expert-tensor-parallel-size", s.tp);
        push(&mut args, "--moe-token-dispatcher-type", "allgather");
    }
    push(&mut args, "--micro-batch-size", s.micro_batch);
    push(&mut args, "--global-batch-size", s.global_batch);
    sharding_args(plan, &mut args)?;
    match s.recompute {
        Recompute::None => {}
        Recompute::Selective => push(&mut args, "--recompute-granularity", "selective"),
        Recompute::Full => {
            push(&mut args, "--recompute-granularity", "full");
            push(&mut args, "--recompute-method", "uniform");
            push(&mut args, "--recompute-num-layers", 1);
        }
    }
    precision_args(s.precision, &mut args);
    push(&mut args, "--transformer-impl", "transformer_engine");
    push(
        &mut args,
        "--attention-backend",
        match s.attention {
            // Transformer Engine's FlashAttention refuses query and value heads of different
            // widths (latent attention: "does not support MLA"); its cuDNN fused attention,
            // also tiled with no s² buffer, runs them.
            crate::cost::compute::AttentionKernel::Fused if arch.latent.is_some() => "fused",
            crate::cost::compute::AttentionKernel::Fused => "flash",
            crate::cost::compute::AttentionKernel::Materialized => "unfused",
        },
    );
    Ok(args)
}
