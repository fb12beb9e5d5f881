//! Every op kind against the reference interpreter: random small instances, forward and
//! backward, f32 kernels vs f64 reference within 1e-4 (tensor-wise relative).

mod common;

use common::{check, ids, positive, rand};
use ir::testing::Rng;
use ir::{Dim, OpKind, Sym};

const SEEDS: [u64; 3] = [1, 2, 3];

/// Runs `body` for each seed and reports the worst error of the op family.
fn each_seed(name: &str, mut body: impl FnMut(&mut Rng) -> f64) {
    let worst = SEEDS
        .iter()
        .map(|&s| body(&mut Rng::new(s)))
        .fold(0.0, f64::max);
    eprintln!("{name}: worst relative error {worst:.2e}");
}

#[test]
fn unary() {
    let kinds = [
        OpKind::Neg,
        OpKind::Exp,
        OpKind::Tanh,
        OpKind::Sigmoid,
        OpKind::Pow { exponent: 2.0 },
        OpKind::Pow { exponent: 3.0 },
        OpKind::Scale { factor: -0.37 },
        OpKind::Gelu { tanh: false },
        OpKind::Gelu { tanh: true },
        OpKind::Silu,
        OpKind::Relu,
        OpKind::Clamp { limit: 0.4 },
    ];
    for kind in kinds {
        each_seed(kind.mnemonic(), |rng| {
            check(kind.mnemonic(), &kind, &[rand(rng, &[3, 4, 5])], rng)
        });
    }
    // Domain-restricted functions on positive inputs.
    for kind in [
        OpKind::Sqrt,
        OpKind::Rsqrt,
        OpKind::Pow { exponent: 0.5 },
        OpKind::Pow { exponent: -1.5 },
    ] {
        each_seed(kind.mnemonic(), |rng| {
            check(kind.mnemonic(), &kind, &[positive(rng, &[4, 6], 0.5)], rng)
        });
    }
}

#[test]
fn binary_with_broadcasting() {
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[3, 4, 5], &[3, 4, 5]),
        (&[3, 4, 5], &[5]),
        (&[5], &[3, 4, 5]),
        (&[3, 1, 5], &[4, 1]),
        (&[1, 4, 1], &[3, 4, 5]),
        (&[2, 3], &[]),
    ];
    for kind in [OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div] {
        each_seed(kind.mnemonic(), |rng| {
            shapes
                .iter()
                .map(|(a, b)| {
                    let x = rand(rng, a);
                    // Keep divisors away from 0.
                    let y = if kind == OpKind::Div {
                        positive(rng, b, 0.5)
                    } else {
                        rand(rng, b)
                    };
                    check(kind.mnemonic(), &kind, &[x, y], rng)
                })
                .fold(0.0, f64::max)
        });
    }
}

#[test]
fn embedding() {
    each_seed("embedding", |rng| {
        // 5 rows, 12 ids: rows repeat, so the gradient scatter-adds.
        let ids = ids(rng, &[3, 4], 5);
        check(
            "embedding",
            &OpKind::Embedding,
            &[rand(rng, &[5, 6]), ids],
            rng,
        )
    });
}

#[test]
fn matmul_batched_and_broadcast() {
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[4, 5], &[5, 6]),
        (&[2, 3, 4, 5], &[5, 6]),
        (&[2, 4, 5], &[2, 5, 6]),
        (&[2, 1, 4, 5], &[3, 5, 6]),
        (&[4, 5], &[3, 5, 2]),
    ];
    each_seed("matmul", |rng| {
        shapes
            .iter()
            .map(|(a, b)| {
                check(
                    "matmul",
                    &OpKind::MatMul,
                    &[rand(rng, a), rand(rng, b)],
                    rng,
                )
            })
            .fold(0.0, f64::max)
    });
}

#[test]
fn linear() {
    each_seed("linear", |rng| {
        let x = rand(rng, &[2, 3, 7]);
        let w = rand(rng, &[7, 5]);
        let b = rand(rng, &[5]);
        let e1 = check(
            "linear",
            &OpKind::Linear { bias: false },
            &[x.clone(), w.clone()],
            rng,
        );
        let e2 = check(
            "linear+bias",
            &OpKind::Linear { bias: true },
            &[x, w, b],
            rng,
        );
        e1.max(e2)
    });
}

#[test]
fn reductions() {
    for kind in [OpKind::ReduceMean, OpKind::ReduceSum] {
        each_seed(kind.mnemonic(), |rng| {
            check(kind.mnemonic(), &kind, &[rand(rng, &[3, 4, 9])], rng)
        });
    }
}

