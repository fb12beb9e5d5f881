//! Scaled dot-product attention (`attention.cu`): one fused forward kernel, and a backward in
//! three (row statistics, dq per query, dk and dv per key); no `[sq, sk]` buffer, the backward
//! recomputes the probabilities. On the tensor cores the forward may keep each query row's
//! log-sum-exp for the backward ([`forward_keeping`]), which then takes D = dO·O from the
//! forward's output in one cheap pass ([`backward_kept`]) instead of recomputing the forward
//! for its row statistics: FlashAttention-2's backward (Dao 2023, Algorithm 2).

use ir::OpKind;
use kernels::device::{AttentionShape, MAX_HEAD_DIM};

use super::{Buf, row_grid};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, GemmPrecision, KernelArg};
use crate::backend::{KeptBackward, KeptForward};

/// The kernel's view of an `Attention` op on `q`, `k`, `v` (`kernels/src/attention.rs`'s
/// layout); `None` for shapes it does not take (the host path reports bad ones).
fn shape<D: Device>(kind: &OpKind, xs: &[&Buf<D>]) -> Option<AttentionShape> {
    let shapes: Vec<&[usize]> = xs.iter().map(|x| x.shape.as_slice()).collect();
    shape_of(kind, &shapes)
}

/// [`shape`] from the operands' shapes alone (q, k, v, and the sinks where the op has them).
fn shape_of(kind: &OpKind, shapes: &[&[usize]]) -> Option<AttentionShape> {
    let (
        &OpKind::Attention {
            heads,
            kv_heads,
            scale,
            causal,
            softcap,
            sinks,
            window,
            chunk,
        },
        &[q, k, v, ref rest @ ..],
    ) = (kind, shapes)
    else {
        return None;
    };
    let sinks_fit = match rest {
        [] => !sinks,
        [s] => sinks && *s == [usize::try_from(heads).ok()?],
        _ => false,
    };
    if !sinks_fit {
        return None;
    }
    let (heads, kv) = (
        usize::try_from(heads).ok()?,
        usize::try_from(kv_heads).ok()?,
    );
    if heads == 0 || kv == 0 || heads % kv != 0 {
        return None;
    }
    let (&[b, sq, qw], &[kb, sk, kw], &[vb, vs, vw]) = (q, k, v) else {
        return None;
    };
    if qw % heads != 0 || vw % kv != 0 {
        return None;
    }
    let (d, dv) = (qw / heads, vw / kv);
    let fits =
        kb == b && vb == b && vs == sk && kw == kv * d && d <= MAX_HEAD_DIM && dv <= MAX_HEAD_DIM;
    let i = |n: usize| i64::try_from(n).ok();
    fits.then_some(())?;
    Some(AttentionShape {
        batch: i(b)?,
        sq: i(sq)?,
        sk: i(sk)?,
        heads: i(heads)?,
        kv: i(kv)?,
        d: i(d)?,
        dv: i(dv)?,
        scale,
        softcap: softcap.unwrap_or(0.0),
        causal: i32::from(causal),
        window: i(usize::try_from(window.unwrap_or(0)).ok()?)?,
        chunk: i(usize::try_from(chunk.unwrap_or(0)).ok()?)?,
        ..AttentionShape::default()
    })
}

/// Whether attention `kind` on inputs of `shapes` (q, k, v, and for its gradient, `grad`, the
/// output's) reads `operand` only as its bf16 words ([`words`], which takes a twin as it is):
/// q, k and v on the tensor-core kernels, and for the gradient the output's gradient dO too
/// (D = dO·O from its words, `attention_dsum_bf16g`; the recomputed row statistics expand it).
pub(super) fn reads_words_only<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    shapes: &[&[usize]],
    grad: bool,
    operand: usize,
) -> bool {
    let (qkv, rest) = shapes.split_at(shapes.len().min(3));
    let Some(a) = shape_of(kind, qkv) else {
        return false;
    };
    let output_grad = match rest {
        [] => !grad,
        [g] => grad && *g == out_shape(&a).as_slice(),
        _ => false,
    };
    let operands = if grad { 4 } else { 3 };
    operand < operands && output_grad && Kernels::of(b, &a).mma
}

/// `attention.cu`'s ATTN_TILE_Q, ATTN_TILE_K and ATTN_TILE_D: queries and keys per tile,
/// widest head a tile holds.
const TILE_Q: i64 = 16;
const TILE_K: i64 = 16;
const TILE_D: i64 = 128;

