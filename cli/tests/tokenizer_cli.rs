//! Real vocabularies: a text tokenized by a Hugging Face tokenizer.json whose vocabulary is above
//! u16's 65,536 ids trains (`plait run --tokenizer`), and the same ids written once as a u32
//! `.bin` (`plait tokenize`) train to the same losses (`--data-width u32`).

mod common;

use std::collections::HashMap;

use common::{dir, plait};
use tokenizers::Tokenizer;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;

/// Vocabulary of the test tokenizer: above 65,535, as Llama 3's 128,256 is.
const VOCAB: u64 = 70_000;

/// A word-level tokenizer of `VOCAB` words, the text's words given the highest ids (so the
/// trained tokens need u32).
fn tokenizer(words: &[&str]) -> Tokenizer {
    let mut vocab: HashMap<String, u32> = HashMap::new();
    vocab.insert("[UNK]".into(), 0);
    for i in 1..VOCAB as u32 - words.len() as u32 {
        vocab.insert(format!("w{i}"), i);
    }
    for (k, w) in words.iter().enumerate() {
        vocab.insert((*w).to_string(), VOCAB as u32 - 1 - k as u32);
    }
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .expect("word-level model");
    let mut t = Tokenizer::new(model);
    t.with_pre_tokenizer(Some(Whitespace {}));
    t
}

fn losses(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("step "))
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .collect()
}

#[test]
fn a_vocabulary_above_u16_trains_from_text_and_from_u32_tokens() {
    let d = dir("tokenizer");
    let words = [
        "the", "plan", "fits", "in", "memory", "and", "trains", "fast",
    ];
    let text: String = (0..400)
        .map(|i| words[(i * 7 + i / 3) % words.len()])
        .collect::<Vec<_>>()
        .join(" ");
    let text_file = d.join("text.txt");
    std::fs::write(&text_file, text).expect("text written");
    let tok_file = d.join("tokenizer.json");
    tokenizer(&words)
        .save(&tok_file, false)
        .expect("tokenizer saved");
    let model = d.join("m.json");
    std::fs::write(
        &model,
        format!(
            r#"{{"model_type":"llama","hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,
                "num_attention_heads":2,"num_key_value_heads":1,"vocab_size":{VOCAB},
                "max_position_embeddings":64}}"#
        ),
    )
    .expect("config written");
    let plan = d.join("plan.json");
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let (code, _, err) = plait(&[
        "compile",
        &s(&model),
        "--cluster",
        "cpu",
        "--gpus",
        "1",
        "--global-batch",
        "2",
        "--seq",
        "16",
        "--precision",
        "fp32",
        "-o",
        &s(&plan),
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, from_text, err) = plait(&[
        "run",
        &s(&plan),
        "--steps",
        "3",
        "--data",
        &s(&text_file),
        "--tokenizer",
        &s(&tok_file),
    ]);
    assert_eq!(code, 0, "{from_text}{err}");
    let text_losses = losses(&from_text);
    assert_eq!(text_losses.len(), 3, "{from_text}");
    // Without the tokenizer the text would be bytes and train too, on other ids: the
    // tokenizer's run starts near ln(70,000) = 11.16, a byte-level one could not.
    let first: f64 = text_losses[0].parse().expect("a loss");
    assert!((first - (VOCAB as f64).ln()).abs() < 1.0, "{first}");

    let bin = d.join("ids.bin");
    let (code, out, err) = plait(&[
        "tokenize",
        &s(&text_file),
        "--tokenizer",
        &s(&tok_file),
        "-o",
        &s(&bin),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("400 tokens") && out.contains("u32"), "{out}");
    assert_eq!(std::fs::metadata(&bin).map(|m| m.len()).ok(), Some(400 * 4));
    let (code, from_bin, err) = plait(&[
        "run",
        &s(&plan),
        "--steps",
        "3",
        "--data",
        &s(&bin),
        "--data-width",
        "u32",
    ]);
    assert_eq!(code, 0, "{from_bin}{err}");
    assert_eq!(losses(&from_bin), text_losses, "{from_bin}");
    // Read as u16 the same file is other ids: a different run, and plait says why.
    let (_, as_u16, note) = plait(&["run", &s(&plan), "--steps", "3", "--data", &s(&bin)]);
    assert_ne!(losses(&as_u16), text_losses);
    assert!(note.contains("--data-width u32"), "{note}");
}
