//! Compute time of IR ops on one GPU: a roofline of FLOPs over (peak × achievable efficiency)
//! against bytes over sustained HBM bandwidth, plus a fixed launch overhead per kernel.
//!
//! Matmul efficiency = measured maximum achievable fraction of peak (MAMF, in the cluster file)
//! × tile quantization × wave quantization (NVIDIA, "Matrix Multiplication Background User's
//! Guide": output tiles of 128×128 are computed whole, and tiles run in waves of one per SM), so
//! small or skinny GEMMs run slower than large square ones. Non-matmul FLOPs run on the vector
//! units at the fp32 peak.
//!
//! Tensor-parallel sharding follows Megatron-LM (Shoeybi et al. 2019): linear layers, attention
//! heads, rotary, the MLP's inner activations and the vocabulary-parallel embedding and head are
//! split `tp` ways; ops on the hidden-sized residual stream (norms, residual adds) are
//! replicated, or split along the sequence with sequence parallelism (Korthikanti et al. 2022).
//!
//! Kernel fusion ([`Kernels`]) is a property of the software that runs the strategy: `eager`
//! launches one kernel per IR op (PyTorch eager, plait's own runtime); `fused` runs each chain of
//! point-wise ops as one kernel ([`fuse_pointwise`]) and applies the causal mask inside the
//! softmax of a materialized attention (Megatron-LM's fused kernels, Narayanan et al. SC'21 §4.2).

use ir::{Binding, Graph, KeyMask, OpId, OpKind, cost::op_cost};

use crate::hardware::Cluster;
use crate::precision::Precision;

const TILE: f64 = 128.0;

/// Sustained bandwidth of memory-bound kernels relative to a plain device copy, by op class.
///
/// Measured with PyTorch 2.11 on an H200 (`bench/device/gpu_calibration.py`, results in
/// `bench/device/results/h200-2026-11-29.json`, bf16 on [16384, 8192] activations, softmax on
/// [8, 16, 2048, 2048]): copy 4.17 TB/s, add 4.29, GELU-tanh 3.49, dropout 2.97, LayerNorm 2.37,
/// softmax 1.88. Normalizations and softmax reduce along rows and run well below streaming
/// speed; the fractions are assumed to carry over to other NVIDIA GPUs, whose own streaming
/// efficiency (`memory_efficiency` in the cluster file) they multiply.
pub fn bandwidth_fraction(kind: &OpKind) -> f64 {
    h200_fraction(kernel_class(kind))
}

/// The H200 measurement above, by class.
fn h200_fraction(class: KernelClass) -> f64 {
    match class {
        KernelClass::Pointwise => 1.0,
        KernelClass::Activation => GELU_FRACTION,
        KernelClass::Norm => NORM_FRACTION,
        KernelClass::Dropout => DROPOUT_FRACTION,
        KernelClass::Softmax => SOFTMAX_FRACTION,
    }
}

/// The classes of memory-bound kernel whose bandwidth differs (a cluster file may give its
/// own measured fraction per class: `gpu.kernel_fractions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelClass {
    Pointwise,
    Activation,
    Norm,
    Dropout,
    Softmax,
}

pub fn kernel_class(kind: &OpKind) -> KernelClass {
    match kind {
        OpKind::Gelu { .. }
        | OpKind::Silu
        | OpKind::Tanh
        | OpKind::Sigmoid
        | OpKind::Exp
        | OpKind::Pow { .. } => KernelClass::Activation,
        OpKind::LayerNorm { .. }
        | OpKind::RmsNorm { .. }
        | OpKind::ReduceMean
        | OpKind::ReduceSum => KernelClass::Norm,
        OpKind::Dropout { .. } => KernelClass::Dropout,
        OpKind::Softmax { .. } | OpKind::CrossEntropy => KernelClass::Softmax,
        _ => KernelClass::Pointwise,
    }
}

/// Throughput of the GEMMs of transformer layers relative to the best-shaped GEMM (MAMF).
///
/// Measured on an H200 (same file as above): the 48 forward, data-gradient and weight-gradient
/// GEMMs of the QKV, projection and two MLP linears of four GPT layers (h 2304 to 25600, tp 1
/// to 8) ran at a harmonic mean of 712 TFLOP/s against 812 TFLOP/s for the best shape of a
/// large sweep: 0.877 (range 0.77–0.97). MAMF figures in cluster files are best-shape figures,
/// so this factor converts them to what a layer's GEMM mix sustains.
pub const TRANSFORMER_GEMM_FRACTION: f64 = 712.0 / 812.0;