/// `attention_mma.cu`'s kernels for heads `d` wide (d = dv): forward, row statistics, dq, dk
/// and dv, and the forward and gradients that write their results as bf16 words; its queries
/// or keys per block (MMA_BLOCK_ROWS) and threads per block (MMA_THREADS).
struct MmaKernels {
    d: i64,
    forward: &'static str,
    forward_words: &'static str,
    row_stats: &'static str,
    dq: &'static str,
    dkv: &'static str,
    dq_words: &'static str,
    dkv_words: &'static str,
}

macro_rules! mma_kernels {
    ($d:literal) => {
        MmaKernels {
            d: $d,
            forward: concat!("attention_forward_mma", $d),
            forward_words: concat!("attention_forward_words_mma", $d),
            row_stats: concat!("attention_row_stats_mma", $d),
            dq: concat!("attention_backward_dq_mma", $d),
            dkv: concat!("attention_backward_dkv_mma", $d),
            dq_words: concat!("attention_backward_dq_words_mma", $d),
            dkv_words: concat!("attention_backward_dkv_words_mma", $d),
        }
    };
}

const MMA_KERNELS: [MmaKernels; 3] = [mma_kernels!(32), mma_kernels!(64), mma_kernels!(128)];
const MMA_ROWS: i64 = 64;
const MMA_THREADS: u32 = 128;

/// The kernels of one attention, their grids and blocks: on the tensor cores for a bf16 plan
/// on a device that has them (`attention_mma.cu`: bf16 operands, as the plan rounds its GEMMs);
/// else tiles on the CUDA cores (FlashAttention-2's loops: a key and value tile in shared
/// memory serves a tile of queries) for heads up to `TILE_D` wide, one block per query (and
/// per key) beyond.
struct Kernels {
    /// Whether these are the tiled or tensor-core kernels (which take the queries' positions).
    tiled: bool,
    /// Whether these are the tensor-core kernels (which take bf16 words, [`words`]).
    mma: bool,
    forward: &'static str,
    /// The forward whose output is bf16 words alone (the tensor-core kernels).
    forward_words: Option<&'static str>,
    row_stats: &'static str,
    dq: &'static str,
    dkv: &'static str,
    /// dq, and dk and dv, as bf16 words alone (the tensor-core kernels).
    grads_words: Option<[&'static str; 2]>,
    /// Blocks of the forward, row statistics and dq kernels.
    query_grid: u32,
    /// Blocks of the dk, dv kernel.
    key_grid: u32,
    /// Threads per block.
    block: u32,
}

impl Kernels {
    fn of<D: Device>(b: &DeviceBackend<D>, a: &AttentionShape) -> Kernels {
        let tiles = |n: i64, per: i64| (n + per - 1) / per;
        let mma = b.gemm_precision == GemmPrecision::Bf16 && b.device.tensor_cores() && a.d == a.dv;
        if let Some(k) = MMA_KERNELS.iter().find(|k| mma && k.d == a.d) {
            Kernels {
                tiled: true,
                mma: true,
                forward: k.forward,
                forward_words: Some(k.forward_words),
                row_stats: k.row_stats,
                dq: k.dq,
                dkv: k.dkv,
                grads_words: Some([k.dq_words, k.dkv_words]),
                query_grid: row_grid((a.batch * a.heads * tiles(a.sq, MMA_ROWS)) as usize),
                key_grid: row_grid((a.batch * a.kv * tiles(a.sk, MMA_ROWS)) as usize),
                block: MMA_THREADS,
            }
        } else if a.d <= TILE_D && a.dv <= TILE_D {
            Kernels {
                tiled: true,
                mma: false,
                forward: "attention_forward_tiled",
                forward_words: None,
                row_stats: "attention_row_stats_tiled",
                dq: "attention_backward_dq_tiled",
                dkv: "attention_backward_dkv_tiled",
                grads_words: None,
                query_grid: row_grid((a.batch * a.heads * tiles(a.sq, TILE_Q)) as usize),
                key_grid: row_grid((a.batch * a.kv * tiles(a.sk, TILE_K)) as usize),
                block: b.device.block_size(),
            }
        } else {
            Kernels {
                tiled: false,
                mma: false,
                forward: "attention_forward",
                forward_words: None,
                row_stats: "attention_row_stats",
                dq: "attention_backward_dq",
                dkv: "attention_backward_dkv",
                grads_words: None,
                query_grid: row_grid(rows(a)),
                key_grid: row_grid((a.batch * a.kv * a.sk) as usize),
                block: b.device.block_size(),
            }
        }
    }
}

/// The tiled kernels take the queries' positions (null: none) before the shape.
fn positions<'a, M>(args: &mut Vec<KernelArg<'a, M>>, tiled: bool, qpos: Option<&'a M>) {
    if tiled {
        args.push(qpos.map_or(KernelArg::Null, KernelArg::In));
    }
}

