//! Built-in model shapes, listed by `plait models`.
//!
//! Sources: GPT-2 small (Radford et al. 2019, Hugging Face `gpt2` config); GPT-3 175B (Brown et
//! al. 2020, Table 2.1); the GPT sizes of Megatron-LM SC'21 Table 1 (Narayanan et al. 2021,
//! ../shared/data/megatron_sc21_runs.csv: 4h MLP, vocab 51200, seq 2048); Llama 2 7B and Llama 3
//! 8B/70B/405B and Mixtral 8x7B from their published Hugging Face `config.json` files.

use crate::spec::{Family, ModelSpec};

fn gpt(name: &str, layers: u64, hidden: u64, heads: u64, vocab: u64, positions: u64) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        family: Family::Gpt2,
        variant: Default::default(),
        layers,
        hidden,
        heads,
        kv_heads: heads,
        ffn: 4 * hidden,
        vocab,
        max_positions: positions,
        tied_embeddings: true,
        norm_eps: 1e-5,
        rope_theta: 0.0,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: crate::spec::default_seq(positions),
        // GPT-2 (Radford et al. 2019) and Megatron-LM's GPT train with dropout 0.1.
        dropout: 0.1,
    }
}

#[allow(clippy::too_many_arguments)]
fn llama(
    name: &str,
    layers: u64,
    hidden: u64,
    ffn: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    positions: u64,
    theta: f64,
) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        family: Family::Llama,
        variant: Default::default(),
        layers,
        hidden,
        heads,
        kv_heads,
        ffn,
        vocab,
        max_positions: positions,
        tied_embeddings: false,
        norm_eps: 1e-5,
        rope_theta: theta,
        rope_scaling: ir::RopeScaling::None,
        experts: 0,
        experts_per_token: 0,
        default_seq: crate::spec::default_seq(positions),
        dropout: 0.0,
    }
}

/// Every zoo entry, in the order `plait models` lists them.
pub fn zoo() -> Vec<ModelSpec> {
    let mut v = vec![
        gpt("gpt2", 12, 768, 12, 50257, 1024),
        gpt("gpt3-175b", 96, 12288, 96, 51200, 2048),
        // Megatron-LM SC'21 Table 1 (weak scaling).
        gpt("gpt-1.7b", 24, 2304, 24, 51200, 2048),
        gpt("gpt-3.6b", 30, 3072, 32, 51200, 2048),
        gpt("gpt-7.5b", 36, 4096, 32, 51200, 2048),
        gpt("gpt-18.4b", 40, 6144, 48, 51200, 2048),
        gpt("gpt-39.1b", 48, 8192, 64, 51200, 2048),
        gpt("gpt-76.1b", 60, 10240, 80, 51200, 2048),
        gpt("gpt-145.6b", 80, 12288, 96, 51200, 2048),
        gpt("gpt-310.1b", 96, 16384, 128, 51200, 2048),
        gpt("gpt-529.6b", 105, 20480, 128, 51200, 2048),
        gpt("gpt-1t", 128, 25600, 160, 51200, 2048),
        llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096, 10000.0),
        llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, 500000.0),
        llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192, 500000.0),
        llama(
            "llama3-405b",
            126,
            16384,
            53248,
            128,
            8,
            128256,
            8192,
            500000.0,
        ),
    ];
    let mut mixtral = llama("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, 32768, 1e6);
    mixtral.family = Family::Mixtral;
    mixtral.experts = 8;
    mixtral.experts_per_token = 2;
    v.push(mixtral);
    v
}

/// Looks a zoo entry up by name (case-insensitive).
pub fn find(name: &str) -> Option<ModelSpec> {
    zoo()
        .into_iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

/// A one-line description for listings.
pub fn describe(m: &ModelSpec) -> String {
    let mut s = format!(
        "{} layers, hidden {}, {} heads",
        m.layers, m.hidden, m.heads
    );
    if m.kv_heads != m.heads {
        s += &format!(" ({} kv)", m.kv_heads);
    }
    s += &format!(", ffn {}, vocab {}", m.ffn, m.vocab);
    if m.experts > 0 {
        s += &format!(", {} experts top-{}", m.experts, m.experts_per_token);
    }
    s
}
