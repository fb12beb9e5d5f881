//! Token data from text: `plait run --tokenizer tokenizer.json --data some.txt` tokenizes the
//! text with the model's own tokenizer (Hugging Face's `tokenizers` library reads the file), and
//! `plait tokenize` writes the ids once as a `.bin` that `plait run --data` reads back.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use runtime::data::{TokenWidth, Tokens};

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// A text file (read as UTF-8).
    text: PathBuf,
    /// The model's tokenizer.json (Hugging Face `tokenizers` format).
    #[arg(long)]
    tokenizer: PathBuf,
    /// The `.bin` file to write: headerless little-endian token ids.
    #[arg(short, long)]
    output: PathBuf,
    /// Width of the ids written: u16 (nanoGPT) or u32 [default: u16 when the tokenizer's
    /// vocabulary fits in 65,536 ids, else u32]. `plait run --data-width` reads it back.
    #[arg(long)]
    width: Option<TokenWidth>,
}

pub fn run(args: &TokenizeArgs) -> anyhow::Result<()> {
    crate::outputs::not_an_input(
        &args.output,
        &[("text", &args.text), ("tokenizer", &args.tokenizer)],
    )?;
    let (tokens, vocab) = tokenize_file(&args.text, &args.tokenizer)?;
    if tokens.ids.is_empty() {
        anyhow::bail!(
            "{} tokenizes to no tokens: nothing to train on; give it text",
            args.text.display()
        );
    }
    let width = args.width.unwrap_or(TokenWidth::for_vocab(vocab));
    tokens.write_bin(&args.output, width)?;
    println!(
        "tokenized   {} tokens of {} (vocabulary {vocab}) written to {} as {}",
        tokens.ids.len(),
        args.text.display(),
        args.output.display(),
        width.name()
    );
    println!(
        "train on it with `plait run PLAN --data {}{}`",
        args.output.display(),
        if width == TokenWidth::U32 {
            " --data-width u32"
        } else {
            ""
        }
    );
    Ok(())
}

/// The ids of `text` under the tokenizer in `tokenizer_file` (no special tokens added), with
/// the tokenizer's vocabulary size (added tokens included).
pub fn tokenize_file(text: &Path, tokenizer_file: &Path) -> anyhow::Result<(Tokens, u64)> {
    let tokenizer = tokenizers::Tokenizer::from_file(tokenizer_file)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| {
            format!(
                "cannot read tokenizer {} (expected a Hugging Face tokenizer.json)",
                tokenizer_file.display()
            )
        })?;
    let body = std::fs::read_to_string(text)
        .with_context(|| format!("cannot read {} as UTF-8 text", text.display()))?;
    let encoding = tokenizer
        .encode(body.as_str(), false)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("tokenizing {}", text.display()))?;
    let vocab = tokenizer.get_vocab_size(true) as u64;
    let name = format!("{} ({})", text.display(), tokenizer_file.display());
    Ok((Tokens::from_ids(name, encoding.get_ids().to_vec()), vocab))
}
