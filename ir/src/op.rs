//! The op set: what each op computes, its attributes, and its result types.
//!
//! Semantics (all shapes row-major, broadcasting is numpy's, trailing-aligned):
//! - Sources: `Input` (data fed per step), `Param` (trainable weight), `Buffer` (constant tensor
//!   such as a mask or rotary table), `State` (optimizer state), `Scalar` (a literal), `Iota`
//!   (the positions `0..len` as i64).
//! - `Embedding(table[V,H], ids[..])` → `[.., H]`: row lookup.
//! - `MatMul(a[.., M, K], b[.., K, N])` → `[.., M, N]`, batch dims broadcast.
//! - `Linear(x[.., K], w[K, N], bias[N]?)` → `[.., N]` (weights stored input-major).
//! - Elementwise: `Add`, `Sub`, `Mul`, `Div` (broadcasting); `Neg`, `Exp`, `Sqrt`, `Rsqrt`,
//!   `Tanh`, `Sigmoid`, `Pow{exponent}`, `Scale{factor}`, `Gelu{tanh}`, `Silu`, `Relu`,
//!   `Clamp{limit}` (to ±limit).
//! - `ReduceMean`/`ReduceSum` over the last axis, keeping it as size 1.
//! - `LayerNorm{eps, bias}(x[.., H], gamma[H], beta[H]?)` (no beta where `bias` is false:
//!   Cohere's), `RmsNorm{eps}(x[.., H], gamma[H])`.
//! - `Softmax{causal}` over the last axis of `[.., Sq, Sk]`; causal masks key `j > i + Sk - Sq`.
//! - `Attention{heads, kv_heads, scale, causal}(q[B,S,heads*d], k[B,S,kv*d], v[B,S,kv*dv])`
//!   → `[B,S,heads*dv]`: softmax(q kᵀ · scale) v per head; query head `h` reads kv head
//!   `h / (heads / kv_heads)` (grouped-query attention). The value head size `dv` is usually
//!   `d`; multi-head latent attention's is smaller. With `sinks`, a fourth operand `sinks[heads]`
//!   is one more logit per head in each row's softmax, attending to nothing (gpt-oss's
//!   attention sinks): weights sum to less than one. With `window` w (causal only), query i
//!   sees keys i − w < j ≤ i (a sliding window); with `chunk` c (causal only), keys j ≤ i with
//!   ⌊j/c⌋ = ⌊i/c⌋ (chunked attention); [`crate::KeyMask`] says which.
//! - `Rotary{heads, theta, scaling}(x[B,S,heads*d])`: rotary position embedding in the "rotate
//!   half" convention of Hugging Face Llama, position = index along S, its frequencies rescaled
//!   as [`RopeScaling`] says.
//! - `Reshape{shape}`, `Expand{shape}` (numpy broadcast_to), `Transpose{perm}`, `Split{axis, sizes}` (one result per part),
//!   `Concat{axis}`, `Slice{axis, start, end}`.
//! - `Dropout{p, seed}`: inverted dropout with a mask that is a pure function of (seed, index).
//! - `CrossEntropy(logits[.., V], targets[..])` → scalar mean negative log-likelihood.
//! - `TopKRouter{experts, k, routing, bias}(x[.., H], w[H, E], b[E]?)` → gates `[.., E]`: the
//!   weights of the `k` experts chosen from the router logits `x w (+ b)`, zero elsewhere;
//!   [`Routing`] says how (Mixtral's softmax over the top k, Qwen-MoE's unnormalized shares,
//!   DeepSeek-V3's group-limited sigmoid).
//! - `MoeExperts{experts, form}(x[.., H], gates[.., E], w1[E,H,F], w3[E,H,F], w2[E,F,H],
//!   b1[E,F]?, b3[E,F]?)` → `[.., H]`: Σₑ gatesₑ · unit(x w1ₑ + b1ₑ, x w3ₑ + b3ₑ) w2ₑ, the unit
//!   SwiGLU's silu(a) ⊙ b or another [`ExpertForm`] (gpt-oss's clamped one; a bias after w2
//!   is a `Linear` of the gates outside the op, where a split of the experts' sum cannot
//!   count it twice).
//! - `Grad{of, wrt}(inputs of `of`.., dy)` → one gradient per input index listed in `wrt`.
//! - `AdamW{..}(param, grad, m, v, step)` → `(param', m', v')`.

