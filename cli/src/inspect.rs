//! `plait inspect MODEL`: headline numbers of a model, or its IR text.

use std::io::Write;

use clap::Args;
use import::summary::summarize;

use crate::models::human;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A zoo name (see `plait models`), a Hugging Face config.json (or its directory), an ONNX
    /// file, or a Hub id (`org/name`) already downloaded to the local Hugging Face cache.
    model: String,
    /// Sequence length (default: a config's or zoo model's context length, at most 8192; for ONNX the length
    /// the file fixes, else 128 capped by a learned position table).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    seq: Option<u64>,
    /// Batch size in sequences (ONNX imports are folded to this batch) [default: the batch an
    /// ONNX file fixes, else 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    batch: Option<u64>,
    /// Print one JSON object instead of text.
    #[arg(long, conflicts_with = "ir")]
    json: bool,
    /// Print the model's forward graph in plait's IR text form (grammar: ir/src/text/mod.rs).
    #[arg(long)]
    ir: bool,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let m = import::load_model_at(&args.model, args.batch, args.seq)?;
    let text = if args.ir {
        ir::text::print(&m.graph)
    } else if args.json {
        // The summary, and `notes`: what the import approximates (as the text form's `note`
        // lines), for tools that read the JSON.
        let mut v = serde_json::to_value(summarize(&m.graph, m.binding))?;
        if let Some(o) = v.as_object_mut() {
            o.insert("notes".into(), serde_json::json!(m.notes));
        }
        serde_json::to_string_pretty(&v)? + "\n"
    } else {
        let mut t = summary_text(&m.graph, m.binding);
        for note in &m.notes {
            t += &format!("note             {note}\n");
        }
        t
    };
    emit(&text)
}

/// Writes `text` to stdout; a closed pipe (`plait inspect M --ir | head`) is not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing to stdout"))
        }
        _ => Ok(()),
    }
}

fn summary_text(graph: &ir::Graph, binding: ir::Binding) -> String {
    let s = summarize(graph, binding);
    let mut t = String::new();
    let mut line = |l: String| {
        t.push_str(&l);
        t.push('\n');
    };
    line(format!("model            {}", s.model));
    line(format!(
        "parameters       {} ({})",
        s.params,
        human(s.params)
    ));
    line(format!("layers           {}", s.layers));
    line(format!("hidden           {}", s.hidden));
    if s.kv_heads != s.heads {
        line(format!(
            "heads            {} ({} key/value heads)",
            s.heads, s.kv_heads
        ));
    } else {
        line(format!("heads            {}", s.heads));
    }
    line(format!("vocabulary       {}", s.vocab));
    line(format!("batch x seq      {} x {}", s.batch, s.seq));
    line(format!(
        "train FLOPs/tok  {:.4e} (forward + backward, no recompute)",
        s.flops_per_token
    ));
    if let Some(block) = ir::blocks::layer_summary(graph) {
        line(format!("repeated block   {block}"));
    }
    if let Some(w) = &s.sliding_window {
        line(format!(
            "sliding window   {} keys, in {} of {} attention layers",
            w.keys, w.windowed, w.attentions
        ));
    }
    if let Some(c) = &s.attention_chunk {
        line(format!(
            "attention chunks {} keys, in {} of {} attention layers",
            c.keys, c.windowed, c.attentions
        ));
    }
    if let Some(n) = s.nope_layers {
        line(format!("no rotary (NoPE) in {n} of {} layers", s.layers));
    }
    line("ops:".into());
    let mut hist: Vec<_> = s.op_histogram.iter().collect();
    hist.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (name, n) in hist {
        line(format!("  {name:<16} {n}"));
    }
    t
}