/// Rows of the kernels' grid: one per (batch, head, query).
fn rows(a: &AttentionShape) -> usize {
    (a.batch * a.heads * a.sq) as usize
}

fn out_shape(a: &AttentionShape) -> Vec<usize> {
    out_shape_of(a, a.sq, a.heads, a.dv)
}

/// `[batch, n, heads·d]`: the layout of q, k, v, the output and their gradients.
fn out_shape_of(a: &AttentionShape, n: i64, heads: i64, d: i64) -> Vec<usize> {
    vec![a.batch as usize, n as usize, (heads * d) as usize]
}

pub(super) fn forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    forward_at(b, kind, xs, None)
}

/// The forward with the queries' whole-sequence positions `qpos` where given (context
/// parallelism: the keys in sequence order; tiled heads only, `None` otherwise).
pub(super) fn forward_at<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    qpos: Option<&D::Mem>,
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(a) = shape::<D>(kind, xs) else {
        return Ok(None);
    };
    let Some((q, k, v, sinks)) = with_sinks::<D>(xs) else {
        return Ok(None);
    };
    let p = Kernels::of(b, &a);
    if qpos.is_some() && !p.tiled {
        return Ok(None);
    }
    let x = if p.mma {
        Operands::of(b, [q, k, v])?
    } else {
        Operands {
            q: &q.mem,
            k: &k.mem,
            v: &v.mem,
        }
    };
    let Some(sinks) = sinks else {
        return run_forward(b, &a, &p, &x, qpos, None, false).map(Some);
    };
    // Each row's log-sum-exp over its keys: the tensor-core forward keeps it (log₂ units);
    // elsewhere the row statistics make it, the output standing in for dO (D is not read).
    let mut lse = b.alloc(&[rows(&a)])?;
    let mut o = if p.mma {
        run_forward(b, &a, &p, &x, qpos, Some(&mut lse), false)?
    } else {
        let o = run_forward(b, &a, &p, &x, qpos, None, false)?;
        let mut unread = b.alloc(&[rows(&a)])?;
        let mut args = vec![
            KernelArg::Out(&mut lse.mem),
            KernelArg::Out(&mut unread.mem),
            KernelArg::In(x.q),
            KernelArg::In(x.k),
            KernelArg::In(x.v),
            KernelArg::In(&o.mem),
        ];
        positions(&mut args, p.tiled, qpos);
        args.push(KernelArg::Attention(a));
        b.device
            .launch(p.row_stats, p.query_grid, p.block, &mut args)?;
        drop(args);
        b.device.release(unread.mem);
        o
    };
    let mut args = [
        KernelArg::Out(&mut o.mem),
        KernelArg::Out(&mut lse.mem),
        KernelArg::In(&sinks.mem),
        KernelArg::Attention(a),
        KernelArg::I32(i32::from(p.mma)),
    ];
    let launched = super::launch_pointwise(b, "attention_sink_forward", rows(&a), &mut args);
    b.device.release(lse.mem);
    launched.map(|()| Some(o))
}

/// q, k, v and the sinks where the op reads them.
type WithSinks<'x, D> = (&'x Buf<D>, &'x Buf<D>, &'x Buf<D>, Option<&'x Buf<D>>);

fn with_sinks<'x, D: Device>(xs: &[&'x Buf<D>]) -> Option<WithSinks<'x, D>> {
    match *xs {
        [q, k, v] => Some((q, k, v, None)),
        [q, k, v, s] => Some((q, k, v, Some(s))),
        _ => None,
    }
}

