//! `plait profile --device cuda`: what plait's own device runtime sustains on this GPU, in
//! the terms of the cost model (docs/hardware.md), so that a plan priced on the file predicts
//! `plait run` rather than PyTorch or Megatron-LM on the same GPU.
//!
//! Every figure goes through the [`Backend`] the executor uses, timed to the device's
//! completion: the copy bandwidth (a device-to-device copy), the device's time per op between
//! kernels (small ops queued behind a long product), the GEMM rate of large
//! square products (the MAMF of the schema; the bf16 operands' conversions are priced apart:
//! `matmul_casts_operands`), the bandwidth of each class of
//! memory-bound kernel over the copy's (`kernel_fractions`), and the fused attention's rates
//! (`flash_attention`), forward and backward with FlashAttention's FLOP convention.

use std::hint::black_box;
use std::time::Instant;

use ir::{Binding, OpKind};

use super::kernels::{KernelFractions, filled, held_as_words, kernel_fractions_on};
use crate::backend::DeviceProperties;
use crate::{Backend, RuntimeError};

/// How long to measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuProfileOptions {
    /// Small sizes and few repetitions: for tests on the `simt` emulator.
    pub quick: bool,
}

/// The attention the rates were measured on: `[batch, seq, heads · head_dim]`, causal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionCase {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl AttentionCase {
    /// The forward's products as FlashAttention counts them, 4·B·S²·heads·d, over the part
    /// a causal kernel computes: every key up to the query's own, (S + 1) / 2S of them.
    pub fn forward_flops(&self) -> f64 {
        let s = self.seq as f64;
        let all = 4.0 * self.batch as f64 * s * s * (self.heads * self.head_dim) as f64;
        all * (s + 1.0) / (2.0 * s)
    }
}

/// What was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProfile {
    /// The backend's own name, e.g. `cuda:0 (NVIDIA H200)`.
    pub device: String,
    pub properties: DeviceProperties,
    /// Device-to-device copy, GB/s counting bytes read plus written.
    pub copy_gb_per_s: f64,
    /// The device's time per op between kernels, µs ([`dispatch_seconds`]).
    pub launch_us: f64,
    /// Square products of `gemm_size`: f32 operands, and bf16 operands (conversions removed).
    pub gemm_size: usize,
    pub gemm_f32_tflops: f64,
    pub gemm_bf16_tflops: f64,
    /// Memory-bound kernels by class, f32 activations, forward plus backward.
    pub kernel_fractions: KernelFractions,
    pub kernel_rows: u64,
    pub kernel_cols: u64,
    /// The bf16 backend's attention, TFLOP/s: forward, and backward at 2.5 × the forward's
    /// FLOPs (FlashAttention-2 §4.1, the convention of `flash_attention` in the schema).
    pub attention: AttentionCase,
    pub attention_fwd_tflops: f64,
    pub attention_bwd_tflops: f64,
    /// Seconds since the Unix epoch when the measurement ended.
    pub unix_time: u64,
}

/// Best of `reps` timings of `f` after a warm-up, each to the device's completion.
fn best_seconds<B: Backend>(
    be: &B,
    reps: usize,
    mut f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f64, RuntimeError> {
    f()?;
    be.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        be.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best.max(1e-9))
}

/// Device copy bandwidth of `elements` f32s, GB/s (read plus written).
pub fn device_copy_gb_per_s<B: Backend>(
    be: &B,
    elements: usize,
    reps: usize,
) -> Result<f64, RuntimeError> {
    let x = filled(be, &[elements], 0)?;
    let secs = best_seconds(be, reps, || be.duplicate(&x).map(|y| be.free(y)))?;
    Ok(8.0 * elements as f64 / secs / 1e9)
}

