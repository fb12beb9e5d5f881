//! Training on `DeviceBackend` (the CUDA backend's lowering and kernels) run on the `simt`
//! emulator: the tiny GPT's losses equal the CPU backend's within 1e-4 relative on one rank,
//! and DP 2 / TP 2 (threads, one emulated device each) equal one rank: acceptance 2's f32 rows
//! of issue 15, checked here without a GPU. Prints the host round trips per step that remain
//! (the ops the device does not lower yet).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Config, LLAMA, MODEL, ODD_VOCAB, WIDE_HEADS, loss_diff, programs, text, train};
use planner::Schedule;
use runtime::DeviceBackend;
use runtime::comm::ThreadComm;
use runtime::exec::{Init, p2p};
use runtime::train::{RankOutcome, TrainOptions, train_rank};
use tests::emulator::{Emulator, emulator, emulator_bf16, emulator_mma, emulator_with_collectives};

const STEPS: u64 = 4;

fn options() -> TrainOptions {
    TrainOptions {
        steps: STEPS,
        seed: 7,
        init: Init::Seed(7),
        timeout: Duration::from_secs(120),
        checkpoint: None,
        reproducible: false,
        dp_comm: Default::default(),
        device: Default::default(),
        op_times: false,
    }
}

/// Every rank of `set` as a thread, each on its own emulated device; with rank 0's host ops
/// by kind.
fn train_emulated(
    set: &codegen::ProgramSet,
    device: fn(u32) -> DeviceBackend<Emulator>,
) -> (Vec<RankOutcome>, Vec<(String, u64)>) {
    let opts = options();
    let data = text();
    let kinds = std::sync::Mutex::new(Vec::new());
    let outs = ThreadComm::run(set.ranks.len(), opts.timeout, |c| {
        let device = device(32);
        let rank = runtime::comm::Communicator::rank(&c);
        let host_ops = device.host_ops();
        let out = train_rank(set, device, c, &data, &opts, &|_, _| {});
        if rank == 0 {
            *kinds.lock().unwrap() = host_ops.by_kind();
        }
        out
    })
    .unwrap()
    .into_iter()
    .map(Result::unwrap)
    .collect();
    (outs, kinds.into_inner().unwrap())
}

/// Trains `model` under `c` on emulated devices against one CPU rank; returns rank 0's
/// transfers per step and the micro-batches per step.
fn check(model: &str, c: &Config, what: &str) -> (runtime::TransferStats, u64) {
    check_on(model, c, what, emulator)
}

/// [`check`] on the devices `device` makes.
fn check_on(
    model: &str,
    c: &Config,
    what: &str,
    device: fn(u32) -> DeviceBackend<Emulator>,
) -> (runtime::TransferStats, u64) {
    let one = train(&programs(model, &Config::new(1, 1, 1)), STEPS, 7);
    let set = programs(model, c);
    let (outs, kinds) = train_emulated(&set, device);
    let diff = loss_diff(&outs[0].losses, &one.losses);
    let t = outs[0].transfers_per_step.unwrap();
    println!(
        "{what}: losses {:?}, CPU one rank {:?}, max relative difference {diff:.1e}; per step on rank 0: {} host ops, {} uploads, {} downloads",
        outs[0].losses, one.losses, t.host_ops, t.uploads, t.downloads
    );
    println!("{what}: host ops over {STEPS} steps and initialization: {kinds:?}");
    assert!(diff < 1e-4, "{what}: {diff}");
    assert!(
        outs[0].losses.last() < outs[0].losses.first(),
        "{what}: the loss falls"
    );
    (t, u64::from(set.mesh.micro_batches))
}

#[test]
fn tiny_gpt_on_one_emulated_device_equals_the_cpu() {
    let (t, micro_batches) = check(MODEL, &Config::new(1, 1, 1), "GPT, one rank");
    // Inside a step only the batch goes up (token ids and targets per micro-batch) and the
    // loss comes down (per micro-batch): no op runs on the host.
    assert_eq!(t.host_ops, 0);
    assert_eq!((t.uploads, t.downloads), (2 * micro_batches, micro_batches));
}

