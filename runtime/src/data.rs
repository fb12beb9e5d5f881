//! Training tokens: nanoGPT-style `.bin` files (little-endian token ids without a header, `u16`
//! unless told `u32`: vocabularies above 65,535 need `u32`) or any other file read as bytes
//! (vocabulary 256), and the global batch of each step.
//!
//! Step `k`'s batch is a pure function of (tokens, seed, k): `rows` windows of `seq + 1`
//! tokens at offsets drawn uniformly (splitmix64 seeded by seed and step); inputs are a
//! window's first `seq` tokens, targets its last `seq`. Every rank computes the same batch
//! and loads its own rows, so no data moves between ranks.

use std::path::Path;

use ir::testing::Rng;

use crate::RuntimeError;
use crate::exec::Batch;

/// A token stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokens {
    /// Where it came from (for messages).
    pub name: String,
    pub ids: Vec<u32>,
}

/// The width of the token ids in a `.bin` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TokenWidth {
    /// nanoGPT's `np.uint16` (vocabularies up to 65,536).
    #[default]
    U16,
    /// `np.uint32`, for larger vocabularies (Llama 3's 128,256, Qwen's 151,936).
    U32,
}

impl TokenWidth {
    pub fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TokenWidth::U16 => "u16",
            TokenWidth::U32 => "u32",
        }
    }

    /// The narrowest width that holds every id below `vocab`.
    pub fn for_vocab(vocab: u64) -> TokenWidth {
        if vocab <= 1 << 16 {
            TokenWidth::U16
        } else {
            TokenWidth::U32
        }
    }
}

impl std::str::FromStr for TokenWidth {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "u16" => Ok(TokenWidth::U16),
            "u32" => Ok(TokenWidth::U32),
            _ => Err(format!("unknown token width `{s}`; expected u16 or u32")),
        }
    }
}

impl Tokens {
    /// Reads `path`: `.bin` as `u16` token ids, anything else as bytes.
    pub fn load(path: &Path) -> Result<Tokens, RuntimeError> {
        Tokens::load_as(path, TokenWidth::U16)
    }

    /// Reads `path`: `.bin` as token ids of `width`, anything else as bytes.
    pub fn load_as(path: &Path, width: TokenWidth) -> Result<Tokens, RuntimeError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| RuntimeError::Data {
            path: name.clone(),
            message: e.to_string(),
        })?;
        if path.extension().is_some_and(|e| e == "bin") {
            let ids = decode_ids(&bytes, width).map_err(|message| RuntimeError::Data {
                path: name.clone(),
                message,
            })?;
            Ok(Tokens { name, ids })
        } else {
            Ok(Tokens::from_bytes(name, &bytes))
        }
    }

    /// Writes the ids as a headerless little-endian `.bin` of `width` (what [`Tokens::load_as`]
    /// reads back, and nanoGPT's `np.memmap(path, dtype)` too).
    pub fn write_bin(&self, path: &Path, width: TokenWidth) -> Result<(), RuntimeError> {
        let fail = |message: String| RuntimeError::Data {
            path: path.display().to_string(),
            message,
        };
        let mut bytes = Vec::with_capacity(self.ids.len() * width.bytes());
        for (i, &t) in self.ids.iter().enumerate() {
            match width {
                TokenWidth::U16 => {
                    let t = u16::try_from(t).map_err(|_| {
                        fail(format!(
                            "token {t} at position {i} does not fit u16; write u32 tokens"
                        ))
                    })?;
                    bytes.extend_from_slice(&t.to_le_bytes());
                }
                TokenWidth::U32 => bytes.extend_from_slice(&t.to_le_bytes()),
            }
        }
        std::fs::write(path, bytes).map_err(|e| fail(e.to_string()))
    }

    /// A text (any bytes) as tokens of a 256-symbol vocabulary.
    pub fn from_bytes(name: String, bytes: &[u8]) -> Tokens {
        Tokens {
            name,
            ids: bytes.iter().map(|&b| u32::from(b)).collect(),
        }
    }

    /// Checks every token id is below `vocab`.
    pub fn check_vocab(&self, vocab: u64) -> Result<(), RuntimeError> {
        match self.ids.iter().position(|&t| u64::from(t) >= vocab) {
            Some(i) => Err(RuntimeError::Data {
                path: self.name.clone(),
                message: format!(
                    "token {} at position {i} is outside the model's vocabulary of {vocab}: \
                     train it on ids below {vocab} (`plait tokenize` with the model's own \
                     tokenizer writes them; bytes need a vocabulary of at least 256)",
                    self.ids[i]
                ),
            }),
            None => Ok(()),
        }
    }

    /// Whether ids read as u16 look like u32 ids read at the wrong width: every second one (the
    /// high halves) is below 4, over at least 64 ids. nanoGPT files carry no header, so
    /// this is the only hint there is; real u16 token streams almost never look so.
    pub fn look_like_u32_read_as_u16(&self) -> bool {
        self.ids.len() >= 64
            && self.ids.len().is_multiple_of(2)
            && self.ids.iter().skip(1).step_by(2).all(|&high| high < 4)
            && self.ids.iter().step_by(2).any(|&low| low >= 4)
    }

    /// The ids of a tokenizer's output (for messages, `name`).
    pub fn from_ids(name: String, ids: Vec<u32>) -> Tokens {
        Tokens { name, ids }
    }

    /// The global batch of step `step` (1-based).
    pub fn batch(
        &self,
        seed: u64,
        step: u64,
        rows: usize,
        seq: usize,
    ) -> Result<Batch, RuntimeError> {
        if self.ids.len() < seq + 2 {
            return Err(RuntimeError::Data {
                path: self.name.clone(),
                message: format!(
                    "{} tokens; a sequence of {seq} needs at least {}",
                    self.ids.len(),
                    seq + 2
                ),
            });
        }
        let mut rng = Rng::new(crate::exec::dropout::step_seed(
            seed ^ 0x5eed_da7a,
            step + 1,
        ));
        let span = (self.ids.len() - seq - 1) as u64;
        let mut input_ids = Vec::with_capacity(rows * seq);
        let mut targets = Vec::with_capacity(rows * seq);
        for _ in 0..rows {
            let o = rng.below(span + 1) as usize;
            input_ids.extend_from_slice(&self.ids[o..o + seq]);
            targets.extend_from_slice(&self.ids[o + 1..o + seq + 1]);
        }
        Ok(Batch {
            rows,
            seq,
            input_ids,
            targets,
        })
    }
}

