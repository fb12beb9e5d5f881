//! What plait's own CPU kernels sustain: the matmul rate per rank when every rank multiplies at
//! once, and, per class of memory-bound kernel, the bandwidth of a forward plus backward pass
//! relative to a plain copy (`gpu.kernel_fractions` in the cluster file). The bytes of a pass
//! are the cost model's (`ir::cost::op_cost`: operands read, results written), so a fraction
//! converts the model's bytes into this runtime's seconds exactly as the H200 fractions do for
//! PyTorch's kernels.

use std::hint::black_box;
use std::time::Instant;

use ir::{Binding, DType, Graph, OpKind, Shape, TensorType};
use kernels::Tensor32;

use crate::backend::{DropoutMask, Stashed};
use crate::{Backend, CpuBackend, RuntimeError};

/// Per-thread sgemm GFLOP/s at `n`³ with `threads` threads multiplying their own matrices at
/// once (best of `reps` rounds after a warm-up): a rank's rate when every rank computes.
pub fn sgemm_gflops_concurrent(threads: usize, n: usize, reps: usize) -> Result<f64, RuntimeError> {
    let one = |_: usize| -> Result<f64, RuntimeError> {
        let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.2).collect();
        let mut c = vec![0f32; n * n];
        let mut best = f64::INFINITY;
        for _ in 0..=reps.max(1) {
            let t = Instant::now();
            kernels::sgemm(black_box(&a), black_box(&b), &mut c, n, n, n)
                .map_err(RuntimeError::kernel("sgemm"))?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        black_box(&c);
        Ok(2.0 * (n as f64).powi(3) / best.max(1e-12) / 1e9)
    };
    let rates = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|i| s.spawn(move || one(i)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::Profile {
                        message: "an sgemm thread panicked".into(),
                    })
                })
            })
            .collect::<Result<Vec<f64>, RuntimeError>>()
    })?;
    Ok(rates.iter().sum::<f64>() / rates.len() as f64)
}

/// Measured bandwidth fractions (kernel GB/s over copy GB/s, both per rank with every thread
/// busy) for the kernel classes of `planner::cost::compute::KernelClass`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelFractions {
    pub pointwise: f64,
    pub activation: f64,
    pub norm: f64,
    pub softmax: f64,
    pub dropout: f64,
}

/// One class's representative op on `[rows, cols]` activations: its kind and operand types.
fn case(kind: OpKind, rows: u64, cols: u64) -> Result<(Graph, ir::OpId), RuntimeError> {
    let mut g = Graph::new("profile");
    let act = TensorType::new(DType::F32, Shape::fixed(&[rows, cols]));
    let vec = TensorType::new(DType::F32, Shape::fixed(&[cols]));
    let input = |g: &mut Graph, name: &str, ty: &TensorType| {
        g.push_source(
            OpKind::Input {
                name: name.to_string(),
            },
            ty.clone(),
            None,
        )
    };
    let mut ins = vec![input(&mut g, "x", &act)];
    match kind {
        OpKind::Add => ins.push(input(&mut g, "y", &act)),
        OpKind::LayerNorm { bias, .. } => {
            ins.push(input(&mut g, "w", &vec));
            if bias {
                ins.push(input(&mut g, "b", &vec));
            }
        }
        _ => {}
    }
    g.push_op(kind, ins, None)
        .map_err(|e| RuntimeError::Profile {
            message: format!("building the profile op: {e}"),
        })?;
    let o = *g.order().last().ok_or_else(|| RuntimeError::Profile {
        message: "empty profile graph".into(),
    })?;
    Ok((g, o))
}

/// The operands of `o` as `be`'s buffers: deterministic values in [-0.4, 0.4].
fn operands<B: Backend>(be: &B, g: &Graph, o: ir::OpId) -> Result<Vec<B::Buffer>, RuntimeError> {
    let b = Binding { batch: 1, seq: 1 };
    g.op(o)
        .inputs
        .iter()
        .enumerate()
        .map(|(j, &v)| {
            let shape: Vec<usize> = g.ty(v).shape.eval(b).iter().map(|&d| d as usize).collect();
            filled(be, &shape, j)
        })
        .collect()
}

/// `x` held as its bf16 words alone (`true`) where the backend keeps words, as the executor
/// holds a result only word readers read ([`Backend::forward_words`]); else `x` as it is.
pub(super) fn held_as_words<B: Backend>(
    be: &B,
    x: B::Buffer,
) -> Result<(B::Buffer, bool), RuntimeError> {
    let shape = be.shape(&x).to_vec();
    match be.stash_bf16(x)? {
        Stashed::Words(w) => Ok((be.unstash_bf16_words(w, &shape)?, true)),
        Stashed::Kept(x) => Ok((x, false)),
    }
}