/// Speed of Transformer Engine's FP8 linear layers over the same layers in BF16, with the
/// casts to FP8 (input, weight and output gradient, each with its transpose) included:
/// 1.69 × for the default delayed-scaling recipe, measured by NVIDIA on the linear GEMMs of a
/// 5B model on H200 (Transformer Engine docs, "GEMM Speedups Across Precisions"; current
/// scaling 1.58 ×). Well below the 2 × of the datasheet peaks: the casts and FP8's lower
/// achieved fraction of its peak.
pub const FP8_GEMM_SPEEDUP: f64 = 1.69;

/// The same speed-up under per-tensor current scaling (`Fp8Tensorwise`), measured in the same
/// benchmark: 1.58 × (its amax is computed from each tensor before its cast, a pass delayed
/// scaling takes from the history instead).
pub const FP8_TENSORWISE_GEMM_SPEEDUP: f64 = 1.58;

/// GELU-tanh 3.49 TB/s over copy 4.17 TB/s (H200 measurement above).
const GELU_FRACTION: f64 = 3.49 / 4.17;
/// LayerNorm 2.37 / 4.17.
const NORM_FRACTION: f64 = 2.37 / 4.17;
/// Dropout 2.97 / 4.17.
const DROPOUT_FRACTION: f64 = 2.97 / 4.17;
/// Softmax 1.88 / 4.17.
const SOFTMAX_FRACTION: f64 = 1.88 / 4.17;

/// Forward and backward seconds of one op.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpTime {
    pub fwd: f64,
    pub bwd: f64,
    /// FLOPs actually executed on this GPU (after the tensor-parallel split).
    pub fwd_flops: f64,
    pub bwd_flops: f64,
}

/// How an op is laid out across the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpLayout {
    /// Every TP rank computes the whole op.
    Replicated,
    /// Each TP rank computes 1/tp of it.
    Split,
}

/// Megatron's layout of `o` given the model's hidden size.
pub fn tp_layout(g: &Graph, o: OpId, hidden: u64, sequence_parallel: bool) -> TpLayout {
    let op = g.op(o);
    let out_last = op
        .results
        .first()
        .and_then(|&v| g.ty(v).shape.last())
        .and_then(|d| d.fixed());
    match &op.kind {
        OpKind::Linear { .. }
        | OpKind::MatMul
        | OpKind::Attention { .. }
        | OpKind::Rotary { .. }
        | OpKind::MoeExperts { .. }
        | OpKind::Embedding
        | OpKind::CrossEntropy => TpLayout::Split,
        k if k.is_source() => TpLayout::Replicated,
        _ if out_last != Some(hidden) && out_last != Some(1) => TpLayout::Split,
        _ if sequence_parallel => TpLayout::Split,
        _ => TpLayout::Replicated,
    }
}

/// Megatron-LM's layout of `o`, an op outside the layers, for a vocabulary of `vocab` tokens:
/// [`tp_layout`] where the vocabulary `splits` over the tensor-parallel ranks (the
/// vocabulary-parallel embedding, head and loss, padded where it does not divide). Where it
/// does not split, plait's program keeps the token table and the head whole: the ops on
/// vocabulary-wide tensors run whole on every rank, or on the rank's sequence shard under
/// sequence parallelism.
pub fn outer_tp_layout(
    g: &Graph,
    o: OpId,
    hidden: u64,
    vocab: u64,
    splits: bool,
    sequence_parallel: bool,
) -> TpLayout {
    let op = g.op(o);
    let vocab_wide = |v: &ir::ValueId| {
        g.ty(*v)
            .shape
            .dims()
            .iter()
            .any(|d| d.fixed() == Some(vocab))
    };
    if splits
        || op.kind.is_source()
        || !(op.inputs.iter().any(vocab_wide) || op.results.iter().any(vocab_wide))
    {
        return tp_layout(g, o, hidden, sequence_parallel);
    }
    if sequence_parallel && !matches!(op.kind, OpKind::Embedding) {
        TpLayout::Split
    } else {
        TpLayout::Replicated
    }
}

