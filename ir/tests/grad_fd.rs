//! Finite-difference checks of the vector-Jacobian product of every differentiable op kind.

mod common;

use common::{check_op, float, int};
use ir::testing::Rng;
use ir::{OpKind, Tensor};

fn t(rng: &mut Rng, shape: &[usize]) -> Tensor {
    rng.tensor(shape, 1.0)
}

/// Values in [lo, lo + width), for ops defined on a half-line.
fn positive(rng: &mut Rng, shape: &[usize], lo: f64) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(
        shape.to_vec(),
        (0..n).map(|_| lo + 2.0 * rng.uniform()).collect(),
    )
}

fn ids(rng: &mut Rng, shape: &[usize], bound: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(
        shape.to_vec(),
        (0..n).map(|_| rng.below(bound) as f64).collect(),
    )
}

fn unary(name: &str, kind: OpKind, x: Tensor, seed: u64) {
    check_op(name, kind, vec![float(x)], &mut Rng::new(seed));
}

#[test]
fn fd_embedding() {
    let mut r = Rng::new(1);
    // Repeated ids exercise the scatter-add into the table.
    let ids = Tensor::new(vec![2, 3], vec![0.0, 2.0, 2.0, 4.0, 0.0, 1.0]);
    check_op(
        "embedding",
        OpKind::Embedding,
        vec![float(t(&mut r, &[5, 3])), int(ids)],
        &mut r,
    );
}

#[test]
fn fd_matmul_with_broadcast_batch() {
    let mut r = Rng::new(2);
    let (a, b) = (t(&mut r, &[2, 1, 3, 4]), t(&mut r, &[3, 4, 2]));
    check_op("matmul", OpKind::MatMul, vec![float(a), float(b)], &mut r);
}

#[test]
fn fd_linear() {
    let mut r = Rng::new(3);
    let (x, w, b) = (t(&mut r, &[2, 3, 4]), t(&mut r, &[4, 5]), t(&mut r, &[5]));
    check_op(
        "linear+bias",
        OpKind::Linear { bias: true },
        vec![float(x.clone()), float(w.clone()), float(b)],
        &mut r,
    );
    check_op(
        "linear",
        OpKind::Linear { bias: false },
        vec![float(x), float(w)],
        &mut r,
    );
}

#[test]
fn fd_broadcasting_binary() {
    let mut r = Rng::new(4);
    for (name, kind) in [
        ("add", OpKind::Add),
        ("sub", OpKind::Sub),
        ("mul", OpKind::Mul),
    ] {
        let (a, b) = (t(&mut r, &[2, 3, 4]), t(&mut r, &[3, 1]));
        check_op(name, kind.clone(), vec![float(a), float(b)], &mut r);
        let (a, b) = (t(&mut r, &[1, 4]), t(&mut r, &[3, 1, 1]));
        check_op(name, kind, vec![float(a), float(b)], &mut r);
    }
    // Keep the divisor away from zero.
    let (a, b) = (t(&mut r, &[2, 3, 4]), positive(&mut r, &[4], 0.5));
    check_op("div", OpKind::Div, vec![float(a), float(b)], &mut r);
    let (a, b) = (positive(&mut r, &[3, 1], 0.5), t(&mut r, &[2, 3, 4]));
    check_op(
        "div (scalar-like dividend)",
        OpKind::Div,
        vec![float(b), float(a)],
        &mut r,
    );
}

#[test]
fn fd_neg_exp_tanh_sigmoid_scale_silu_relu() {
    let mut r = Rng::new(5);
    unary("neg", OpKind::Neg, t(&mut r, &[3, 4]), 50);
    unary("exp", OpKind::Exp, t(&mut r, &[3, 4]), 51);
    unary("tanh", OpKind::Tanh, t(&mut r, &[3, 4]), 52);
    unary("sigmoid", OpKind::Sigmoid, t(&mut r, &[3, 4]), 53);
    unary(
        "scale",
        OpKind::Scale { factor: -0.37 },
        t(&mut r, &[3, 4]),
        54,
    );
    unary("silu", OpKind::Silu, t(&mut r, &[3, 4]), 55);
    unary("relu", OpKind::Relu, t(&mut r, &[3, 4]), 56);
    unary(
        "clamp",
        OpKind::Clamp { limit: 0.4 },
        t(&mut r, &[3, 4]),
        57,
    );
}