#[test]
fn norms() {
    each_seed("layernorm", |rng| {
        let ops = [rand(rng, &[2, 3, 8]), rand(rng, &[8]), rand(rng, &[8])];
        check(
            "layernorm",
            &OpKind::LayerNorm {
                eps: 1e-5,
                bias: true,
            },
            &ops,
            rng,
        )
    });
    each_seed("layernorm without bias", |rng| {
        let ops = [rand(rng, &[2, 3, 8]), rand(rng, &[8])];
        let kind = OpKind::LayerNorm {
            eps: 1e-5,
            bias: false,
        };
        check("layernorm without bias", &kind, &ops, rng)
    });
    each_seed("rmsnorm", |rng| {
        let ops = [rand(rng, &[2, 3, 8]), rand(rng, &[8])];
        check("rmsnorm", &OpKind::RmsNorm { eps: 1e-6 }, &ops, rng)
    });
}

#[test]
fn softmax_plain_and_causal() {
    for causal in [false, true] {
        let kind = OpKind::Softmax { causal };
        each_seed("softmax", |rng| {
            // Square, more keys than queries, and more queries than keys (fully masked rows).
            [[2, 5, 5], [2, 3, 6], [1, 6, 4]]
                .iter()
                .map(|s| check("softmax", &kind, &[rand(rng, s)], rng))
                .fold(0.0, f64::max)
        });
    }
}

#[test]
fn attention_mha_gqa_causal() {
    // (heads, kv_heads, d, dv, sq, sk, causal); dv < d is multi-head latent attention's
    // narrower value head.
    let cases = [
        (2, 2, 4, 4, 5, 5, false),
        (2, 2, 4, 4, 5, 5, true),
        (4, 2, 3, 3, 6, 6, true),
        (6, 2, 2, 2, 4, 4, false),
        (4, 1, 4, 4, 3, 5, true),
        (2, 1, 8, 8, 5, 3, true),
        (3, 3, 6, 4, 5, 5, true),
        (4, 2, 5, 2, 4, 6, false),
    ];
    // Every case plain, with Gemma 2's soft cap (tight, so the tanh bends) and with gpt-oss's
    // sinks; the causal ones also in sliding windows (of 2 keys, and of 3 with both) and in
    // Llama 4's chunks (of 2 keys, and of 3 under a window of 2).
    let variants = [
        (None, false, None, None),
        (Some(0.75), false, None, None),
        (None, true, None, None),
        (None, false, Some(2), None),
        (Some(0.75), true, Some(3), None),
        (None, false, None, Some(2)),
        (None, true, Some(2), Some(3)),
    ];
    each_seed("attention", |rng| {
        cases
            .iter()
            .flat_map(|&case| variants.map(|variant| (case, variant)))
            .filter(|&((.., causal), (.., window, chunk))| {
                causal || (window.is_none() && chunk.is_none())
            })
            .map(
                |((heads, kv, d, dv, sq, sk, causal), (softcap, sinks, window, chunk))| {
                    let kind = OpKind::Attention {
                        heads,
                        kv_heads: kv,
                        scale: 1.0 / (d as f64).sqrt(),
                        causal,
                        softcap,
                        sinks,
                        window,
                        chunk,
                    };
                    let (h, kvu, d, dv) = (heads as usize, kv as usize, d as usize, dv as usize);
                    let mut ops = vec![
                        rand(rng, &[2, sq, h * d]),
                        rand(rng, &[2, sk, kvu * d]),
                        rand(rng, &[2, sk, kvu * dv]),
                    ];
                    if sinks {
                        ops.push(rand(rng, &[h]));
                    }
                    check("attention", &kind, &ops, rng)
                },
            )
            .fold(0.0, f64::max)
    });
}

#[test]
fn rotary() {
    each_seed("rotary", |rng| {
        let kind = OpKind::Rotary {
            heads: 3,
            theta: 10_000.0,
            scaling: Default::default(),
        };
        let e1 = check("rotary", &kind, &[rand(rng, &[2, 5, 12])], rng);
        let kind = OpKind::Rotary {
            heads: 1,
            theta: 500.0,
            scaling: Default::default(),
        };
        let e2 = check("rotary", &kind, &[rand(rng, &[1, 7, 8])], rng);
        // Llama 3.1's and YaRN's rescaled frequencies (YaRN's cos and sin scaled too).
        let llama3 = OpKind::Rotary {
            heads: 2,
            theta: 10_000.0,
            scaling: ir::RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max: 16.0,
            },
        };
        let e3 = check("rotary", &llama3, &[rand(rng, &[2, 9, 16])], rng);
        let yarn = OpKind::Rotary {
            heads: 2,
            theta: 10_000.0,
            scaling: ir::RopeScaling::Yarn {
                factor: 4.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max: 16.0,
                attention_factor: 1.2,
                truncate: true,
            },
        };
        let e4 = check("rotary", &yarn, &[rand(rng, &[2, 9, 16])], rng);
        let temperature = OpKind::Rotary {
            heads: 2,
            theta: 10_000.0,
            scaling: ir::RopeScaling::Temperature {
                floor: 3.0,
                scale: 0.1,
            },
        };
        let e5 = check("rotary", &temperature, &[rand(rng, &[2, 9, 16])], rng);
        e1.max(e2).max(e3).max(e4).max(e5)
    });
}