/// Little-endian ids of `width` from `bytes`.
fn decode_ids(bytes: &[u8], width: TokenWidth) -> Result<Vec<u32>, String> {
    let n = width.bytes();
    if !bytes.len().is_multiple_of(n) {
        return Err(format!(
            "{} bytes is not a whole number of {} tokens",
            bytes.len(),
            width.name()
        ));
    }
    Ok(match width {
        TokenWidth::U16 => bytes
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        TokenWidth::U32 => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u32_bin_files_round_trip() {
        let dir = std::env::temp_dir().join(format!("plait-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("ids.bin");
        // Ids above u16's range (Llama 3's vocabulary is 128,256).
        let tokens = Tokens::from_ids("ids".into(), vec![0, 65_535, 65_536, 128_255, 7]);
        tokens.write_bin(&path, TokenWidth::U32).expect("written");
        let back = Tokens::load_as(&path, TokenWidth::U32).map(|t| t.ids);
        assert_eq!(back.ok(), Some(tokens.ids.clone()));
        // u16 cannot hold them: the writer says so rather than wrapping.
        let err = tokens
            .write_bin(&path, TokenWidth::U16)
            .map_err(|e| e.to_string());
        assert!(err.is_err_and(|e| e.contains("65536") && e.contains("u32")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn u32_ids_read_as_u16_are_noticed() {
        let ids: Vec<u32> = (0..100).map(|i| 70_000 + i).collect();
        let mut bytes = Vec::new();
        for t in &ids {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        let as_u16 =
            decode_ids(&bytes, TokenWidth::U16).map(|ids| Tokens::from_ids("x".into(), ids));
        assert!(as_u16.is_ok_and(|t| t.look_like_u32_read_as_u16()));
        let gpt2_like = Tokens::from_ids("y".into(), (0..100).map(|i| i * 487 % 50_257).collect());
        assert!(!gpt2_like.look_like_u32_read_as_u16());
    }

    #[test]
    fn a_bin_of_the_wrong_width_is_refused() {
        let err = decode_ids(&[1, 2, 3, 4, 5, 6], TokenWidth::U32);
        assert!(err.is_err_and(|e| e.contains("6 bytes") && e.contains("u32")));
        assert_eq!(decode_ids(&[1, 0, 2, 0], TokenWidth::U16), Ok(vec![1, 2]));
    }

    #[test]
    fn the_width_follows_the_vocabulary() {
        assert_eq!(TokenWidth::for_vocab(50_257), TokenWidth::U16);
        assert_eq!(TokenWidth::for_vocab(65_536), TokenWidth::U16);
        assert_eq!(TokenWidth::for_vocab(128_256), TokenWidth::U32);
    }
}