#[test]
fn tiny_gpt_dp2_and_tp2_on_emulated_devices_equal_one_rank() {
    for (c, what) in [
        (Config::new(1, 1, 2), "GPT, dp 2"),
        (Config::new(2, 1, 1), "GPT, tp 2"),
    ] {
        let (t, _) = check(MODEL, &c, what);
        assert_eq!(t.host_ops, 0, "{what}");
    }
}

#[test]
fn with_device_collectives_dp2_and_tp2_keep_their_reductions_on_the_devices() {
    // The executor's device-collective path (NCCL's place on a GPU): gathers and scatters
    // arranged on the device around flat collectives, chunks and the vocabulary-parallel
    // loss on the device. DP 2 and TP 2 with sequence parallelism then move only the batch
    // up and the loss down, as one rank does.
    let sp = Config {
        sp: true,
        ..Config::new(2, 1, 1)
    };
    let (staged, _) = check(MODEL, &sp, "GPT, tp 2 + SP, host-staged collectives");
    for (c, what) in [
        (Config::new(1, 1, 2), "GPT, dp 2, device collectives"),
        (sp, "GPT, tp 2 + SP, device collectives"),
    ] {
        let (t, micro_batches) = check_on(MODEL, &c, what, emulator_with_collectives);
        assert_eq!(t.host_ops, 0, "{what}");
        assert_eq!(
            (t.uploads, t.downloads),
            (2 * micro_batches, micro_batches),
            "{what}: host-staged it was {staged:?}"
        );
    }
}

#[test]
fn pipeline_stages_exchange_device_buffers_in_nccl_order() {
    // 1F1B (pp 2 and pp 4): activations and their gradients go device to device with NCCL's
    // point-to-point semantics (a pair's messages matched in issue order, a send done only once
    // received; the emulator's rendezvous), each stage's pending sends grouped with its next
    // receive: no wait that never ends, and only the batch and the loss cross to the host.
    for (c, what) in [
        (Config::new(1, 2, 1), "GPT, pp 2 1F1B, device collectives"),
        (Config::new(1, 4, 1), "GPT, pp 4 1F1B, device collectives"),
    ] {
        assert!(p2p::deadlock_free(&programs(MODEL, &c)), "{what}");
        let (t, micro_batches) = check_on(MODEL, &c, what, emulator_with_collectives);
        assert_eq!(t.host_ops, 0, "{what}");
        assert!(
            t.uploads <= 2 * micro_batches && t.downloads <= micro_batches,
            "{what}: only the batch and the loss cross to the host: {t:?}"
        );
    }
    // The interleaved schedule's stages send ahead of what they receive: under NCCL's rules
    // their groups would wait on each other, so its messages stay on the host communicator
    // (and it still trains equal to one rank).
    let interleaved = Config {
        schedule: Schedule::Interleaved,
        v: 2,
        ..Config::new(1, 2, 1)
    };
    assert!(!p2p::deadlock_free(&programs(MODEL, &interleaved)));
    let what = "GPT, pp 2 interleaved, host point-to-point";
    let (t, micro_batches) = check_on(MODEL, &interleaved, what, emulator_with_collectives);
    assert!(t.downloads > micro_batches, "{what}: {t:?}");
}

#[test]
fn llama_with_context_parallelism_on_emulated_devices_equals_one_rank() {
    // cp 2: each rank's two chunks of every sequence; rotary at their positions and attention
    // over the group's keys in sequence order run on the device, with device collectives.
    let cp = Config {
        cp: 2,
        ..Config::new(1, 1, 1)
    };
    let (t, micro_batches) = check_on(LLAMA, &cp, "Llama, cp 2", emulator_with_collectives);
    assert_eq!(t.host_ops, 0, "context-parallel ops on the device");
    assert_eq!((t.uploads, t.downloads), (2 * micro_batches, micro_batches));
}

