//! `plait clusters`: the built-in cluster presets.

use clap::Args;
use planner::hardware;

#[derive(Args, Debug)]
pub struct ClustersArgs {
    /// Print the presets as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &ClustersArgs) -> anyhow::Result<()> {
    let presets = hardware::presets()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&presets)?);
        return Ok(());
    }
    for c in &presets {
        println!("{:<18} {}", c.name, c.description);
    }
    println!("\nUse a name with --cluster, or write your own TOML (docs/hardware.md).");
    Ok(())
}