use serde::{Deserialize, Serialize};

use crate::expert::ExpertForm;
use crate::rope::RopeScaling;
use crate::routing::Routing;
use crate::types::{DType, Dim, Shape, TensorType};

/// AdamW hyper-parameters (Loshchilov & Hutter, decoupled weight decay).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        // PyTorch's torch.optim.AdamW defaults, except lr which suits small models.
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// What an op computes. Attributes live in the variant; operands live in the graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OpKind {
    Input {
        name: String,
    },
    Param {
        name: String,
    },
    Buffer {
        name: String,
    },
    State {
        name: String,
    },
    Scalar {
        value: f64,
    },
    Iota {
        len: Dim,
    },
    Embedding,
    MatMul,
    Linear {
        bias: bool,
    },
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    Exp,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Pow {
        exponent: f64,
    },
    Scale {
        factor: f64,
    },
    Gelu {
        tanh: bool,
    },
    Silu,
    Relu,
    /// `min(max(x, -limit), limit)` (OLMo's `clip_qkv`); the gradient passes where
    /// |x| ≤ limit, as PyTorch's `clamp`.
    Clamp {
        limit: f64,
    },
    ReduceMean,
    ReduceSum,
    LayerNorm {
        eps: f64,
        /// A beta input (every LayerNorm in files written before the field).
        #[serde(default = "with_bias", skip_serializing_if = "is_true")]
        bias: bool,
    },
    RmsNorm {
        eps: f64,
    },
    Softmax {
        causal: bool,
    },
    Attention {
        heads: u64,
        kv_heads: u64,
        scale: f64,
        causal: bool,
        /// Scores soft-capped as cap·tanh(s/cap) before the mask and softmax (Gemma 2's
        /// `attn_logit_softcapping`); none when absent from a file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        softcap: Option<f64>,
        /// A learned sink logit per head as a fourth operand (gpt-oss); none in files written
        /// before the field.
        #[serde(default, skip_serializing_if = "is_false")]
        sinks: bool,
        /// A sliding window: query i sees keys i − window < j ≤ i, the `window` most recent
        /// itself included (transformers' `sliding_window` mask: Mistral, Gemma 2/3, gpt-oss).
        /// Causal only; none (full attention) in files written before the field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u64>,
        /// Chunked attention: query i sees only keys j ≤ i of its own chunk, ⌊j/chunk⌋ =
        /// ⌊i/chunk⌋ (Llama 4's `attention_chunk_size`). Causal only; none in files written
        /// before the field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chunk: Option<u64>,
    },
    Rotary {
        heads: u64,
        theta: f64,
        /// The config's `rope_scaling` (none when absent from a file).
        #[serde(default, skip_serializing_if = "RopeScaling::is_none")]
        scaling: RopeScaling,
    },
    Reshape {
        shape: Vec<Dim>,
    },
    Expand {
        shape: Vec<Dim>,
    },
    Transpose {
        perm: Vec<usize>,
    },
    Split {
        axis: usize,
        sizes: Vec<u64>,
    },
    Concat {
        axis: usize,
    },
    Slice {
        axis: usize,
        start: u64,
        end: u64,
    },
    Dropout {
        p: f64,
        seed: u64,
    },
    CrossEntropy,
    TopKRouter {
        experts: u64,
        k: u64,
        /// Scoring, normalization and group limit (Mixtral's when absent from a file).
        #[serde(default)]
        routing: Routing,
        /// A bias `[E]` on the router logits as a third operand (gpt-oss).
        #[serde(default, skip_serializing_if = "is_false")]
        bias: bool,
    },
    MoeExperts {
        experts: u64,
        /// Each expert's biases and gated unit (SwiGLU without biases when absent).
        #[serde(default, skip_serializing_if = "ExpertForm::is_swiglu")]
        form: ExpertForm,
    },
    Grad {
        of: Box<OpKind>,
        wrt: Vec<usize>,
    },
    AdamW(AdamWConfig),
}

fn with_bias() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Attention sinks are one logit per query head, of the query's float type.
fn attention_sinks(sinks: &TensorType, q: &TensorType, heads: u64) -> Result<(), String> {
    same_float(q, sinks)?;
    if sinks.shape.0 != [Dim::Fixed(heads)] {
        return Err(format!(
            "attention sinks {} must be [{heads}] (one per query head)",
            sinks.shape
        ));
    }
    Ok(())
}