#[test]
fn tiny_gpt_with_dropout_on_emulated_devices_equals_the_cpu() {
    // The masks are drawn on the device from global element indices: one rank, and tp 2 with
    // sequence parallelism (sharded rows), equal one CPU rank.
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tiny-gpt2-dropout.json"
    );
    let (t, _) = check(model, &Config::new(1, 1, 1), "GPT with dropout, one rank");
    assert_eq!(t.host_ops, 0);
    let sp = Config {
        sp: true,
        ..Config::new(2, 1, 1)
    };
    check(model, &sp, "GPT with dropout, tp 2 + SP");
}

#[test]
fn tiny_llama_on_one_emulated_device_equals_the_cpu() {
    let (t, _) = check(LLAMA, &Config::new(1, 1, 1), "Llama, one rank");
    assert_eq!(
        t.host_ops, 0,
        "rotary, SwiGLU, RMSNorm and grouped-query attention on the device"
    );
}

#[test]
fn tiny_mixture_of_experts_models_on_one_emulated_device_equal_the_cpu() {
    // Mixtral's softmax top-2 router and DeepSeek-V3's group-limited sigmoid one (with its
    // latent attention), each with SwiGLU experts (Qwen-MoE's unnormalized routing is
    // device_ops' test).
    for name in ["mixtral", "deepseek_v3"] {
        let model = format!("{}/tests/data/tiny-{name}.json", env!("CARGO_MANIFEST_DIR"));
        let (t, _) = check(&model, &Config::new(1, 1, 1), name);
        assert_eq!(t.host_ops, 0, "{name}: routers and experts on the device");
    }
}

#[test]
fn tiny_gpt_with_bf16_gemms_trains_within_2e2_of_f32() {
    // Acceptance 2's bf16 row, emulated: the GEMMs' operands rounded to bf16 as cuBLAS's
    // FAST_16BF compute type rounds them; everything else f32.
    let set = programs(MODEL, &Config::new(1, 1, 1));
    let one = train(&set, STEPS, 7);
    let opts = options();
    let data = text();
    let outs = ThreadComm::run(1, opts.timeout, |c| {
        train_rank(&set, emulator_bf16(32), c, &data, &opts, &|_, _| {})
    })
    .unwrap();
    let losses = outs.into_iter().next().unwrap().unwrap().losses;
    let diff = loss_diff(&losses, &one.losses);
    println!(
        "bf16 GEMMs: losses {losses:?}, f32 CPU {:?}, max relative difference {diff:.1e}",
        one.losses
    );
    assert!(diff < 2e-2, "{diff}");
    assert!(diff > 1e-6, "bf16 rounding leaves a trace ({diff})");
    assert!(losses.last() < losses.first(), "the loss falls");
}

#[test]
fn a_bf16_plans_activations_are_stashed_as_bf16_and_train_within_2e2() {
    // The tiny GPT's program with its activations and their gradients declared bf16, as a
    // mixed-precision plan declares them: the executor holds those with distant uses as bf16
    // words on the device (`runtime::exec::stash`).
    let mut set = programs(MODEL, &Config::new(1, 1, 1));
    let f32_run = train_emulated(&set, emulator).0[0].losses.clone();
    for t in &mut set.templates {
        for b in &mut t.buffers {
            if matches!(b.role, program::Role::Activation | program::Role::ActGrad) {
                b.elem = program::Elem::Bf16;
            }
        }
    }
    let tpl = &set.templates[0];
    let plan = runtime::exec::stash::plan(tpl);
    let stashes: usize = plan.after.iter().map(Vec::len).sum();
    let expansions: usize = plan.before.iter().map(Vec::len).sum();
    assert!(
        stashes > 0,
        "the forward's activations are read by the backward"
    );
    assert_eq!(
        stashes, expansions,
        "every stash is expanded at its next use"
    );
    for (k, bufs) in plan.after.iter().enumerate() {
        for b in bufs {
            let next = (k + 1..plan.before.len()).find(|&j| plan.before[j].contains(b));
            let gap = next.map(|j| j - k);
            assert!(
                gap.is_some_and(|g| g >= runtime::exec::stash::STASH_GAP),
                "{b} stashed after {k}: next use {next:?}"
            );
        }
    }
    let one = train(&programs(MODEL, &Config::new(1, 1, 1)), STEPS, 7);
    let stashed = train_emulated(&set, emulator).0[0].losses.clone();
    let diff = loss_diff(&stashed, &one.losses);
    println!(
        "{stashes} stashes per step: losses {stashed:?}, f32 CPU {:?}, max relative difference {diff:.1e}",
        one.losses
    );
    assert!(diff < 2e-2, "{diff}");
    assert_ne!(stashed, f32_run, "the stashed values were rounded to bf16");
    assert!(stashed.last() < stashed.first(), "the loss falls");
}