/// The backward's row statistics with the sinks (`attention_sink_stats`: l', D').
fn sink_stats<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    [lse, dsum]: [&mut Buf<D>; 2],
    sinks: &Buf<D>,
    log2u: bool,
) -> Result<(), RuntimeError> {
    let mut args = [
        KernelArg::Out(&mut lse.mem),
        KernelArg::Out(&mut dsum.mem),
        KernelArg::In(&sinks.mem),
        KernelArg::Attention(*a),
        KernelArg::I32(i32::from(log2u)),
    ];
    super::launch_pointwise(b, "attention_sink_stats", rows(a), &mut args)
}

/// The sinks' gradient from the statistics with them: a block per head.
fn sink_grad<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    [lse, dsum]: [&Buf<D>; 2],
    sinks: &Buf<D>,
    log2u: bool,
) -> Result<Buf<D>, RuntimeError> {
    let mut dsinks = b.alloc(&sinks.shape)?;
    let block = b.device.block_size();
    b.device.launch(
        "attention_sink_grad",
        row_grid(a.heads as usize),
        block,
        &mut [
            KernelArg::Out(&mut dsinks.mem),
            KernelArg::In(&lse.mem),
            KernelArg::In(&dsum.mem),
            KernelArg::In(&sinks.mem),
            KernelArg::Attention(*a),
            KernelArg::I32(i32::from(log2u)),
        ],
    )?;
    Ok(dsinks)
}

/// The forward on the tensor cores with each query row's log-sum-exp (`[batch, heads, sq]`,
/// log₂ units, as the backward's kernels read it) kept for [`backward_kept`], its output made
/// as bf16 words alone where `as_words` (every reader reads only those: [`super::words`]);
/// `None` where the kernels are not the tensor cores' (their backward recomputes the
/// statistics).
pub(crate) fn forward_keeping<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    as_words: bool,
) -> Result<Option<KeptForward<Buf<D>>>, RuntimeError> {
    let Some(a) = shape::<D>(kind, xs) else {
        return Ok(None);
    };
    // With sinks (four operands) the forward and backward correct their statistics: no
    // statistics are kept.
    let &[q, k, v] = xs else { return Ok(None) };
    let p = Kernels::of(b, &a);
    if !p.mma {
        return Ok(None);
    }
    let x = Operands::of(b, [q, k, v])?;
    keeping(b, &a, &p, &x, as_words).map(Some)
}

/// [`forward_keeping`] with q, k and v the column blocks of one buffer `qkv` (a fused
/// projection's output, whose split is never made), of shapes `parts`, read where they lie
/// ([`AttentionShape::packed`]); `None` where [`reads_packed`] says no.
pub(crate) fn forward_keeping_packed<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    qkv: &Buf<D>,
    parts: [&[usize]; 3],
    as_words: bool,
) -> Result<Option<KeptForward<Buf<D>>>, RuntimeError> {
    let Some((a, p)) = packed_shape(b, kind, &qkv.shape, parts) else {
        return Ok(None);
    };
    let w = words(b, qkv)?;
    let x = Operands { q: w, k: w, v: w };
    keeping(b, &a, &p, &x, as_words).map(Some)
}

/// Whether the attention `kind` on q, k and v of shapes `parts` reads them as the column
/// blocks of one buffer ([`forward_keeping_packed`], [`backward_kept_packed`]): on the
/// tensor cores, one sequence for all three, each block whole 16-byte words wide.
pub(crate) fn reads_packed<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    parts: [&[usize]; 3],
) -> bool {
    let [q, k, v] = parts;
    let (Some(&lead), true) = (q.first(), q.len() == 3) else {
        return false;
    };
    let packed = vec![lead, q[1], q[2] + k[2] + v[2]];
    packed_shape(b, kind, &packed, parts).is_some()
}

/// The packed attention's shape and kernels, where `qkv` is `parts` side by side.
fn packed_shape<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    qkv: &[usize],
    parts: [&[usize]; 3],
) -> Option<(AttentionShape, Kernels)> {
    let a = shape_of(kind, &parts)?.packed()?;
    let width: usize = parts.iter().map(|s| s.last().copied().unwrap_or(0)).sum();
    let side_by_side = parts.iter().all(|s| s.len() == 3 && s[..2] == qkv[..2])
        && qkv.len() == 3
        && qkv[2] == width;
    let p = Kernels::of(b, &a);
    (side_by_side && p.mma && a.sq == a.sk).then_some((a, p))
}

