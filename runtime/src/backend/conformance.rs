//! A conformance suite for [`Backend`]s: each op forward, backward and as the executor's
//! `Grad{of, wrt}` against the CPU kernels (`kernels::forward` / `kernels::backward`), within
//! a relative tolerance, and (where the backend counts them) with no op run on the host.
//!
//! The emulator tests (`tests/tests/device_ops.rs`) run [`check`] on their own cases and
//! [`cases`] on the emulated device; `plait bench kernels --device cuda` runs [`cases`] on a
//! GPU, so the first minute of GPU time says which kernel, if any, differs there.

use ir::routing::Routing;
use ir::{Binding, Dim, OpKind, RopeScaling};
use kernels::Tensor32;

use super::Backend;
use crate::RuntimeError;

/// A failed check: where the backend's value left the tolerance, a host fallback, or an error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConformanceError {
    #[error("{check}: element {index} is {got}, the CPU kernels say {want} (tolerance {tol})")]
    Wrong {
        check: String,
        index: usize,
        got: f32,
        want: f32,
        tol: f32,
    },
    #[error("{check}: shape {got:?}, the CPU kernels give {want:?}")]
    Shape {
        check: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("{check}: {count} op(s) ran on the host instead of the device")]
    HostFallback { check: String, count: u64 },
    #[error("{check}: {source}")]
    Backend {
        check: String,
        #[source]
        source: RuntimeError,
    },
    #[error("{check}: the CPU kernels fail: {source}")]
    Reference {
        check: String,
        #[source]
        source: kernels::KernelError,
    },
}

/// One op on fixed operands, and the relative tolerance its results must meet.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub kind: OpKind,
    pub inputs: Vec<Tensor32>,
    pub tol: f32,
}

/// What a passed check measured: the largest error relative to `1 + |want|` over every result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Passed {
    pub max_error: f32,
}

/// Deterministic values in [-1, 1).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let step = |s: u64| {
        s.wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    };
    let mut s = step(seed);
    (0..n)
        .map(|_| {
            s = step(s);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn build(shape: &[usize], values: Vec<f32>) -> Tensor32 {
    Tensor32 {
        shape: shape.to_vec(),
        data: values,
    }
}

/// A tensor of [`data`].
pub fn tensor(shape: &[usize], seed: u64) -> Tensor32 {
    build(shape, data(shape.iter().product(), seed))
}

/// Values in [lo, lo + 1): operands that must stay positive (sqrt, pow, div).
pub fn positive(shape: &[usize], seed: u64, lo: f32) -> Tensor32 {
    let t = tensor(shape, seed);
    build(shape, t.data.iter().map(|x| lo + 0.5 * (x + 1.0)).collect())
}

/// Integer ids below `vocab`, as f32 (token ids, targets).
pub fn ids(shape: &[usize], vocab: usize, seed: u64) -> Tensor32 {
    let t = tensor(shape, seed);
    let v = vocab as f32;
    let id = |x: &f32| ((x + 1.0) * 0.5 * v).floor().min(v - 1.0);
    build(shape, t.data.iter().map(id).collect())
}

const BINDING: Binding = Binding { batch: 1, seq: 1 };

/// `got` against `want`: the largest relative error, or where it leaves `tol`.
fn compare(
    got: &Tensor32,
    want: &Tensor32,
    tol: f32,
    check: &str,
) -> Result<f32, ConformanceError> {
    if got.shape != want.shape {
        return Err(ConformanceError::Shape {
            check: check.into(),
            got: got.shape.clone(),
            want: want.shape.clone(),
        });
    }
    let mut worst = 0f32;
    for (index, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        // A NaN error (a NaN result where the CPU has a number, or the reverse) fails too.
        if err.is_nan() || err > tol {
            return Err(ConformanceError::Wrong {
                check: check.into(),
                index,
                got: g,
                want: w,
                tol,
            });
        }
        worst = worst.max(err);
    }
    Ok(worst)
}

/// The backend's results (downloaded) against the CPU kernels', one by one.
fn compare_all<B: Backend>(
    b: &B,
    got: &[Option<B::Buffer>],
    want: &[Option<Tensor32>],
    tol: f32,
    check: &str,
) -> Result<f32, ConformanceError> {
    if got.len() != want.len() {
        return Err(ConformanceError::Shape {
            check: format!("{check}: result count"),
            got: vec![got.len()],
            want: vec![want.len()],
        });
    }
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let what = format!("{check} result {i}");
        match (g, w) {
            (Some(g), Some(w)) => {
                let host = b.download(g).map_err(backend(&what))?;
                worst = worst.max(compare(&host, w, tol, &what)?);
            }
            (None, None) => {}
            _ => {
                return Err(ConformanceError::Shape {
                    check: format!("{what}: present on one side only"),
                    got: vec![usize::from(g.is_some())],
                    want: vec![usize::from(w.is_some())],
                });
            }
        }
    }
    Ok(worst)
}

fn backend(check: &str) -> impl Fn(RuntimeError) -> ConformanceError + '_ {
    move |source| ConformanceError::Backend {
        check: check.into(),
        source,
    }
}