#[test]
fn a_bf16_plan_trains_on_the_emulated_device_with_its_bf16_buffers_stashed() {
    // The tiny GPT planned in bf16 for a GPU cluster (f32 master weights and optimizer state;
    // activations, compute weights and gradients declared bf16), run on the emulated device
    // with bf16 GEMMs: the executor holds the declared-bf16 buffers with distant uses as bf16,
    // parameters and their gradients among them, and training stays within 2e-2 of the f32
    // CPU run and falls.
    let c = Config {
        precision: planner::Precision::Bf16,
        cluster: "dgx-h100",
        ..Config::new(1, 1, 1)
    };
    let set = programs(MODEL, &c);
    let tpl = &set.templates[0];
    let plan = runtime::exec::stash::plan(tpl);
    let roles: std::collections::BTreeSet<&str> = plan
        .after
        .iter()
        .flatten()
        .filter_map(|b| tpl.buffer(*b).map(|d| d.role.class()))
        .collect();
    println!("stashed roles: {roles:?}");
    assert!(
        roles.contains("param") && roles.contains("activation"),
        "{roles:?}"
    );
    let one = train(&programs(MODEL, &Config::new(1, 1, 1)), STEPS, 7);
    let (outs, _) = train_emulated(&set, emulator_bf16);
    let losses = &outs[0].losses;
    let diff = loss_diff(losses, &one.losses);
    println!(
        "bf16 plan: losses {losses:?}, f32 CPU {:?}, max relative difference {diff:.1e}",
        one.losses
    );
    // Each master weight's update writes its compute copy too (`exec/adamw_copy.rs`).
    let updates = tpl
        .instrs
        .iter()
        .filter(|i| matches!(i, program::Instr::AdamW { .. }))
        .count() as u64;
    let t = outs[0].launches_last_step.as_ref().expect("counted");
    // (Reading a gradient back from the stash as words: `_bf16g`.)
    let launches = |k: &str| t.get(k).launches + t.get(&format!("{k}_bf16g")).launches;
    assert_eq!(
        (launches("adamw_step_copy"), launches("adamw_step")),
        (updates, 0),
        "every update with its copy"
    );
    // The norms' outputs feed only linears: made as bf16 words, never as f32
    // (`exec/words_only.rs`).
    let norms = tpl
        .instrs
        .iter()
        .filter(|i| {
            matches!(
                i,
                program::Instr::Compute {
                    kind: ir::OpKind::LayerNorm { .. },
                    ..
                }
            )
        })
        .count() as u64;
    let words = t.get("layer_norm_forward_warp_words").launches
        + t.get("layer_norm_forward_words").launches;
    assert_eq!(words, norms, "every norm's output made as words");
    // The residual adds whose outputs the backward reads again (stashed in between) write
    // their bf16 twin in the same launch (`exec/twins.rs`), and so do the gradient
    // accumulations the stash holds, except those the executor runs as moves (the first
    // addition into an accumulator of zeros), and the residual gradients' sums, which a
    // linear's gradient reads as its output gradient once they are moved on.
    let residuals = stashed_add_results(tpl, |r| matches!(r, program::Role::Activation));
    let adds = tpl
        .instrs
        .iter()
        .filter(|i| {
            matches!(
                i,
                program::Instr::Compute {
                    kind: ir::OpKind::Add,
                    ..
                }
            )
        })
        .count() as u64;
    let twins = t.get("binary_forward_twin").launches;
    assert!(residuals > 0, "the plan stashes residual sums");
    assert!(
        (residuals..=adds).contains(&twins),
        "{twins} twins, {residuals} stashed residual sums, {adds} additions"
    );
    // Each projection the residual add reads runs without its bias, which the add adds
    // (`exec/bias_sum.rs`): no `add_bias` pass for them.
    let sums = projections_into_sums(tpl);
    assert!(sums > 0);
    assert_eq!(t.get("binary_forward_biased").launches, sums, "{t:?}");
    // The projections a split or a GELU reads next are made as words: the bias's words
    // first, the GEMM adding onto them (no f32 product, no `add_bias_to_words`).
    let into_words = projections_into_words(tpl);
    assert!(into_words > 0);
    assert_eq!(t.get("bias_rows_words").launches, into_words, "{t:?}");
    assert_eq!(t.get("add_bias_to_words").launches, 0, "{t:?}");
    // With 8 micro-batches each weight gradient but the first is added to its accumulator,
    // which AdamW then reads in f32 terms: only the products whose input gradient a GELU's
    // gradient alone reads, and those projections, write bf16 words (`Gemm::c_words`).
    assert_eq!(
        t.get(runtime::backend::device::bf16_gemm::CUBLAS_WORDS)
            .launches,
        grads_made_as_words(tpl, set.mesh.micro_batches) + into_words,
        "GEMMs writing bf16 words"
    );
    assert!(diff < 2e-2, "{diff}");
    assert!(losses.last() < losses.first(), "the loss falls");
}

