//! `plait export --to megatron` against Megatron-LM's own argument list (core_v0.15.0's
//! `arguments.py`, `data/engines/`): every flag exists and takes a valid value, the degrees are
//! the plan's, the architecture gives the model's parameter count by Megatron's own formula,
//! and what Megatron cannot run is refused.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use ir::DType;
use planner::engine::{Engine, Overlap};
use planner::plan::{ModelRef, Plan, SearchSummary};
use planner::{Cluster, ModelInfo, PlanError, Precision, Recompute, Schedule, Strategy};

const ARGUMENTS: &str = include_str!("../../data/engines/megatron-lm-core_v0.15.0-arguments.tsv");

/// One row of the argument list: type, action and choices.
struct Flag {
    ty: String,
    action: String,
    choices: Vec<String>,
}

fn megatron_flags() -> HashMap<String, Flag> {
    ARGUMENTS
        .lines()
        .filter(|l| l.starts_with("--"))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let choices = f.get(3).map_or(Vec::new(), |c| {
                c.split(',')
                    .map(|x| x.trim().trim_matches('\'').to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            });
            (
                f[0].to_string(),
                Flag {
                    ty: f.get(1).unwrap_or(&"").to_string(),
                    action: f.get(2).unwrap_or(&"").to_string(),
                    choices,
                },
            )
        })
        .collect()
}

/// Checks `args` against the list; returns each flag's value ("" for switches).
fn check_args(args: &[String]) -> HashMap<String, String> {
    let flags = megatron_flags();
    assert!(flags.len() > 500, "the argument list is read");
    let mut values = HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let name = &args[i];
        let f = flags
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not an argument of Megatron-LM core_v0.15.0"));
        let switch = f.action.starts_with("store_");
        let value = if switch {
            String::new()
        } else {
            i += 1;
            args.get(i)
                .unwrap_or_else(|| panic!("{name} needs a value"))
                .clone()
        };
        match f.ty.as_str() {
            "int" => assert!(value.parse::<i64>().is_ok(), "{name} {value}: not an int"),
            "float" => assert!(value.parse::<f64>().is_ok(), "{name} {value}: not a float"),
            _ => {}
        }
        if !f.choices.is_empty() {
            assert!(
                f.choices.contains(&value),
                "{name} {value}: not one of {:?}",
                f.choices
            );
        }
        assert!(
            values.insert(name.clone(), value).is_none(),
            "{name} given twice"
        );
        i += 1;
    }
    values
}

fn strategy(tp: u32, pp: u32, dp: u32, mb: u64, gbs: u64, seq: u64) -> Strategy {
    Strategy {
        tp,
        pp,
        dp,
        micro_batch: mb,
        global_batch: gbs,
        seq,
        zero: 1,
        recompute: Recompute::None,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        sequence_parallel: tp > 1,
        precision: Precision::Bf16,
        attention: Default::default(),
        kernels: Default::default(),
        cp: 1,
        ep: 1,
        engine: Engine::Megatron,
        overlap: Overlap::LEGACY,
        stage_layers: None,
        dp_comm: Default::default(),
    }
}

fn plan(model: &str, cluster: &str, s: &Strategy) -> Plan {
    plan_of(&import::zoo::find(model).unwrap(), model, cluster, s)
}