fn reference(check: &str) -> impl Fn(kernels::KernelError) -> ConformanceError + '_ {
    move |source| ConformanceError::Reference {
        check: check.into(),
        source,
    }
}

/// The smallest tolerance a bf16 result is checked at: 2.6 units of its last place (2⁻⁸).
const BF16_TOL: f32 = 1e-2;

/// `case` forward, backward and as `Grad` on `b` against the CPU kernels; fails on a host
/// fallback where `b` counts them.
pub fn check<B: Backend>(b: &B, case: &Case) -> Result<Passed, ConformanceError> {
    let what = format!("{} ({}) on {}", case.name, case.kind.mnemonic(), b.name());
    let before = b.transfer_stats();
    let bufs = case
        .inputs
        .iter()
        .map(|t| b.upload(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(backend(&what))?;
    let refs: Vec<&B::Buffer> = bufs.iter().collect();
    let host: Vec<&Tensor32> = case.inputs.iter().collect();
    let fwd = format!("{what} forward");
    let got = b
        .forward(&case.kind, &refs, BINDING)
        .map_err(backend(&fwd))?;
    let want = kernels::forward(&case.kind, &host, BINDING).map_err(reference(&fwd))?;
    let got: Vec<_> = got.into_iter().map(Some).collect();
    let dys: Vec<Tensor32> = want
        .iter()
        .enumerate()
        .map(|(i, w)| tensor(&w.shape, 99 + i as u64))
        .collect();
    let want: Vec<_> = want.into_iter().map(Some).collect();
    let mut worst = compare_all(b, &got, &want, case.tol, &fwd)?;
    // The results made as bf16 words alone where `b` makes them so (a biased linear's: its
    // GEMM adding onto the bias's words): the same values within the case's tolerance, where
    // that is a bf16 one (words hold 8 significant bits).
    let fwd_words = format!("{fwd} as bf16 words");
    let words = if case.tol >= BF16_TOL {
        b.forward_words(&case.kind, &refs)
            .map_err(backend(&fwd_words))?
    } else {
        None
    };
    if let Some(made) = words {
        let made: Vec<_> = made.into_iter().map(Some).collect();
        worst = worst.max(compare_all(b, &made, &want, case.tol, &fwd_words)?);
    }
    let dy_bufs = dys
        .iter()
        .map(|t| b.upload(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(backend(&what))?;
    let dy_refs: Vec<&B::Buffer> = dy_bufs.iter().collect();
    let dy_host: Vec<&Tensor32> = dys.iter().collect();
    let bwd = format!("{what} backward");
    let got = b
        .backward(&case.kind, &refs, &dy_refs)
        .map_err(backend(&bwd))?;
    let want = kernels::backward(&case.kind, &host, &dy_host).map_err(reference(&bwd))?;
    worst = worst.max(compare_all(b, &got, &want, case.tol, &bwd)?);
    // The executor's form of the same: `Grad{of, wrt}` through `forward`.
    let wrt = (0..want.len()).filter(|&i| want[i].is_some()).collect();
    let grad = OpKind::Grad {
        of: Box::new(case.kind.clone()),
        wrt,
    };
    let all: Vec<&B::Buffer> = refs.iter().chain(&dy_refs).copied().collect();
    let host_all: Vec<&Tensor32> = host.iter().chain(&dy_host).copied().collect();
    let gop = format!("{what} grad op");
    let got = b.forward(&grad, &all, BINDING).map_err(backend(&gop))?;
    let want = kernels::forward(&grad, &host_all, BINDING).map_err(reference(&gop))?;
    let got: Vec<_> = got.into_iter().map(Some).collect();
    let want: Vec<_> = want.into_iter().map(Some).collect();
    worst = worst.max(compare_all(b, &got, &want, case.tol, &gop)?);
    worst = worst.max(check_words(b, case, (&grad, &all), &want, &what)?);
    worst = worst.max(check_pitched(b, case, (&grad, &all), &want, &what)?);
    let fallbacks = b
        .transfer_stats()
        .zip(before)
        .map_or(0, |(now, then)| now.since(then).host_ops);
    if fallbacks > 0 {
        return Err(ConformanceError::HostFallback {
            check: what,
            count: fallbacks,
        });
    }
    Ok(Passed { max_error: worst })
}

/// The gradient made by the paths that write results as bf16 words alone, where `b` has them
/// for `case`: a linear's or product's gradients written by their GEMMs as bf16
/// (`Backend::forward_some_words`), and the tensor-core attention's gradients from its kept
/// forward (`Backend::attention_backward_kept` with its words kernels); the same values as the
/// CPU kernels' `want` within the case's tolerance. 0 where `b` has neither.
fn check_words<B: Backend>(
    b: &B,
    case: &Case,
    (grad, all): (&OpKind, &[&B::Buffer]),
    want: &[Option<Tensor32>],
    what: &str,
) -> Result<f32, ConformanceError> {
    let check = format!("{what} grad op as bf16 words");
    let mask = vec![true; want.len()];
    if let Some(made) = b
        .forward_some_words(grad, all, &mask)
        .map_err(backend(&check))?
    {
        let got: Vec<_> = made.into_iter().map(|(g, _)| Some(g)).collect();
        return compare_all(b, &got, want, case.tol, &check);
    }
    let (OpKind::Attention { .. }, Some((dy, xs))) = (&case.kind, all.split_last()) else {
        return Ok(0.0);
    };
    let Some(kept) = b
        .attention_forward_keeping(&case.kind, xs, false)
        .map_err(backend(&check))?
    else {
        return Ok(0.0);
    };
    let grads = b
        .attention_backward_kept(&case.kind, xs, [dy, &kept.out, &kept.stats], true)
        .map_err(backend(&check))?;
    let worst = match grads {
        Some(g) => {
            let got: Vec<_> = g.grads.into_iter().map(Some).collect();
            compare_all(b, &got, want, case.tol, &check)
        }
        None => Ok(0.0),
    };
    b.free(kept.out);
    b.free(kept.stats);
    worst
}

/// The gradient held at a pitch where `b` makes it so (`Backend::forward_pitched`: the
/// cross-entropy's as a bf16 GEMM's operand), the same values as the CPU kernels' `want`
/// within the case's tolerance once expanded (read back through `Backend::download`); 0
/// where `b` does not.
fn check_pitched<B: Backend>(
    b: &B,
    case: &Case,
    (grad, all): (&OpKind, &[&B::Buffer]),
    want: &[Option<Tensor32>],
    what: &str,
) -> Result<f32, ConformanceError> {
    let check = format!("{what} grad op held at a pitch");
    if case.tol < BF16_TOL {
        return Ok(0.0);
    }
    match b.forward_pitched(grad, all).map_err(backend(&check))? {
        Some(held) => compare_all(b, &[Some(held)], want, case.tol, &check),
        None => Ok(0.0),
    }
}

fn case(name: &str, kind: OpKind, inputs: Vec<Tensor32>, tol: f32) -> Case {
    Case {
        name: name.into(),
        kind,
        inputs,
        tol,
    }
}

/// Cases for a backend of a bf16 plan (`GemmPrecision::Bf16`), at bf16's tolerance (operands
/// rounded to 8 significant bits; a wrong fragment layout or mask is off by O(1)): the GEMMs
/// (bf16 copies of the operands on a GPU), and attention
/// at each head width the tensor-core kernels are built for (`attention_mma.cu`), with grouped
/// heads, a soft cap, no mask, sequences that end inside a tile, and fewer queries than keys.
pub fn bf16_cases() -> Vec<Case> {
    let attention = |heads, kv_heads, causal, softcap| OpKind::Attention {
        heads,
        kv_heads,
        scale: 0.3,
        causal,
        softcap,
        sinks: false,
        window: None,
        chunk: None,
    };
    let qkv = |seq: usize, heads: usize, kv: usize, d: usize, seed: u64| {
        vec![
            tensor(&[2, seq, heads * d], seed),
            tensor(&[2, seq, kv * d], seed + 1),
            tensor(&[2, seq, kv * d], seed + 2),
        ]
    };
    let tol = 2e-2;
    // Products over 80 and 160 terms of two rounded operands: their error reaches 0.03 of
    // 1 + |result|.
    let gemms = product_cases().into_iter().map(|c| Case { tol: 5e-2, ..c });
    gemms
        .chain([
            // Outputs whose rows are not whole 16-byte words (an LM head's 50257 columns), which
            // cuBLAS writes at a padded pitch first (cuda_ops.rs: `PaddedOutput`).
            case(
                "gemm",
                OpKind::Linear { bias: false },
                vec![tensor(&[3, 70, 96], 25), tensor(&[96, 203], 26)],
                5e-2,
            ),
            case(
                "gemm",
                OpKind::MatMul,
                vec![tensor(&[2, 3, 50, 80], 27), tensor(&[2, 3, 80, 37], 28)],
                5e-2,
            ),
            // A vocabulary of odd width: the gradient made as the LM head's bf16 GEMM operand
            // (rows padded to 8 columns), checked through its expansion. Few rows, so that
            // the targets' entries (−g/N) stand out of the tolerance.
            case(
                "loss",
                OpKind::CrossEntropy,
                vec![tensor(&[2, 3, 203], 29), ids(&[2, 3], 203, 30)],
                BF16_TOL,
            ),
            case(
                "attention",
                attention(4, 2, true, None),
                qkv(200, 4, 2, 32, 60),
                tol,
            ),
            case(
                "attention",
                attention(2, 2, true, Some(5.0)),
                qkv(130, 2, 2, 64, 63),
                tol,
            ),
            case(
                "attention",
                attention(2, 1, false, None),
                qkv(70, 2, 1, 64, 66),
                tol,
            ),
            // Sliding windows on the tensor cores: 70 keys (across blocks of 64 keys, with
            // sinks) and 9 (inside one), with fewer queries than keys.
            case(
                "attention",
                OpKind::Attention {
                    heads: 4,
                    kv_heads: 2,
                    scale: 0.3,
                    causal: true,
                    softcap: None,
                    sinks: true,
                    window: Some(70),
                    chunk: None,
                },
                qkv(200, 4, 2, 64, 86)
                    .into_iter()
                    .chain([tensor(&[4], 89)])
                    .collect(),
                tol,
            ),
            case(
                "attention",
                attention(4, 2, true, None).with_window(Some(9)),
                vec![
                    tensor(&[2, 40, 4 * 32], 90),
                    tensor(&[2, 100, 2 * 32], 91),
                    tensor(&[2, 100, 2 * 32], 92),
                ],
                tol,
            ),
            // Llama 4's chunks on the tensor cores: 96 keys (chunks starting inside blocks of
            // 64 keys), and 24 under fewer queries than keys.
            case(
                "attention",
                attention(4, 2, true, None).with_mask(ir::KeyMask {
                    window: None,
                    chunk: Some(96),
                }),
                qkv(200, 4, 2, 64, 93),
                tol,
            ),
            case(
                "attention",
                attention(4, 2, true, None).with_mask(ir::KeyMask {
                    window: None,
                    chunk: Some(24),
                }),
                vec![
                    tensor(&[2, 40, 4 * 32], 94),
                    tensor(&[2, 100, 2 * 32], 95),
                    tensor(&[2, 100, 2 * 32], 96),
                ],
                tol,
            ),
            // gpt-oss's sinks on the tensor cores (their statistics in log₂ units).
            case(
                "attention",
                OpKind::Attention {
                    heads: 4,
                    kv_heads: 2,
                    scale: 0.3,
                    causal: true,
                    softcap: None,
                    sinks: true,
                    window: None,
                    chunk: None,
                },
                qkv(90, 4, 2, 64, 80)
                    .into_iter()
                    .chain([tensor(&[4], 83)])
                    .collect(),
                tol,
            ),
            case(
                "attention",
                attention(2, 1, true, None),
                qkv(100, 2, 1, 128, 69),
                tol,
            ),
            // Fewer queries than keys under the causal mask (the queries aligned with the last
            // keys): the masks' offset, in the forward and in dk, dv's per-key bounds.
            case(
                "attention",
                attention(4, 2, true, None),
                vec![
                    tensor(&[2, 40, 4 * 64], 72),
                    tensor(&[2, 100, 2 * 64], 73),
                    tensor(&[2, 100, 2 * 64], 74),
                ],
                tol,
            ),
        ])
        .collect()
}

/// One case of every op family a device lowers, at sizes that span several blocks and tiles.
pub fn cases() -> Vec<Case> {
    let mut all = pointwise_cases();
    all.extend(row_cases());
    all.extend(product_cases());
    all.extend(layout_cases());
    all.extend(moe_cases());
    all
}

fn pointwise_cases() -> Vec<Case> {
    let x = tensor(&[7, 333], 1);
    let mut all: Vec<Case> = [
        OpKind::Neg,
        OpKind::Exp,
        OpKind::Tanh,
        OpKind::Sigmoid,
        OpKind::Gelu { tanh: false },
        OpKind::Gelu { tanh: true },
        OpKind::Silu,
        OpKind::Relu,
        OpKind::Clamp { limit: 0.4 },
    ]
    .into_iter()
    .map(|k| case("unary", k, vec![x.clone()], 1e-6))
    .collect();
    let p = positive(&[7, 333], 2, 0.25);
    all.push(case("unary", OpKind::Rsqrt, vec![p.clone()], 1e-6));
    all.push(case("unary", OpKind::Pow { exponent: 2.5 }, vec![p], 1e-6));
    for kind in [OpKind::Add, OpKind::Mul, OpKind::Div] {
        let operands = vec![tensor(&[4, 50, 64], 3), positive(&[64], 4, 0.5)];
        all.push(case("broadcast", kind, operands, 1e-5));
    }
    all
}

/// [`row_cases`]' attention with gpt-oss's sinks.
fn attention_with_sinks() -> OpKind {
    OpKind::Attention {
        heads: 4,
        kv_heads: 2,
        scale: 0.35,
        causal: true,
        softcap: None,
        sinks: true,
        window: None,
        chunk: None,
    }
}

fn row_cases() -> Vec<Case> {
    // 270 rows: the weights' gradients sum over several chunks of rows.
    let (x, gamma, beta) = (tensor(&[3, 90, 96], 5), tensor(&[96], 6), tensor(&[96], 7));
    let attention = OpKind::Attention {
        heads: 4,
        kv_heads: 2,
        scale: 0.35,
        causal: true,
        softcap: None,
        sinks: false,
        window: None,
        chunk: None,
    };
    let qkv = vec![
        tensor(&[2, 300, 4 * 16], 40),
        tensor(&[2, 300, 2 * 16], 41),
        tensor(&[2, 300, 2 * 16], 42),
    ];
    let rotary = OpKind::Rotary {
        heads: 4,
        theta: 10000.0,
        scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max: 64.0,
        },
    };
    vec![
        case(
            "norm",
            OpKind::LayerNorm {
                eps: 1e-5,
                bias: true,
            },
            vec![x.clone(), gamma.clone(), beta],
            1e-5,
        ),
        case(
            "norm",
            OpKind::LayerNorm {
                eps: 1e-5,
                bias: false,
            },
            vec![x.clone(), gamma.clone()],
            1e-5,
        ),
        case(
            "norm",
            OpKind::RmsNorm { eps: 1e-6 },
            vec![x.clone(), gamma],
            1e-5,
        ),
        case(
            "softmax",
            OpKind::Softmax { causal: true },
            vec![tensor(&[2, 3, 300, 300], 9)],
            1e-5,
        ),
        case("reduce", OpKind::ReduceSum, vec![x], 1e-6),
        case(
            "loss",
            OpKind::CrossEntropy,
            vec![tensor(&[3, 50, 1000], 11), ids(&[3, 50], 1000, 12)],
            1e-5,
        ),
        case(
            "table",
            OpKind::Embedding,
            vec![tensor(&[1000, 64], 13), ids(&[4, 60], 1000, 14)],
            1e-6,
        ),
        case("attention", attention.clone(), qkv.clone(), 2e-5),
        // gpt-oss's sinks, one logit per head beside the keys.
        case(
            "attention",
            attention_with_sinks(),
            qkv.clone().into_iter().chain([tensor(&[4], 43)]).collect(),
            2e-5,
        ),
        // A sliding window of 40 keys (Mistral's, Gemma 2's, gpt-oss's), with the sinks:
        // windows that start inside a tile and skip whole tiles before them.
        case(
            "attention",
            attention_with_sinks().with_window(Some(40)),
            qkv.clone().into_iter().chain([tensor(&[4], 44)]).collect(),
            2e-5,
        ),
        // Llama 4's chunks of 50 keys, each query seeing only its own chunk's (chunks starting
        // inside tiles), alone and under a window of 30.
        case(
            "attention",
            attention.clone().with_mask(ir::KeyMask {
                window: None,
                chunk: Some(50),
            }),
            qkv.clone(),
            2e-5,
        ),
        case(
            "attention",
            attention_with_sinks().with_mask(ir::KeyMask {
                window: Some(30),
                chunk: Some(50),
            }),
            qkv.into_iter().chain([tensor(&[4], 45)]).collect(),
            2e-5,
        ),
        case("rotary", rotary, vec![tensor(&[2, 300, 4 * 16], 43)], 1e-5),
        // Llama 4's NoPE queries: unturned, scaled by the attention temperature per position.
        case(
            "rotary temperature",
            OpKind::Rotary {
                heads: 4,
                theta: 500_000.0,
                scaling: RopeScaling::Temperature {
                    floor: 64.0,
                    scale: 0.1,
                },
            },
            vec![tensor(&[2, 300, 4 * 16], 44)],
            1e-5,
        ),
    ]
}

fn product_cases() -> Vec<Case> {
    vec![
        case(
            "gemm",
            OpKind::MatMul,
            vec![tensor(&[2, 3, 50, 80], 17), tensor(&[2, 3, 80, 40], 18)],
            1e-5,
        ),
        case(
            "gemm",
            OpKind::Linear { bias: true },
            vec![
                tensor(&[4, 60, 160], 21),
                tensor(&[160, 120], 22),
                tensor(&[120], 23),
            ],
            1e-5,
        ),
    ]
}

fn layout_cases() -> Vec<Case> {
    let x = tensor(&[4, 30, 24], 24);
    vec![
        case(
            "layout",
            OpKind::Transpose {
                perm: vec![1, 0, 2],
            },
            vec![x.clone()],
            0.0,
        ),
        case(
            "layout",
            OpKind::Reshape {
                shape: vec![Dim::from(120), Dim::from(24)],
            },
            vec![x.clone()],
            0.0,
        ),
        case(
            "layout",
            OpKind::Slice {
                axis: 2,
                start: 3,
                end: 19,
            },
            vec![x],
            0.0,
        ),
        // Last dims of 64 and more, which strided_copy moves a row per block: contiguous on
        // both sides, and strided on one (a transpose of the last two dims).
        case(
            "layout",
            OpKind::Transpose {
                perm: vec![1, 0, 2],
            },
            vec![tensor(&[3, 20, 70], 29)],
            0.0,
        ),
        case(
            "layout",
            OpKind::Transpose {
                perm: vec![0, 2, 1],
            },
            vec![tensor(&[2, 65, 80], 30)],
            0.0,
        ),
    ]
}

fn moe_cases() -> Vec<Case> {
    let (experts, hidden, width) = (8u64, 32, 24);
    let e = experts as usize;
    let x = tensor(&[2, 40, hidden], 71);
    let w = tensor(&[hidden, e], 72);
    let deepseek = Routing {
        sigmoid: true,
        normalize: true,
        groups: 4,
        groups_kept: 2,
        group_top: 2,
    };
    // DeepSeek-V2's group-limited greedy: softmax shares, a group scored by its best expert.
    let deepseek_v2 = Routing {
        sigmoid: false,
        normalize: false,
        group_top: 1,
        ..deepseek
    };
    let router = |k, routing| OpKind::TopKRouter {
        experts,
        k,
        routing,
        bias: false,
    };
    let gates = kernels::forward(&router(2, Routing::default()), &[&x, &w], BINDING)
        .map(|mut g| g.remove(0))
        .unwrap_or_else(|_| tensor(&[2, 40, e], 70));
    let weights = vec![
        tensor(&[e, hidden, width], 73),
        tensor(&[e, hidden, width], 74),
        tensor(&[e, width, hidden], 75),
    ];
    let mut operands = vec![x.clone(), gates];
    operands.extend(weights);
    vec![
        case(
            "router",
            router(2, Routing::default()),
            vec![x.clone(), w.clone()],
            1e-5,
        ),
        case(
            "router",
            router(3, deepseek),
            vec![x.clone(), w.clone()],
            1e-5,
        ),
        case("router", router(3, deepseek_v2), vec![x, w], 1e-5),
        case(
            "experts",
            OpKind::MoeExperts {
                experts,
                form: Default::default(),
            },
            operands.clone(),
            1e-5,
        ),
        // gpt-oss's experts: biases, the clamped unit (biting on these values), offset up.
        case(
            "experts",
            OpKind::MoeExperts {
                experts,
                form: ir::ExpertForm {
                    bias: true,
                    alpha: 1.702,
                    limit: Some(0.5),
                    up_offset: 1.0,
                    scales_input: false,
                },
            },
            operands
                .into_iter()
                .chain([tensor(&[e, width], 76), tensor(&[e, width], 77)])
                .collect(),
            1e-5,
        ),
    ]
}