/// How attention is computed.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKernel {
    /// Scores are written to memory: q·kᵀ, (masked, scaled) softmax, dropout, then ·v, each a
    /// kernel reading and writing the B·heads·S×S matrix (Megatron-LM 2021, plait's own kernels).
    #[default]
    Materialized,
    /// One fused kernel that never stores the scores (FlashAttention, Dao et al. 2022).
    Fused,
}

impl std::str::FromStr for AttentionKernel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "materialized" => Ok(AttentionKernel::Materialized),
            "fused" => Ok(AttentionKernel::Fused),
            _ => Err(format!(
                "unknown attention kernel `{s}`; expected materialized or fused"
            )),
        }
    }
}

/// How the runtime executes element-wise work.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// One kernel per IR op: each reads its operands from memory and writes its results
    /// (PyTorch eager mode, plait's own runtime). The default of plans written before this
    /// setting existed.
    #[default]
    Eager,
    /// Fused element-wise kernels, as Megatron-LM runs them (Narayanan et al. SC'21, §4.2:
    /// fused bias + GeLU, bias + dropout + add, scale + mask + softmax): a chain of point-wise
    /// ops whose intermediate results have no other use is one kernel that reads the chain's
    /// inputs and writes its result; a materialized attention's softmax applies the causal mask
    /// itself and loads only the scores it keeps.
    Fused,
}

impl Kernels {
    pub fn name(self) -> &'static str {
        match self {
            Kernels::Eager => "eager",
            Kernels::Fused => "fused",
        }
    }
}

impl std::fmt::Display for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Kernels {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "eager" => Ok(Kernels::Eager),
            "fused" => Ok(Kernels::Fused),
            _ => Err(format!("unknown kernels `{s}`; expected eager or fused")),
        }
    }
}

/// Whether `kind` is point-wise ([`OpKind::is_pointwise`]), so a chain of such ops can run as
/// one kernel. Normalizations, softmax and reductions reduce along rows and end a chain, as do
/// products and layout changes.
pub fn is_pointwise(kind: &OpKind) -> bool {
    kind.is_pointwise()
}

/// The non-source ops of `ops` (in order) grouped into the kernels a fusing runtime launches.
///
/// A point-wise op joins the kernel of the point-wise op that consumes its result when that is
/// the result's only use anywhere in the graph (`uses`, from [`Graph::uses`]) and both produce
/// the same shape: the intermediate then never leaves registers. Because the producer's only
/// edge out of the group leads into it, no fused group can depend on itself through an outside
/// op. Every other op is a group of its own. Groups are listed by their last op (the kernel
/// runs when its last input is ready).
pub fn fuse_pointwise(g: &Graph, ops: &[OpId], uses: &ir::Uses) -> Vec<Vec<OpId>> {
    let compute: Vec<OpId> = ops
        .iter()
        .copied()
        .filter(|&o| !g.op(o).kind.is_source())
        .collect();
    // group[i]: index in `compute` of the op whose kernel op i runs in (its sole consumer chain).
    let pos = |o: OpId| compute.iter().position(|&c| c == o);
    let mut into: Vec<Option<usize>> = vec![None; compute.len()];
    for (i, &o) in compute.iter().enumerate() {
        let op = g.op(o);
        if !is_pointwise(&op.kind) || op.results.len() != 1 {
            continue;
        }
        let r = op.results[0];
        let Some([user]) = uses.get(r.index()) else {
            continue;
        };
        let Some(j) = pos(*user) else {
            continue;
        };
        let u = g.op(*user);
        let same_shape = u.results.len() == 1 && g.ty(u.results[0]).shape == g.ty(r).shape;
        if is_pointwise(&u.kind) && same_shape && j > i {
            into[i] = Some(j);
        }
    }
    let root = |mut i: usize| {
        while let Some(j) = into[i] {
            i = j;
        }
        i
    };
    let mut groups: Vec<Vec<OpId>> = vec![Vec::new(); compute.len()];
    for (i, &o) in compute.iter().enumerate() {
        groups[root(i)].push(o);
    }
    groups.into_iter().filter(|gr| !gr.is_empty()).collect()
}

/// Average fraction of the keys a causal query row sees (`sq` queries ending at the last of `sk`
/// keys; query i sees `sk − sq + i + 1` of them).
fn causal_visible_fraction(sq: u64, sk: u64) -> f64 {
    windowed_visible_fraction(sq, sk, None)
}

