//! `plait inspect MODEL`: headline numbers of a model, or its IR text.

use clap::Args;
use import::summary::summarize;

use crate::model;
use crate::models::human;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A zoo name (see `plait models`), a Hugging Face config.json, or an ONNX file.
    model: String,
    /// Sequence length (default: the model's context length, at most 4096).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    seq: Option<u64>,
    /// Batch size in sequences (ONNX imports are folded to this batch).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// Print one JSON object instead of text.
    #[arg(long, conflicts_with = "ir")]
    json: bool,
    /// Print the model's IR in plait's text form.
    #[arg(long)]
    ir: bool,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let m = model::load(&args.model, args.batch, args.seq)?;
    let s = summarize(&m.graph, m.binding);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("model            {}", s.model);
    println!("parameters       {} ({})", s.params, human(s.params));
    println!("layers           {}", s.layers);
    println!("hidden           {}", s.hidden);
    if s.kv_heads != s.heads {
        println!(
            "heads            {} ({} key/value heads)",
            s.heads, s.kv_heads
        );
    } else {
        println!("heads            {}", s.heads);
    }
    println!("vocabulary       {}", s.vocab);
    println!("batch x seq      {} x {}", s.batch, s.seq);
    println!(
        "train FLOPs/tok  {:.4e} (forward + backward, no recompute)",
        s.flops_per_token
    );
    if let Some(b) = &s.repeated_block {
        println!(
            "repeated block   {} x{}: {} ops, {} params each",
            b.name,
            b.count,
            b.ops_per_layer,
            human(b.params_per_layer)
        );
    }
    println!("ops:");
    let mut hist: Vec<_> = s.op_histogram.iter().collect();
    hist.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (name, n) in hist {
        println!("  {name:<16} {n}");
    }
    Ok(())
}
