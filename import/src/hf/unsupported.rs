//! Model types people train that plait does not build yet, each with what it lacks, so that
//! refusing one says why rather than only listing what is supported.

/// (model types, what plait would need to build them).
const KNOWN: [(&[&str], &str); 9] = [
    (
        &["qwen3_next"],
        "Qwen3-Next's Gated DeltaNet (linear attention) layers",
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
    (&["lfm2"], "LFM2's short convolution layers"),
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