/// [`causal_visible_fraction`] in a sliding window of `window` keys: query i sees the
/// min(sk − sq + i + 1, window) keys before it, itself included.
pub fn windowed_visible_fraction(sq: u64, sk: u64, window: Option<u64>) -> f64 {
    masked_visible_fraction(
        sq,
        sk,
        KeyMask {
            window,
            chunk: None,
        },
    )
}

/// [`causal_visible_fraction`] under `mask`: the query at position p sees
/// [`KeyMask::keys_of`] p keys (its window's, or its own chunk's).
pub fn masked_visible_fraction(sq: u64, sk: u64, mask: KeyMask) -> f64 {
    if sk == 0 {
        return 1.0;
    }
    let sq = sq.min(sk);
    (mask.keys_seen(sk) - mask.keys_seen(sk - sq)) / (sq.max(1) as f64 * sk as f64)
}

/// For an attention op in a sliding window or chunks, the keys a row has over those `ir::cost`
/// counts for it (Sk / min(Sk, w)); 1 for any other op.
fn unwindowed_share(g: &Graph, o: OpId, b: Binding) -> f64 {
    let op = g.op(o);
    match op.kind.attention_mask().widest() {
        Some(w) => {
            let sk = g.ty(op.inputs[1]).shape.eval(b)[1];
            sk as f64 / sk.min(w).max(1) as f64
        }
        None => 1.0,
    }
}

/// The masks of a model's layers' attention, as one representative layer's attention is priced
/// for every layer: each distinct mask and the share of layers with it (Gemma 2's and gpt-oss's
/// half windowed, Gemma 3's five in six, Llama 4's three in four chunked), the rest full causal
/// attention. At most [`MaskMix::MAX`] masks are told apart (no model has more than two); any
/// further ones are priced as the last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaskMix {
    masks: [(KeyMask, f64); MaskMix::MAX],
    len: usize,
}

/// The name the estimate and the model info use for it (sliding windows came first).
pub type WindowMix = MaskMix;

impl MaskMix {
    pub const MAX: usize = 4;

    /// The mix of `g`'s layers' attention ops (none where every layer attends to every earlier
    /// key).
    pub fn of_graph(g: &Graph) -> Option<MaskMix> {
        let masks: Vec<KeyMask> = g
            .order()
            .iter()
            .filter(|&&o| g.op(o).layer.is_some())
            .filter(|&&o| matches!(g.op(o).kind, OpKind::Attention { .. }))
            .map(|&o| g.op(o).kind.attention_mask())
            .collect();
        if masks.iter().all(KeyMask::is_causal) {
            return None;
        }
        let mut mix = MaskMix {
            masks: [(KeyMask::CAUSAL, 0.0); MaskMix::MAX],
            len: 0,
        };
        let share = 1.0 / masks.len() as f64;
        for mask in masks {
            let slot = mix.masks[..mix.len].iter().position(|(m, _)| *m == mask);
            let at = slot.unwrap_or(mix.len.min(MaskMix::MAX - 1));
            if slot.is_none() && mix.len < MaskMix::MAX {
                mix.masks[at].0 = mask;
                mix.len += 1;
            }
            mix.masks[at].1 += share;
        }
        Some(mix)
    }

    /// Each distinct mask and its share of the layers.
    pub fn masks(&self) -> &[(KeyMask, f64)] {
        &self.masks[..self.len]
    }

    /// The average fraction of the keys a query sees over the layers.
    fn visible_fraction(self, sq: u64, sk: u64) -> f64 {
        self.masks()
            .iter()
            .map(|&(mask, share)| share * masked_visible_fraction(sq, sk, mask))
            .sum()
    }
}

