//! Memory per rank: model states by precision and ZeRO stage, activations by recompute mode.
//!
//! Model states (Rajbhandari et al., SC'20, mixed-precision Adam with K = 12): weights 2Ψ,
//! gradients 2Ψ, optimizer 12Ψ bytes for Ψ parameters on a rank. ZeRO-1 divides the optimizer by
//! N_d, ZeRO-2 also the gradients, ZeRO-3 also the weights.
//!
//! Activations per layer and micro-batch follow Korthikanti et al. 2022 (arXiv 2205.05198, §4),
//! written term by term so the same accounting covers grouped-query attention, SwiGLU and MoE
//! MLPs and models without dropout. For a GPT layer (kv = h, f = 4h, dropout) the terms add up to
//! the paper's s·b·h·(34 + 5·a·s/h) bytes, and to its tensor-parallel, sequence-parallel,
//! selective and full-recompute variants.

use serde::Serialize;

use crate::cost::compute::AttentionKernel;
use crate::precision::Precision;
use crate::strategy::Recompute;

/// The shape of one transformer layer, as the activation formula needs it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerShape {
    pub hidden: f64,
    pub heads: f64,
    /// Width of the query projection and of the attention output: heads × head size (the
    /// hidden size unless the model sets its own head size: Qwen3, Gemma).
    pub q_width: f64,
    /// Width of the key (and of the value) projection: kv_heads × head size.
    pub kv_width: f64,
    /// Inner width of the MLP (per expert).
    pub ffn: f64,
    /// Three inner-wide tensors saved (SwiGLU's gate, up and product; a squared ReLU's
    /// projection, ReLU and square) rather than a GELU MLP's two.
    pub gated: bool,
    /// Experts each token visits (1 for a dense MLP).
    pub experts_per_token: f64,
    /// The MLP is routed experts: one kernel over the layer's tokens made whole (gathered
    /// over the tensor-parallel ranks under SP, over the expert group under EP).
    pub routed: bool,
    /// Hidden-wide outputs scaled by a one-column gate (Qwen2-MoE's shared expert times
    /// `sigmoid(shared_expert_gate(x))`): the product's backward reads each, so each is kept.
    pub gate_scaled: f64,
    /// Dropout after attention probabilities, attention output and MLP output (GPT, Megatron).
    pub dropout: bool,
    /// Norms on the residual stream beyond the two of a pre-norm block (Gemma 2's norms on
    /// the attention and MLP outputs): each keeps its hidden-wide input.
    pub extra_norms: f64,
    /// Per-head norms of q and k (Qwen3): they keep the q and k projections' outputs.
    pub qk_norm: bool,
    /// Width of a dense expert every token visits beside the routed ones (Qwen2-MoE's shared
    /// expert; 0 without): it keeps its gate, up and product like a gated MLP.
    pub shared_ffn: f64,
    /// Per-token elements every tensor-parallel rank keeps whole: multi-head latent
    /// attention's low-rank latents (the inputs and outputs of their norms), computed whole on
    /// every rank on the whole sequence (0 without).
    pub latent_width: f64,
    /// Hidden-wide tensors the MLP block reads that the attention block keeps already: in a
    /// parallel block (GPT-NeoX, Falcon, Phi) both norms read the layer's input (1), or one
    /// norm's output feeds both branches (2); 0 in a sequential block.
    pub shared_inputs: f64,
    /// Widths summed of the norms over all of q's or k's heads (OLMo 2's `q_norm`, `k_norm`):
    /// each keeps its input, on sequence shards under SP and whole otherwise, as the sharding
    /// extraction lays them out (0 without).
    pub head_spanning_norms: f64,
    /// Per-token elements kept by the norms composed of elementwise ops over q's heads and
    /// over k's (Llama 4's weightless L2 norms, x·rsqrt(mean(x²) + eps)): each keeps its
    /// input and two per-head statistics, split as the heads are (0 without).
    pub composed_q_norms: f64,
    pub composed_kv_norms: f64,
    /// q, k and v clamped after their projections (OLMo's `clip_qkv`): each clamp keeps its
    /// input beside the attention's q, k and v, split as they are.
    pub clamped_qkv: bool,
}