/// Seconds the device spends per op between kernels: `ops` one-element additions queued
/// behind an `[n, n]` product long enough that the host has queued them all before it ends,
/// less the product alone. A run that keeps the device busy pays this per op (the host's own
/// dispatch runs ahead, hidden); on a synchronous backend (the CPU) it is the host's cost.
pub fn dispatch_seconds<B: Backend>(be: &B, n: usize, ops: usize) -> Result<f64, RuntimeError> {
    let (a, b) = (filled(be, &[1], 1)?, filled(be, &[1], 2)?);
    let (x, w) = (filled(be, &[n, n], 3)?, filled(be, &[n, n], 4)?);
    let one = Binding { batch: 1, seq: 1 };
    let product = || -> Result<(), RuntimeError> {
        black_box(be.forward(&OpKind::MatMul, &[&x, &w], one)?);
        Ok(())
    };
    let alone = best_seconds(be, 2, product)?;
    let behind = best_seconds(be, 2, || {
        product()?;
        for _ in 0..ops {
            black_box(be.forward(&OpKind::Add, &[&a, &b], one)?);
        }
        Ok(())
    })?;
    Ok((behind - alone).max(0.0) / ops.max(1) as f64)
}

/// Operand `operand` of `kind` on `shapes` (`seed`'s values) held as its bf16 words alone
/// where the op reads it only so ([`Backend::reads_stashed_words`]), as the runtime holds a
/// result only such readers read ([`Backend::forward_words`]): then `true`. Else in f32.
fn operand_as_run<B: Backend>(
    be: &B,
    kind: &OpKind,
    shapes: &[&[usize]],
    operand: usize,
    seed: usize,
) -> Result<(B::Buffer, bool), RuntimeError> {
    let x = filled(be, shapes[operand], seed)?;
    if !be.reads_stashed_words(kind, shapes, operand) {
        return Ok((x, false));
    }
    held_as_words(be, x)
}

/// TFLOP/s of `be`'s `[n, n] · [n, n]` product; with `cast_bytes_per_s` (bf16 operands) on
/// operands held as bf16 words where `be` keeps them (as the runtime's GEMMs read theirs), and
/// where it does not, `cast_bytes_per_s` removes the conversion of both f32 operands (4 bytes read, 2 written per
/// element) at that rate.
pub fn gemm_tflops<B: Backend>(
    be: &B,
    n: usize,
    reps: usize,
    cast_bytes_per_s: Option<f64>,
) -> Result<f64, RuntimeError> {
    let shapes: [&[usize]; 2] = [&[n, n], &[n, n]];
    let operand = |i| operand_as_run(be, &OpKind::MatMul, &shapes, i, 3 + i);
    let ((a, a_words), (b, b_words)) = (operand(0)?, operand(1)?);
    let words = a_words && b_words;
    let one = Binding { batch: 1, seq: 1 };
    let secs = best_seconds(be, reps, || {
        black_box(be.forward(&OpKind::MatMul, &[&a, &b], one)?);
        Ok(())
    })?;
    let cast_bytes_per_s = cast_bytes_per_s.filter(|_| !words);
    let casts = cast_bytes_per_s.map_or(0.0, |bw| 2.0 * (n * n) as f64 * 6.0 / bw);
    // The conversions cannot take most of the product: keep at least half the time measured.
    let gemm = (secs - casts).max(secs / 2.0);
    Ok(2.0 * (n as f64).powi(3) / gemm / 1e12)
}