/// The device a strategy runs on, with the numbers the roofline needs.
#[derive(Clone, Copy, Debug)]
pub struct Device<'c> {
    pub cluster: &'c Cluster,
    pub attention: AttentionKernel,
    pub kernels: Kernels,
    /// Whether attention probabilities go through dropout (models trained with dropout).
    pub score_dropout: bool,
    pub matmul_peak: f64,
    pub vector_peak: f64,
    /// FLOP/s of a fused attention kernel, forward and backward: the 16-bit dense peak times
    /// the GPU's FlashAttention rates (attention stays in 16 bits under FP8 training, as
    /// Transformer Engine runs it), or the matmul rate where the GPU has no measured rate.
    pub flash_fwd: f64,
    pub flash_bwd: f64,
    /// Context-parallel degree: each rank holds 1/cp of the queries (two load-balanced chunks)
    /// and attends to the whole sequence's keys passed around the ring.
    pub cp: u64,
    /// Where set, a layer's fused attention is priced as the model's mix of sliding-window and
    /// full layers (its representative layer stands for all); else by its own window.
    pub layer_windows: Option<WindowMix>,
    /// FP8 GEMMs as Transformer Engine runs them (see [`FP8_GEMM_SPEEDUP`]).
    pub fp8: bool,
    /// The GEMMs convert f32 operands to bf16 first (`gpu.matmul_casts_operands`, a 16-bit
    /// plan).
    pub casts: bool,
    pub hbm: f64,
    pub launch: f64,
}