/// How a layer's activations are kept: the parallel split of the tensors and what the run
/// recomputes or never stores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationPolicy {
    pub tp: f64,
    pub sequence_parallel: bool,
    pub recompute: Recompute,
    pub precision: Precision,
    pub attention: AttentionKernel,
    /// Expert-parallel degree (1: off).
    pub ep: f64,
}

/// Activation bytes one layer keeps for one micro-batch of `b` sequences of length `s`.
///
/// A materialized attention keeps Korthikanti's score terms; a fused one (FlashAttention)
/// never stores the scores: it keeps its output (the projection input, counted already) and the
/// softmax statistics, one fp32 log-sum-exp per query row and head (Dao et al. 2022, §3.1), and
/// regenerates its dropout mask from the random state.
pub fn layer_activation_bytes(l: &LayerShape, s: f64, b: f64, a: &ActivationPolicy) -> f64 {
    let (tp, sequence_parallel, recompute) = (a.tp, a.sequence_parallel, a.recompute);
    let precision = a.precision;
    let e = precision.activation_bytes();
    let sbh = s * b * l.hidden;
    // Tensors on the residual stream: replicated across TP ranks unless sequence-parallel.
    let rep = if sequence_parallel { tp } else { 1.0 };
    if recompute == Recompute::Full {
        // Only each layer's input is kept (Korthikanti eq. for full recompute: 2sbh, /t with SP).
        return e * sbh / rep;
    }
    let mask = if l.dropout { 1.0 } else { 0.0 };
    // Attention block: LN input, QKV input, Q, K, V, projection input, output dropout mask.
    let mut bytes = (e * sbh + e * sbh + mask * sbh) / rep;
    // K and V split by head. With fewer KV heads than ranks (vLLM's replicated KV heads,
    // which plait's programs lower) every rank projects all of K and V, keeps them whole in
    // the head-major view its head is selected from, and then its one head.
    let kv_heads = (l.kv_width * l.heads / l.q_width).max(1.0);
    let kv_split = tp.min(kv_heads);
    let replicated = kv_heads < tp;
    let (sbq, sbkv) = (s * b * l.q_width, s * b * l.kv_width);
    bytes += 2.0 * e * sbq / tp;
    bytes += if replicated {
        2.0 * e * sbkv * (1.0 + 1.0 / kv_split)
    } else {
        2.0 * e * sbkv / kv_split
    };
    if l.qk_norm {
        // The norms' inputs: q and k as projected, before the norm and the rotation (a
        // replicated k is normalized whole). The norm's output is the rotation's input, which
        // the rotation's backward does not read (its gradient is the inverse rotation).
        bytes += e * sbq / tp
            + if replicated {
                e * sbkv
            } else {
                e * sbkv / kv_split
            };
    }
    if l.clamped_qkv {
        bytes += e * sbq / tp
            + 2.0
                * if replicated {
                    e * sbkv
                } else {
                    e * sbkv / kv_split
                };
    }
    bytes += e * s * b * l.composed_q_norms / tp;
    bytes += e * s * b * l.composed_kv_norms / if replicated { 1.0 } else { kv_split };
    bytes += l.extra_norms * e * sbh / rep;
    bytes += e * s * b * l.head_spanning_norms / rep;
    bytes += e * s * b * l.latent_width;
    // Attention core: softmax output, dropout mask and dropout output per head (5·a·s²·b);
    // selective recompute drops it.
    if recompute == Recompute::None {
        bytes += match a.attention {
            AttentionKernel::Materialized => {
                let per_score = if l.dropout { 2.0 * e + 1.0 } else { e };
                per_score * l.heads * s * s * b / tp
            }
            AttentionKernel::Fused => LSE_BYTES * l.heads * s * b / tp,
        };
    }
    // MLP block: LN input, first-linear input, dropout mask; inner activations split by TP.
    bytes += ((2.0 - l.shared_inputs) * e * sbh + mask * sbh) / rep;
    let inner = if l.gated { 3.0 } else { 2.0 };
    bytes += inner * e * s * b * l.ffn * l.experts_per_token / tp;
    bytes += 3.0 * e * s * b * l.shared_ffn / tp;
    bytes += l.gate_scaled * e * sbh / rep;
    bytes
}