/// The biased linears whose output the next instruction to touch it adds to another value.
fn projections_into_sums(tpl: &program::Template) -> u64 {
    biased_linears_into(tpl, &|k| matches!(k, ir::OpKind::Add))
}

/// The biased linears whose output a split (q, k, v) or a GELU reads next: ops that read it
/// only as bf16 words, so that it is made as words, by its GEMM adding onto the bias's words.
fn projections_into_words(tpl: &program::Template) -> u64 {
    biased_linears_into(tpl, &|k| {
        matches!(k, ir::OpKind::Split { .. } | ir::OpKind::Gelu { .. })
    })
}

/// The biased linears whose output the next instruction to touch it is a computation `next`
/// accepts.
fn biased_linears_into(tpl: &program::Template, next: &dyn Fn(&ir::OpKind) -> bool) -> u64 {
    let touches = |ins: &program::Instr, b: program::BufferId| {
        let (reads, writes) = program::verify::operands(ins);
        reads.contains(&b) || writes.contains(&b)
    };
    let mut n = 0;
    for (k, ins) in tpl.instrs.iter().enumerate() {
        let program::Instr::Compute {
            kind: ir::OpKind::Linear { bias: true },
            outputs,
            ..
        } = ins
        else {
            continue;
        };
        let toucher = tpl.instrs[k + 1..].iter().find(|i| touches(i, outputs[0]));
        if let Some(program::Instr::Compute { kind, .. }) = toucher
            && next(kind)
        {
            n += 1;
        }
    }
    n
}