fn plan_of(spec: &import::ModelSpec, model: &str, cluster: &str, s: &Strategy) -> Plan {
    let g = import::build_forward(spec, DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let cluster = Cluster::load(cluster).unwrap();
    let est = planner::estimate(&info, &cluster, s.gpus(), s).unwrap();
    Plan::new(
        ModelRef::of("zoo", model, &info),
        &info,
        &cluster,
        s.gpus(),
        &est,
        SearchSummary {
            candidates_evaluated: 1,
            candidates_pruned: 0,
            target: None,
        },
        vec![],
    )
}

fn int(v: &HashMap<String, String>, flag: &str) -> u64 {
    v.get(flag)
        .unwrap_or_else(|| panic!("{flag} missing"))
        .parse()
        .unwrap()
}

/// Megatron's `moe_freq_type`: an integer N (an expert layer every N layers) or a list
/// expression of the form plait writes, `([0]*3+[1]*58)`, as the layers' pattern.
fn moe_layer_pattern(value: &str, layers: u64) -> Vec<bool> {
    if let Ok(n) = value.parse::<u64>() {
        return (0..layers).map(|i| i % n == 0).collect();
    }
    let inner = value
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .unwrap_or(value);
    let mut pattern = Vec::new();
    for term in inner.split('+') {
        let (item, times) = term.split_once('*').unwrap_or((term, "1"));
        let kind = item.trim_matches(|c| c == '[' || c == ']');
        assert!(
            kind == "0" || kind == "1",
            "{value}: {item} is not [0] or [1]"
        );
        pattern.extend(std::iter::repeat_n(kind == "1", times.parse().unwrap()));
    }
    assert_eq!(pattern.len() as u64, layers, "{value}: one entry per layer");
    pattern
}

fn float(v: &HashMap<String, String>, flag: &str) -> Option<f64> {
    v.get(flag).map(|x| x.parse().unwrap())
}

/// Megatron-LM's own parameter count from its arguments (`compute_weight_and_optimizer_memory`
/// in `megatron/training/theoretical_memory_usage.py` at core_v0.15.0): attention (its
/// multi-latent form's projections and latent norms), dense and expert MLPs by the layers'
/// `--moe-layer-freq` pattern, two norms per layer and the final norm at 2·h each (LayerNorm
/// with its bias), the embedding (twice when untied). It leaves out linear biases, routers
/// and a learned position table and counts an RMSNorm as a LayerNorm with its bias: within a
/// few 1e-4 of the whole count.
fn megatron_parameters(v: &HashMap<String, String>) -> f64 {
    let (l, h) = (int(v, "--num-layers"), int(v, "--hidden-size") as f64);
    let heads = int(v, "--num-attention-heads") as f64;
    let groups = float(v, "--num-query-groups").unwrap_or(heads);
    // The query projection's width over the hidden size (`--kv-channels` × heads).
    let q_ratio = float(v, "--kv-channels").map_or(1.0, |d| d * heads / h);
    let gated = if v.contains_key("--swiglu") { 1.5 } else { 1.0 };
    let ffn = int(v, "--ffn-hidden-size") as f64;
    let shared = float(v, "--moe-shared-expert-intermediate-size").unwrap_or(0.0);
    let (experts, moe_ffn, pattern) = match float(v, "--num-experts") {
        Some(e) => (
            e,
            float(v, "--moe-ffn-hidden-size").unwrap_or(ffn),
            moe_layer_pattern(v.get("--moe-layer-freq").map_or("1", String::as_str), l),
        ),
        None => (1.0, 0.0, vec![false; l as usize]),
    };
    let attention = if v.contains_key("--multi-latent-attention") {
        let dim = |f: &str| float(v, f).unwrap();
        let (qk, pos, vd) = (
            dim("--qk-head-dim"),
            dim("--qk-pos-emb-head-dim"),
            dim("--v-head-dim"),
        );
        let q = match float(v, "--q-lora-rank") {
            None => h * heads * (qk + pos),
            Some(r) => r * (h + heads * (qk + pos) + 1.0),
        };
        q + dim("--kv-lora-rank") * (h + heads * (qk + vd) + 1.0) + h * pos + heads * vd * h
    } else {
        2.0 * h * h * (1.0 + groups / heads) * q_ratio
    };
    let dense = 2.0 * h * (ffn * gated + 2.0) + attention;
    let moe = 2.0 * h * (moe_ffn * experts * gated + shared * gated + 2.0) + attention;
    let moe_layers = pattern.iter().filter(|&&m| m).count() as f64;
    let block = dense * (l as f64 - moe_layers) + moe * moe_layers + 2.0 * h;
    // NullTokenizer's vocabulary is --vocab-size + 1 (its end-of-document id).
    let vocab = (int(v, "--vocab-size") + 1) as f64;
    let tables = if v.contains_key("--untie-embeddings-and-output-weights") {
        2.0
    } else {
        1.0
    };
    block + tables * h * vocab
}

#[test]
fn published_plans_export_to_megatron_arguments_it_accepts() {
    let mut gpt3_h100 = strategy(4, 8, 4, 1, 256, 2048);
    (gpt3_h100.schedule, gpt3_h100.virtual_stages) = (Schedule::Interleaved, 6);
    gpt3_h100.precision = Precision::Fp8;
    let mut gpt3_a100 = strategy(8, 8, 16, 1, 1536, 2048);
    (gpt3_a100.schedule, gpt3_a100.virtual_stages) = (Schedule::Interleaved, 2);
    gpt3_a100.recompute = Recompute::Full;
    let cases = [
        ("gpt3-175b", "dgx-a100-80gb", gpt3_a100),
        ("llama3-8b", "dgx-h100", strategy(1, 1, 8, 1, 128, 8192)),
        ("llama3-70b", "dgx-h100", strategy(8, 4, 2, 1, 128, 8192)),
        ("gpt3-175b", "dgx-h100", gpt3_h100),
        ("mixtral-8x7b", "dgx-h100", strategy(1, 4, 8, 1, 64, 4096)),
        ("llama3-70b", "dgx-h100", {
            // Megatron-Bridge's Llama-3 70B recipe: FP8 with per-tensor current scaling.
            let mut s = strategy(4, 8, 2, 1, 128, 8192);
            (s.schedule, s.virtual_stages) = (Schedule::Interleaved, 5);
            s.precision = Precision::Fp8Tensorwise;
            s
        }),
    ];
    for (model, cluster, s) in cases {
        let p = plan(model, cluster, &s);
        let e = planner::export::export(&p, Engine::Megatron).unwrap();
        let v = check_args(&e.args);
        if s.precision.is_fp8() {
            let recipe = if s.precision == Precision::Fp8 {
                "delayed"
            } else {
                "tensorwise"
            };
            assert_eq!(v.get("--fp8-recipe").map(String::as_str), Some(recipe));
        }
        // The gradients in the 16-bit dtype the plan's memory counts them in (2 bytes a
        // parameter), not Megatron's fp32 default under --bf16.
        assert_eq!(
            v.contains_key("--grad-reduce-in-bf16"),
            s.precision.grad_bytes() == 2.0 && v.contains_key("--bf16"),
            "{model}"
        );
        assert_eq!(int(&v, "--tensor-model-parallel-size"), u64::from(s.tp));
        assert_eq!(int(&v, "--pipeline-model-parallel-size"), u64::from(s.pp));
        assert_eq!(int(&v, "--micro-batch-size"), s.micro_batch);
        assert_eq!(int(&v, "--global-batch-size"), s.global_batch);
        assert_eq!(int(&v, "--seq-length"), s.seq);
        assert_eq!(v.contains_key("--sequence-parallel"), s.sequence_parallel);
        if s.virtual_stages > 1 {
            let per_chunk = int(&v, "--num-layers-per-virtual-pipeline-stage");
            let layers = int(&v, "--num-layers");
            assert_eq!(
                layers / per_chunk / u64::from(s.pp),
                u64::from(s.virtual_stages)
            );
        }
        assert_eq!(
            v.contains_key("--use-distributed-optimizer"),
            s.zero >= 1,
            "{model}: ZeRO-{}",
            s.zero
        );
        let ours = p.model.params as f64;
        let theirs = megatron_parameters(&v);
        let gap = (ours - theirs) / ours;
        println!(
            "{model} on {cluster}: {} arguments; parameters {ours:.4e} plait, {theirs:.4e} Megatron ({:+.2e})",
            e.args.len(),
            gap
        );
        assert!(
            gap.abs() < 1e-3,
            "{model}: Megatron builds {theirs:.6e} parameters, plait counts {ours:.6e}"
        );
        assert!(e.launch.contains("pretrain_gpt.py"), "{}", e.launch);
    }
}

/// Today's families from their published config.json files (`fixtures/hf/`): each exports
/// with Megatron's own parameter count from its arguments within 1e-3 of plait's (heads wider
/// or narrower than hidden / heads by `--kv-channels`, Qwen2's q/k/v biases by
/// `--add-qkv-bias`, per-head q/k norms by `--qk-layernorm`, GLM-4.5's half-head rotary by
/// `--rotary-percent`), or is refused naming what
/// Megatron's GPT model cannot build. Gemma's GeGLU once exported as a plain GELU MLP and
/// Mistral-Nemo's 128-wide heads as 160-wide ones (Megatron's counts 29 % and 4 % off).
#[test]
fn published_families_export_with_megatrons_count_or_are_refused_by_name() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf");
    let spec = |name: &str| import::hf::read_config(&fixtures.join(name).join("config.json"));
    let s = strategy(1, 1, 8, 1, 64, 4096);
    let exported: [(&str, &[&str]); 8] = [
        ("qwen2.5-7b", &["--add-qkv-bias", "--disable-bias-linear"]),
        ("nemotron-mini-4b", &["--squared-relu", "--rotary-percent"]),
        ("qwen3-8b", &["--qk-layernorm", "--disable-bias-linear"]),
        ("mistral-nemo-base", &["--kv-channels"]),
        ("phi-3-mini-4k", &["--disable-bias-linear", "--window-size"]),
        ("qwen3-30b-a3b", &["--kv-channels", "--qk-layernorm"]),
        // Every fourth layer without rotary embeddings.
        ("smollm3-3b", &["--no-rope-freq", "--disable-bias-linear"]),
        // Biases on q, k and v only, half of each head rotated, a dense layer before sigmoid-
        // routed experts beside a shared one.
        (
            "glm-4.5-air",
            &[
                "--add-qkv-bias",
                "--disable-bias-linear",
                "--rotary-percent",
                "--kv-channels",
                "--moe-shared-expert-intermediate-size",
                "--moe-layer-freq",
            ],
        ),
    ];
    for (name, flags) in exported {
        let spec = spec(name).unwrap();
        let p = plan_of(&spec, name, "dgx-h100", &s);
        let e = planner::export::export(&p, Engine::Megatron).unwrap();
        let v = check_args(&e.args);
        for f in flags {
            assert!(v.contains_key(*f), "{name}: {f} missing from {:?}", e.args);
        }
        assert_eq!(
            v.contains_key("--add-qkv-bias"),
            spec.variant.qkv_bias,
            "{name}"
        );
        if let Some(share) = v.get("--rotary-percent") {
            // Nemotron-Mini's and GLM-4.5-Air's partial_rotary_factor.
            assert_eq!(share.parse::<f64>().unwrap(), 0.5, "{name}");
        }
        if let Some(d) = v.get("--kv-channels") {
            assert_eq!(d.parse::<u64>().unwrap(), spec.head_dim(), "{name}");
        }
        let (ours, theirs) = (p.model.params as f64, megatron_parameters(&v));
        assert!(
            ((ours - theirs) / ours).abs() < 1e-3,
            "{name}: Megatron builds {theirs:.6e} parameters, plait counts {ours:.6e}"
        );
    }
    for (name, feature) in [
        ("gemma-7b", "GeGLU"),
        // Its windowed layers rotate by rope_local_base_freq, the others by rope_theta.
        (
            "gemma-3-1b",
            "rotary embeddings whose base or scaling differs",
        ),
        ("gemma-2-9b", "soft-capped"),
        ("glm-4-9b-0414", "GLM-4"),
        ("qwen1.5-moe-a2.7b", "sigmoid gate"),
        ("olmo-2-1124-7b", "OLMo 2"),
        ("olmoe-1b-7b", "OLMoE"),
        // Its whole-projection norms reach attention through a partial rotary's slice and
        // concatenation.
        ("minimax-m2.7-nvfp4", "MiniMax-M2's q_norm"),
        ("granite-3.1-2b-instruct", "Granite"),
        ("granite-3.1-3b-a800m", "Granite"),
        ("pythia-160m", "in parallel"),
        ("phi-2", "in parallel"),
        ("falcon-7b", "in parallel"),
        ("command-r7b", "in parallel"),
        ("gpt-oss-20b", "attention sinks"),
    ] {
        let p = plan_of(&spec(name).unwrap(), name, "dgx-h100", &s);
        match planner::export::export(&p, Engine::Megatron) {
            Err(PlanError::Unexportable { feature: f, .. }) => {
                assert!(f.contains(feature), "{name}: {f}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// OLMo 1's LayerNorms have no weight or bias, and its q, k and v may be clamped
/// (`clip_qkv`); Hunyuan norms q and k after the rotary; NanoChat's RMSNorms have no weight:
/// none is an argument of Megatron's GPT model, and each is named.
#[test]
fn olmo_1_hunyuan_and_nanochat_are_refused_by_name() {
    let olmo = r#"{"model_type":"olmo","hidden_size":2048,"intermediate_size":8192,
        "num_hidden_layers":16,"num_attention_heads":16,"vocab_size":50304,
        "max_position_embeddings":2048,"tie_word_embeddings":true,"clip_qkv":null}"#;
    let s = strategy(1, 1, 8, 1, 64, 2048);
    let hunyuan = olmo
        .replace("\"olmo\"", "\"hunyuan_v1_dense\"")
        .replace(",\"clip_qkv\":null", "");
    let nanochat = olmo
        .replace("\"olmo\"", "\"nanochat\"")
        .replace(",\"clip_qkv\":null", "");
    for (config, feature) in [
        (olmo.to_string(), "OLMo 1's"),
        (olmo.replace("null", "8.0"), "clip_qkv"),
        (hunyuan, "after the rotary"),
        (nanochat, "NanoChat's RMSNorms"),
    ] {
        let spec = import::hf::parse_config(&config, std::path::Path::new("config.json")).unwrap();
        let p = plan_of(&spec, "olmo", "dgx-h100", &s);
        match planner::export::export(&p, Engine::Megatron) {
            Err(PlanError::Unexportable { feature: f, .. }) => {
                assert!(f.contains(feature), "{feature}: {f}")
            }
            other => panic!("{feature}: {other:?}"),
        }
    }
}

/// GPT-NeoX in Llama's order (`use_parallel_residual: false`) is a block Megatron builds:
/// LayerNorms, biases on every linear layer, a quarter of each head rotated
/// (`--rotary-percent 0.25`), untied; its parameters from the arguments within 1e-3.
#[test]
fn sequential_gpt_neox_exports_with_a_quarter_head_rotary() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf");
    let file = fixtures.join("pythia-160m/config.json");
    let text = std::fs::read_to_string(&file).unwrap().replace(
        r#""use_parallel_residual": true"#,
        r#""use_parallel_residual": false"#,
    );
    let spec = import::hf::parse_config(&text, &file).unwrap();
    assert_eq!(spec.variant.parallel, None);
    let p = plan_of(
        &spec,
        "pythia-160m",
        "dgx-h100",
        &strategy(1, 1, 8, 1, 64, 2048),
    );
    let e = planner::export::export(&p, Engine::Megatron).unwrap();
    let v = check_args(&e.args);
    assert_eq!(v["--rotary-percent"].parse::<f64>().unwrap(), 0.25);
    assert_eq!(v["--normalization"], "LayerNorm");
    assert!(!v.contains_key("--disable-bias-linear") && !v.contains_key("--swiglu"));
    assert!(v.contains_key("--untie-embeddings-and-output-weights"));
    let (ours, theirs) = (p.model.params as f64, megatron_parameters(&v));
    assert!(((ours - theirs) / ours).abs() < 1e-3, "{ours} vs {theirs}");
}

/// NVIDIA's own Megatron-LM model arguments for DeepSeek-V2-Lite and DeepSeek-R1 (V3's
/// architecture), in core_v0.15.0's `examples/post_training/modelopt/conf/deepseek-ai/
/// {DeepSeek-V2-Lite,DeepSeek-R1}.sh`: the flags plait's export must give for the published
/// config.json files. Left out of the comparison: their tokenizer's vocabulary padding, the
/// load-balancing settings (aux-loss coefficients, V3's `--moe-router-enable-expert-bias`,
/// whose bias plait holds at zero, as it starts), `--kv-channels` (MLA ignores it) and a
/// `--moe-router-pre-softmax` beside a sigmoid score (which it ignores).
const NVIDIA_DEEPSEEK: [(&str, &[(&str, &str)]); 2] = [
    (
        "deepseek-v2-lite",
        &[
            ("--num-layers", "27"),
            ("--hidden-size", "2048"),
            ("--ffn-hidden-size", "10944"),
            ("--num-attention-heads", "16"),
            ("--multi-latent-attention", ""),
            ("--kv-lora-rank", "512"),
            ("--v-head-dim", "128"),
            ("--qk-head-dim", "128"),
            ("--qk-layernorm", ""),
            ("--qk-pos-emb-head-dim", "64"),
            ("--num-experts", "64"),
            ("--moe-layer-freq", "([0]+[1]*26)"),
            ("--moe-ffn-hidden-size", "1408"),
            ("--moe-router-topk", "6"),
            ("--moe-router-pre-softmax", ""),
            ("--moe-shared-expert-intermediate-size", "2816"),
            ("--normalization", "RMSNorm"),
            ("--norm-epsilon", "1e-6"),
            ("--swiglu", ""),
            ("--disable-bias-linear", ""),
            ("--untie-embeddings-and-output-weights", ""),
            ("--position-embedding-type", "rope"),
            ("--rotary-base", "10000"),
            ("--rotary-scaling-factor", "40"),
            ("--mscale", "0.707"),
            ("--mscale-all-dim", "0.707"),
        ],
    ),
    (
        "deepseek-v3",
        &[
            ("--num-layers", "61"),
            ("--hidden-size", "7168"),
            ("--ffn-hidden-size", "18432"),
            ("--num-attention-heads", "128"),
            ("--multi-latent-attention", ""),
            ("--kv-lora-rank", "512"),
            ("--v-head-dim", "128"),
            ("--q-lora-rank", "1536"),
            ("--qk-head-dim", "128"),
            ("--qk-layernorm", ""),
            ("--qk-pos-emb-head-dim", "64"),
            ("--num-experts", "256"),
            ("--moe-layer-freq", "[0]*3+[1]*58"),
            ("--moe-ffn-hidden-size", "2048"),
            ("--moe-router-score-function", "sigmoid"),
            ("--moe-router-topk", "8"),
            ("--moe-router-num-groups", "8"),
            ("--moe-router-group-topk", "4"),
            ("--moe-router-topk-scaling-factor", "2.5"),
            ("--moe-shared-expert-intermediate-size", "2048"),
            ("--normalization", "RMSNorm"),
            ("--swiglu", ""),
            ("--disable-bias-linear", ""),
            ("--untie-embeddings-and-output-weights", ""),
            ("--position-embedding-type", "rope"),
            ("--rotary-base", "10000"),
            ("--rotary-scaling-factor", "40"),
            ("--mscale", "1.0"),
            ("--mscale-all-dim", "1.0"),
        ],
    ),
];

/// DeepSeek-V2-Lite and V3 (multi-head latent attention with YaRN, dense layers before the
/// expert layers, shared experts, routed scaling, group-limited sigmoid routing) export with
/// NVIDIA's own arguments for those models and Megatron's own parameter count within 1e-3.
#[test]
fn deepseek_exports_as_nvidias_own_megatron_arguments() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf");
    for (name, reference) in NVIDIA_DEEPSEEK {
        let spec = import::hf::read_config(&fixtures.join(name).join("config.json")).unwrap();
        let mut s = strategy(8, 1, 4, 1, 64, 4096);
        s.attention = planner::cost::compute::AttentionKernel::Fused;
        let p = plan_of(&spec, name, "dgx-h100", &s);
        let e = planner::export::export(&p, Engine::Megatron).unwrap();
        let v = check_args(&e.args);
        let layers = int(&v, "--num-layers");
        for (flag, theirs) in reference {
            let ours = v
                .get(*flag)
                .unwrap_or_else(|| panic!("{name}: {flag} missing from {:?}", e.args));
            let same = match (ours.parse::<f64>(), theirs.parse::<f64>()) {
                (Ok(a), Ok(b)) => (a - b).abs() <= 1e-9 * b.abs(),
                _ if *flag == "--moe-layer-freq" => {
                    moe_layer_pattern(ours, layers) == moe_layer_pattern(theirs, layers)
                }
                _ => ours == theirs,
            };
            assert!(same, "{name}: {flag} {ours}, NVIDIA's {theirs}");
        }
        assert!(!v.contains_key("--kv-channels"), "{name}");
        assert!(!v.contains_key("--rotary-percent"), "{name}");
        // Transformer Engine's FlashAttention refuses MLA's unequal head widths; Megatron
        // turns userbuffer overlap off for MLA's projections (so it is not asked for).
        assert_eq!(v["--attention-backend"], "fused", "{name}");
        assert!(v.contains_key("--sequence-parallel"), "{name}");
        assert!(!v.contains_key("--tp-comm-overlap"), "{name}");
        let (ours, theirs) = (p.model.params as f64, megatron_parameters(&v));
        println!("{name}: parameters {ours:.6e} plait, {theirs:.6e} Megatron");
        assert!(
            ((ours - theirs) / ours).abs() < 1e-3,
            "{name}: Megatron builds {theirs:.6e} parameters, plait counts {ours:.6e}"
        );
    }
}

/// Each layer's attention window as Megatron-Core builds it from the arguments (its
/// `TransformerConfig`: `window_size` = (keys to the left, keys to the right) of the query,
/// and with `window_attn_skip_freq` n, layer numbers (from 1) divisible by n attend fully).
fn megatron_windows(v: &HashMap<String, String>, layers: u64) -> Vec<Option<u64>> {
    let Some(size) = v.get("--window-size") else {
        return vec![None; layers as usize];
    };
    let (left, right) = size.split_once(',').unwrap();
    assert_eq!(right, "0", "a causal window");
    let keys = left.parse::<u64>().unwrap() + 1;
    let skip = v
        .get("--window-attn-skip-freq")
        .map(|n| n.parse::<u64>().unwrap());
    (1..=layers)
        .map(|number| match skip {
            Some(n) if number % n == 0 => None,
            _ => Some(keys),
        })
        .collect()
}

/// Sliding windows export as Megatron-Core's `--window-size` and `--window-attn-skip-freq`
/// and build each layer's window as plait's graph has it: Phi-3-mini's 2047 keys on every
/// layer, a Mistral whose `layer_types` make every second or every fourth layer full; a
/// pattern the two flags cannot say is refused by name.
#[test]
fn sliding_windows_export_as_megatrons_window_flags() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf");
    let phi3 = import::hf::read_config(&fixtures.join("phi-3-mini-4k/config.json")).unwrap();
    let mistral = |types: &str| {
        let text = format!(
            r#"{{"model_type":"mistral","hidden_size":1024,"intermediate_size":2048,
            "num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":8,
            "vocab_size":32000,"sliding_window":512,"layer_types":{types}}}"#
        );
        import::hf::parse_config(&text, std::path::Path::new("config.json")).unwrap()
    };
    let (sw, full) = ("\"sliding_attention\"", "\"full_attention\"");
    let s = strategy(1, 1, 8, 1, 64, 4096);
    for (name, spec) in [
        ("phi-3-mini-4k", phi3),
        (
            "mistral 1:1",
            mistral(&format!("[{sw},{full},{sw},{full}]")),
        ),
        ("mistral 3:1", mistral(&format!("[{sw},{sw},{sw},{full}]"))),
    ] {
        let g = import::build_forward(&spec, DType::F32).unwrap();
        let ours: Vec<Option<u64>> = g
            .op_ids()
            .filter(|&o| matches!(g.op(o).kind, ir::OpKind::Attention { .. }))
            .map(|o| g.op(o).kind.attention_window())
            .collect();
        assert!(ours.iter().any(Option::is_some), "{name}");
        let p = plan_of(&spec, name, "dgx-h100", &s);
        let v = check_args(&planner::export::export(&p, Engine::Megatron).unwrap().args);
        assert_eq!(megatron_windows(&v, spec.layers), ours, "{name}");
    }
    let p = plan_of(
        &mistral(&format!("[{full},{sw},{sw},{full}]")),
        "mistral",
        "dgx-h100",
        &s,
    );
    match planner::export::export(&p, Engine::Megatron) {
        Err(PlanError::Unexportable { feature, .. }) => {
            assert!(
                feature.contains("sliding-window layers [1, 2]"),
                "{feature}"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// Whether each layer skips its rotary embedding as Megatron-Core reads `--no-rope-freq`
/// (`no_rope_freq_type` and `TransformerConfig`: n repeats `[0] * (n − 1) + [1]` over the
/// layers, which must be whole periods; a list gives 1 (skip) or 0 per layer, and may hold
/// only digits, commas, brackets, parentheses, `+` and `*`).
fn megatron_nope(v: &HashMap<String, String>, layers: u64) -> Vec<bool> {
    let Some(freq) = v.get("--no-rope-freq") else {
        return vec![false; layers as usize];
    };
    if let Ok(n) = freq.parse::<u64>() {
        assert_eq!(layers % n, 0, "whole periods of {n}");
        return (1..=layers).map(|number| number % n == 0).collect();
    }
    assert!(
        freq.chars()
            .all(|c| c.is_ascii_digit() || ",[]()+*".contains(c)),
        "{freq}: Megatron's pattern check"
    );
    let list: Vec<bool> = freq
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|x| x == "1")
        .collect();
    assert_eq!(list.len() as u64, layers, "{freq}");
    list
}

/// Layers without rotary embeddings export as Megatron-Core's `--no-rope-freq`, and Megatron
/// skips the rotary of the layers plait's graph leaves unrotated: SmolLM3-3B's every fourth
/// (`4`), and a SmolLM3 whose first and last layers are NoPE (the list), still turning the
/// others by the config's base; EXAONE 4's post-norm block is refused.
#[test]
fn nope_layers_export_as_megatrons_no_rope_freq() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf");
    let smollm3 = import::hf::read_config(&fixtures.join("smollm3-3b/config.json")).unwrap();
    let custom = import::hf::parse_config(
        r#"{"model_type":"smollm3","hidden_size":1024,"intermediate_size":2048,
        "num_hidden_layers":8,"num_attention_heads":8,"num_key_value_heads":4,
        "vocab_size":32000,"rope_theta":100000,"no_rope_layers":[0,1,1,1,1,1,1,0]}"#,
        std::path::Path::new("config.json"),
    )
    .unwrap();
    let s = strategy(1, 1, 8, 1, 64, 4096);
    for (name, spec, freq, base) in [
        ("smollm3-3b", smollm3, "4", "5000000"),
        ("first and last", custom, "[1,0,0,0,0,0,0,1]", "100000"),
    ] {
        let g = import::build_forward(&spec, DType::F32).unwrap();
        let ours: Vec<bool> = g
            .ops_by_layer()
            .iter()
            .map(|ops| {
                ops.iter().any(|&o| {
                    matches!(&g.op(o).kind, ir::OpKind::Rotary { scaling, .. } if scaling.is_nope())
                })
            })
            .collect();
        assert!(ours.contains(&true), "{name}");
        let p = plan_of(&spec, name, "dgx-h100", &s);
        let v = check_args(&planner::export::export(&p, Engine::Megatron).unwrap().args);
        assert_eq!(v["--no-rope-freq"], freq, "{name}");
        assert_eq!(v["--rotary-base"], base, "{name}");
        assert_eq!(megatron_nope(&v, spec.layers), ours, "{name}");
    }
    // EXAONE 4's NoPE layers sit in a block whose norms follow attention and the MLP, with
    // per-head q/k norms: not Megatron's pre-norm layer, refused by name (not exported as one).
    let exaone4 = import::hf::parse_config(
        r#"{"model_type":"exaone4","hidden_size":1024,"intermediate_size":2048,
        "num_hidden_layers":8,"num_attention_heads":8,"num_key_value_heads":4,
        "vocab_size":32000}"#,
        std::path::Path::new("config.json"),
    )
    .unwrap();
    let p = plan_of(&exaone4, "exaone4", "dgx-h100", &s);
    for engine in [Engine::Megatron, Engine::Torchtitan] {
        match planner::export::export(&p, engine) {
            Err(PlanError::Unexportable { feature, .. }) => {
                assert!(feature.contains("instead of before them"), "{feature}")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn what_megatron_cannot_run_is_refused_by_name() {
    let mut gpipe = strategy(1, 4, 2, 1, 64, 2048);
    gpipe.schedule = Schedule::Gpipe;
    let mut zero3_pp = strategy(1, 4, 2, 1, 64, 2048);
    zero3_pp.zero = 3;
    for (s, feature) in [(gpipe, "GPipe"), (zero3_pp, "ZeRO-3 with a pipeline")] {
        let p = plan("gpt-1.7b", "dgx-a100-80gb", &s);
        match planner::export::export(&p, Engine::Megatron) {
            Err(PlanError::Unexportable { feature: f, .. }) => {
                assert!(f.contains(feature), "{f}")
            }
            other => panic!("{feature}: {other:?}"),
        }
    }
}

/// Each engine's limits as its own sources state them, written here apart from
/// `Engine::runs` so that the search is checked against them rather than against itself:
/// - Megatron-LM core_v0.15.0: `megatron/core/pipeline_parallel/schedules.py` offers 1F1B and
///   interleaved 1F1B; Megatron-FSDP (its ZeRO-2/3) does not run with pipeline parallelism.
/// - torchtitan 0.3.0: `data_parallel_replicate_degree` (DDP) and `data_parallel_shard_degree`
///   (FSDP2) are its data parallelism (no optimizer-only sharding);
///   `--training.mixed-precision-param {bfloat16,float32}` (its `--help`).
/// - DeepSpeed: ZeRO-2/3 are incompatible with its pipeline engine, whose schedule is 1F1B;
///   `ds_config.json` has no Megatron tensor, sequence or context parallelism or TE FP8.
fn engine_allows(e: Engine, s: &Strategy) -> bool {
    let piped = s.pp > 1;
    match e {
        Engine::Megatron => !(piped && (s.schedule == Schedule::Gpipe || s.zero >= 2)),
        Engine::Torchtitan => {
            !(s.zero == 1 && s.dp * s.cp > 1)
                && matches!(s.precision, Precision::Bf16 | Precision::Fp32)
        }
        Engine::Deepspeed => {
            !(piped && (s.zero >= 2 || s.schedule != Schedule::OneFOneB))
                && s.tp == 1
                && s.cp == 1
                && s.precision != Precision::Fp8
                && s.recompute != Recompute::Selective
        }
    }
}

/// `compile --target X` over a grid of models, GPU counts and global batches: the plan found
/// is one X runs by the engine's own limits ([`engine_allows`]), and a Megatron target's plan
/// exports. Without a target the same grid finds plans some engine refuses (so the rules bite).
#[test]
fn a_targeted_search_finds_only_what_the_engine_runs() {
    use planner::search::{Pins, SearchRequest, search};
    let cluster = Cluster::load("dgx-h100").unwrap();
    let mut refused_untargeted = 0;
    let mut compiles = 0;
    for model in ["gpt-1.7b", "llama3-8b", "mixtral-8x7b"] {
        let spec = import::zoo::find(model).unwrap();
        let g = import::build_forward(&spec, DType::F32).unwrap();
        let info = ModelInfo::new(&g).unwrap();
        for (gpus, batch) in [(8u64, 64u64), (16, 128), (32, 256), (64, 256), (128, 512)] {
            for target in [
                None,
                Some(Engine::Megatron),
                Some(Engine::Torchtitan),
                Some(Engine::Deepspeed),
            ] {
                let req = SearchRequest {
                    gpus,
                    global_batch: batch,
                    seq: 2048,
                    pins: Pins {
                        engine: target,
                        target: target.is_some(),
                        ..Pins::default()
                    },
                    top_k: 0,
                };
                let Ok(best) = search(&info, &cluster, &req, &mut |_, _| {}).unwrap() else {
                    continue;
                };
                compiles += 1;
                let s = &best.best.strategy;
                match target {
                    Some(e) => {
                        assert!(engine_allows(e, s), "{model} on {gpus} --target {e}: {s:?}");
                        assert!(e.runs(s).is_ok(), "{model} on {gpus} --target {e}: {s:?}");
                        if e == Engine::Megatron {
                            let p = Plan::new(
                                ModelRef::of("zoo", model, &info),
                                &info,
                                &cluster,
                                gpus,
                                &best.best,
                                SearchSummary {
                                    candidates_evaluated: 0,
                                    candidates_pruned: 0,
                                    target: None,
                                },
                                vec![],
                            );
                            check_args(&planner::export::export(&p, e).unwrap().args);
                        }
                    }
                    None => {
                        refused_untargeted += Engine::ALL
                            .iter()
                            .filter(|&&e| !engine_allows(e, s))
                            .count();
                        for e in Engine::ALL {
                            assert_eq!(e.runs(s).is_ok(), engine_allows(e, s), "{e}: {s:?}");
                        }
                    }
                }
            }
        }
    }
    println!(
        "{compiles} compiles; untargeted plans refused by {refused_untargeted} engine(s) in all"
    );
    assert!(compiles >= 50, "{compiles} compiles");
    assert!(
        refused_untargeted > 0,
        "no untargeted plan breaks an engine rule: the test proves nothing"
    );
}

/// DeepSpeed's configuration: its batch arithmetic closes over the plan's data-parallel degree
/// (DeepSpeed derives dp from the world size), the ZeRO stage and precision are the plan's, and
/// what its configuration cannot say (Megatron tensor parallelism, FP8, ZeRO-3 with a pipeline)
/// is refused.
#[test]
fn deepspeed_configs_close_their_batch_arithmetic_and_refuse_what_they_cannot_say() {
    let mut cases = Vec::new();
    for zero in 0..=3 {
        let mut s = strategy(1, 1, 16, 4, 256, 2048);
        s.zero = zero;
        cases.push(s);
    }
    let mut piped = strategy(1, 4, 4, 1, 64, 2048);
    piped.recompute = Recompute::Full;
    cases.push(piped);
    for s in cases {
        let p = plan("gpt-1.7b", "dgx-a100-80gb", &s);
        let e = planner::export::export(&p, Engine::Deepspeed).unwrap();
        let c = e.config.unwrap();
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
        assert_eq!(
            n("train_batch_size"),
            n("train_micro_batch_size_per_gpu")
                * n("gradient_accumulation_steps")
                * u64::from(s.dp)
        );
        assert_eq!(n("train_batch_size"), s.global_batch);
        assert_eq!(c["zero_optimization"]["stage"], u64::from(s.zero));
        assert_eq!(c["bf16"]["enabled"], true);
        // Accumulated in bf16, as the plan counts them (DeepSpeed's default is fp32).
        assert_eq!(c["data_types"]["grad_accum_dtype"], "bf16");
        assert_eq!(
            c.get("activation_checkpointing").is_some(),
            s.recompute == Recompute::Full
        );
    }
    let mut tp2 = strategy(2, 1, 8, 1, 64, 2048);
    tp2.sequence_parallel = false;
    let mut fp8 = strategy(1, 1, 8, 1, 64, 2048);
    fp8.precision = Precision::Fp8;
    let mut zero3_pp = strategy(1, 2, 4, 1, 64, 2048);
    zero3_pp.zero = 3;
    for (s, cluster, what) in [
        (tp2, "dgx-a100-80gb", "tensor parallelism"),
        (fp8, "dgx-h100", "FP8"),
        (zero3_pp, "dgx-a100-80gb", "ZeRO-3"),
    ] {
        let p = plan("gpt-1.7b", cluster, &s);
        match planner::export::export(&p, Engine::Deepspeed) {
            Err(PlanError::Unexportable { feature, .. }) => {
                assert!(feature.contains(what), "{feature}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

const TORCHTITAN_HELP: &str = include_str!("../../data/engines/torchtitan-0.3.0-llama3-help.txt");
const TORCHTITAN_FIELDS: &str =
    include_str!("../../data/engines/torchtitan-0.3.0-config-fields.tsv");

/// torchtitan's options from its own `--help`: each spelling (`--a.b-c`, and `--a.no-b-c` for
/// booleans) with its value form (`INT`, `{x,y}` choices, `STR`, or none for a switch).
fn torchtitan_options() -> HashMap<String, String> {
    let mut out = HashMap::new();
    for line in TORCHTITAN_HELP.lines() {
        let l = line.trim_start();
        if !l.starts_with("--") || line.starts_with("     ") {
            continue;
        }
        for spelling in l.split(", ") {
            let mut parts = spelling.splitn(2, ' ');
            let name = parts.next().unwrap_or("").to_string();
            let form = parts.next().unwrap_or("").trim().to_string();
            out.insert(name, form);
        }
    }
    out
}

/// Checks a torchtitan argument list against its help and field list.
fn check_torchtitan(args: &[String]) -> HashMap<String, String> {
    let options = torchtitan_options();
    assert!(
        options.len() > 100,
        "the help is read ({} options)",
        options.len()
    );
    let schedules: Vec<&str> = TORCHTITAN_FIELDS
        .lines()
        .find(|l| l.contains("Pipeline schedule names"))
        .and_then(|l| l.split(": ").nth(1))
        .map(|l| l.trim_end_matches('.').split(", ").collect())
        .unwrap();
    let mut values = HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let name = &args[i];
        if let Some(mode) = name.strip_prefix("activation-checkpoint:") {
            assert!(
                ["selective", "full", "memory-budget", "none"].contains(&mode),
                "{name}"
            );
            assert_eq!(i + 1, args.len(), "the subcommand comes last");
            values.insert("activation-checkpoint".into(), mode.into());
            break;
        }
        let value = if name == "--module" || name == "--config" {
            i += 1;
            args[i].clone()
        } else {
            let form = options
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not an option of torchtitan 0.3.0"));
            if form.is_empty() {
                String::new()
            } else if form.contains("[A,B,C,... [A,B,C,...") {
                // A list of lists: one comma-separated argument per inner list.
                let mut parts = Vec::new();
                while args
                    .get(i + 1)
                    .is_some_and(|a| !a.starts_with("--") && !a.contains(':'))
                {
                    i += 1;
                    parts.push(args[i].clone());
                }
                assert!(!parts.is_empty(), "{name} needs its lists");
                parts.join(" ")
            } else {
                i += 1;
                let v = args[i].clone();
                if form.ends_with("INT") {
                    assert!(v.parse::<i64>().is_ok(), "{name} {v}: not an int");
                } else if let Some(choices) =
                    form.strip_prefix('{').and_then(|f| f.strip_suffix('}'))
                {
                    assert!(
                        choices.split(',').any(|c| c == v),
                        "{name} {v}: not in {form}"
                    );
                }
                v
            }
        };
        if name == "--parallelism.pipeline-parallel-schedule" {
            assert!(
                schedules.contains(&value.as_str()),
                "{value}: not in {schedules:?}"
            );
        }
        values.insert(name.clone(), value);
        i += 1;
    }
    values
}

#[test]
fn llama_plans_export_to_torchtitan_options_it_accepts() {
    let mut fsdp = strategy(1, 1, 8, 1, 128, 8192);
    fsdp.zero = 3;
    let mut tp_pp = strategy(8, 4, 2, 1, 128, 8192);
    (tp_pp.zero, tp_pp.schedule, tp_pp.virtual_stages) = (3, Schedule::Interleaved, 5);
    tp_pp.recompute = Recompute::Full;
    let mut uneven = strategy(8, 4, 2, 1, 128, 8192);
    uneven.zero = 3;
    uneven.stage_layers = Some(vec![19, 21, 21, 19]);
    for (model, s, config) in [
        ("llama3-8b", fsdp, "llama3_8b"),
        ("llama3-70b", tp_pp, "llama3_70b"),
        ("llama3-70b", uneven, "llama3_70b"),
    ] {
        let p = plan(model, "dgx-h100", &s);
        let e = planner::export::export(&p, Engine::Torchtitan).unwrap();
        let v = check_torchtitan(&e.args);
        assert_eq!(v["--config"], config);
        let n = |k: &str| v[k].parse::<u64>().unwrap_or_else(|_| panic!("{k}"));
        let dp = n("--parallelism.data-parallel-replicate-degree")
            * n("--parallelism.data-parallel-shard-degree");
        assert_eq!(dp, u64::from(s.dp));
        assert_eq!(n("--parallelism.tensor-parallel-degree"), u64::from(s.tp));
        assert_eq!(n("--training.global-batch-size"), s.global_batch);
        if s.pp > 1 {
            assert_eq!(n("--parallelism.pipeline-parallel-degree"), u64::from(s.pp));
            // Every layer in exactly one model chunk.
            let parts: Vec<u64> = match v.get("--parallelism.module-fqns-per-model-part") {
                Some(fqns) => fqns
                    .split(' ')
                    .map(|part| part.split(',').filter(|m| m.starts_with("layers.")).count() as u64)
                    .collect(),
                None => vec![
                    n("--parallelism.pipeline-parallel-layers-per-stage");
                    (s.pp * s.virtual_stages) as usize
                ],
            };
            assert_eq!(parts.len() as u32, s.pp * s.virtual_stages);
            assert_eq!(parts.iter().sum::<u64>(), u64::from(p.model.layers));
            assert!(v.contains_key("--training.disable-cuda-graphs"));
        }
        assert!(e.launch.contains("-m torchtitan.train"));
    }
    // A model torchtitan has no configuration for, and ZeRO-1, are refused by name.
    let mut ddp = strategy(1, 1, 8, 1, 64, 2048);
    ddp.zero = 0;
    let zero1 = strategy(1, 1, 8, 1, 128, 8192);
    for (model, s, what) in [
        ("gpt-1.7b", ddp, "24 layers"),
        ("llama3-8b", zero1, "ZeRO-1"),
    ] {
        let p = plan(model, "dgx-h100", &s);
        match planner::export::export(&p, Engine::Torchtitan) {
            Err(PlanError::Unexportable { feature, .. }) => {
                assert!(feature.contains(what), "{feature}")
            }
            other => panic!("{model}: {other:?}"),
        }
    }
}

/// The router's scoring reaches Megatron-Core's flags: Mixtral's softmax over the top k is its
/// default; unnormalized softmax shares are `--moe-router-pre-softmax`; a group-limited sigmoid
/// names its score function and groups; unnormalized sigmoid weights (which Megatron always
/// renormalizes) are refused.
#[test]
fn megatron_routers_match_the_models_routing() {
    let s = strategy(1, 4, 8, 1, 64, 4096);
    let export = |routing: ir::Routing| {
        let mut spec = import::zoo::find("mixtral-8x7b").unwrap();
        spec.variant.routing = routing;
        let p = plan_of(&spec, "mixtral-8x7b", "dgx-h100", &s);
        planner::export::export(&p, Engine::Megatron).map(|e| check_args(&e.args))
    };
    let mixtral = export(ir::Routing::default()).unwrap();
    assert!(!mixtral.contains_key("--moe-router-pre-softmax"));
    assert!(!mixtral.contains_key("--moe-router-score-function"));
    let shares = export(ir::Routing {
        normalize: false,
        ..ir::Routing::default()
    })
    .unwrap();
    assert!(shares.contains_key("--moe-router-pre-softmax"));
    let grouped = export(ir::Routing {
        sigmoid: true,
        normalize: true,
        groups: 4,
        groups_kept: 1,
        group_top: 2,
    })
    .unwrap();
    assert_eq!(grouped["--moe-router-score-function"], "sigmoid");
    assert_eq!(int(&grouped, "--moe-router-num-groups"), 4);
    assert_eq!(int(&grouped, "--moe-router-group-topk"), 1);
    // DeepSeek-V2's groups, scored by their best expert: Megatron's best k / group-topk is
    // that one expert with two groups kept for top-2, and two experts with one group kept.
    let by_best = |groups_kept| {
        export(ir::Routing {
            normalize: false,
            groups: 4,
            groups_kept,
            group_top: 1,
            ..ir::Routing::default()
        })
    };
    assert_eq!(int(&by_best(2).unwrap(), "--moe-router-group-topk"), 2);
    let unstated = by_best(1);
    assert!(
        matches!(unstated, Err(PlanError::Unexportable { ref feature, .. })
            if feature.contains("best 1 expert")),
        "{unstated:?}"
    );
    let unnormalized = export(ir::Routing {
        sigmoid: true,
        normalize: false,
        groups: 1,
        groups_kept: 1,
        group_top: 2,
    });
    assert!(
        matches!(unnormalized, Err(PlanError::Unexportable { ref feature, .. })
            if feature.contains("sigmoid")),
        "{unnormalized:?}"
    );
}

/// Llama 3.1's rope scaling is Megatron-Core's `--use-rope-scaling` (bands fixed at 1 and 4
/// over 8192 positions); a scaling it cannot state is refused, not dropped.
#[test]
fn megatron_rope_scaling_is_stated_or_refused() {
    let s = strategy(1, 1, 8, 1, 128, 8192);
    let export = |scaling: ir::RopeScaling| {
        let mut spec = import::zoo::find("llama3-8b").unwrap();
        spec.rope_scaling = scaling;
        let p = plan_of(&spec, "llama3-8b", "dgx-h100", &s);
        planner::export::export(&p, Engine::Megatron).map(|e| check_args(&e.args))
    };
    let plain = export(ir::RopeScaling::None).unwrap();
    assert!(!plain.contains_key("--use-rope-scaling"));
    let llama31 = export(ir::RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max: 8192.0,
    })
    .unwrap();
    assert!(llama31.contains_key("--use-rope-scaling"));
    assert_eq!(llama31["--rope-scaling-factor"], "8");
    let yarn = export(ir::RopeScaling::Yarn {
        factor: 4.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        original_max: 32768.0,
        attention_factor: 1.1,
        truncate: true,
    });
    assert!(
        matches!(yarn, Err(PlanError::Unexportable { ref feature, .. }) if feature.contains("Yarn")),
        "{yarn:?}"
    );
    // Latent attention's YaRN over other than the 4096 original positions MLA fixes.
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf");
    let mut lite = import::hf::read_config(&fixtures.join("deepseek-v2-lite/config.json")).unwrap();
    if let ir::RopeScaling::Yarn { original_max, .. } = &mut lite.rope_scaling {
        *original_max = 8192.0;
    }
    let p = plan_of(
        &lite,
        "deepseek-v2-lite",
        "dgx-h100",
        &strategy(1, 1, 8, 1, 64, 4096),
    );
    let refused = planner::export::export(&p, Engine::Megatron);
    assert!(
        matches!(refused, Err(PlanError::Unexportable { ref feature, .. })
            if feature.contains("latent attention") && feature.contains("8192")),
        "{refused:?}"
    );
    // Latent attention without rope scaling: plain rope, whose fusion Megatron's MLA refuses.
    let path = fixtures.join("deepseek-v2-lite/config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("rope_scaling");
    let plain = import::hf::parse_config(&config.to_string(), &path).unwrap();
    let p = plan_of(
        &plain,
        "deepseek-v2-lite",
        "dgx-h100",
        &strategy(1, 1, 8, 1, 64, 4096),
    );
    let v = check_args(&planner::export::export(&p, Engine::Megatron).unwrap().args);
    assert_eq!(v["--rope-type"], "rope");
    assert!(v.contains_key("--no-rope-fusion"));
    assert!(!v.contains_key("--mscale"));
}