/// The kept forward on operands `x`: the output and each query row's log-sum-exp.
fn keeping<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    p: &Kernels,
    x: &Operands<'_, D::Mem>,
    as_words: bool,
) -> Result<KeptForward<Buf<D>>, RuntimeError> {
    let mut lse = b.alloc(&[rows(a)])?;
    let as_words = as_words && p.forward_words.is_some();
    let out = run_forward(b, a, p, x, None, Some(&mut lse), as_words)?;
    Ok(KeptForward {
        out,
        stats: lse,
        out_as_words: as_words,
    })
}

/// One forward launch (the tensor-core kernels on the operands' words), writing `lse` where
/// given (the tensor-core kernels only), and the output as bf16 words alone where `as_words`
/// and the kernels can.
fn run_forward<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    p: &Kernels,
    x: &Operands<'_, D::Mem>,
    qpos: Option<&D::Mem>,
    lse: Option<&mut Buf<D>>,
    as_words: bool,
) -> Result<Buf<D>, RuntimeError> {
    let lse = lse.map(|l| &mut l.mem);
    let launch = |kernel, o: &mut D::Mem| {
        let mut args = vec![KernelArg::Out(o)];
        if p.mma {
            args.push(lse.map_or(KernelArg::Null, KernelArg::Out));
        }
        args.extend([KernelArg::In(x.q), KernelArg::In(x.k), KernelArg::In(x.v)]);
        positions(&mut args, p.tiled, qpos);
        args.push(KernelArg::Attention(*a));
        b.device.launch(kernel, p.query_grid, p.block, &mut args)
    };
    match p.forward_words.filter(|_| as_words) {
        Some(kernel) => super::words::words_only(b, &out_shape(a), |w| launch(kernel, w)),
        None => {
            let mut o = b.alloc(&out_shape(a))?;
            launch(p.forward, &mut o.mem)?;
            Ok(o)
        }
    }
}

/// `[dq, dk, dv]` (and the sinks' gradient): the row statistics (corrected for the sinks),
/// then dq per query and dk, dv per key (no atomics).
pub(super) fn backward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    g: &Buf<D>,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    backward_at(b, kind, xs, g, None)
}

/// The backward with the queries' positions `qpos` (see [`forward_at`]).
pub(super) fn backward_at<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    g: &Buf<D>,
    qpos: Option<&D::Mem>,
) -> Result<Option<Vec<Buf<D>>>, RuntimeError> {
    let Some(a) = shape::<D>(kind, xs) else {
        return Ok(None);
    };
    let Some((q, k, v, sinks)) = with_sinks::<D>(xs) else {
        return Ok(None);
    };
    let p = Kernels::of(b, &a);
    let block = p.block;
    if g.shape != out_shape(&a) || (qpos.is_some() && !p.tiled) {
        return Ok(None);
    }
    if p.mma {
        return backward_mma(b, &a, &p, [q, k, v, g], (qpos, sinks)).map(Some);
    }

    let (mut lse, mut dsum) = (b.alloc(&[rows(&a)])?, b.alloc(&[rows(&a)])?);
    let mut args = vec![
        KernelArg::Out(&mut lse.mem),
        KernelArg::Out(&mut dsum.mem),
        KernelArg::In(&q.mem),
        KernelArg::In(&k.mem),
        KernelArg::In(&v.mem),
        KernelArg::In(&g.mem),
    ];
    positions(&mut args, p.tiled, qpos);
    args.push(KernelArg::Attention(a));
    b.device
        .launch(p.row_stats, p.query_grid, block, &mut args)?;
    drop(args);
    if let Some(s) = sinks {
        sink_stats(b, &a, [&mut lse, &mut dsum], s, false)?;
    }
    let mut dq = b.alloc(&q.shape)?;
    let mut args = vec![
        KernelArg::Out(&mut dq.mem),
        KernelArg::In(&q.mem),
        KernelArg::In(&k.mem),
        KernelArg::In(&v.mem),
        KernelArg::In(&g.mem),
        KernelArg::In(&lse.mem),
        KernelArg::In(&dsum.mem),
    ];
    positions(&mut args, p.tiled, qpos);
    args.push(KernelArg::Attention(a));
    b.device.launch(p.dq, p.query_grid, block, &mut args)?;
    drop(args);
    let (mut dk, mut dv) = (b.alloc(&k.shape)?, b.alloc(&v.shape)?);
    let mut args = vec![
        KernelArg::Out(&mut dk.mem),
        KernelArg::Out(&mut dv.mem),
        KernelArg::In(&q.mem),
        KernelArg::In(&k.mem),
        KernelArg::In(&v.mem),
        KernelArg::In(&g.mem),
        KernelArg::In(&lse.mem),
        KernelArg::In(&dsum.mem),
    ];
    positions(&mut args, p.tiled, qpos);
    args.push(KernelArg::Attention(a));
    b.device.launch(p.dkv, p.key_grid, block, &mut args)?;
    drop(args);
    let dsinks = sinks
        .map(|s| sink_grad(b, &a, [&lse, &dsum], s, false))
        .transpose();
    b.device.release(lse.mem);
    b.device.release(dsum.mem);
    Ok(Some([dq, dk, dv].into_iter().chain(dsinks?).collect()))
}