#[test]
fn fd_sqrt_rsqrt_pow() {
    let mut r = Rng::new(6);
    unary("sqrt", OpKind::Sqrt, positive(&mut r, &[3, 4], 0.3), 60);
    unary("rsqrt", OpKind::Rsqrt, positive(&mut r, &[3, 4], 0.3), 61);
    unary(
        "pow 2.5",
        OpKind::Pow { exponent: 2.5 },
        positive(&mut r, &[3, 4], 0.3),
        62,
    );
    unary(
        "pow 3",
        OpKind::Pow { exponent: 3.0 },
        positive(&mut r, &[3, 4], 0.3),
        63,
    );
    unary(
        "pow -0.5",
        OpKind::Pow { exponent: -0.5 },
        positive(&mut r, &[3, 4], 0.3),
        64,
    );
}

#[test]
fn fd_gelu_tanh_and_exact() {
    let mut r = Rng::new(7);
    unary(
        "gelu tanh",
        OpKind::Gelu { tanh: true },
        t(&mut r, &[4, 5]),
        70,
    );
    unary(
        "gelu exact",
        OpKind::Gelu { tanh: false },
        t(&mut r, &[4, 5]),
        71,
    );
}

#[test]
fn fd_reduce_mean_and_sum() {
    let mut r = Rng::new(8);
    unary("reduce_mean", OpKind::ReduceMean, t(&mut r, &[2, 3, 4]), 80);
    unary("reduce_sum", OpKind::ReduceSum, t(&mut r, &[2, 3, 4]), 81);
}

#[test]
fn fd_layernorm() {
    let mut r = Rng::new(9);
    let (x, g, b) = (t(&mut r, &[2, 3, 6]), t(&mut r, &[6]), t(&mut r, &[6]));
    check_op(
        "layernorm",
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: true,
        },
        vec![float(x.clone()), float(g.clone()), float(b)],
        &mut r,
    );
    // Without a beta (Cohere's): the same function less β, two gradients.
    check_op(
        "layernorm without bias",
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: false,
        },
        vec![float(x), float(g)],
        &mut r,
    );
}

#[test]
fn fd_rmsnorm() {
    let mut r = Rng::new(10);
    let (x, g) = (t(&mut r, &[2, 3, 6]), t(&mut r, &[6]));
    check_op(
        "rmsnorm",
        OpKind::RmsNorm { eps: 1e-6 },
        vec![float(x), float(g)],
        &mut r,
    );
}

#[test]
fn fd_softmax() {
    let mut r = Rng::new(11);
    unary(
        "softmax causal",
        OpKind::Softmax { causal: true },
        t(&mut r, &[2, 4, 4]),
        110,
    );
    unary(
        "softmax causal Sq<Sk",
        OpKind::Softmax { causal: true },
        t(&mut r, &[2, 3, 5]),
        111,
    );
    unary(
        "softmax",
        OpKind::Softmax { causal: false },
        t(&mut r, &[3, 5]),
        112,
    );
}

#[test]
fn fd_attention_gqa_causal() {
    let mut r = Rng::new(12);
    // B=2, S=4, heads 4 of width 3 over 2 kv heads.
    let (q, k, v) = (
        t(&mut r, &[2, 4, 12]),
        t(&mut r, &[2, 4, 6]),
        t(&mut r, &[2, 4, 6]),
    );
    let kind = OpKind::Attention {
        heads: 4,
        kv_heads: 2,
        scale: 0.6,
        causal: true,
        softcap: None,
        sinks: false,
        window: None,
        chunk: None,
    };
    check_op(
        "attention gqa causal",
        kind,
        vec![float(q), float(k), float(v)],
        &mut r,
    );
}

/// Gemma 2's soft cap, tight enough that the tanh bends the scores.
#[test]
fn fd_attention_softcapped() {
    let mut r = Rng::new(16);
    let (q, k, v) = (
        t(&mut r, &[2, 4, 12]),
        t(&mut r, &[2, 4, 6]),
        t(&mut r, &[2, 4, 6]),
    );
    let kind = OpKind::Attention {
        heads: 4,
        kv_heads: 2,
        scale: 0.6,
        causal: true,
        softcap: Some(0.5),
        sinks: false,
        window: None,
        chunk: None,
    };
    check_op(
        "attention softcap",
        kind,
        vec![float(q), float(k), float(v)],
        &mut r,
    );
}