impl<'c> Device<'c> {
    pub fn new(
        cluster: &'c Cluster,
        precision: Precision,
        attention: AttentionKernel,
        kernels: Kernels,
        score_dropout: bool,
    ) -> Option<Device<'c>> {
        // FP8 training runs its GEMMs at Transformer Engine's measured speed-up over the same
        // GEMMs in 16 bits, casts included; everything else stays in 16 bits.
        let (gemm_precision, gemm_speedup) = match precision {
            Precision::Fp8 => (Precision::Bf16, FP8_GEMM_SPEEDUP),
            Precision::Fp8Tensorwise => (Precision::Bf16, FP8_TENSORWISE_GEMM_SPEEDUP),
            p => (p, 1.0),
        };
        cluster.peak_flops(precision)?;
        let matmul_peak = cluster.peak_flops(gemm_precision)?
            * gemm_speedup
            * cluster.gpu.matmul_efficiency
            * if cluster.gpu.matmul_packs_operands {
                1.0
            } else {
                TRANSFORMER_GEMM_FRACTION
            };
        let sixteen_bit = match precision {
            Precision::Fp8 | Precision::Fp8Tensorwise => cluster
                .peak_flops(Precision::Bf16)
                .or(cluster.peak_flops(Precision::Fp16)),
            p => cluster.peak_flops(p),
        };
        let (flash_fwd, flash_bwd) = match (cluster.gpu.flash_attention, sixteen_bit) {
            (Some(fa), Some(peak)) if precision != Precision::Fp32 => {
                (peak * fa.forward, peak * fa.backward)
            }
            _ => (matmul_peak, matmul_peak),
        };
        Some(Device {
            cluster,
            flash_fwd,
            flash_bwd,
            cp: 1,
            layer_windows: None,
            fp8: precision.is_fp8(),
            casts: cluster.gpu.matmul_casts_operands && precision != Precision::Fp32,
            attention,
            kernels,
            score_dropout,
            // A measured CPU rate (`plait profile`) is the library's own at n³; its shape
            // effects are the packing passes (`op_time`), not the H200's GEMM mix.
            matmul_peak,
            vector_peak: cluster.peak_flops(Precision::Fp32)?,
            hbm: cluster.hbm_bytes_per_s(),
            launch: cluster.gpu.launch_overhead_us * 1e-6,
        })
    }

    /// The bandwidth fraction of `kind`'s kernel class: the cluster's measurement if it has
    /// one, else plait's H200 measurement ([`bandwidth_fraction`]).
    pub fn fraction(&self, kind: &OpKind) -> f64 {
        self.class_fraction(kernel_class(kind))
    }

    fn class_fraction(&self, class: KernelClass) -> f64 {
        let measured = self.cluster.gpu.kernel_fractions.and_then(|k| match class {
            KernelClass::Pointwise => k.pointwise,
            KernelClass::Activation => k.activation,
            KernelClass::Norm => k.norm,
            KernelClass::Dropout => k.dropout,
            KernelClass::Softmax => k.softmax,
        });
        measured.unwrap_or_else(|| h200_fraction(class))
    }

    /// Tile and wave quantization of a batched (m × k)·(k × n) GEMM.
    pub fn shape_efficiency(&self, batch: f64, m: f64, n: f64) -> f64 {
        if m <= 0.0 || n <= 0.0 {
            return 1.0;
        }
        let tm = (m / TILE).ceil();
        let tn = (n / TILE).ceil();
        let tile = (m * n) / (tm * tn * TILE * TILE);
        let tiles = batch.max(1.0) * tm * tn;
        let sms = f64::from(self.cluster.gpu.sm_count);
        let wave = tiles / ((tiles / sms).ceil() * sms);
        tile * wave
    }

    fn roofline(
        &self,
        flops: f64,
        bytes: f64,
        matmul_eff: Option<f64>,
        act_scale: f64,
        bw_fraction: f64,
    ) -> f64 {
        let compute = match matmul_eff {
            Some(e) => flops / (self.matmul_peak * e),
            None => flops / self.vector_peak,
        };
        compute.max(bytes * act_scale / (self.hbm * bw_fraction)) + self.launch
    }

    /// Time of op `o` at binding `b` with a tensor-parallel degree `tp`.
    ///
    /// `act_scale` converts the graph's element size to the run's precision (a graph built in
    /// f32 costed for bf16 moves half the bytes).
    pub fn op_time(
        &self,
        g: &Graph,
        o: OpId,
        b: Binding,
        tp: u64,
        layout: TpLayout,
        act_scale: f64,
    ) -> OpTime {
        let op = g.op(o);
        if op.kind.is_source() {
            return OpTime::default();
        }
        let mut c = op_cost(g, o, b);
        if self.attention == AttentionKernel::Materialized {
            // Scores written to memory are computed whole and masked: a sliding window saves
            // none of the products `ir::cost` leaves out for it.
            let scale = unwindowed_share(g, o, b);
            c.fwd_flops *= scale;
            c.bwd_flops *= scale;
        }
        let split = if layout == TpLayout::Split {
            tp.max(1) as f64
        } else {
            1.0
        };
        let eff = self.matmul_shape(g, o, b, tp, layout);
        let fwd_flops = c.fwd_flops / split;
        let bwd_flops = c.bwd_flops / split;
        let frac = self.fraction(&op.kind);
        let mut t = OpTime {
            fwd: self.roofline(fwd_flops, c.fwd_bytes() / split, eff, act_scale, frac),
            // A backward of a product op is two GEMMs (two launches).
            bwd: self.roofline(bwd_flops, c.bwd_bytes() / split, eff, act_scale, frac)
                + if eff.is_some() { self.launch } else { 0.0 },
            fwd_flops,
            bwd_flops,
        };
        if self.cluster.gpu.matmul_packs_operands
            && matches!(op.kind, OpKind::Linear { .. } | OpKind::MatMul)
        {
            // The packing pass reads and writes both operands once per GEMM (Goto and van de
            // Geijn 2008: A in mc×kc blocks, B in kc×nc panels, each packed once while n and k
            // fit a panel), before and apart from the arithmetic. Forward x·w; backward
            // dy·wᵀ and xᵀ·dy.
            let bytes = |v: ir::ValueId| g.ty(v).bytes(b) as f64 * act_scale / split;
            let (x, w) = (bytes(op.inputs[0]), bytes(op.inputs[1]));
            let y = bytes(op.results[0]);
            t.fwd += 2.0 * (x + w) / self.hbm;
            t.bwd += 2.0 * (x + w + 2.0 * y) / self.hbm;
        }
        if self.casts && matches!(op.kind, OpKind::Linear { .. } | OpKind::MatMul) {
            // Each conversion reads an f32 operand and writes it in bf16: 1.5 × its f32 bytes.
            // Forward x and w; backward dy (once, for both products), x and w.
            let f32_bytes = |v: ir::ValueId| 4.0 * g.ty(v).shape.numel(b) as f64 / split;
            let (x, w) = (f32_bytes(op.inputs[0]), f32_bytes(op.inputs[1]));
            let y = f32_bytes(op.results[0]);
            t.fwd += 1.5 * (x + w) / self.hbm;
            t.bwd += 1.5 * (x + w + y) / self.hbm;
            // A product whose output rows are not whole 16-byte words (a 50257-word vocabulary)
            // is written at a padded pitch and copied out: one more read and write of it.
            let unaligned =
                |v: ir::ValueId| g.ty(v).shape.eval(b).last().is_some_and(|&n| n % 4 != 0);
            if unaligned(op.results[0]) {
                t.fwd += 2.0 * y / self.hbm;
            }
            if unaligned(op.inputs[1]) {
                t.bwd += 2.0 * w / self.hbm;
            }
            if unaligned(op.inputs[0]) {
                t.bwd += 2.0 * x / self.hbm;
            }
        }
        if let (OpKind::Attention { causal, .. }, AttentionKernel::Fused) =
            (&op.kind, self.attention)
        {
            return self.flash_attention_time(g, o, b, split, *causal, eff.unwrap_or(1.0));
        }
        if let (OpKind::Attention { heads, .. }, AttentionKernel::Materialized) =
            (&op.kind, self.attention)
        {
            // The score matrix makes round trips through HBM as separate, memory-bound kernels:
            // q·kᵀ writes it, softmax reads and writes it, p·v reads it (4 element passes);
            // with dropout, dropout reads and writes it and writes a 1-byte mask (+2 passes,
            // +1 byte). The backward makes twice the passes (gradients of each step).
            let q = g.ty(op.inputs[0]).shape.eval(b);
            let k = g.ty(op.inputs[1]).shape.eval(b);
            let scores = (q[0] * heads * q[1] * k[1]) as f64 / split;
            let elem = g.ty(op.inputs[0]).dtype.size_bytes() as f64 * act_scale;
            // A fused scale-mask-softmax applies the causal mask itself: it loads only the
            // scores it keeps (Megatron-LM's `scaled_upper_triang_masked_softmax` loads each row
            // up to the diagonal and writes the whole row). Eager, the softmax reads them all.
            let softmax_passes = match (self.kernels, &op.kind) {
                (Kernels::Fused, OpKind::Attention { causal: true, .. }) => {
                    1.0 + causal_visible_fraction(q[1], k[1])
                }
                _ => 2.0,
            };
            // Streaming passes (the products' write and read), softmax passes, dropout passes,
            // each at its measured kernel bandwidth.
            let mut secs = 2.0 * elem / self.hbm
                + softmax_passes * elem / (self.hbm * self.class_fraction(KernelClass::Softmax));
            if self.score_dropout {
                secs += (2.0 * elem + 1.0) / (self.hbm * self.class_fraction(KernelClass::Dropout));
            }
            t.fwd += scores * secs + 3.0 * self.launch;
            t.bwd += 2.0 * scores * secs + 3.0 * self.launch;
        }
        t
    }

    /// A fused attention kernel (FlashAttention, Dao et al. 2022; FlashAttention-2, Dao 2023):
    /// scores never leave on-chip memory, so its time is its products at the kernel's measured
    /// rate. A causal kernel skips the blocks above the diagonal (it does the visible fraction of
    /// the 4·B·Sq·Sk·heads·d products); the backward recomputes the scores and runs five
    /// products to the forward's two, 2.5 × the forward's FLOPs (FlashAttention-2 §4.1). The
    /// products' tile and wave quantization (`shape`) applies as to any GEMM.
    fn flash_attention_time(
        &self,
        g: &Graph,
        o: OpId,
        b: Binding,
        split: f64,
        causal: bool,
        shape: f64,
    ) -> OpTime {
        let op = g.op(o);
        let q = g.ty(op.inputs[0]).shape.eval(b);
        // With context parallelism the rank's queries meet every key of the sequence; the
        // load-balanced split (chunks r and 2·cp − 1 − r) gives each rank an equal share of the
        // causal work, the whole sequence's visible fraction.
        let sk = g.ty(op.inputs[1]).shape.eval(b)[1] * self.cp.max(1);
        // A sliding window skips the key blocks wholly before it (FlashAttention-2's
        // `window_size`, Megatron's `--window-size`), a chunked query those before its chunk:
        // the fraction of the products the mask leaves.
        let visible = match (causal, self.layer_windows) {
            (false, _) => 1.0,
            (true, Some(mix)) if op.layer.is_some() => mix.visible_fraction(sk, sk),
            (true, _) => masked_visible_fraction(sk, sk, op.kind.attention_mask()),
        };
        let products = 4.0 * (q[0] * q[1] * sk * q[2]) as f64 * visible / split;
        let fwd_flops = products;
        let bwd_flops = 2.5 * products;
        OpTime {
            fwd: fwd_flops / (self.flash_fwd * shape) + self.launch,
            bwd: bwd_flops / (self.flash_bwd * shape) + self.launch,
            fwd_flops,
            bwd_flops,
        }
    }

    /// Time of a group of point-wise ops fused into one kernel (see [`fuse_pointwise`]): it
    /// reads the group's inputs and writes the results no member reads, once; its backward
    /// reads those inputs and the output gradients and writes the input gradients, the
    /// convention of `ir::cost` for one element-wise op. It streams at the bandwidth of its
    /// slowest member (dropout's random numbers, GELU's tanh) and pays one launch per pass.
    pub fn fused_time(
        &self,
        g: &Graph,
        group: &[OpId],
        b: Binding,
        tp: u64,
        layout: TpLayout,
        act_scale: f64,
    ) -> OpTime {
        if let [o] = group {
            return self.op_time(g, *o, b, tp, layout, act_scale);
        }
        let split = if layout == TpLayout::Split {
            tp.max(1) as f64
        } else {
            1.0
        };
        let inside = |v: ir::ValueId| group.contains(&g.def_op(v));
        let mut inputs: Vec<ir::ValueId> = Vec::new();
        let (mut out_bytes, mut fwd_flops, mut bwd_flops) = (0.0, 0.0, 0.0);
        let mut frac = 1.0f64;
        for &o in group {
            let op = g.op(o);
            let c = op_cost(g, o, b);
            fwd_flops += c.fwd_flops;
            bwd_flops += c.bwd_flops;
            frac = frac.min(self.fraction(&op.kind));
            for &v in &op.inputs {
                if !inside(v) && !inputs.contains(&v) {
                    inputs.push(v);
                }
            }
            // A member's result that no member reads is the kernel's output (in a group from
            // `fuse_pointwise` every other result has its only use inside the group).
            for &r in &op.results {
                if !group.iter().any(|&m| g.op(m).inputs.contains(&r)) {
                    out_bytes += g.ty(r).bytes(b) as f64;
                }
            }
        }
        let in_bytes: f64 = inputs.iter().map(|&v| g.ty(v).bytes(b) as f64).sum();
        let (fwd_flops, bwd_flops) = (fwd_flops / split, bwd_flops / split);
        OpTime {
            fwd: self.roofline(
                fwd_flops,
                (in_bytes + out_bytes) / split,
                None,
                act_scale,
                frac,
            ),
            bwd: self.roofline(
                bwd_flops,
                (2.0 * in_bytes + out_bytes) / split,
                None,
                act_scale,
                frac,
            ),
            fwd_flops,
            bwd_flops,
        }
    }

    /// The shape efficiency of a product op after the TP split, or `None` for other ops.
    fn matmul_shape(
        &self,
        g: &Graph,
        o: OpId,
        b: Binding,
        tp: u64,
        layout: TpLayout,
    ) -> Option<f64> {
        let op = g.op(o);
        let dims = |i: usize| g.ty(op.inputs[i]).shape.eval(b);
        let split = if layout == TpLayout::Split {
            tp.max(1)
        } else {
            1
        } as f64;
        match &op.kind {
            OpKind::Linear { .. } => {
                let x = dims(0);
                let w = dims(1);
                let k = *x.last()? as f64;
                let m = x.iter().rev().skip(1).product::<u64>() as f64;
                let n = *w.get(1)? as f64;
                // Column-parallel (n split) when the output is wider than the input, else
                // row-parallel (k split): either way the output tile grid is what matters.
                let n_local = if n >= k { n / split } else { n };
                Some(self.shape_efficiency(1.0, m, n_local))
            }
            OpKind::MatMul => {
                let a = dims(0);
                let bm = dims(1);
                let m = *a.get(a.len().checked_sub(2)?)? as f64;
                let n = *bm.last()? as f64;
                let batch = a.iter().rev().skip(2).product::<u64>() as f64 / split;
                Some(self.shape_efficiency(batch, m, n))
            }
            OpKind::Attention { heads, .. } => {
                let q = dims(0);
                let k = dims(1);
                let batch = (q[0] * heads) as f64 / split;
                Some(self.shape_efficiency(batch, q[1] as f64, k[1] as f64))
            }
            OpKind::MoeExperts { experts, .. } => {
                let x = dims(0);
                let f = *dims(2).get(2)? as f64;
                let tokens = x.iter().rev().skip(1).product::<u64>() as f64;
                Some(self.shape_efficiency(*experts as f64, tokens / *experts as f64, f / split))
            }
            OpKind::TopKRouter { .. } => Some(1.0),
            _ => None,
        }
    }
}