/// `x`'s bf16 words, in order, as the tensor-core kernels read q, k, v and dO in their own
/// layout (`attention_mma.cu`'s `MmaHead`: no copy gathers a head's rows): its twin where it
/// has one (made as words, back from the stash, or a GEMM's copy: each holds its values rounded
/// to bf16 in order), else converted now and kept as its twin, which a stash after this then
/// keeps as it is.
fn words<'x, D: Device>(b: &DeviceBackend<D>, x: &'x Buf<D>) -> Result<&'x D::Mem, RuntimeError> {
    // A twin a GEMM made is dense in order only for rows of a multiple of 8 (`matmul::bf16_twin`),
    // which q, k, v and dO ([batch, n, heads·d], d a multiple of 16) always are.
    let dense = x.bf16_exact || x.shape.last().is_some_and(|c| c.is_multiple_of(8));
    if !dense {
        return Err(RuntimeError::DeviceLaunch {
            kernel: "attention",
            message: format!("an operand's bf16 twin of shape {:?} is not dense", x.shape),
        });
    }
    if x.bf16.get().is_none() {
        let made = super::stash_bf16(b, x)?;
        if let Err(made) = x.bf16.set(made.mem) {
            b.device.release(made);
        }
    }
    x.bf16.get().ok_or_else(|| RuntimeError::DeviceLaunch {
        kernel: "to_bf16",
        message: "attention: an operand's bf16 words vanished".into(),
    })
}

/// q, k and v as [`words`].
struct Operands<'x, M> {
    q: &'x M,
    k: &'x M,
    v: &'x M,
}

impl<'x, M> Operands<'x, M> {
    fn of<D: Device<Mem = M>>(
        b: &DeviceBackend<D>,
        [q, k, v]: [&'x Buf<D>; 3],
    ) -> Result<Operands<'x, M>, RuntimeError> {
        Ok(Operands {
            q: words(b, q)?,
            k: words(b, k)?,
            v: words(b, v)?,
        })
    }
}

/// `[dq, dk, dv]` on the tensor cores: the row statistics, then dq per query block and dk, dv
/// per key block, from the operands' and dO's words.
fn backward_mma<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    p: &Kernels,
    [q, k, v, g]: [&Buf<D>; 4],
    (qpos, sinks): (Option<&D::Mem>, Option<&Buf<D>>),
) -> Result<Vec<Buf<D>>, RuntimeError> {
    let x = Operands::of(b, [q, k, v])?;
    let (mut lse, mut dsum) = (b.alloc(&[rows(a)])?, b.alloc(&[rows(a)])?);
    // The row statistics read dO in f32: expanded into a temporary where it is held as words
    // alone (made so by the GEMM before, for the tensor-core kernels' reads).
    let expanded = g.f32_lazy.then(|| super::expanded_copy(b, g)).transpose()?;
    let stats = b.device.launch(
        p.row_stats,
        p.query_grid,
        p.block,
        &mut [
            KernelArg::Out(&mut lse.mem),
            KernelArg::Out(&mut dsum.mem),
            KernelArg::In(x.q),
            KernelArg::In(x.k),
            KernelArg::In(x.v),
            KernelArg::In(&expanded.as_ref().unwrap_or(g).mem),
            qpos.map_or(KernelArg::Null, KernelArg::In),
            KernelArg::Attention(*a),
        ],
    );
    if let Some(t) = expanded {
        crate::Backend::free(b, t);
    }
    stats?;
    let Some(s) = sinks else {
        return mma_gradients(b, a, p, &x, g, [&lse, &dsum], qpos, false);
    };
    sink_stats(b, a, [&mut lse, &mut dsum], s, true)?;
    let mut grads = mma_gradients(b, a, p, &x, g, [&lse, &dsum], qpos, false)?;
    grads.push(sink_grad(b, a, [&lse, &dsum], s, true)?);
    Ok(grads)
}

