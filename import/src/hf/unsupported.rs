//! Model types people train that plait does not build yet, each with what it lacks, so that
//! refusing one says why rather than only listing what is supported.

/// (model types, what plait would need to build them).
const KNOWN: [(&[&str], &str); 13] = [
    (
        &[
            "qwen3_next",
            "qwen3_5",
            "qwen3_5_text",
            "qwen3_5_moe",
            "qwen3_5_moe_text",
        ],
        "Qwen3-Next's and Qwen3.5's Gated DeltaNet (linear attention) layers",
    ),
    (
        &["gemma4", "gemma4_text"],
        "Gemma 4's per-layer embeddings, full-attention layers of their own head size and \
         key/value heads, and keys shared as values and across layers",
    ),
    (
        &["deepseek_v32", "glm_moe_dsa"],
        "DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2's, GLM-5's)",
    ),
    (
        &["apertus"],
        "Apertus's xIELU activation (its learned slopes in every layer)",
    ),
    (
        &["longcat_flash"],
        "LongCat-Flash's zero-computation experts and shortcut-connected MoE",
    ),
    (
        &[
            "mamba",
            "mamba2",
            "jamba",
            "falcon_h1",
            "zamba2",
            "nemotron_h",
            "granitemoehybrid",
        ],
        "state-space (Mamba) layers",
    ),
    (&["phimoe"], "Phi-3.5-MoE's SparseMixer router"),
    (
        &["hunyuan_v1_moe"],
        "Hunyuan-A13B's experts of fixed capacity, which drop the tokens beyond it",
    ),
    (
        &["minimax"],
        "MiniMax-Text-01's lightning (linear) attention layers",
    ),
    (&["lfm2", "lfm2_moe"], "LFM2's short convolution layers"),
    (&["jetmoe"], "JetMoE's mixture of attention heads"),
    (
        &["gemma3n"],
        "Gemma 3n's per-layer embeddings and alternating updates (AltUp)",
    ),
    (
        &["bert", "roberta", "t5", "bart", "modernbert"],
        "encoders (plait plans decoder-only language models)",
    ),
];

/// What plait lacks to build `model_type`, where it is one people train.
pub(super) fn lacks(model_type: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(types, _)| types.contains(&model_type))
        .map(|&(_, why)| why)
}