/// A NoPE layer's rotary (every frequency zero) hands its operand and its gradient through
/// unchanged, bit for bit, in the kernels and in the reference.
#[test]
fn nope_rotary_is_the_identity() {
    let mut rng = Rng::new(7);
    let nope = OpKind::Rotary {
        heads: 2,
        theta: 10_000.0,
        scaling: ir::RopeScaling::Nope,
    };
    let x = rand(&mut rng, &[2, 9, 16]);
    let dy = rand(&mut rng, &[2, 9, 16]);
    let want = ir::interp::apply(&nope, &[&x], common::BIND).unwrap();
    assert_eq!(want[0].data, x.data, "reference forward");
    let back = ir::interp::vjp(&nope, &[&x], &[&dy]).unwrap();
    assert_eq!(
        back[0].as_ref().unwrap().data,
        dy.data,
        "reference backward"
    );
    let (x32, dy32) = (
        kernels::Tensor32::from_ir(&x),
        kernels::Tensor32::from_ir(&dy),
    );
    let got = kernels::forward(&nope, &[&x32], common::BIND).unwrap();
    assert_eq!(got[0].to_ir().data, x.data, "kernel forward");
    let back = kernels::backward(&nope, &[&x32], &[&dy32]).unwrap();
    assert_eq!(
        back[0].as_ref().unwrap().to_ir().data,
        dy.data,
        "kernel backward"
    );
    // The same op with frequencies turns the operand: the check above can fail.
    let plain = OpKind::Rotary {
        heads: 2,
        theta: 10_000.0,
        scaling: ir::RopeScaling::None,
    };
    let turned = kernels::forward(&plain, &[&x32], common::BIND).unwrap();
    assert_ne!(turned[0].to_ir().data, x.data);
}

/// Llama 4's attention temperature on its NoPE layers' queries: position p scaled by
/// 1 + 0.1·ln(⌊(p + 1)/4⌋ + 1) (transformers' `log1p(floor((pos + 1) / floor_scale)) *
/// attn_scale + 1`, here with floor_scale 4), unturned, in both directions and both
/// implementations.
#[test]
fn temperature_scales_each_position() {
    let mut rng = Rng::new(11);
    let kind = OpKind::Rotary {
        heads: 2,
        theta: 500_000.0,
        scaling: ir::RopeScaling::Temperature {
            floor: 4.0,
            scale: 0.1,
        },
    };
    let (s, w) = (9, 16);
    let x = rand(&mut rng, &[2, s, w]);
    let temperature = |p: usize| 1.0 + 0.1 * (((p + 1) / 4) as f64 + 1.0).ln();
    assert_eq!(temperature(2), 1.0);
    let want: Vec<f64> = x
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| v * temperature((i / w) % s))
        .collect();
    let reference = ir::interp::apply(&kind, &[&x], common::BIND).unwrap();
    let back = ir::interp::vjp(&kind, &[&x], &[&x]).unwrap();
    let x32 = kernels::Tensor32::from_ir(&x);
    let got = kernels::forward(&kind, &[&x32], common::BIND).unwrap();
    let got_back = kernels::backward(&kind, &[&x32], &[&x32]).unwrap();
    let outputs = [
        ("reference forward", reference[0].data.clone()),
        ("reference backward", back[0].as_ref().unwrap().data.clone()),
        ("kernel forward", got[0].to_ir().data),
        (
            "kernel backward",
            got_back[0].as_ref().unwrap().to_ir().data,
        ),
    ];
    for (what, data) in outputs {
        let worst = data
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-6, "{what}: off by {worst}");
    }
    // Positions 7 and 8 are scaled by 1 + 0.1·ln 3: the check above sees the temperature.
    assert!((temperature(8) - 1.109_861).abs() < 1e-6);
}