/// [`backward_mma`] from the row statistics the forward kept: `lse` as
/// [`forward_keeping`] wrote it and the forward's output `o` (f32, or its exact bf16 words
/// where it came back from the stash), D = dO·O per query row in one pass
/// (`attention_dsum`); with `as_words` (every reader of dq, dk and dv reads only their words)
/// the gradients are written as bf16 words alone. `None` where the kernels are not the tensor
/// cores'.
pub(crate) fn backward_kept<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    kept: [&Buf<D>; 3],
    as_words: bool,
) -> Result<Option<KeptBackward<Buf<D>>>, RuntimeError> {
    let Some(a) = shape::<D>(kind, xs) else {
        return Ok(None);
    };
    let &[q, k, v] = xs else { return Ok(None) };
    let p = Kernels::of(b, &a);
    if !p.mma || !kept_fits(b, &a, kept) {
        return Ok(None);
    }
    let x = Operands::of(b, [q, k, v])?;
    gradients_kept(b, &a, &p, &x, kept, as_words).map(Some)
}

/// [`backward_kept`] with q, k and v the column blocks of `qkv` ([`forward_keeping_packed`]);
/// the gradients come apart, as `dq`, `dk` and `dv`, or with `grads_packed` as one buffer
/// laid out as `qkv` (what the concatenation of the three would make).
pub(crate) fn backward_kept_packed<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    qkv: &Buf<D>,
    parts: [&[usize]; 3],
    kept: [&Buf<D>; 3],
    (as_words, grads_packed): (bool, bool),
) -> Result<Option<KeptBackward<Buf<D>>>, RuntimeError> {
    let Some((a, p)) = packed_shape(b, kind, &qkv.shape, parts) else {
        return Ok(None);
    };
    let a = AttentionShape {
        grads_packed: i32::from(grads_packed),
        ..a
    };
    if !kept_fits(b, &a, kept) {
        return Ok(None);
    }
    let w = words(b, qkv)?;
    let x = Operands { q: w, k: w, v: w };
    gradients_kept(b, &a, &p, &x, kept, as_words).map(Some)
}

/// Whether dO, O and the kept statistics `[g, o, lse]` are this attention's, and the block
/// suits `attention_dsum_of` (eight lanes a row in whole warps).
fn kept_fits<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    [g, o, lse]: [&Buf<D>; 3],
) -> bool {
    g.shape == out_shape(a)
        && o.shape == g.shape
        && lse.len == rows(a)
        && b.device.block_size().is_multiple_of(32)
}

/// The kept backward's D = dO·O pass, then the gradients from operands `x`.
fn gradients_kept<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    p: &Kernels,
    x: &Operands<'_, D::Mem>,
    [g, o, lse]: [&Buf<D>; 3],
    as_words: bool,
) -> Result<KeptBackward<Buf<D>>, RuntimeError> {
    let block = b.device.block_size();
    let mut dsum = b.alloc(&[rows(a)])?;
    // dO and O as their exact words where they have them (made so, or back from the stash).
    let kernel = match (o.exact_bf16().is_some(), g.exact_bf16().is_some()) {
        (false, false) => "attention_dsum",
        (true, false) => "attention_dsum_bf16x",
        (false, true) => "attention_dsum_bf16g",
        (true, true) => "attention_dsum_bf16xg",
    };
    let launched = b.device.launch(
        kernel,
        super::pointwise_grid(block, 8 * rows(a)),
        block,
        &mut [
            KernelArg::Out(&mut dsum.mem),
            KernelArg::In(g.exact_bf16().unwrap_or(&g.mem)),
            KernelArg::In(o.exact_bf16().unwrap_or(&o.mem)),
            KernelArg::I64(a.batch),
            KernelArg::I64(a.sq),
            KernelArg::I64(a.heads),
            KernelArg::I64(a.dv),
        ],
    );
    let as_words = as_words && p.grads_words.is_some();
    let grads = launched.and_then(|()| mma_gradients(b, a, p, x, g, [lse, &dsum], None, as_words));
    b.device.release(dsum.mem);
    Ok(KeptBackward {
        grads: grads?,
        as_words,
    })
}

