//! The layer parameters tensor parallelism keeps whole on every rank, counted from the
//! published configurations' shapes (Megatron-Core's layout: norms, the router and MLA's
//! `duplicated` latent down-projections whole; key/value projections whole only where the
//! ranks outnumber the key/value heads).
#![allow(clippy::unwrap_used)] // test helpers panic on purpose

use import::build_forward;
use ir::DType;
use planner::model::ModelInfo;

fn published(dir: &str) -> ir::Graph {
    let path = format!(
        "{}/../fixtures/hf/{dir}/config.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let spec = import::hf::parse_config(&text, std::path::Path::new(&path)).unwrap();
    build_forward(&spec, DType::F32).unwrap()
}

/// DeepSeek-V3 (hidden 7168, q_lora_rank 1536, kv_lora_rank 512, rope head 64, 256 routed
/// experts): the latent down-projections with their norms, the layer's two norms and, in the
/// expert layers, the router.
#[test]
fn deepseek_v3_keeps_its_latents_norms_and_router_whole() {
    let g = published("deepseek-v3");
    let info = ModelInfo::new(&g).unwrap();
    let h = 7168u64;
    let latents = h * 1536 + 1536 + h * (512 + 64) + 512;
    let norms = 2 * h;
    let router = 256 * h;
    let runs = info.runs();
    assert_eq!(runs.len(), 2);
    let dense = runs[0].info.tp_whole_params_per_layer(8);
    let expert = runs[1].info.tp_whole_params_per_layer(8);
    assert_eq!(dense, latents + norms);
    assert_eq!(expert, latents + norms + router);
    assert_eq!(runs[1].info.tp_whole_params_per_layer(1), 0);
    // The rest of an expert layer's dense parameters are split: 1/8 of them per rank.
    let split = runs[1].info.dense_params_per_layer() - expert;
    let per_rank = runs[1].info.dense_params_per_tp_rank(8);
    assert!((per_rank - (split as f64 / 8.0 + expert as f64)).abs() < 1.0);
}

/// Gemma 2 normalizes its attention and MLP outputs (post-norms on the residual stream):
/// those outputs are whole after the row-parallel reduction, so the output projections stay
/// split and only the four norms are whole.
#[test]
fn gemma2s_post_norms_do_not_make_its_output_projections_whole() {
    let g = published("gemma-2-9b");
    let info = ModelInfo::new(&g).unwrap();
    assert_eq!(info.tp_whole_params_per_layer(2), 4 * 3584);
}

/// Llama-3-8B's 8 key/value heads: at tp 8 each rank holds one, at tp 16 two ranks share
/// one and the key and value projections (4096 × 1024 each) are whole on every rank.
#[test]
fn kv_projections_are_whole_where_ranks_outnumber_kv_heads() {
    let llama = import::load_model("llama3-8b", 1, Some(4096)).unwrap();
    let info = ModelInfo::new(&llama.graph).unwrap();
    let norms = 2 * 4096;
    assert_eq!(info.tp_whole_params_per_layer(8), norms);
    assert_eq!(info.tp_whole_params_per_layer(16), norms + 2 * 4096 * 1024);
}