/// A bias of the experts' ops: `shape`, of the input's float type.
fn per_expert(what: &str, b: &TensorType, x: &TensorType, shape: &[u64]) -> Result<(), String> {
    same_float(x, b)?;
    if b.shape != Shape::fixed(shape) {
        return Err(format!("{what} {} must be {shape:?}", b.shape));
    }
    Ok(())
}

/// A coarse class of op, used by the cost model and the histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    Source,
    Compute,
    Layout,
    Training,
}

impl OpKind {
    /// An attention's sliding window ([`OpKind::Attention`]'s `window`); none for other kinds.
    pub fn attention_window(&self) -> Option<u64> {
        match self {
            OpKind::Attention { window, .. } => *window,
            _ => None,
        }
    }

    /// This kind with an attention's sliding window replaced by `w` (any other kind as it is):
    /// the window is a per-layer attribute, as a dropout's seed is.
    pub fn with_window(mut self, w: Option<u64>) -> OpKind {
        if let OpKind::Attention { window, .. } = &mut self {
            *window = w;
        }
        self
    }

    /// An attention's mask beyond causality (its window and chunk); causal for other kinds.
    pub fn attention_mask(&self) -> crate::KeyMask {
        match self {
            OpKind::Attention { window, chunk, .. } => crate::KeyMask {
                window: *window,
                chunk: *chunk,
            },
            _ => crate::KeyMask::CAUSAL,
        }
    }

    /// This kind with an attention's mask replaced by `mask` (any other kind as it is): a
    /// per-layer attribute, as a window is.
    pub fn with_mask(mut self, mask: crate::KeyMask) -> OpKind {
        if let OpKind::Attention { window, chunk, .. } = &mut self {
            *window = mask.window;
            *chunk = mask.chunk;
        }
        self
    }

