//! `plait export`: a plan as an engine's launch.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use planner::engine::Engine;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A plan written by `plait compile -o`
    plan: PathBuf,
    /// The engine to launch the plan with: megatron (Megatron-LM core_v0.15.0's
    /// pretrain_gpt.py under torchrun), torchtitan (0.3.0's torchtitan.train with a registered
    /// llama3 config) or deepspeed (its ds_config.json)
    #[arg(long = "to", value_name = "ENGINE")]
    to: Engine,
    /// Write the launch script to this file (made executable; for deepspeed, the
    /// ds_config.json) instead of printing it
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Print one JSON object: {"engine", "version", "args": [...] or "config": {...}, "launch"}
    #[arg(long)]
    json: bool,
}

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    if let Some(out) = &args.output {
        crate::outputs::not_an_input(out, &[("plan", &args.plan)])?;
    }
    let plan = crate::plan_file::read(&args.plan)?;
    let export = planner::export::export(&plan, args.to)
        .with_context(|| format!("cannot export {}", args.plan.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&export)?);
        return Ok(());
    }
    match &args.output {
        // DeepSpeed's artifact is its configuration file.
        Some(path) if export.config.is_some() => {
            let text = serde_json::to_string_pretty(&export.config)? + "\n";
            std::fs::write(path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            println!(
                "{} {} configuration written to {}; start your training script with \
                 `deepspeed ... train.py --deepspeed --deepspeed_config {}`",
                export.engine,
                export.version,
                path.display(),
                path.display()
            );
        }
        Some(path) => {
            std::fs::write(path, &export.launch)
                .with_context(|| format!("cannot write {}", path.display()))?;
            make_executable(path)?;
            println!(
                "{} launch ({} {}) written to {}",
                export.engine,
                export.engine,
                export.version,
                path.display()
            );
        }
        None => print!("{}", export.launch),
    }
    Ok(())
}

fn make_executable(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perms = std::fs::metadata(path)?.permissions();
    perms.set_mode(perms.mode() | 0o111);
    std::fs::set_permissions(path, perms)
        .with_context(|| format!("cannot chmod {}", path.display()))
}
