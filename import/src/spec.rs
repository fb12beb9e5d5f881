//! A decoder-only transformer described by its hyper-parameters: what a Hugging Face
//! `config.json` or a zoo entry says, before it becomes an IR graph.

use serde::Serialize;

/// The architecture family, which fixes the block's structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// GPT-2 / GPT-3 / Megatron GPT: learned positions, LayerNorm, GELU MLP, biases.
    Gpt2,
    /// Llama: rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases.
    Llama,
    /// Mixtral: Llama with a top-k routed mixture of SwiGLU experts instead of the MLP.
    Mixtral,
}

impl Family {
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mixtral => "mixtral",
        }
    }
}

/// Hyper-parameters of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelSpec {
    pub name: String,
    pub family: Family,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    /// MLP inner width (per expert for Mixtral).
    pub ffn: u64,
    pub vocab: u64,
    /// Longest sequence the position embedding covers (GPT-2's n_positions).
    pub max_positions: u64,
    pub tied_embeddings: bool,
    pub norm_eps: f64,
    pub rope_theta: f64,
    pub experts: u64,
    pub experts_per_token: u64,
    /// Sequence length used when the user gives none.
    pub default_seq: u64,
    /// Dropout probability on the embedding output and after each attention and MLP block
    /// (GPT-2's embd_pdrop / resid_pdrop); 0 disables it. Llama-family models train without.
    pub dropout: f64,
}

impl ModelSpec {
    pub fn head_dim(&self) -> u64 {
        self.hidden / self.heads
    }

    /// Exact trainable parameter count, by formula (the graph's own count must agree).
    pub fn param_count(&self) -> u64 {
        let (h, v, f) = (self.hidden, self.vocab, self.ffn);
        let kv = self.kv_heads * self.head_dim();
        let embed = v * h;
        let head = if self.tied_embeddings { 0 } else { h * v };
        match self.family {
            Family::Gpt2 => {
                let layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h;
                embed + self.max_positions * h + self.layers * layer + 2 * h + head
            }
            Family::Llama | Family::Mixtral => {
                let attn = h * h + 2 * h * kv + h * h;
                let mlp = if self.family == Family::Mixtral {
                    h * self.experts + self.experts * 3 * h * f
                } else {
                    3 * h * f
                };
                embed + self.layers * (attn + mlp + 2 * h) + h + head
            }
        }
    }
}