#[test]
fn layout_ops() {
    each_seed("layout", |rng| {
        let x = rand(rng, &[2, 3, 4]);
        let ks = [
            OpKind::Reshape {
                shape: vec![Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq), Dim::Fixed(4)],
            },
            OpKind::Reshape {
                shape: vec![Dim::Fixed(6), Dim::Fixed(4)],
            },
            OpKind::Transpose {
                perm: vec![2, 0, 1],
            },
            OpKind::Transpose {
                perm: vec![1, 0, 2],
            },
            OpKind::Transpose {
                perm: vec![0, 2, 1],
            },
            OpKind::Split {
                axis: 2,
                sizes: vec![1, 3],
            },
            OpKind::Split {
                axis: 1,
                sizes: vec![1, 1, 1],
            },
            OpKind::Slice {
                axis: 1,
                start: 1,
                end: 3,
            },
            OpKind::Slice {
                axis: 2,
                start: 0,
                end: 1,
            },
        ];
        let mut worst = ks
            .iter()
            .map(|k| check(k.mnemonic(), k, std::slice::from_ref(&x), rng))
            .fold(0.0, f64::max);
        // Expand: a [1, 3, 1] tensor to [B, 3, 4] and a rank-extending expand.
        let e = OpKind::Expand {
            shape: vec![Dim::Sym(Sym::Batch), Dim::Fixed(3), Dim::Fixed(4)],
        };
        worst = worst.max(check("expand", &e, &[rand(rng, &[1, 3, 1])], rng));
        let e = OpKind::Expand {
            shape: vec![Dim::Fixed(5), Dim::Fixed(2), Dim::Fixed(3)],
        };
        worst = worst.max(check("expand", &e, &[rand(rng, &[3])], rng));
        // Concat of three parts along the middle axis and along the last.
        let parts = [
            rand(rng, &[2, 1, 4]),
            rand(rng, &[2, 3, 4]),
            rand(rng, &[2, 2, 4]),
        ];
        worst = worst.max(check("concat", &OpKind::Concat { axis: 1 }, &parts, rng));
        let parts = [rand(rng, &[2, 3, 1]), rand(rng, &[2, 3, 2])];
        worst.max(check("concat", &OpKind::Concat { axis: 2 }, &parts, rng))
    });
}

#[test]
fn dropout_uses_the_reference_mask() {
    each_seed("dropout", |rng| {
        let x = rand(rng, &[4, 50]);
        let kind = OpKind::Dropout { p: 0.3, seed: 17 };
        let e = check("dropout", &kind, std::slice::from_ref(&x), rng);
        // Same mask bit for bit: zeros exactly where the reference has them.
        let ours = kernels::forward(&kind, &[&kernels::Tensor32::from_ir(&x)], common::BIND)
            .expect("runs");
        let want = ir::interp::apply(&kind, &[&x], common::BIND).expect("runs");
        let dropped = |d: &[f64]| d.iter().map(|&v| v == 0.0).collect::<Vec<_>>();
        assert_eq!(dropped(&ours[0].to_ir().data), dropped(&want[0].data));
        assert!(
            dropped(&want[0].data).iter().any(|&z| z),
            "some elements are dropped"
        );
        e
    });
}

#[test]
fn cross_entropy() {
    each_seed("cross_entropy", |rng| {
        let logits = rand(rng, &[2, 3, 7]);
        let targets = ids(rng, &[2, 3], 7);
        check(
            "cross_entropy",
            &OpKind::CrossEntropy,
            &[logits, targets],
            rng,
        )
    });
}

#[test]
fn moe_router_and_experts() {
    let mixtral = ir::Routing::default();
    for (experts, k) in [(4, 1), (4, 2), (3, 3)] {
        let router = OpKind::TopKRouter {
            experts,
            k,
            routing: mixtral,
            bias: false,
        };
        each_seed("topk_router", |rng| {
            let ops = [rand(rng, &[2, 3, 6]), rand(rng, &[6, experts as usize])];
            check("topk_router", &router, &ops, rng)
        });
        each_seed("moe_experts", |rng| {
            let (e, h, f) = (experts as usize, 6, 5);
            let x = rand(rng, &[2, 3, h]);
            let w = rand(rng, &[h, e]);
            let gates = ir::interp::apply(&router, &[&x, &w], common::BIND)
                .expect("routes")
                .remove(0);
            let gates = common::round(&gates);
            let ops = [
                x,
                gates,
                rand(rng, &[e, h, f]),
                rand(rng, &[e, h, f]),
                rand(rng, &[e, f, h]),
            ];
            check(
                "moe_experts",
                &OpKind::MoeExperts {
                    experts,
                    form: Default::default(),
                },
                &ops,
                rng,
            )
        });
    }
}