/// Activation-gradient bytes one layer's backward holds at once, beyond what the layer keeps.
///
/// Korthikanti's terms count what the forward stores; the backward also holds gradients. At its
/// widest point: a column-parallel projection's output gradient (`[s, b, f/t]` per routed copy
/// of a token) beside its input gradient on the whole sequence (`[s, b, h]`, gathered under SP,
/// before its reduce-scatter); a gated MLP's product splits one inner-wide gradient into two
/// (three at once); a materialized attention the scores' gradient beside the softmax's
/// (`2·a·s²·b/t`). Under expert parallelism the expert kernel's backward holds its inner
/// gradients while the group's gathered tokens (regathered for it), their output gradient and
/// their input gradient are live too: three `[ep·s, b, h]` tensors (and, under SP, the
/// whole-sequence tokens they were gathered from) beside the inner-wide ones. Without expert
/// parallelism the kernel still runs on whole tokens: their output and input gradients, and
/// under SP the tokens gathered again from the rank's shard, beside its inner gradients.
pub fn layer_backward_gradient_bytes(l: &LayerShape, s: f64, b: f64, a: &ActivationPolicy) -> f64 {
    let inner = s * b * l.ffn * l.experts_per_token / a.tp;
    let projection = s * b * l.hidden + inner;
    let pointwise = if l.gated { 3.0 } else { 2.0 } * inner;
    let scores = match a.attention {
        AttentionKernel::Materialized => 2.0 * l.heads * s * s * b / a.tp,
        AttentionKernel::Fused => 0.0,
    };
    let gathered_over_tp = if a.sequence_parallel && a.tp > 1.0 {
        1.0
    } else {
        0.0
    };
    let dispatch = if !l.routed {
        0.0
    } else if a.ep > 1.0 {
        s * b * l.hidden * (3.0 * a.ep + gathered_over_tp)
    } else {
        s * b * l.hidden * (2.0 + gathered_over_tp)
    };
    a.precision.activation_bytes() * projection.max(pointwise + dispatch).max(scores)
}

/// Bytes of one softmax statistic a fused attention keeps per query row and head (fp32).
pub const LSE_BYTES: f64 = 4.0;

/// Model-state bytes on one rank holding `params` parameters (already divided by TP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StateBytes {
    pub weights: f64,
    pub grads: f64,
    pub optimizer: f64,
}

impl StateBytes {
    /// Adds another set of parameters' states (the experts beside the dense weights).
    pub fn add(&mut self, other: &StateBytes) {
        self.weights += other.weights;
        self.grads += other.grads;
        self.optimizer += other.optimizer;
    }
}