/// Whether a transformer's `kind` writes a result that only GEMMs read (a GELU's, ahead of the
/// down projection; a norm's, ahead of the projections): the executor makes it as bf16 words
/// where the backend can, and its gradient comes back as the words a GEMM wrote.
fn feeds_gemms(kind: &OpKind) -> bool {
    matches!(
        kind,
        OpKind::Gelu { .. } | OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. }
    )
}

/// What one pass of an op reads, held as the executor would hold it: for an op whose result
/// only GEMMs read ([`feeds_gemms`]), an output gradient (as words where the gradient reads
/// it so), and each operand that both directions read only as words held as words.
struct Held<B: Backend> {
    xs: Vec<B::Buffer>,
    /// The output gradient, for an op whose result is made as words.
    dy: Option<B::Buffer>,
}

impl<B: Backend> Held<B> {
    fn new(be: &B, kind: &OpKind, xs: Vec<B::Buffer>) -> Result<Held<B>, RuntimeError> {
        if !feeds_gemms(kind) || xs.is_empty() {
            return Ok(Held { xs, dy: None });
        }
        let n = xs.len();
        let y_shape = be.shape(&xs[0]).to_vec();
        let mut owned: Vec<Vec<usize>> = xs.iter().map(|x| be.shape(x).to_vec()).collect();
        owned.push(y_shape.clone());
        let shapes: Vec<&[usize]> = owned.iter().map(Vec::as_slice).collect();
        let grad = OpKind::Grad {
            of: Box::new(kind.clone()),
            wrt: (0..n).collect(),
        };
        let mut dy = filled(be, &y_shape, 11)?;
        if be.reads_stashed_words(&grad, &shapes, n) {
            dy = held_as_words(be, dy)?.0;
        }
        let xs = xs
            .into_iter()
            .enumerate()
            .map(|(i, x)| {
                let forward = be.reads_stashed_words(kind, &shapes[..n], i);
                if forward && be.reads_stashed_words(&grad, &shapes, i) {
                    held_as_words(be, x).map(|(w, _)| w)
                } else {
                    Ok(x)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Held { xs, dy: Some(dy) })
    }
}

/// A buffer of `shape` with deterministic values in [-0.4, 0.4].
pub(super) fn filled<B: Backend>(
    be: &B,
    shape: &[usize],
    seed: usize,
) -> Result<B::Buffer, RuntimeError> {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| ((i * 31 + seed * 7) % 17) as f32 * 0.05 - 0.4)
        .collect();
    let host =
        Tensor32::new(shape.to_vec(), data).map_err(RuntimeError::kernel("profile input"))?;
    be.upload_owned(host)
}

/// One forward plus backward of `kind` on `held`, as the executor runs it: dropout through
/// [`Backend::dropout`] on its mask both ways, an op whose result only GEMMs read made as
/// words ([`Backend::forward_words`]) where the backend can and given `held`'s output
/// gradient, every other op through `forward` and `backward` (its results as its gradients).
fn pass<B: Backend>(be: &B, kind: &OpKind, held: &Held<B>) -> Result<(), RuntimeError> {
    let xs: Vec<&B::Buffer> = held.xs.iter().collect();
    let one = Binding { batch: 1, seq: 1 };
    if let (OpKind::Dropout { p, seed }, [x]) = (kind, xs.as_slice()) {
        let shape = be.shape(x);
        let per_row = shape.last().copied().unwrap_or(1);
        let mask = DropoutMask {
            p: *p,
            seed: *seed,
            row: 0,
            per_row,
            seq: shape.iter().product::<usize>() / per_row.max(1),
            shard: None,
        };
        let y = be.dropout(x, &mask)?;
        let dx = be.dropout(&y, &mask)?;
        black_box((&y, &dx));
        return Ok(());
    }
    if let Some(dy) = &held.dy {
        let ys = match be.forward_words(kind, &xs)? {
            Some(ys) => ys,
            None => be.forward(kind, &xs, one)?,
        };
        // A GELU's input gradient goes to the linear before it, whose GEMMs read words: the
        // executor makes it so ([`Backend::forward_words`] on the gradient op); a norm's joins
        // the residual stream's f32 gradient.
        let mut operands = xs.clone();
        operands.push(dy);
        let grad = OpKind::Grad {
            of: Box::new(kind.clone()),
            wrt: (0..xs.len()).collect(),
        };
        let as_words = match kind {
            OpKind::Gelu { .. } => be.forward_words(&grad, &operands)?,
            _ => None,
        };
        if as_words.is_none() {
            black_box(be.backward(kind, &xs, &[dy])?);
        }
        black_box((&ys, &as_words));
        return Ok(());
    }
    let ys = be.forward(kind, &xs, one)?;
    let dys: Vec<&B::Buffer> = ys.iter().collect();
    let dxs = be.backward(kind, &xs, &dys)?;
    black_box(&dxs);
    Ok(())
}

/// Seconds of one forward plus backward of `o` on `be` (best of `reps` after a warm-up, each
/// timed to the device's completion).
pub(super) fn pass_seconds<B: Backend>(
    be: &B,
    g: &Graph,
    o: ir::OpId,
    reps: usize,
) -> Result<f64, RuntimeError> {
    let kind = &g.op(o).kind;
    let held = Held::new(be, kind, operands(be, g, o)?)?;
    pass(be, kind, &held)?;
    be.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        pass(be, kind, &held)?;
        be.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// The cost model's bytes (operands read, results written) of one forward plus backward of
/// each class's representative op on `[rows, cols]` activations, and that op.
fn class_cases(rows: u64, cols: u64) -> Result<Vec<(Graph, ir::OpId, f64)>, RuntimeError> {
    [
        OpKind::Add,
        OpKind::Gelu { tanh: true },
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: true,
        },
        OpKind::Softmax { causal: false },
        OpKind::Dropout { p: 0.1, seed: 1 },
    ]
    .into_iter()
    .map(|kind| {
        let (g, o) = case(kind, rows, cols)?;
        let c = ir::cost::op_cost(&g, o, Binding { batch: 1, seq: 1 });
        Ok((g, o, c.fwd_bytes() + c.bwd_bytes()))
    })
    .collect()
}

impl KernelFractions {
    /// From the five classes' fractions in [`class_cases`]' order.
    fn from_classes(f: &[f64]) -> Result<KernelFractions, RuntimeError> {
        match *f {
            [pointwise, activation, norm, softmax, dropout] => Ok(KernelFractions {
                pointwise,
                activation,
                norm,
                softmax,
                dropout,
            }),
            _ => Err(RuntimeError::Profile {
                message: format!("{} kernel classes measured, 5 expected", f.len()),
            }),
        }
    }
}

/// Every class on one backend (a GPU): its bytes per second over `copy_gb_per_s`, the
/// device's own copy bandwidth.
pub fn kernel_fractions_on<B: Backend>(
    be: &B,
    rows: u64,
    cols: u64,
    reps: usize,
    copy_gb_per_s: f64,
) -> Result<KernelFractions, RuntimeError> {
    let f = class_cases(rows, cols)?
        .iter()
        .map(|(g, o, bytes)| {
            let secs = pass_seconds(be, g, *o, reps)?;
            Ok(bytes / secs.max(1e-12) / 1e9 / copy_gb_per_s.max(1e-9))
        })
        .collect::<Result<Vec<f64>, RuntimeError>>()?;
    KernelFractions::from_classes(&f)
}

/// Measures every class with `threads` threads at once on `[rows, cols]` activations;
/// `copy_gb_per_s` is one thread's share of the all-thread copy bandwidth.
pub fn kernel_fractions(
    threads: usize,
    rows: u64,
    cols: u64,
    reps: usize,
    copy_gb_per_s: f64,
) -> Result<KernelFractions, RuntimeError> {
    let measure = |(g, o, bytes): &(Graph, ir::OpId, f64)| -> Result<f64, RuntimeError> {
        let secs = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads.max(1))
                .map(|_| s.spawn(|| pass_seconds(&CpuBackend::new(), g, *o, reps)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(RuntimeError::Profile {
                            message: "a kernel thread panicked".into(),
                        })
                    })
                })
                .collect::<Result<Vec<f64>, RuntimeError>>()
        })?;
        let mean = secs.iter().sum::<f64>() / secs.len() as f64;
        Ok(bytes / mean / 1e9 / copy_gb_per_s.max(1e-9))
    };
    let f = class_cases(rows, cols)?
        .iter()
        .map(measure)
        .collect::<Result<Vec<f64>, RuntimeError>>()?;
    KernelFractions::from_classes(&f)
}
