//! One test per rewrite rule: it fires on a zoo block (GPT-2, Llama 3 8B with GQA, Mixtral,
//! DeepSeek-V2-Lite's latent attention, gpt-oss's sinks and biased experts, Llama 4 Scout's
//! composed q/k norms, and GPT-2's
//! embedding and LM-head ops), and every union it made joined classes of equal
//! global shape and layout (the analysis records any other merge as a conflict, which makes
//! `build` fail).

#![allow(clippy::unwrap_used)] // test helpers panic on purpose

use std::collections::BTreeMap;
use std::sync::OnceLock;

use ir::{Binding, DType, Graph, OpId};
use planner::sharding::ShardOptions;
use planner::sharding::build::build;
use planner::sharding::rules::all_rules;

fn model(name: &str) -> Graph {
    import::build_forward(&import::zoo::find(name).unwrap(), DType::F32).unwrap()
}

fn deepseek_v2_lite() -> Graph {
    fixture("deepseek-v2-lite")
}

fn fixture(name: &str) -> Graph {
    let path = format!(
        "{}/../fixtures/hf/{name}/config.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let path = path.as_str();
    let text = std::fs::read_to_string(path).unwrap();
    let spec = import::hf::parse_config(&text, std::path::Path::new(path)).unwrap();
    import::build_forward(&spec, DType::F32).unwrap()
}

const B: Binding = Binding { batch: 2, seq: 64 };

/// Ops outside every layer before (`pre`) or after (`post`) them.
fn outside(g: &Graph, pre: bool) -> Vec<OpId> {
    let first_layer = g
        .order()
        .iter()
        .position(|&o| g.op(o).layer.is_some())
        .unwrap();
    g.order()
        .iter()
        .enumerate()
        .filter(|&(i, &o)| g.op(o).layer.is_none() && (i < first_layer) == pre)
        .map(|(_, &o)| o)
        .collect()
}

/// Rule name → times applied, summed over the test blocks.
fn applied() -> &'static BTreeMap<String, usize> {
    static A: OnceLock<BTreeMap<String, usize>> = OnceLock::new();
    A.get_or_init(|| {
        let mut total = BTreeMap::new();
        let gpt2 = model("gpt2");
        let llama = model("llama3-8b");
        let mixtral = model("mixtral-8x7b");
        let gpt = model("gpt-1.7b");
        // Multi-head latent attention views its heads through reshapes, slices, a
        // concatenation and a broadcast of the one rotary key.
        let deepseek = deepseek_v2_lite();
        // A parallel block without biases: attention's and the MLP's partial sums add.
        let falcon = fixture("falcon-40b");
        // gpt-oss: a sink logit per head, a biased router and biased experts.
        let oss = fixture("gpt-oss-20b");
        // Llama 4 Scout: q and k divided per head by their root mean square, composed of a
        // square, its mean over the head, eps (a scalar) and a broadcast product.
        let scout = fixture("llama-4-scout");
        let cases: Vec<(&Graph, Vec<OpId>, u32, bool, bool)> = vec![
            (&gpt2, gpt2.layer_ops(0), 2, false, false),
            (&gpt2, gpt2.layer_ops(0), 2, true, true),
            (&llama, llama.layer_ops(0), 8, true, false),
            (&llama, llama.layer_ops(0), 2, false, true),
            // Eight kv heads over sixteen ranks: K and V whole, q by heads.
            (&llama, llama.layer_ops(0), 16, true, false),
            (&mixtral, mixtral.layer_ops(0), 2, true, false),
            // GPT-2's 50257-token vocabulary does not split (Megatron pads it); the GPT of
            // Megatron's Table 1 has 51200 and a tied head.
            (&gpt, outside(&gpt, true), 2, true, false),
            (&gpt, outside(&gpt, false), 2, false, false),
            (&llama, outside(&llama, false), 8, true, false),
            (&deepseek, deepseek.layer_ops(0), 2, true, true),
            (&falcon, falcon.layer_ops(0), 8, false, false),
            (&oss, oss.layer_ops(0), 8, true, true),
            // Eight kv heads over sixteen ranks: the sinks split with q alone.
            (&oss, oss.layer_ops(0), 16, true, false),
            (&scout, scout.layer_ops(0), 8, true, false),
        ];
        for (g, ops, tp, sp, batch) in cases {
            let mut opts = ShardOptions::new(tp, sp, B);
            opts.allow_batch_split = batch;
            let built = build(g, &ops, &opts).unwrap();
            assert!(built.egraph.analysis.conflicts.is_empty());
            for (k, v) in built.applied {
                *total.entry(k).or_default() += v;
            }
        }
        total
    })
}

fn fires(rule: &str) {
    assert!(
        all_rules().unwrap().iter().any(|r| r.name.as_str() == rule),
        "no rule named {rule}"
    );
    let n = applied().get(rule).copied().unwrap_or(0);
    assert!(n > 0, "rule {rule} never fired; applied: {:?}", applied());
}

macro_rules! rule_tests {
    ($($test:ident => $name:literal,)*) => {
        $(#[test] fn $test() { fires($name); })*

        #[test]
        fn every_rule_has_a_test() {
            let tested = [$($name),*];
            for r in all_rules().unwrap() {
                assert!(tested.contains(&r.name.as_str()), "rule {} has no test", r.name);
            }
        }
    };
}

rule_tests! {
    matmul_row => "matmul-row",
    matmul_column => "matmul-column",
    matmul_column_blocks3 => "matmul-column/3",
    matmul_tokens => "matmul-tokens",
    bias_column => "bias-column",
    bias_column_blocks3 => "bias-column/3",
    bias_tokens => "bias-tokens",
    transpose_swap_1 => "transpose-swap-1",
    map_shard => "map-shard",
    zip_shard => "zip-shard",
    zip_shard_left => "zip-shard-left",
    reduce_other => "reduce-other",
    part_blocks3 => "part-blocks/3",
    part_other => "part-other",
    attention_heads => "attention-heads",
    attention_heads_whole_kv => "attention-heads-whole-kv",
    attention_batch => "attention-batch",
    rotary_heads => "rotary-heads",
    embedding_vocab => "embedding-vocab",
    embedding_tokens => "embedding-tokens",
    cross_entropy_vocab => "cross-entropy-vocab",
    moe_experts => "moe-experts",
    moe_ffn => "moe-ffn",
    moe_tokens => "moe-tokens",
    router_tokens => "router-tokens",
    layernorm_tokens => "layernorm-tokens",
    rmsnorm_tokens => "rmsnorm-tokens",
    reduce_scatter => "reduce-scatter",
    all_reduce_split => "all-reduce-split",
    all_gather => "all-gather",
    all_to_all => "all-to-all",
    all_reduce_sum => "all-reduce-sum",
    param_stored_sharded => "param-stored-sharded",
    transpose_swap_0 => "transpose-swap-0",
    rotary_batch => "rotary-batch",
    reshape_prefix => "reshape-prefix",
    slice_other => "slice-other",
    concat_other => "concat-other",
    expand_other => "expand-other",
    sink_attention_heads => "sink-attention-heads",
    sink_attention_heads_whole_kv => "sink-attention-heads-whole-kv",
    sink_attention_batch => "sink-attention-batch",
    bmoe_experts => "bmoe-experts",
    bmoe_ffn => "bmoe-ffn",
    bmoe_tokens => "bmoe-tokens",
    brouter_tokens => "brouter-tokens",
}
