//! Training tokens: nanoGPT-style `.bin` files (little-endian `u16` token ids) or any other
//! file read as bytes (vocabulary 256), and the global batch of each step.
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

impl Tokens {
    /// Reads `path`: `.bin` as `u16` token ids, anything else as bytes.
    pub fn load(path: &Path) -> Result<Tokens, RuntimeError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| RuntimeError::Data {
            path: name.clone(),
            message: e.to_string(),
        })?;
        if path.extension().is_some_and(|e| e == "bin") {
            if bytes.len() % 2 != 0 {
                return Err(RuntimeError::Data {
                    path: name,
                    message: format!("{} bytes is not a whole number of u16 tokens", bytes.len()),
                });
            }
            let ids = bytes
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            Ok(Tokens { name, ids })
        } else {
            Ok(Tokens::from_bytes(name, &bytes))
        }
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
                    "token {} at position {i} is outside the model's vocabulary of {vocab}",
                    self.ids[i]
                ),
            }),
            None => Ok(()),
        }
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