/// gpt-oss's attention sinks: a logit per head, its gradient through the row's softmax.
#[test]
fn fd_attention_with_sinks() {
    let mut r = Rng::new(17);
    let (q, k, v, sinks) = (
        t(&mut r, &[2, 4, 12]),
        t(&mut r, &[2, 4, 6]),
        t(&mut r, &[2, 4, 6]),
        t(&mut r, &[4]),
    );
    for causal in [true, false] {
        let kind = OpKind::Attention {
            heads: 4,
            kv_heads: 2,
            scale: 0.6,
            causal,
            softcap: None,
            sinks: true,
            window: None,
            chunk: None,
        };
        let operands = [&q, &k, &v, &sinks].map(|x| float(x.clone()));
        check_op("attention sinks", kind, Vec::from(operands), &mut r);
    }
}

/// A sliding window of 2 keys over 5 (Mistral's, Gemma 2's, gpt-oss's mask), with a soft cap
/// and with sinks: the keys it hides get no gradient and take no share.
#[test]
fn fd_attention_windowed() {
    let mut r = Rng::new(18);
    let (q, k, v, sinks) = (
        t(&mut r, &[2, 5, 12]),
        t(&mut r, &[2, 5, 6]),
        t(&mut r, &[2, 5, 6]),
        t(&mut r, &[4]),
    );
    for (softcap, with_sinks) in [(None, false), (Some(0.5), false), (None, true)] {
        let kind = OpKind::Attention {
            heads: 4,
            kv_heads: 2,
            scale: 0.6,
            causal: true,
            softcap,
            sinks: with_sinks,
            window: Some(2),
            chunk: None,
        };
        let mut operands = vec![float(q.clone()), float(k.clone()), float(v.clone())];
        if with_sinks {
            operands.push(float(sinks.clone()));
        }
        check_op("attention window", kind, operands, &mut r);
    }
    // Llama 4's chunked attention (chunks of 2 over 5 positions), alone and under a window.
    for window in [None, Some(1)] {
        let kind = OpKind::Attention {
            heads: 4,
            kv_heads: 2,
            scale: 0.6,
            causal: true,
            softcap: None,
            sinks: false,
            window,
            chunk: Some(2),
        };
        let operands = vec![float(q.clone()), float(k.clone()), float(v.clone())];
        check_op("attention chunk", kind, operands, &mut r);
    }
}

#[test]
fn fd_attention_narrow_values() {
    // Multi-head latent attention: value heads (3) narrower than query/key heads (5).
    let mut r = Rng::new(15);
    let (q, k, v) = (
        t(&mut r, &[2, 4, 10]),
        t(&mut r, &[2, 4, 10]),
        t(&mut r, &[2, 4, 6]),
    );
    let kind = OpKind::Attention {
        heads: 2,
        kv_heads: 2,
        scale: 0.4,
        causal: true,
        softcap: None,
        sinks: false,
        window: None,
        chunk: None,
    };
    check_op(
        "attention dv < d",
        kind,
        vec![float(q), float(k), float(v)],
        &mut r,
    );
}

#[test]
fn fd_attention_more_keys_than_queries() {
    let mut r = Rng::new(13);
    let (q, k, v) = (
        t(&mut r, &[1, 3, 4]),
        t(&mut r, &[1, 5, 4]),
        t(&mut r, &[1, 5, 4]),
    );
    for causal in [true, false] {
        let kind = OpKind::Attention {
            heads: 2,
            kv_heads: 2,
            scale: 0.5,
            causal,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        };
        check_op(
            "attention Sq<Sk",
            kind,
            vec![float(q.clone()), float(k.clone()), float(v.clone())],
            &mut r,
        );
    }
}

#[test]
fn fd_rotary() {
    let mut r = Rng::new(14);
    unary(
        "rotary",
        OpKind::Rotary {
            heads: 2,
            theta: 10_000.0,
            scaling: Default::default(),
        },
        t(&mut r, &[2, 5, 8]),
        140,
    );
}

