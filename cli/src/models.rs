//! `plait models`: the built-in zoo.

use clap::Args;
use import::zoo;

#[derive(Args, Debug)]
pub struct ModelsArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &ModelsArgs) -> anyhow::Result<()> {
    let models = zoo::zoo();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&models)?);
        return Ok(());
    }
    println!("{:<14} {:>9} {:<8} shape", "name", "params", "family");
    for m in &models {
        println!(
            "{:<14} {:>9} {:<8} {}",
            m.name,
            human(m.param_count()),
            m.family.model_type(),
            zoo::describe(m)
        );
    }
    println!("\nUse a name wherever a MODEL is expected, e.g. `plait inspect llama3-8b`.");
    Ok(())
}

/// 124439808 → "124.4M".
pub fn human(n: u64) -> String {
    let x = n as f64;
    if x >= 1e12 {
        format!("{:.2}T", x / 1e12)
    } else if x >= 1e9 {
        format!("{:.1}B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}K", x / 1e3)
    } else {
        n.to_string()
    }
}
