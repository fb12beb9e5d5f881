//! torchtitan (0.3.0): `torchrun -m torchtitan.train --module llama3 --config NAME` with the
//! plan's `--parallelism.*` and `--training.*` options and the activation-checkpoint
//! subcommand, as its own `--help` names them (`data/engines/`).
//!
//! torchtitan builds its models from registered configurations, not from architecture flags:
//! the plan's model must be one of them (the Llama 3.1 8B, 70B and 405B shapes of
//! `torchtitan/models/llama3`), or the export is refused.

use super::arch::{Architecture, Positions};
use crate::engine::Engine;
use crate::error::PlanError;
use crate::plan::Plan;
use crate::precision::Precision;
use crate::strategy::{Recompute, Schedule};

pub const VERSION: &str = "0.3.0";

/// torchtitan's Llama 3 configurations: name, layers, hidden, heads, KV heads, MLP width.
const LLAMA3: [(&str, u32, u64, u64, u64, u64); 3] = [
    ("llama3_8b", 32, 4096, 32, 8, 14336),
    ("llama3_70b", 80, 8192, 64, 8, 28672),
    ("llama3_405b", 126, 16384, 128, 8, 53248),
];
const LLAMA3_VOCAB: u64 = 128_256;

fn refuse(feature: impl Into<String>, limit: &str) -> PlanError {
    PlanError::Unexportable {
        engine: "torchtitan",
        feature: feature.into(),
        limit: limit.into(),
    }
}

/// The registered configuration whose model is `a`.
pub(super) fn config_name(a: &Architecture) -> Result<&'static str, PlanError> {
    let rotary = matches!(a.positions, Positions::Rotary { .. });
    LLAMA3
        .iter()
        .find(|&&(_, l, h, heads, kv, ffn)| {
            (l, h, heads, kv, ffn, a.vocab)
                == (a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, LLAMA3_VOCAB)
                && rotary
                && a.rms_norm
                && a.swiglu
                && a.experts == 0
                && a.latent.is_none()
                && a.window.is_none()
                && a.nope.is_empty()
                && !a.tied
                // Its Llama 3 has no biases or q/k norms, and heads dim / n_heads wide.
                && !(a.qkv_bias || a.other_bias || a.qk_norm)
                && a.head_dim * a.heads == a.hidden
        })
        .map(|c| c.0)
        .ok_or_else(|| {
            refuse(
                format!(
                    "a model of {} layers, hidden {}, {} heads ({} KV), MLP {}, vocabulary {}",
                    a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, a.vocab
                ),
                "it builds its registered models: llama3_8b, llama3_70b, llama3_405b",
            )
        })
}

fn push(args: &mut Vec<String>, flag: &str, value: impl ToString) {
    args.push(flag.into());
    args.push(value.to_string());
}

/// The arguments after `-m torchtitan.train`.
pub fn args(plan: &Plan, arch: &Architecture) -> Result<Vec<String>, PlanError> {
    let s = &plan.strategy;
    Engine::Torchtitan
        .runs(s)
        .map_err(|why| refuse(why, "see `plait compile --target torchtitan`"))?;
    let name = config_name(arch)?;
    let mut args = vec![
        "--module".to_string(),
        "llama3".into(),
        "--config".into(),
        name.into(),
    ];
    push(&mut args, "--training.seq-len", s.seq);
    push(&mut args, "--training.global-batch-size", s.global_batch);
    let per_replica = s.global_batch / u64::from(s.dp);
    if s.pp > 1 {
        // One step runs the replica's whole batch as pipeline micro-batches.
        push(&mut args, "--training.local-batch-size", per_replica);
        push(
            &mut args,
            "--parallelism.pipeline-parallel-microbatch-size",
            s.micro_batch,
        );
    } else {
        push(&mut args, "--training.local-batch-size", s.micro_batch);
    }
    push(
        &mut args,
        "--training.mixed-precision-param",
        if s.precision == Precision::Fp32 {
            "float32"
        } else {
            "bfloat16"
        },
    );
    // FSDP2 shards (ZeRO-3, or ZeRO-2 keeping the parameters gathered after the forward);
    // DDP replicates (ZeRO-0).
    let (replicate, shard) = if s.zero == 0 { (s.dp, 1) } else { (1, s.dp) };
    push(
        &mut args,
        "--parallelism.data-parallel-replicate-degree",
        replicate,
    );
    push(&mut args, "--parallelism.data-parallel-shard-degree", shard);
    if s.zero == 2 {
        push(
            &mut args,
            "--parallelism.fsdp-reshard-after-forward",
            "never",
        );
    }
    push(&mut args, "--parallelism.tensor-parallel-degree", s.tp);
    if s.tp > 1 {
        args.push(
            if s.sequence_parallel {
                "--parallelism.enable-sequence-parallel"
            } else {
                "--parallelism.no-enable-sequence-parallel"
            }
            .into(),
        );
    }
    pipeline_args(plan, &mut args)?;
    push(&mut args, "--parallelism.context-parallel-degree", s.cp);
    push(&mut args, "--training.steps", 20);
    args.push(
        match s.recompute {
            Recompute::None => "activation-checkpoint:none",
            Recompute::Selective => "activation-checkpoint:selective",
            Recompute::Full => "activation-checkpoint:full",
        }
        .into(),
    );
    Ok(args)
}