    /// The mnemonic used by the text form and histograms.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            OpKind::Input { .. } => "input",
            OpKind::Param { .. } => "param",
            OpKind::Buffer { .. } => "buffer",
            OpKind::State { .. } => "state",
            OpKind::Scalar { .. } => "scalar",
            OpKind::Iota { .. } => "iota",
            OpKind::Embedding => "embedding",
            OpKind::MatMul => "matmul",
            OpKind::Linear { .. } => "linear",
            OpKind::Add => "add",
            OpKind::Sub => "sub",
            OpKind::Mul => "mul",
            OpKind::Div => "div",
            OpKind::Neg => "neg",
            OpKind::Exp => "exp",
            OpKind::Sqrt => "sqrt",
            OpKind::Rsqrt => "rsqrt",
            OpKind::Tanh => "tanh",
            OpKind::Sigmoid => "sigmoid",
            OpKind::Pow { .. } => "pow",
            OpKind::Scale { .. } => "scale",
            OpKind::Gelu { .. } => "gelu",
            OpKind::Silu => "silu",
            OpKind::Relu => "relu",
            OpKind::Clamp { .. } => "clamp",
            OpKind::ReduceMean => "reduce_mean",
            OpKind::ReduceSum => "reduce_sum",
            OpKind::LayerNorm { .. } => "layernorm",
            OpKind::RmsNorm { .. } => "rmsnorm",
            OpKind::Softmax { .. } => "softmax",
            OpKind::Attention { .. } => "attention",
            OpKind::Rotary { .. } => "rotary",
            OpKind::Reshape { .. } => "reshape",
            OpKind::Expand { .. } => "expand",
            OpKind::Transpose { .. } => "transpose",
            OpKind::Split { .. } => "split",
            OpKind::Concat { .. } => "concat",
            OpKind::Slice { .. } => "slice",
            OpKind::Dropout { .. } => "dropout",
            OpKind::CrossEntropy => "cross_entropy",
            OpKind::TopKRouter { .. } => "topk_router",
            OpKind::MoeExperts { .. } => "moe_experts",
            OpKind::Grad { .. } => "grad",
            OpKind::AdamW(_) => "adamw",
        }
    }

    pub fn class(&self) -> OpClass {
        match self {
            OpKind::Input { .. }
            | OpKind::Param { .. }
            | OpKind::Buffer { .. }
            | OpKind::State { .. }
            | OpKind::Scalar { .. }
            | OpKind::Iota { .. } => OpClass::Source,
            OpKind::Reshape { .. }
            | OpKind::Expand { .. }
            | OpKind::Transpose { .. }
            | OpKind::Split { .. }
            | OpKind::Concat { .. }
            | OpKind::Slice { .. } => OpClass::Layout,
            OpKind::Grad { .. } | OpKind::AdamW(_) => OpClass::Training,
            _ => OpClass::Compute,
        }
    }

    pub fn is_source(&self) -> bool {
        self.class() == OpClass::Source
    }

    /// Element-wise with one operand: each output element depends only on the same element
    /// of the input (activations, scaling, dropout).
    pub fn is_unary_pointwise(&self) -> bool {
        matches!(
            self,
            OpKind::Neg
                | OpKind::Exp
                | OpKind::Sqrt
                | OpKind::Rsqrt
                | OpKind::Tanh
                | OpKind::Sigmoid
                | OpKind::Pow { .. }
                | OpKind::Scale { .. }
                | OpKind::Gelu { .. }
                | OpKind::Silu
                | OpKind::Relu
                | OpKind::Clamp { .. }
                | OpKind::Dropout { .. }
        )
    }

    /// Element-wise with two operands (after broadcasting).
    pub fn is_binary_pointwise(&self) -> bool {
        matches!(self, OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::Div)
    }

    /// Point-wise: each output element depends only on the same element of its operands, so a
    /// chain of such ops can run as one kernel and shards along any axis. Normalizations,
    /// softmax, reductions, products and layout changes are not.
    pub fn is_pointwise(&self) -> bool {
        self.is_unary_pointwise() || self.is_binary_pointwise()
    }

    /// The operand count this op takes, or `None` when it varies (concat, linear, grad).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            OpKind::Input { .. }
            | OpKind::Param { .. }
            | OpKind::Buffer { .. }
            | OpKind::State { .. }
            | OpKind::Scalar { .. }
            | OpKind::Iota { .. } => 0,
            OpKind::Neg
            | OpKind::Exp
            | OpKind::Sqrt
            | OpKind::Rsqrt
            | OpKind::Tanh
            | OpKind::Sigmoid
            | OpKind::Pow { .. }
            | OpKind::Scale { .. }
            | OpKind::Gelu { .. }
            | OpKind::Silu
            | OpKind::Relu
            | OpKind::Clamp { .. }
            | OpKind::ReduceMean
            | OpKind::ReduceSum
            | OpKind::Softmax { .. }
            | OpKind::Rotary { .. }
            | OpKind::Reshape { .. }
            | OpKind::Expand { .. }
            | OpKind::Transpose { .. }
            | OpKind::Split { .. }
            | OpKind::Slice { .. }
            | OpKind::Dropout { .. } => 1,
            OpKind::Embedding
            | OpKind::MatMul
            | OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Div
            | OpKind::RmsNorm { .. }
            | OpKind::CrossEntropy => 2,
            OpKind::TopKRouter { bias, .. } => 2 + usize::from(*bias),
            OpKind::Attention { sinks, .. } => 3 + usize::from(*sinks),
            OpKind::LayerNorm { bias, .. } => 2 + usize::from(*bias),
            OpKind::MoeExperts { form, .. } => form.operands(),
            OpKind::AdamW(_) => 5,
            OpKind::Linear { bias } => 2 + usize::from(*bias),
            OpKind::Concat { .. } | OpKind::Grad { .. } => return None,
        })
    }

    /// How many results the op defines.
    pub fn result_count(&self) -> usize {
        match self {
            OpKind::Split { sizes, .. } => sizes.len(),
            OpKind::Grad { wrt, .. } => wrt.len(),
            OpKind::AdamW(_) => 3,
            _ => 1,
        }
    }

    /// Operand indices through which a gradient flows (float data inputs, not indices).
    pub fn differentiable_inputs(&self) -> Vec<usize> {
        match self {
            OpKind::Embedding => vec![0],
            OpKind::CrossEntropy => vec![0],
            // Top-k selection is piecewise constant in the logits' ranking; the gradient flows
            // through the softmax of the selected logits into both x and the router weight.
            OpKind::Grad { .. } | OpKind::AdamW(_) => vec![],
            k if k.is_source() => vec![],
            k => (0..k.arity().unwrap_or(0)).collect(),
        }
    }
}