/// YaRN's attention factor makes the map a scaled rotation: its VJP scales too.
#[test]
fn fd_rotary_scaled() {
    let mut r = Rng::new(24);
    let yarn = ir::RopeScaling::Yarn {
        factor: 4.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        original_max: 16.0,
        attention_factor: 1.3,
        truncate: true,
    };
    unary(
        "rotary",
        OpKind::Rotary {
            heads: 2,
            theta: 10_000.0,
            scaling: yarn,
        },
        t(&mut r, &[2, 5, 8]),
        141,
    );
}

#[test]
fn fd_layout_ops() {
    let mut r = Rng::new(15);
    use ir::Dim;
    let f = |v: &[u64]| v.iter().map(|&d| Dim::Fixed(d)).collect::<Vec<_>>();
    unary(
        "reshape",
        OpKind::Reshape { shape: f(&[6, 4]) },
        t(&mut r, &[2, 3, 4]),
        150,
    );
    unary(
        "expand",
        OpKind::Expand {
            shape: f(&[2, 3, 4]),
        },
        t(&mut r, &[3, 1]),
        151,
    );
    unary(
        "transpose",
        OpKind::Transpose {
            perm: vec![2, 0, 1],
        },
        t(&mut r, &[2, 3, 4]),
        152,
    );
    unary(
        "split",
        OpKind::Split {
            axis: 1,
            sizes: vec![1, 3, 2],
        },
        t(&mut r, &[2, 6, 3]),
        153,
    );
    unary(
        "slice",
        OpKind::Slice {
            axis: 1,
            start: 1,
            end: 4,
        },
        t(&mut r, &[2, 5, 3]),
        154,
    );
    let parts = vec![
        float(t(&mut r, &[2, 1, 3])),
        float(t(&mut r, &[2, 4, 3])),
        float(t(&mut r, &[2, 2, 3])),
    ];
    check_op("concat", OpKind::Concat { axis: 1 }, parts, &mut r);
}

#[test]
fn fd_dropout() {
    let mut r = Rng::new(16);
    unary(
        "dropout",
        OpKind::Dropout { p: 0.1, seed: 1234 },
        t(&mut r, &[4, 8]),
        160,
    );
}

#[test]
fn fd_cross_entropy() {
    let mut r = Rng::new(17);
    let logits = t(&mut r, &[2, 3, 7]);
    let targets = ids(&mut r, &[2, 3], 7);
    check_op(
        "cross_entropy",
        OpKind::CrossEntropy,
        vec![float(logits), int(targets)],
        &mut r,
    );
}

/// The smallest gap between the k-th and (k+1)-th largest router logit over all rows.
fn topk_margin(x: &Tensor, w: &Tensor, e: usize, k: usize) -> f64 {
    let h = w.shape[0];
    x.data
        .chunks(h)
        .map(|row| {
            let mut l: Vec<f64> = (0..e)
                .map(|j| (0..h).map(|i| row[i] * w.data[i * e + j]).sum())
                .collect();
            l.sort_by(|a, b| b.total_cmp(a));
            l[k - 1] - l[k]
        })
        .fold(f64::INFINITY, f64::min)
}

/// Router inputs with every top-k selection at least 0.05 from a tie, far beyond the FD step.
fn router_inputs(r: &mut Rng, tokens: usize, h: usize, e: usize, k: usize) -> (Tensor, Tensor) {
    loop {
        let (x, w) = (t(r, &[tokens, h]), t(r, &[h, e]));
        if topk_margin(&x, &w, e, k) > 0.05 {
            return (x, w);
        }
    }
}

#[test]
fn fd_topk_router() {
    let mut r = Rng::new(18);
    let (x, w) = router_inputs(&mut r, 6, 5, 4, 2);
    check_op(
        "topk_router",
        OpKind::TopKRouter {
            experts: 4,
            k: 2,
            routing: Default::default(),
            bias: false,
        },
        vec![float(x), float(w)],
        &mut r,
    );
}