/// Degree, schedule and plait's split of the layers over the (virtual) stages: an even split
/// as layers per stage (torchtitan's own default takes one layer off the first and last stage,
/// which plait's does not), an uneven one as each chunk's module names.
fn pipeline_args(plan: &Plan, args: &mut Vec<String>) -> Result<(), PlanError> {
    let s = &plan.strategy;
    if s.pp == 1 {
        return Ok(());
    }
    push(args, "--parallelism.pipeline-parallel-degree", s.pp);
    let schedule = match s.schedule {
        Schedule::Gpipe => "GPipe",
        Schedule::OneFOneB if s.virtual_stages == 1 => "1F1B",
        _ => "Interleaved1F1B",
    };
    push(args, "--parallelism.pipeline-parallel-schedule", schedule);
    let layers: Vec<u32> = plan
        .chunks
        .iter()
        .map(|c| c.layers[1] - c.layers[0])
        .collect();
    if layers.windows(2).any(|w| w[0] != w[1]) {
        // An uneven split: each model chunk's modules by name, the embedding in the first and
        // the final norm and output in the last (torchtitan's Llama 3 module names).
        args.push("--parallelism.module-fqns-per-model-part".into());
        let last = plan.chunks.len().saturating_sub(1);
        for (i, c) in plan.chunks.iter().enumerate() {
            let mut part: Vec<String> = Vec::new();
            if i == 0 {
                part.push("tok_embeddings".into());
            }
            part.extend((c.layers[0]..c.layers[1]).map(|l| format!("layers.{l}")));
            if i == last {
                part.extend(["norm".to_string(), "output".to_string()]);
            }
            args.push(part.join(","));
        }
    } else {
        push(
            args,
            "--parallelism.pipeline-parallel-layers-per-stage",
            layers[0],
        );
        push(
            args,
            "--parallelism.pipeline-parallel-first-stage-less-layers",
            0,
        );
        push(
            args,
            "--parallelism.pipeline-parallel-last-stage-less-layers",
            0,
        );
    }
    // torchtitan's parser refuses CUDA graphs with pipelining.
    args.push("--training.disable-cuda-graphs".into());
    Ok(())
}

/// `torchrun` over `torchtitan.train` on every node.
pub fn launch(plan: &Plan, args: &[String]) -> String {
    let per_node = u64::from(plan.cluster.gpus_per_node).min(plan.gpus).max(1);
    let nodes = plan.gpus.div_ceil(per_node);
    let mut out = format!(
        "#!/usr/bin/env bash\n\
         # plait plan for {} on {} x {} ({}), torchtitan {VERSION}: run from its checkout on \
         each of the {nodes} node(s) (NNODES, NODE_RANK, MASTER_ADDR set), with the model's \
         tokenizer under its hf_assets_path.\n\
         set -euo pipefail\n\
         torchrun --nproc-per-node {per_node} --nnodes \"${{NNODES:-{nodes}}}\" --node-rank \
         \"${{NODE_RANK:-0}}\" --master-addr \"${{MASTER_ADDR:-localhost}}\" --master-port \
         \"${{MASTER_PORT:-29500}}\" -m torchtitan.train",
        super::comment(&plan.model.name),
        plan.gpus,
        super::comment(&plan.cluster.gpu.name),
        super::comment(&plan.cluster.name)
    );
    for a in args {
        out.push(' ');
        out.push_str(&super::shell_word(a));
    }
    out + "\n"
}