/// The products of a step whose GEMM writes bf16 words: each GELU's and each norm's output
/// gradient (the input gradient of the linear after it, which only their gradients read) and,
/// with one micro-batch, each layer's weight gradients (moved into their zeroed accumulators,
/// then read only by AdamW, as words).
fn grads_made_as_words(tpl: &program::Template, micro_batches: u32) -> u64 {
    let count = |f: &dyn Fn(&ir::OpKind, &[program::BufferId]) -> bool| {
        tpl.instrs
            .iter()
            .filter(
                |i| matches!(i, program::Instr::Compute { kind, inputs, .. } if f(kind, inputs)),
            )
            .count() as u64
    };
    let param = |b: &program::BufferId| {
        tpl.buffer(*b)
            .is_some_and(|d| matches!(d.role, program::Role::Param(_)))
    };
    let weight_grads = count(&|kind, inputs| {
        matches!(kind, ir::OpKind::Grad { of, wrt }
            if matches!(**of, ir::OpKind::Linear { .. }) && wrt.contains(&1))
            && inputs.get(1).is_some_and(param)
    });
    let gelu_grads = count(
        &|kind, _| matches!(kind, ir::OpKind::Grad { of, .. } if matches!(**of, ir::OpKind::Gelu { .. })),
    );
    let norm_grads = count(
        &|kind, _| matches!(kind, ir::OpKind::Grad { of, .. } if matches!(**of, ir::OpKind::LayerNorm { .. })),
    );
    assert!(weight_grads > 0 && gelu_grads > 0 && norm_grads > 0);
    gelu_grads + norm_grads + if micro_batches == 1 { weight_grads } else { 0 }
}

#[test]
fn with_one_micro_batch_weight_gradients_reach_adamw_as_the_words_their_gemms_write() {
    // One micro-batch: each weight gradient is the first (and only) addition into its zeroed
    // accumulator, which the executor runs as a move, and AdamW reads it only as bf16 words;
    // so its GEMM writes it as words (`Gemm::c_words`) and nothing converts it. Training stays
    // within 2e-2 of the f32 CPU run and falls.
    let c = Config {
        precision: planner::Precision::Bf16,
        cluster: "dgx-h100",
        micro_batch: common::GLOBAL_BATCH,
        ..Config::new(1, 1, 1)
    };
    let set = programs(WIDE_HEADS, &c);
    assert_eq!(set.mesh.micro_batches, 1);
    let one = train(
        &programs(
            WIDE_HEADS,
            &Config {
                micro_batch: common::GLOBAL_BATCH,
                ..Config::new(1, 1, 1)
            },
        ),
        STEPS,
        7,
    );
    let (outs, _) = train_emulated(&set, emulator_bf16);
    let losses = &outs[0].losses;
    let diff = loss_diff(losses, &one.losses);
    let t = outs[0].launches_last_step.as_ref().expect("counted");
    println!(
        "one micro-batch: losses {losses:?}, f32 CPU {:?} ({diff:.1e})",
        one.losses
    );
    assert_eq!(
        t.get(runtime::backend::device::bf16_gemm::CUBLAS_WORDS)
            .launches,
        grads_made_as_words(&set.templates[0], 1) + projections_into_words(&set.templates[0]),
        "GEMMs writing bf16 words"
    );
    assert!(diff < 2e-2, "{diff}");
    assert!(losses.last() < losses.first(), "the loss falls");
}

#[test]
fn an_lm_heads_logits_stay_at_their_gemms_padded_pitch_and_train_as_on_the_cpu() {
    // A vocabulary of odd width: the bf16 LM head's product has rows that are not whole 16-byte
    // words, which the GEMM writes at a padded pitch. The cross-entropy and its gradient read
    // the logits there (`runtime::exec::pitched`), so no copy makes them dense: the step's only
    // `unpad_rows` left is the LM head's weight gradient ([64, 251]), once per micro-batch.
    // The loss's gradient is made as the bf16 operand the head's backward GEMMs read
    // (`cross_entropy_backward_words`), never as f32 values converted after.
    // Training stays within 2e-2 of the f32 CPU run and falls.
    let c = Config {
        precision: planner::Precision::Bf16,
        cluster: "dgx-h100",
        ..Config::new(1, 1, 1)
    };
    let set = programs(ODD_VOCAB, &c);
    let one = train(&programs(ODD_VOCAB, &Config::new(1, 1, 1)), STEPS, 7);
    let (outs, _) = train_emulated(&set, emulator_bf16);
    let losses = &outs[0].losses;
    let t = outs[0].launches_last_step.as_ref().expect("counted");
    let diff = loss_diff(losses, &one.losses);
    println!(
        "odd vocabulary: losses {losses:?}, f32 CPU {:?} ({diff:.1e}), launches {t:?}",
        one.losses
    );
    let heads = u64::from(set.mesh.micro_batches);
    assert_eq!(t.get("unpad_rows").launches, heads, "{t:?}");
    assert_eq!(
        t.get("cross_entropy_backward_words").launches,
        heads,
        "{t:?}"
    );
    assert_eq!(t.get("cross_entropy_backward").launches, 0, "{t:?}");
    assert!(diff < 2e-2, "{diff}");
    assert!(losses.last() < losses.first(), "the loss falls");
}

