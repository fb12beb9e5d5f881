//! `plait export`: a plan as the launch of an engine people already run.
//!
//! The model's architecture is read from the IR graph the plan carries ([`arch`]); each
//! engine's module turns the architecture and the strategy into that engine's own arguments,
//! and refuses ([`PlanError::Unexportable`]) what the engine cannot run rather than writing a
//! wrong launch.

pub mod arch;
pub mod deepspeed;
pub mod megatron;
pub mod torchtitan;

use serde::Serialize;

use crate::engine::Engine;
use crate::error::PlanError;
use crate::model::ModelInfo;
use crate::plan::Plan;

/// An engine's launch of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Export {
    pub engine: &'static str,
    /// The engine version whose arguments these are.
    pub version: &'static str,
    /// The engine's command-line arguments (Megatron-LM, torchtitan).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The engine's configuration file (DeepSpeed's `ds_config.json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
    /// The launch script (text).
    pub launch: String,
}

/// Exports `plan` to `engine`.
pub fn export(plan: &Plan, engine: Engine) -> Result<Export, PlanError> {
    let text = plan.model.ir.as_deref().ok_or_else(|| {
        PlanError::invalid("the plan does not carry its model's graph (model.ir)")
    })?;
    let graph = ir::text::parse(text).map_err(|e| PlanError::ClusterFile {
        file: "plan model.ir".into(),
        message: e.to_string(),
    })?;
    let info = ModelInfo::new(&graph)?;
    match engine {
        Engine::Megatron => {
            let arch = arch::read(&info, "Megatron-LM")?;
            let mut args = megatron::args(plan, &arch)?;
            // A runnable smoke test: synthetic data, a few steps (replace with --data-path).
            args.extend(
                [
                    "--mock-data",
                    "--train-iters",
                    "20",
                    "--lr",
                    "3e-4",
                    "--log-interval",
                    "1",
                ]
                .map(String::from),
            );
            Ok(Export {
                engine: "megatron",
                version: megatron::VERSION,
                launch: megatron_launch(plan, &args),
                args,
                config: None,
            })
        }
        Engine::Deepspeed => {
            let config = deepspeed::config(plan)?;
            Ok(Export {
                engine: "deepspeed",
                version: deepspeed::VERSION,
                launch: deepspeed::launch(plan, &config),
                args: Vec::new(),
                config: Some(config),
            })
        }
        Engine::Torchtitan => {
            let arch = arch::read(&info, "torchtitan")?;
            let args = torchtitan::args(plan, &arch)?;
            Ok(Export {
                engine: "torchtitan",
                version: torchtitan::VERSION,
                launch: torchtitan::launch(plan, &args),
                args,
                config: None,
            })
        }
    }
}

/// `torchrun` over `pretrain_gpt.py` on every node, one process per GPU.
fn megatron_launch(plan: &Plan, args: &[String]) -> String {
    let s = &plan.strategy;
    let per_node = u64::from(plan.cluster.gpus_per_node).min(plan.gpus);
    let nodes = plan.gpus.div_ceil(per_node.max(1));
    let mut lines = vec![
        "#!/usr/bin/env bash".to_string(),
        format!(
            "# plait plan for {} on {} x {} ({}): tp {} pp {} dp {} cp {}, micro-batch {}, \
             predicted {:.3} s per iteration.",
            plan.model.name,
            plan.gpus,
            plan.cluster.gpu.name,
            plan.cluster.name,
            s.tp,
            s.pp,
            s.dp,
            s.cp,
            s.micro_batch,
            plan.predicted.iteration_time_s
        ),
        format!(
            "# Megatron-LM {}: run from its checkout on each of the {nodes} node(s), with NNODES, \
             NODE_RANK and MASTER_ADDR set;",
            megatron::VERSION
        ),
        "# replace --mock-data with --data-path and a tokenizer to train on real data.".to_string(),
        "set -euo pipefail".to_string(),
        "# Megatron's communication overlap needs one CUDA connection per device.".to_string(),
        "export CUDA_DEVICE_MAX_CONNECTIONS=1".to_string(),
        format!(
            "torchrun --nproc-per-node {per_node} --nnodes \"${{NNODES:-{nodes}}}\" \
             --node-rank \"${{NODE_RANK:-0}}\" --master-addr \"${{MASTER_ADDR:-localhost}}\" \
             --master-port \"${{MASTER_PORT:-6000}}\" \\"
        ),
        "  pretrain_gpt.py \\".to_string(),
    ];
    let mut i = 0;
    while i < args.len() {
        let takes_value = args.get(i + 1).is_some_and(|v| !v.starts_with("--"));
        let line = if takes_value {
            i += 2;
            format!("  {} {}", args[i - 2], args[i - 1])
        } else {
            i += 1;
            format!("  {}", args[i - 1])
        };
        let end = if i < args.len() { " \\" } else { "" };
        lines.push(line + end);
    }
    lines.join("\n") + "\n"
}
