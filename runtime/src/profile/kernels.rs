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

use crate::backend::DropoutMask;
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
        OpKind::LayerNorm { .. } => {
            ins.push(input(&mut g, "w", &vec));
            ins.push(input(&mut g, "b", &vec));
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
            let n: usize = shape.iter().product();
            let host = Tensor32::new(
                shape,
                (0..n)
                    .map(|i| ((i * 31 + j * 7) % 17) as f32 * 0.05 - 0.4)
                    .collect(),
            )
            .map_err(RuntimeError::kernel("profile input"))?;
            be.upload_owned(host)
        })
        .collect()
}

/// One forward plus backward of `kind` on `xs`, as the executor runs it: dropout through
/// [`Backend::dropout`] on its mask both ways, every other op through `forward` and `backward`.
fn pass<B: Backend>(be: &B, kind: &OpKind, xs: &[&B::Buffer]) -> Result<(), RuntimeError> {
    if let (OpKind::Dropout { p, seed }, [x]) = (kind, xs) {
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
    let ys = be.forward(kind, xs, Binding { batch: 1, seq: 1 })?;
    let dys: Vec<&B::Buffer> = ys.iter().collect();
    let dxs = be.backward(kind, xs, &dys)?;
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
    let inputs = operands(be, g, o)?;
    let xs: Vec<&B::Buffer> = inputs.iter().collect();
    pass(be, kind, &xs)?;
    be.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        pass(be, kind, &xs)?;
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
        OpKind::LayerNorm { eps: 1e-5 },
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