/// gpt-oss's router: a bias on the logits, small beside the margins the choice keeps.
#[test]
fn fd_topk_router_with_bias() {
    let mut r = Rng::new(23);
    let (x, w) = router_inputs(&mut r, 6, 5, 4, 2);
    let bias = Tensor::new(
        vec![4],
        t(&mut r, &[4]).data.iter().map(|b| b * 0.01).collect(),
    );
    let router = OpKind::TopKRouter {
        experts: 4,
        k: 2,
        routing: Default::default(),
        bias: true,
    };
    check_op(
        "topk_router bias",
        router,
        vec![float(x), float(w), float(bias)],
        &mut r,
    );
}

/// Whether every token's chosen experts stay the same when any one of its logits moves by
/// 0.02 either way: far beyond the FD step, so the check differentiates one smooth piece.
fn stable_route(x: &Tensor, w: &Tensor, routing: &ir::Routing, k: usize) -> bool {
    let (h, e) = (w.shape[0], w.shape[1]);
    x.data.chunks(h).all(|row| {
        let l: Vec<f64> = (0..e)
            .map(|j| (0..h).map(|i| row[i] * w.data[i * e + j]).sum())
            .collect();
        let chosen = routing.route(&l, k).chosen;
        (0..e).all(|j| {
            [-0.02, 0.02].iter().all(|d| {
                let mut moved = l.clone();
                moved[j] += d;
                routing.route(&moved, k).chosen == chosen
            })
        })
    })
}

/// Qwen-MoE's unnormalized softmax shares, DeepSeek-V3's group-limited sigmoid and
/// DeepSeek-V2's group-limited softmax.
#[test]
fn fd_topk_router_scorings() {
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
            sigmoid: false,
            normalize: false,
            groups: 4,
            groups_kept: 2,
            group_top: 1,
        },
    ];
    let mut r = Rng::new(31);
    for routing in scorings {
        let (x, w) = loop {
            let (x, w) = (t(&mut r, &[6, 5]), t(&mut r, &[5, 8]));
            if stable_route(&x, &w, &routing, 3) {
                break (x, w);
            }
        };
        let router = OpKind::TopKRouter {
            experts: 8,
            k: 3,
            routing,
            bias: false,
        };
        check_op("topk_router", router, vec![float(x), float(w)], &mut r);
    }
}

#[test]
fn fd_moe_experts() {
    let mut r = Rng::new(19);
    let (e, h, f, tokens) = (4, 5, 3, 6);
    let x = t(&mut r, &[2, 3, h]);
    let (xr, wr) = router_inputs(&mut r, tokens, h, e, 2);
    // Gates as the router would produce them (zeros off the top 2), as a free operand.
    let gates = ir::interp::apply(
        &OpKind::TopKRouter {
            experts: 4,
            k: 2,
            routing: Default::default(),
            bias: false,
        },
        &[&xr, &wr],
        common::BIND,
    )
    .expect("routes")
    .remove(0);
    let gates = Tensor::new(vec![2, 3, e], gates.data);
    let ops = vec![
        float(x),
        float(gates),
        float(t(&mut r, &[e, h, f])),
        float(t(&mut r, &[e, h, f])),
        float(t(&mut r, &[e, f, h])),
    ];
    check_op(
        "moe_experts",
        OpKind::MoeExperts {
            experts: 4,
            form: Default::default(),
        },
        ops.clone(),
        &mut r,
    );
    // Llama 4's: each gate scales its expert's input (the gate's gradient is then x·dxs, not
    // dy·out).
    let scaling_input = ir::ExpertForm {
        scales_input: true,
        ..ir::ExpertForm::SWIGLU
    };
    check_op(
        "moe_experts scaling input",
        OpKind::MoeExperts {
            experts: 4,
            form: scaling_input,
        },
        ops.clone(),
        &mut r,
    );
    // gpt-oss's experts: biases, σ(1.702·gate), gate and up clamped (tight, so that some
    // are), up offset by one.
    let form = ir::ExpertForm {
        bias: true,
        alpha: 1.702,
        limit: Some(0.6),
        up_offset: 1.0,
        scales_input: false,
    };
    let biased = ops
        .into_iter()
        .chain([float(t(&mut r, &[e, f])), float(t(&mut r, &[e, f]))])
        .collect();
    check_op(
        "moe_experts gpt-oss",
        OpKind::MoeExperts { experts: 4, form },
        biased,
        &mut r,
    );
}