#[test]
fn a_vocabulary_parallel_loss_reads_pitched_logits_and_makes_its_gradient_as_the_heads_operand() {
    // TP 2 splits the odd vocabulary's head (251 words padded to 252: 126 columns a shard, rows
    // that are not whole 16-byte words in bf16). As on one rank, the shard's loss statistics
    // and gradient read the logits where the GEMM wrote them, and the gradient is made as the
    // head's bf16 operand (`shard_loss_grad_words`), never as f32 values converted after: the
    // plan counts it in bf16 (Megatron's engine does). Both ranks train within 2e-2 of the f32
    // CPU run.
    let c = Config {
        precision: planner::Precision::Bf16,
        cluster: "dgx-h100",
        ..Config::new(2, 1, 1)
    };
    let set = programs(ODD_VOCAB, &c);
    let one = train(&programs(ODD_VOCAB, &Config::new(1, 1, 1)), STEPS, 7);
    let (outs, _) = train_emulated(&set, emulator_bf16);
    let heads = u64::from(set.mesh.micro_batches);
    for (rank, out) in outs.iter().enumerate() {
        let t = out.launches_last_step.as_ref().expect("counted");
        let diff = loss_diff(&out.losses, &one.losses);
        println!(
            "tp 2, odd vocabulary, rank {rank}: losses {:?} ({diff:.1e}), launches {t:?}",
            out.losses
        );
        assert_eq!(t.get("shard_loss_grad_words").launches, heads, "{t:?}");
        assert_eq!(t.get("shard_loss_grad").launches, 0, "{t:?}");
        assert!(diff < 2e-2, "rank {rank}: {diff}");
        assert!(out.losses.last() < out.losses.first(), "the loss falls");
    }
}

/// The additions of `tpl`'s step whose result (of a role `role` accepts) the executor stashes
/// before its value ends, counted from the stash plan (`runtime::exec::stash`) and the
/// instructions themselves.
fn stashed_add_results(tpl: &program::Template, role: impl Fn(&program::Role) -> bool) -> u64 {
    let plan = runtime::exec::stash::plan(tpl);
    let mut stashed = std::collections::HashSet::new();
    let mut count = 0;
    for (k, ins) in tpl.instrs.iter().enumerate().rev() {
        stashed.extend(plan.after[k].iter().copied());
        if let program::Instr::Compute { kind, outputs, .. } = ins
            && let &[o] = outputs.as_slice()
        {
            let of_role = tpl.buffer(o).is_some_and(|d| role(&d.role));
            if matches!(kind, ir::OpKind::Add) && stashed.contains(&o) && of_role {
                count += 1;
            }
        }
        let (_, writes) = program::verify::operands(ins);
        let ended = match ins {
            program::Instr::Alloc { buf } | program::Instr::Free { buf } => vec![*buf],
            _ => writes,
        };
        for b in ended {
            stashed.remove(&b);
        }
    }
    count
}