/// Forward and backward TFLOP/s of `be`'s causal attention on `case`, run as the executor
/// runs a GPT's: q, k, v and the output gradient held as bf16 words where `be` keeps them,
/// the forward keeping each row's log-sum-exp and writing its output as words, the backward
/// taking them ([`Backend::attention_forward_keeping`], [`Backend::attention_backward_kept`])
/// where `be` has those paths, else the plain forward and the recomputing backward.
pub fn attention_tflops<B: Backend>(
    be: &B,
    case: AttentionCase,
    reps: usize,
) -> Result<(f64, f64), RuntimeError> {
    let shape = [case.batch, case.seq, case.heads * case.head_dim];
    let kind = OpKind::Attention {
        heads: case.heads as u64,
        kv_heads: case.heads as u64,
        scale: 1.0 / (case.head_dim as f64).sqrt(),
        causal: true,
        softcap: None,
        sinks: false,
        window: None,
        chunk: None,
    };
    // The gradient reads q, k, v and the output gradient (operand 3 of its four).
    let grad = OpKind::Grad {
        of: Box::new(kind.clone()),
        wrt: vec![0, 1, 2],
    };
    let shapes: [&[usize]; 4] = [&shape; 4];
    let operand = |i| operand_as_run(be, &grad, &shapes, i, 5 + i).map(|(x, _)| x);
    let qkv = [operand(0)?, operand(1)?, operand(2)?];
    let xs: Vec<&B::Buffer> = qkv.iter().collect();
    let one = Binding { batch: 1, seq: 1 };
    let fwd = best_seconds(be, reps, || {
        if be.attention_forward_keeping(&kind, &xs, true)?.is_none() {
            black_box(be.forward(&kind, &xs, one)?);
        }
        Ok(())
    })?;
    let dy = operand(3)?;
    let bwd = match be.attention_forward_keeping(&kind, &xs, true)? {
        Some(kept) => best_seconds(be, reps, || {
            let grads =
                be.attention_backward_kept(&kind, &xs, [&dy, &kept.out, &kept.stats], true)?;
            black_box(grads.ok_or_else(|| RuntimeError::Program {
                rank: 0,
                what: "the attention that kept its statistics has no backward from them".into(),
            })?);
            Ok(())
        })?,
        None => best_seconds(be, reps, || {
            black_box(be.backward(&kind, &xs, &[&dy])?);
            Ok(())
        })?,
    };
    let flops = case.forward_flops();
    Ok((flops / fwd / 1e12, 2.5 * flops / bwd / 1e12))
}

/// Runs every measurement: `f32` and `bf16` are the same device's backend with f32 and bf16
/// GEMMs; `properties` what the device reports of itself.
pub fn measure_gpu<B: Backend>(
    f32: &B,
    bf16: &B,
    properties: DeviceProperties,
    opts: &GpuProfileOptions,
) -> Result<GpuProfile, RuntimeError> {
    let quick = opts.quick;
    let reps = if quick { 1 } else { 5 };
    // 256 MiB: far past the last-level cache (H200: 60 MB of L2).
    let copy_gb_per_s = device_copy_gb_per_s(bf16, if quick { 1 << 12 } else { 1 << 26 }, reps)?;
    // An f32 product of 8192³ (about 20 ms on an H200's CUDA cores) outlasts the host's
    // queueing of 1000 small ops.
    let launch_us = if quick {
        dispatch_seconds(f32, 64, 20)?
    } else {
        dispatch_seconds(f32, 8192, 1000)?
    } * 1e6;
    let gemm_size = if quick { 64 } else { 8192 };
    let gemm_f32_tflops = gemm_tflops(f32, gemm_size, reps, None)?;
    let gemm_bf16_tflops = gemm_tflops(bf16, gemm_size, reps, Some(copy_gb_per_s * 1e9))?;
    // [16384, 1024] f32: 64 MiB per activation, streamed from HBM as a layer's are.
    let (kernel_rows, kernel_cols) = if quick { (32, 64) } else { (16384, 1024) };
    let kernel_fractions =
        kernel_fractions_on(bf16, kernel_rows, kernel_cols, reps, copy_gb_per_s)?;
    // GPT-2's attention at its training shape (12 heads of 64, sequence 1024, 8 sequences).
    let attention = if quick {
        // Heads 32 wide: the tensor-core kernels' narrowest, so the emulator runs them too.
        AttentionCase {
            batch: 1,
            seq: 32,
            heads: 2,
            head_dim: 32,
        }
    } else {
        AttentionCase {
            batch: 8,
            seq: 1024,
            heads: 12,
            head_dim: 64,
        }
    };
    let (attention_fwd_tflops, attention_bwd_tflops) = attention_tflops(bf16, attention, reps)?;
    Ok(GpuProfile {
        device: bf16.name(),
        properties,
        copy_gb_per_s,
        launch_us,
        gemm_size,
        gemm_f32_tflops,
        gemm_bf16_tflops,
        kernel_fractions,
        kernel_rows,
        kernel_cols,
        attention,
        attention_fwd_tflops,
        attention_bwd_tflops,
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    })
}