/// Llama 4's experts (each gate scales its expert's input, routed by a top-1 sigmoid),
/// against the interpreter in both directions.
#[test]
fn experts_scaling_their_input() {
    let (experts, k) = (4, 1);
    let routing = ir::Routing {
        sigmoid: true,
        normalize: false,
        ..ir::Routing::default()
    };
    let router = OpKind::TopKRouter {
        experts,
        k,
        routing,
        bias: false,
    };
    let form = ir::ExpertForm {
        scales_input: true,
        ..ir::ExpertForm::SWIGLU
    };
    each_seed("moe_experts scaling input", |rng| {
        let (e, h, f) = (4, 6, 5);
        let x = rand(rng, &[2, 3, h]);
        let w = rand(rng, &[h, e]);
        let gates = ir::interp::apply(&router, &[&x, &w], common::BIND)
            .expect("routes")
            .remove(0);
        let ops = [
            x,
            common::round(&gates),
            rand(rng, &[e, h, f]),
            rand(rng, &[e, h, f]),
            rand(rng, &[e, f, h]),
        ];
        let kind = OpKind::MoeExperts { experts, form };
        check("moe_experts scaling input", &kind, &ops, rng)
    });
}

/// gpt-oss's router (a bias on the logits) and experts (biases, σ(1.702·gate), clamps tight
/// enough to bite, up offset by one), against the interpreter in both directions.
#[test]
fn gpt_oss_router_and_experts() {
    let (experts, k) = (4, 2);
    let router = OpKind::TopKRouter {
        experts,
        k,
        routing: ir::Routing::default(),
        bias: true,
    };
    let form = ir::ExpertForm {
        bias: true,
        alpha: 1.702,
        limit: Some(0.7),
        up_offset: 1.0,
        scales_input: false,
    };
    each_seed("topk_router bias", |rng| {
        let ops = [rand(rng, &[2, 3, 6]), rand(rng, &[6, 4]), rand(rng, &[4])];
        check("topk_router bias", &router, &ops, rng)
    });
    each_seed("moe_experts gpt-oss", |rng| {
        let (e, h, f) = (4, 6, 5);
        let x = rand(rng, &[2, 3, h]);
        let (w, b) = (rand(rng, &[h, e]), rand(rng, &[e]));
        let gates = ir::interp::apply(&router, &[&x, &w, &b], common::BIND)
            .expect("routes")
            .remove(0);
        let ops = [
            x,
            common::round(&gates),
            rand(rng, &[e, h, f]),
            rand(rng, &[e, h, f]),
            rand(rng, &[e, f, h]),
            rand(rng, &[e, f]),
            rand(rng, &[e, f]),
        ];
        let kind = OpKind::MoeExperts { experts, form };
        check("moe_experts gpt-oss", &kind, &ops, rng)
    });
}

/// Qwen-MoE's unnormalized shares, DeepSeek-V3's group-limited sigmoid and DeepSeek-V2's
/// group-limited softmax, against the
/// interpreter in both directions.
#[test]
fn moe_router_scorings() {
    let scorings = [
        ir::Routing {
            normalize: false,
            ..ir::Routing::default()
        },
        ir::Routing {
            sigmoid: true,
            normalize: true,
            groups: 4,
            groups_kept: 2,
            group_top: 2,
        },
        ir::Routing {
            sigmoid: true,
            normalize: false,
            groups: 2,
            groups_kept: 1,
            group_top: 2,
        },
        // DeepSeek-V2's group-limited greedy: softmax shares, a group scored by its best.
        ir::Routing {
            sigmoid: false,
            normalize: false,
            groups: 4,
            groups_kept: 2,
            group_top: 1,
        },
    ];
    for routing in scorings {
        let router = OpKind::TopKRouter {
            experts: 8,
            k: 3,
            routing,
            bias: false,
        };
        each_seed("topk_router", |rng| {
            let ops = [rand(rng, &[2, 3, 6]), rand(rng, &[6, 8])];
            check("topk_router", &router, &ops, rng)
        });
    }
}

#[test]
fn adamw_op_matches_reference() {
    each_seed("adamw", |rng| {
        let cfg = ir::AdamWConfig {
            lr: 0.01,
            beta1: 0.8,
            beta2: 0.95,
            eps: 1e-6,
            weight_decay: 0.1,
        };
        let p = rand(rng, &[3, 5]);
        let g = rand(rng, &[3, 5]);
        let m = rand(rng, &[3, 5]);
        let v = positive(rng, &[3, 5], 0.1);
        let step = ir::Tensor::scalar(4.0);
        check("adamw", &OpKind::AdamW(cfg), &[p, g, m, v, step], rng)
    });
}