/// The program without its attention forwards' `saves` (their gradients then recompute the
/// row statistics).
fn without_attention_saves(set: &codegen::ProgramSet) -> codegen::ProgramSet {
    let mut set = set.clone();
    for t in &mut set.templates {
        for ins in &mut t.instrs {
            if let program::Instr::Compute {
                kind: ir::OpKind::Attention { .. },
                saves,
                ..
            } = ins
            {
                saves.clear();
            }
        }
    }
    set
}

#[test]
fn on_tensor_cores_attention_keeps_its_row_statistics_and_trains_as_when_recomputing() {
    // A bf16 plan's attention forwards declare each query row's log-sum-exp (`saves`): on
    // tensor cores the executor keeps it for the gradient (`runtime::exec::kept`), which then
    // takes D = dO·O from the forward's output in one pass, and no forward is recomputed for the
    // row statistics. Training matches the same program without the saves (which recomputes
    // them, from an f32 output) and stays within 2e-2 of the f32 CPU run.
    let c = Config {
        precision: planner::Precision::Bf16,
        cluster: "dgx-h100",
        ..Config::new(1, 1, 1)
    };
    let set = programs(WIDE_HEADS, &c);
    let plan = runtime::exec::kept::plan(&set.templates[0]);
    let forwards = plan.forward.iter().flatten().count() as u64;
    let per_step = 2 * u64::from(set.mesh.micro_batches);
    assert_eq!(forwards, per_step, "one per layer and micro-batch");
    assert_eq!(plan.grad.iter().flatten().count() as u64, forwards);
    let recomputing = without_attention_saves(&set);
    let none = runtime::exec::kept::plan(&recomputing.templates[0]);
    assert_eq!(none.forward.iter().flatten().count(), 0);

    let run = |set: &codegen::ProgramSet| {
        let out = train_emulated(set, emulator_mma).0.remove(0);
        let t = out
            .launches_last_step
            .expect("the emulator counts launches");
        let count = |k: &str| t.get(k).launches;
        (
            out.losses,
            // D from O and dO, each f32 or its words (dO made as words by its GEMM).
            ["", "_bf16x", "_bf16g", "_bf16xg"]
                .map(|v| count(&format!("attention_dsum{v}")))
                .iter()
                .sum::<u64>(),
            count("attention_row_stats_mma32"),
            count("attention_forward_words_mma32"),
            // Launches that split the fused q, k, v projection's output, and that join their
            // gradients again.
            ["split_cols", "place_cols"].map(|kernel| {
                t.by_bytes()
                    .iter()
                    .filter(|(name, _)| name.starts_with(kernel))
                    .map(|(_, c)| c.launches)
                    .sum::<u64>()
            }),
        )
    };
    // The kept forward also writes its output as bf16 words alone: the projection after it and
    // that projection's weight gradient read only those (`exec/words_only.rs`). It and its
    // gradient read q, k and v in place in the fused projection's output, and the gradient
    // writes dq, dk and dv side by side: no split and no join is made (`runtime::exec::packed`).
    let (kept, dsums, stats, words, copies) = run(&set);
    assert_eq!(
        (dsums, stats, words, copies),
        (per_step, 0, per_step, [0, 0]),
        "D from the output, nothing recomputed, the output made as words, no split or join"
    );
    let (recomputed, dsums, stats, _, copies) = run(&recomputing);
    assert_eq!(
        (dsums, stats, copies),
        (0, per_step, [3 * per_step, 3 * per_step]),
        "the row statistics recomputed, q, k and v split apart and their gradients joined"
    );
    let diff = loss_diff(&kept, &recomputed);
    let one = train(&programs(WIDE_HEADS, &Config::new(1, 1, 1)), STEPS, 7);
    let to_f32 = loss_diff(&kept, &one.losses);
    println!(
        "kept {kept:?}, recomputed {recomputed:?} (max relative difference {diff:.1e}), f32 CPU {:?} ({to_f32:.1e})",
        one.losses
    );
    assert!(diff < 1e-3, "{diff}");
    assert!(to_f32 < 2e-2, "{to_f32}");
    assert!(kept.last() < kept.first(), "the loss falls");
}