/// Infers the result types of `kind` applied to operands of types `inputs`.
///
/// Errors are plain sentences; the verifier attaches the op's location.
pub fn infer_types(kind: &OpKind, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    if let Some(n) = kind.arity().filter(|&n| n != inputs.len()) {
        return Err(format!(
            "{} takes {n} operand(s), got {}",
            kind.mnemonic(),
            inputs.len()
        ));
    }
    let one = |t: TensorType| Ok(vec![t]);
    match kind {
        OpKind::Input { .. }
        | OpKind::Param { .. }
        | OpKind::Buffer { .. }
        | OpKind::State { .. } => Err("a source op's type is declared, not inferred".into()),
        OpKind::Scalar { .. } => one(TensorType::new(DType::F32, Shape::scalar())),
        OpKind::Iota { len } => one(TensorType::new(DType::I64, Shape(vec![*len]))),
        OpKind::Embedding => {
            let (table, ids) = (inputs[0], inputs[1]);
            if table.shape.rank() != 2 {
                return Err(format!(
                    "embedding table must be rank 2, got {}",
                    table.shape
                ));
            }
            if ids.dtype != DType::I64 {
                return Err(format!("embedding ids must be i64, got {}", ids.dtype));
            }
            let mut dims = ids.shape.0.clone();
            dims.push(table.shape.0[1]);
            one(TensorType::new(table.dtype, Shape(dims)))
        }
        OpKind::MatMul => {
            let (a, b) = (inputs[0], inputs[1]);
            same_float(a, b)?;
            if a.shape.rank() < 2 || b.shape.rank() < 2 {
                return Err(format!(
                    "matmul operands must be rank >= 2, got {} and {}",
                    a.shape, b.shape
                ));
            }
            let (ad, bd) = (a.shape.dims(), b.shape.dims());
            let (m, k1) = (ad[ad.len() - 2], ad[ad.len() - 1]);
            let (k2, n) = (bd[bd.len() - 2], bd[bd.len() - 1]);
            if k1 != k2 {
                return Err(format!(
                    "matmul contraction mismatch: {} vs {}",
                    a.shape, b.shape
                ));
            }
            let mut dims =
                broadcast_dims(&ad[..ad.len() - 2], &bd[..bd.len() - 2]).ok_or_else(|| {
                    format!(
                        "matmul batch dims do not broadcast: {} vs {}",
                        a.shape, b.shape
                    )
                })?;
            dims.push(m);
            dims.push(n);
            one(TensorType::new(a.dtype, Shape(dims)))
        }
        OpKind::Linear { bias } => {
            let (x, w) = (inputs[0], inputs[1]);
            same_float(x, w)?;
            if w.shape.rank() != 2 {
                return Err(format!(
                    "linear weight must be rank 2 [in, out], got {}",
                    w.shape
                ));
            }
            if x.shape.last() != Some(w.shape.0[0]) {
                return Err(format!(
                    "linear input {} does not match weight {}",
                    x.shape, w.shape
                ));
            }
            if *bias && inputs[2].shape.0 != [w.shape.0[1]] {
                return Err(format!(
                    "linear bias {} must be [{}]",
                    inputs[2].shape, w.shape.0[1]
                ));
            }
            let mut dims = x.shape.0.clone();
            if let Some(last) = dims.last_mut() {
                *last = w.shape.0[1];
            }
            one(TensorType::new(x.dtype, Shape(dims)))
        }
        OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::Div => {
            let (a, b) = (inputs[0], inputs[1]);
            same_float(a, b)?;
            let dims = broadcast_dims(a.shape.dims(), b.shape.dims())
                .ok_or_else(|| format!("shapes {} and {} do not broadcast", a.shape, b.shape))?;
            one(TensorType::new(a.dtype, Shape(dims)))
        }
        OpKind::Neg
        | OpKind::Exp
        | OpKind::Sqrt
        | OpKind::Rsqrt
        | OpKind::Tanh
        | OpKind::Sigmoid
        | OpKind::Pow { .. }
        | OpKind::Scale { .. }
        | OpKind::Gelu { .. }
        | OpKind::Silu
        | OpKind::Relu
        | OpKind::Clamp { .. }
        | OpKind::Dropout { .. } => {
            float(inputs[0])?;
            one(inputs[0].clone())
        }
        OpKind::ReduceMean | OpKind::ReduceSum => {
            float(inputs[0])?;
            let mut t = inputs[0].clone();
            match t.shape.0.last_mut() {
                Some(d) => *d = Dim::Fixed(1),
                None => return Err("cannot reduce a scalar".into()),
            }
            one(t)
        }
        OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. } => {
            let x = inputs[0];
            float(x)?;
            let h = x.shape.last().ok_or("cannot normalize a scalar")?;
            for p in &inputs[1..] {
                if p.shape.0 != [h] {
                    return Err(format!("norm parameter {} must be [{h}]", p.shape));
                }
            }
            one(x.clone())
        }
        OpKind::Softmax { .. } => {
            float(inputs[0])?;
            if inputs[0].shape.rank() < 1 {
                return Err("softmax of a scalar".into());
            }
            one(inputs[0].clone())
        }
        OpKind::Attention {
            heads,
            kv_heads,
            sinks,
            causal,
            window,
            chunk,
            ..
        } => {
            let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
            if *sinks {
                attention_sinks(inputs[3], q, *heads)?;
            }
            match window {
                Some(0) => return Err("an attention window must hold at least one key".into()),
                Some(w) if !causal => {
                    return Err(format!(
                        "a sliding window ({w} keys) needs causal attention"
                    ));
                }
                _ => {}
            }
            match chunk {
                Some(0) => return Err("an attention chunk must hold at least one key".into()),
                Some(c) if !causal => {
                    return Err(format!(
                        "chunked attention ({c} keys) needs causal attention"
                    ));
                }
                _ => {}
            }
            same_float(q, k)?;
            same_float(q, v)?;
            if *heads == 0 || *kv_heads == 0 || heads % kv_heads != 0 {
                return Err(format!(
                    "heads {heads} must be a positive multiple of kv_heads {kv_heads}"
                ));
            }
            for t in [q, k, v] {
                if t.shape.rank() != 3 {
                    return Err(format!(
                        "attention operands must be [B,S,heads*d], got {}",
                        t.shape
                    ));
                }
            }
            let qw = q.shape.0[2]
                .fixed()
                .ok_or("attention width must be fixed")?;
            if qw % heads != 0 {
                return Err(format!(
                    "query width {qw} is not divisible by heads {heads}"
                ));
            }
            let d = qw / heads;
            if k.shape.0[2] != Dim::Fixed(kv_heads * d) || k.shape.0[0] != q.shape.0[0] {
                return Err(format!(
                    "key {} must be [{}, S, {}]",
                    k.shape,
                    q.shape.0[0],
                    kv_heads * d
                ));
            }
            // The value's head size may differ from the query's (multi-head latent attention).
            let vw = v.shape.0[2].fixed().ok_or("value width must be fixed")?;
            if vw == 0 || !vw.is_multiple_of(*kv_heads) || v.shape.0[0] != q.shape.0[0] {
                return Err(format!(
                    "value {} must be [{}, S, {kv_heads}·dv]",
                    v.shape, q.shape.0[0]
                ));
            }
            if k.shape.0[1] != v.shape.0[1] {
                return Err(format!(
                    "key {} and value {} lengths differ",
                    k.shape, v.shape
                ));
            }
            let mut out = q.clone();
            out.shape.0[2] = Dim::Fixed(heads * (vw / kv_heads));
            one(out)
        }
        OpKind::Rotary { heads, scaling, .. } => {
            let x = inputs[0];
            float(x)?;
            scaling.check()?;
            if x.shape.rank() != 3 {
                return Err(format!(
                    "rotary operand must be [B,S,heads*d], got {}",
                    x.shape
                ));
            }
            let w = x.shape.0[2].fixed().ok_or("rotary width must be fixed")?;
            if *heads == 0 || w % heads != 0 || (w / heads) % 2 != 0 {
                return Err(format!(
                    "rotary width {w} must split into {heads} heads of even size"
                ));
            }
            one(x.clone())
        }
        OpKind::Reshape { shape } => {
            let x = inputs[0];
            let to = Shape(shape.clone());
            if !same_numel(&x.shape, &to) {
                return Err(format!(
                    "cannot reshape {} to {to}: element counts differ",
                    x.shape
                ));
            }
            one(TensorType::new(x.dtype, to))
        }
        OpKind::Expand { shape } => {
            let x = inputs[0];
            let out = broadcast_dims(x.shape.dims(), shape)
                .filter(|d| d == shape)
                .ok_or_else(|| format!("cannot expand {} to {}", x.shape, Shape(shape.clone())))?;
            one(TensorType::new(x.dtype, Shape(out)))
        }
        OpKind::Transpose { perm } => {
            let x = inputs[0];
            let mut seen = vec![false; x.shape.rank()];
            if perm.len() != x.shape.rank() {
                return Err(format!(
                    "permutation {perm:?} does not match rank of {}",
                    x.shape
                ));
            }
            for &p in perm {
                if p >= seen.len() || seen[p] {
                    return Err(format!("{perm:?} is not a permutation"));
                }
                seen[p] = true;
            }
            let dims = perm.iter().map(|&p| x.shape.0[p]).collect();
            one(TensorType::new(x.dtype, Shape(dims)))
        }
        OpKind::Split { axis, sizes } => {
            let x = inputs[0];
            let d = axis_dim(x, *axis)?;
            let total = sizes
                .iter()
                .try_fold(0u64, |a, &s| a.checked_add(s))
                .ok_or("split sizes overflow")?;
            if d != Dim::Fixed(total) {
                return Err(format!(
                    "split sizes {sizes:?} do not sum to dimension {d} of {}",
                    x.shape
                ));
            }
            Ok(sizes
                .iter()
                .map(|&s| {
                    let mut t = x.clone();
                    t.shape.0[*axis] = Dim::Fixed(s);
                    t
                })
                .collect())
        }
        OpKind::Concat { axis } => {
            let first = inputs.first().ok_or("concat needs at least one operand")?;
            axis_dim(first, *axis)?;
            let mut total = 0;
            for t in inputs {
                if t.dtype != first.dtype || t.shape.rank() != first.shape.rank() {
                    return Err(format!("concat operands {} and {} differ", first, t));
                }
                for (i, (a, b)) in first.shape.0.iter().zip(&t.shape.0).enumerate() {
                    if i != *axis && a != b {
                        return Err(format!(
                            "concat operands {} and {} differ off axis {axis}",
                            first.shape, t.shape
                        ));
                    }
                }
                let n = t.shape.0[*axis]
                    .fixed()
                    .ok_or("concat axis must be fixed")?;
                total = u64::checked_add(total, n).ok_or("concat size overflows")?;
            }
            let mut t = (*first).clone();
            t.shape.0[*axis] = Dim::Fixed(total);
            one(t)
        }
        OpKind::Slice { axis, start, end } => {
            let x = inputs[0];
            let d = axis_dim(x, *axis)?;
            if let Some(n) = d.fixed() {
                if start >= end || *end > n {
                    return Err(format!(
                        "slice {start}..{end} out of range for dimension {n}"
                    ));
                }
            } else if start >= end {
                return Err(format!("empty slice {start}..{end}"));
            }
            let mut t = x.clone();
            t.shape.0[*axis] = Dim::Fixed(end - start);
            one(t)
        }
        OpKind::CrossEntropy => {
            let (logits, targets) = (inputs[0], inputs[1]);
            float(logits)?;
            if targets.dtype != DType::I64 {
                return Err(format!(
                    "cross-entropy targets must be i64, got {}",
                    targets.dtype
                ));
            }
            let ld = logits.shape.dims();
            if ld.is_empty() || ld[..ld.len() - 1] != *targets.shape.dims() {
                return Err(format!(
                    "logits {} do not match targets {}",
                    logits.shape, targets.shape
                ));
            }
            one(TensorType::new(logits.dtype, Shape::scalar()))
        }
        OpKind::TopKRouter {
            experts,
            k,
            routing,
            bias,
        } => {
            let (x, w) = (inputs[0], inputs[1]);
            same_float(x, w)?;
            routing.check(*experts, *k)?;
            if *bias {
                per_expert("router bias", inputs[2], x, &[*experts])?;
            }
            if w.shape.rank() != 2
                || x.shape.last() != Some(w.shape.0[0])
                || w.shape.0[1] != Dim::Fixed(*experts)
            {
                return Err(format!(
                    "router weight {} must be [{}, {experts}]",
                    w.shape,
                    x.shape.last().unwrap_or(Dim::Fixed(0))
                ));
            }
            let mut t = x.clone();
            if let Some(last) = t.shape.0.last_mut() {
                *last = Dim::Fixed(*experts);
            }
            one(t)
        }
        OpKind::MoeExperts { experts, form } => {
            let (x, gates, w1, w3, w2) = (inputs[0], inputs[1], inputs[2], inputs[3], inputs[4]);
            float(x)?;
            form.check()?;
            let h = x.shape.last().ok_or("experts input is a scalar")?;
            let e = Dim::Fixed(*experts);
            if gates.shape.last() != Some(e) {
                return Err(format!(
                    "gates {} must end in {experts} experts",
                    gates.shape
                ));
            }
            if w1.shape.rank() != 3 || w1.shape.0[0] != e || w1.shape.0[1] != h {
                return Err(format!(
                    "expert w1 {} must be [{experts}, {h}, F]",
                    w1.shape
                ));
            }
            if w3.shape != w1.shape {
                return Err(format!("expert w3 {} must equal w1 {}", w3.shape, w1.shape));
            }
            if w2.shape.0 != [e, w1.shape.0[2], h] {
                return Err(format!(
                    "expert w2 {} must be [{experts}, {}, {h}]",
                    w2.shape, w1.shape.0[2]
                ));
            }
            if form.bias {
                for (what, b) in [("expert b1", inputs[5]), ("expert b3", inputs[6])] {
                    let f = w1.shape.0[2].fixed().ok_or("expert width must be fixed")?;
                    per_expert(what, b, x, &[*experts, f])?;
                }
            }
            one(x.clone())
        }
        OpKind::Grad { of, wrt } => {
            let r = of.result_count();
            let n = inputs.len();
            if n < r {
                return Err(
                    "grad takes the forward operands and one gradient per forward result".into(),
                );
            }
            let fwd_inputs = &inputs[..n - r];
            let fwd_out = infer_types(of, fwd_inputs)?;
            for (dy, y) in inputs[n - r..].iter().zip(&fwd_out) {
                if *dy != y {
                    return Err(format!(
                        "output gradient {dy} must match the forward result {y}"
                    ));
                }
            }
            let allowed = of.differentiable_inputs();
            wrt.iter()
                .map(|&i| {
                    let concat_operand =
                        matches!(**of, OpKind::Concat { .. }) && i < fwd_inputs.len();
                    if !allowed.contains(&i) && !concat_operand {
                        Err(format!(
                            "operand {i} of {} is not differentiable",
                            of.mnemonic()
                        ))
                    } else {
                        Ok(fwd_inputs[i].clone())
                    }
                })
                .collect()
        }
        OpKind::AdamW(_) => {
            let p = inputs[0];
            for t in &inputs[1..4] {
                if t.shape != p.shape {
                    return Err(format!("adamw operand {} must match parameter {}", t, p));
                }
            }
            if inputs[4].dtype != DType::I64 || inputs[4].shape.rank() != 0 {
                return Err(format!("adamw step must be i64[], got {}", inputs[4]));
            }
            Ok(vec![p.clone(), inputs[2].clone(), inputs[3].clone()])
        }
    }
}