pub fn state_bytes(params: f64, dp: f64, zero: u8, precision: Precision) -> StateBytes {
    let shard = |stage: u8| if zero >= stage { dp } else { 1.0 };
    StateBytes {
        weights: precision.weight_bytes() * params / shard(3),
        grads: precision.grad_bytes() * params / shard(2),
        optimizer: precision.optimizer_bytes() * params / shard(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt(h: f64, a: f64) -> LayerShape {
        LayerShape {
            hidden: h,
            heads: a,
            q_width: h,
            extra_norms: 0.0,
            qk_norm: false,
            shared_ffn: 0.0,
            latent_width: 0.0,
            shared_inputs: 0.0,
            head_spanning_norms: 0.0,
            composed_q_norms: 0.0,
            composed_kv_norms: 0.0,
            clamped_qkv: false,
            kv_width: h,
            ffn: 4.0 * h,
            gated: false,
            experts_per_token: 1.0,
            routed: false,
            gate_scaled: 0.0,
            dropout: true,
        }
    }

    fn policy(tp: f64, sp: bool, recompute: Recompute, precision: Precision) -> ActivationPolicy {
        ActivationPolicy {
            tp,
            sequence_parallel: sp,
            recompute,
            precision,
            attention: AttentionKernel::Materialized,
            ep: 1.0,
        }
    }

    #[test]
    fn fused_attention_keeps_softmax_statistics_not_scores() {
        let (s, b, h, a, t) = (8192.0, 1.0, 4096.0, 32.0, 1.0);
        let l = LayerShape {
            dropout: false,
            ..gpt(h, a)
        };
        let mut p = policy(t, false, Recompute::None, Precision::Bf16);
        let materialized = layer_activation_bytes(&l, s, b, &p);
        p.attention = AttentionKernel::Fused;
        let fused = layer_activation_bytes(&l, s, b, &p);
        // Without dropout the materialized scores are 2·a·s²·b bytes; fused keeps 4·a·s·b.
        let scores = 2.0 * a * s * s * b;
        let lse = 4.0 * a * s * b;
        assert!(((materialized - fused) - (scores - lse)).abs() < 1.0);
        // Selective recompute keeps neither.
        p.recompute = Recompute::Selective;
        assert!((layer_activation_bytes(&l, s, b, &p) - (fused - lse)).abs() < 1.0);
    }

    /// Korthikanti et al. 2022, Table 2, with s, b, h, a, t of GPT-3 175B.
    #[test]
    fn gpt_layer_matches_korthikanti_in_every_mode() {
        let (s, b, h, a, t) = (2048.0, 1.0, 12288.0, 96.0, 8.0);
        let l = gpt(h, a);
        let sbh = s * b * h;
        let p = Precision::Fp16;
        let close =
            |got: f64, want: f64| assert!((got - want).abs() / want < 1e-12, "{got} vs {want}");
        // No parallelism: sbh(34 + 5as/h).
        close(
            layer_activation_bytes(&l, s, b, &policy(1.0, false, Recompute::None, p)),
            sbh * (34.0 + 5.0 * a * s / h),
        );
        // Tensor parallel without SP: sbh(10 + 24/t + 5as/(ht)).
        close(
            layer_activation_bytes(&l, s, b, &policy(t, false, Recompute::None, p)),
            sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t)),
        );
        // Tensor + sequence parallel: sbh(34 + 5as/h)/t.
        close(
            layer_activation_bytes(&l, s, b, &policy(t, true, Recompute::None, p)),
            sbh * (34.0 + 5.0 * a * s / h) / t,
        );
        // Selective recompute with SP: 34 sbh / t; without SP: sbh(10 + 24/t).
        close(
            layer_activation_bytes(&l, s, b, &policy(t, true, Recompute::Selective, p)),
            34.0 * sbh / t,
        );
        close(
            layer_activation_bytes(&l, s, b, &policy(t, false, Recompute::Selective, p)),
            sbh * (10.0 + 24.0 / t),
        );
        // Full recompute: 2sbh, divided by t with SP.
        close(
            layer_activation_bytes(&l, s, b, &policy(t, false, Recompute::Full, p)),
            2.0 * sbh,
        );
        close(
            layer_activation_bytes(&l, s, b, &policy(t, true, Recompute::Full, p)),
            2.0 * sbh / t,
        );
    }

    #[test]
    fn the_widest_backward_gradients_are_the_mlp_pair_or_the_scores() {
        let l = gpt(12288.0, 96.0);
        let fused = ActivationPolicy {
            attention: AttentionKernel::Fused,
            ..policy(8.0, true, Recompute::None, Precision::Bf16)
        };
        // GPT-3's MLP: the up projection's output gradient [s, b, 4h/8] beside its
        // whole-sequence input gradient [s, b, h].
        let (s, b) = (2048.0, 1.0);
        let mlp = 2.0 * (s * b * 12288.0 + s * b * 4.0 * 12288.0 / 8.0);
        assert_eq!(layer_backward_gradient_bytes(&l, s, b, &fused), mlp);
        // Materialized scores at 8k tokens outgrow it: two [a/t, s, s] gradients.
        let materialized = ActivationPolicy {
            attention: AttentionKernel::Materialized,
            ..fused
        };
        let s = 8192.0;
        let scores = 2.0 * 2.0 * 96.0 * s * s / 8.0;
        assert_eq!(
            layer_backward_gradient_bytes(&l, s, b, &materialized),
            scores
        );
    }

    #[test]
    fn zero_stages_match_rajbhandari() {
        // Figure 1 of the ZeRO paper: Ψ = 7.5B, N_d = 64 → 120, 31.4, 16.6, 1.9 GB.
        let psi = 7.5e9;
        let total = |z| {
            let s = state_bytes(psi, 64.0, z, Precision::Fp16);
            (s.weights + s.grads + s.optimizer) / 1e9
        };
        for (z, want) in [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.875)] {
            assert!(
                (total(z) - want).abs() < 0.06,
                "ZeRO-{z}: {} vs {want}",
                total(z)
            );
        }
    }
}
