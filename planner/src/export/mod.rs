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

/// Whether `engine` can build the model at all, at `seq`, whatever the strategy: its GPT
/// model's layers and arguments (Megatron-LM), its registered models (torchtitan); DeepSpeed
/// runs the user's own model code. `compile --target` asks it first, so that it does not plan
/// a model export would refuse.
pub fn check_model(info: &ModelInfo<'_>, engine: Engine, seq: u64) -> Result<(), PlanError> {
    match engine {
        Engine::Megatron => megatron::states_model(&arch::read(info, "Megatron-LM")?, seq),
        Engine::Torchtitan => torchtitan::config_name(&arch::read(info, "torchtitan")?).map(|_| ()),
        Engine::Deepspeed => Ok(()),
    }
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

/// Text from a plan (a model's, a GPU's or a cluster's name, which come from file names and
/// cluster files) made fit for a launch script's `#` comment: a control character (a newline
/// would end the comment and start a command line) becomes a space.
pub(crate) fn comment(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// One word of a launch script's command: as it is where the shell reads it literally, else
/// single-quoted (a quote inside closed, escaped and reopened).
pub(crate) fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
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
            comment(&plan.model.name),
            plan.gpus,
            comment(&plan.cluster.gpu.name),
            comment(&plan.cluster.name),
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
            format!(
                "  {} {}",
                shell_word(&args[i - 2]),
                shell_word(&args[i - 1])
            )
        } else {
            i += 1;
            format!("  {}", shell_word(&args[i - 1]))
        };
        let end = if i < args.len() { " \\" } else { "" };
        lines.push(line + end);
    }
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::{comment, shell_word};

    /// A model named after a file such as `evil\ntouch PWNED #.json` stays inside its comment,
    /// and an argument with shell syntax reaches the program as one literal word: checked by
    /// bash itself where it is installed.
    #[test]
    fn plan_text_stays_a_comment_and_arguments_stay_words() {
        assert_eq!(comment("evil\ntouch PWNED #"), "evil touch PWNED #");
        assert_eq!(shell_word("--seq-length"), "--seq-length");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        let nasty = ["$(touch x)", "a'b\"c", "", "; rm -rf /", "line\nbreak"];
        let script = nasty
            .iter()
            .map(|w| shell_word(w))
            .collect::<Vec<_>>()
            .join(" ");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("printf '%s\\0' {script}"))
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let got: Vec<&[u8]> = o.stdout.split(|&b| b == 0).collect();
                for (w, g) in nasty.iter().zip(got) {
                    assert_eq!(w.as_bytes(), g, "{script}");
                }
            }
            Ok(o) => panic!("bash: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => println!("skipped: bash is not runnable here ({e})"),
        }
    }
}