fn float(t: &TensorType) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("expected a float tensor, got {t}"))
    }
}

fn same_float(a: &TensorType, b: &TensorType) -> Result<(), String> {
    float(a)?;
    if a.dtype != b.dtype {
        return Err(format!("element types differ: {} and {}", a.dtype, b.dtype));
    }
    Ok(())
}

fn axis_dim(t: &TensorType, axis: usize) -> Result<Dim, String> {
    t.shape
        .0
        .get(axis)
        .copied()
        .ok_or_else(|| format!("axis {axis} out of range for {}", t.shape))
}

/// Numpy broadcasting of two dimension lists, aligned at the end.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            Dim::Fixed(1)
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            Dim::Fixed(1)
        };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (Dim::Fixed(1), y) => y,
            (x, Dim::Fixed(1)) => x,
            _ => return None,
        });
    }
    Some(out)
}

/// Whether two shapes hold the same number of elements for every binding of the symbols.
pub fn same_numel(a: &Shape, b: &Shape) -> bool {
    let split = |s: &Shape| {
        let mut fixed = 1u128;
        let mut syms = Vec::new();
        for d in s.dims() {
            match d {
                Dim::Fixed(n) => fixed = u128::checked_mul(fixed, u128::from(*n))?,
                Dim::Sym(s) => syms.push(*s),
            }
        }
        syms.sort();
        Some((fixed, syms))
    };
    // Counts beyond u128 are not comparable; such shapes are never the same.
    matches!((split(a), split(b)), (Some(x), Some(y)) if x == y)
}