/// dq per query block and dk, dv per key block from the operands' words and the row
/// statistics `[lse, dsum]` (dO's words made here where it has none); with `as_words` (the
/// tensor-core kernels' `grads_words`) written as bf16 words alone; where `a.grads_packed`,
/// into one buffer in the operands' packed layout (`[batch, n, q + k + v]`), else apart.
#[allow(clippy::too_many_arguments)] // one launch's operands, statistics and output form
fn mma_gradients<D: Device>(
    b: &DeviceBackend<D>,
    a: &AttentionShape,
    p: &Kernels,
    x: &Operands<'_, D::Mem>,
    g: &Buf<D>,
    [lse, dsum]: [&Buf<D>; 2],
    qpos: Option<&D::Mem>,
    as_words: bool,
) -> Result<Vec<Buf<D>>, RuntimeError> {
    let gp = words(b, g)?;
    let pos = || qpos.map_or(KernelArg::Null, KernelArg::In);
    let [dq_kernel, dkv_kernel] = match p.grads_words {
        Some(kernels) if as_words => kernels,
        _ => [p.dq, p.dkv],
    };
    let launch = |kernel, grid, outs: &mut [KernelArg<'_, D::Mem>]| {
        let mut args: Vec<KernelArg<'_, D::Mem>> = outs
            .iter_mut()
            .map(|o| std::mem::replace(o, KernelArg::Null))
            .collect();
        args.extend([
            KernelArg::In(x.q),
            KernelArg::In(x.k),
            KernelArg::In(x.v),
            KernelArg::In(gp),
            KernelArg::In(&lse.mem),
            KernelArg::In(&dsum.mem),
            pos(),
            KernelArg::Attention(*a),
        ]);
        b.device.launch(kernel, grid, p.block, &mut args)
    };
    if a.grads_packed != 0 {
        let width = a.heads * a.d + a.kv * (a.d + a.dv);
        let shape = [a.batch as usize, a.sq as usize, width as usize];
        let mut dqkv = super::output_buffer(b, &shape, as_words)?;
        let out = super::written::<D>(&mut dqkv);
        // dv null: dk's buffer holds dv too, at its offset.
        let launched =
            launch(dq_kernel, p.query_grid, &mut [KernelArg::Out(&mut *out)]).and_then(|()| {
                launch(
                    dkv_kernel,
                    p.key_grid,
                    &mut [KernelArg::Out(out), KernelArg::Null],
                )
            });
        if let Err(e) = launched {
            crate::Backend::free(b, dqkv);
            return Err(e);
        }
        return Ok(vec![dqkv]);
    }
    let mut dq = super::output_buffer(b, &out_shape_of(a, a.sq, a.heads, a.d), as_words)?;
    launch(
        dq_kernel,
        p.query_grid,
        &mut [KernelArg::Out(super::written::<D>(&mut dq))],
    )?;
    let (mut dk, mut dv) = (
        super::output_buffer(b, &out_shape_of(a, a.sk, a.kv, a.d), as_words)?,
        super::output_buffer(b, &out_shape_of(a, a.sk, a.kv, a.dv), as_words)?,
    );
    launch(
        dkv_kernel,
        p.key_grid,
        &mut [
            KernelArg::Out(super::written::<D>(&mut dk)),
            KernelArg::Out(super::written::<D>(&mut dv)),
        ],
    )?;
    Ok(vec![dq, dk, dv])
}

#[cfg(test)]
mod tests {
    use super::{MMA_KERNELS, MMA_ROWS, MMA_THREADS};

    #[test]
    fn the_launch_constants_are_attention_mma_cus() {
        let src = kernels::device::CUDA_SOURCE;
        for define in [
            format!("#define MMA_BLOCK_ROWS {MMA_ROWS}"),
            format!("#define MMA_THREADS {MMA_THREADS}"),
        ] {
            assert!(src.contains(&define), "attention_mma.cu: {define}");
        }
        let names = kernels::device::kernel_names();
        for k in MMA_KERNELS {
            let all = [
                k.forward,
                k.forward_words,
                k.row_stats,
                k.dq,
                k.dkv,
                k.dq_words,
                k.dkv_words,
            ];
            for kernel in all {
                assert!(names.contains(&kernel), "{kernel}");
                assert!(
                    kernel.ends_with(&format!("mma{}", k.d)),
                    "{kernel} for heads {} wide",
                    k.d
                );
            }
        }
    }
}
