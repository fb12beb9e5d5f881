//! Test support shared across crates: a seeded PRNG, tiny GPT-2-like and Llama-like forward
//! graphs, and random weights and batches for them.
//!
//! The models are built with symbolic batch and sequence dims, inputs `tokens` and `targets`
//! (i64[B,S]) and outputs `logits` ([B,S,V]) and `loss` (scalar); block ops carry their layer
//! index, and `block_name` is `decoder_layer`.

use std::collections::BTreeMap;

use crate::graph::{BuildError, Graph, ValueId};
use crate::op::OpKind;
use crate::tensor::{Tensor, Weights};
use crate::types::{Binding, DType, Dim, Shape, Sym, TensorType};

/// splitmix64: tiny, seedable, and good enough for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Uniform integer in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A tensor of normal samples times `scale`.
    pub fn tensor(&mut self, shape: &[usize], scale: f64) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n).map(|_| self.normal() * scale).collect(),
        }
    }
}

/// Sizes of a tiny decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyConfig {
    pub vocab: u64,
    pub hidden: u64,
    pub layers: u32,
    pub heads: u64,
    /// Key/value heads (grouped-query attention); GPT-2 uses `heads`.
    pub kv_heads: u64,
    pub ffn: u64,
    /// Rows of GPT-2's learned position table (the longest sequence).
    pub max_seq: u64,
    /// GPT-2 only: dropout after attention and MLP (0 disables it).
    pub dropout: f64,
    /// Llama only: replace the MLP by a mixture of `experts` SwiGLU experts, top-`k` routed.
    pub moe: Option<(u64, u64)>,
}

impl TinyConfig {
    /// A 2-layer GPT-2-like model: hidden 8, 2 heads, vocabulary 11.
    pub fn gpt2() -> TinyConfig {
        TinyConfig {
            vocab: 11,
            hidden: 8,
            layers: 2,
            heads: 2,
            kv_heads: 2,
            ffn: 16,
            max_seq: 8,
            dropout: 0.0,
            moe: None,
        }
    }

    /// A 2-layer Llama-like model: hidden 8, 4 query heads over 2 kv heads, vocabulary 11.
    pub fn llama() -> TinyConfig {
        TinyConfig {
            vocab: 11,
            hidden: 8,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 12,
            max_seq: 8,
            dropout: 0.0,
            moe: None,
        }
    }

    fn head_dim(&self) -> u64 {
        self.hidden / self.heads.max(1)
    }
}

/// Builds a graph op by op, tagging ops with the current layer.
struct Builder {
    g: Graph,
    layer: Option<u32>,
}

const F32: DType = DType::F32;
const B: Dim = Dim::Sym(Sym::Batch);
const S: Dim = Dim::Sym(Sym::Seq);

impl Builder {
    fn param(&mut self, name: &str, dims: &[u64]) -> ValueId {
        let name = match self.layer {
            Some(l) => format!("h.{l}.{name}"),
            None => name.to_string(),
        };
        self.g.push_source(
            OpKind::Param { name },
            TensorType::new(F32, Shape::fixed(dims)),
            self.layer,
        )
    }

    fn input(&mut self, name: &str, ty: TensorType) -> ValueId {
        self.g
            .push_source(OpKind::Input { name: name.into() }, ty, None)
    }

    fn op(&mut self, kind: OpKind, inputs: Vec<ValueId>) -> Result<ValueId, BuildError> {
        let mnemonic = kind.mnemonic();
        self.g
            .push_op(kind, inputs, self.layer)?
            .first()
            .copied()
            .ok_or_else(|| BuildError {
                op: mnemonic.into(),
                reason: "no result".into(),
            })
    }

    fn ops(&mut self, kind: OpKind, inputs: Vec<ValueId>) -> Result<Vec<ValueId>, BuildError> {
        self.g.push_op(kind, inputs, self.layer)
    }

    fn linear(
        &mut self,
        x: ValueId,
        name: &str,
        k: u64,
        n: u64,
        bias: bool,
    ) -> Result<ValueId, BuildError> {
        let w = self.param(&format!("{name}.weight"), &[k, n]);
        let mut ins = vec![x, w];
        if bias {
            ins.push(self.param(&format!("{name}.bias"), &[n]));
        }
        self.op(OpKind::Linear { bias }, ins)
    }

    fn layer_norm(&mut self, x: ValueId, name: &str, h: u64) -> Result<ValueId, BuildError> {
        let gamma = self.param(&format!("{name}.gamma"), &[h]);
        let beta = self.param(&format!("{name}.beta"), &[h]);
        self.op(
            OpKind::LayerNorm {
                eps: 1e-5,
                bias: true,
            },
            vec![x, gamma, beta],
        )
    }

    fn rms_norm(&mut self, x: ValueId, name: &str, h: u64) -> Result<ValueId, BuildError> {
        let gamma = self.param(&format!("{name}.gamma"), &[h]);
        self.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x, gamma])
    }

    /// `tokens` and `targets` inputs, i64[B,S].
    fn token_inputs(&mut self) -> (ValueId, ValueId) {
        let ids = TensorType::new(DType::I64, Shape(vec![B, S]));
        (
            self.input("tokens", ids.clone()),
            self.input("targets", ids),
        )
    }

    fn finish(mut self, logits: ValueId, targets: ValueId) -> Result<Graph, BuildError> {
        self.layer = None;
        let loss = self.op(OpKind::CrossEntropy, vec![logits, targets])?;
        self.g.add_output("logits", logits);
        self.g.add_output("loss", loss);
        self.g.block_name = Some("decoder_layer".into());
        Ok(self.g)
    }
}

/// A GPT-2-like forward graph: token + learned position embeddings (positions from `Iota`),
/// pre-LayerNorm blocks with fused QKV (split), causal attention, tanh-GELU MLP, optional
/// dropout, a final LayerNorm and an LM head tied to the token embedding (transposed).
pub fn tiny_gpt2(cfg: &TinyConfig) -> Result<Graph, BuildError> {
    let h = cfg.hidden;
    let mut b = Builder {
        g: Graph::new("tiny_gpt2"),
        layer: None,
    };
    let (tokens, targets) = b.token_inputs();
    let wte = b.param("wte", &[cfg.vocab, h]);
    let wpe = b.param("wpe", &[cfg.max_seq, h]);
    let tok = b.op(OpKind::Embedding, vec![wte, tokens])?;
    let pos = b.op(OpKind::Iota { len: S }, vec![])?;
    let pos = b.op(OpKind::Embedding, vec![wpe, pos])?;
    let mut x = b.op(OpKind::Add, vec![tok, pos])?;
    let mut seed = 0;
    let mut dropout = |b: &mut Builder, v: ValueId| -> Result<ValueId, BuildError> {
        if cfg.dropout == 0.0 {
            return Ok(v);
        }
        seed += 1;
        b.op(
            OpKind::Dropout {
                p: cfg.dropout,
                seed,
            },
            vec![v],
        )
    };
    for l in 0..cfg.layers {
        b.layer = Some(l);
        let a = b.layer_norm(x, "ln_1", h)?;
        let qkv = b.linear(a, "attn.c_attn", h, 3 * h, true)?;
        let parts = b.ops(
            OpKind::Split {
                axis: 2,
                sizes: vec![h, h, h],
            },
            vec![qkv],
        )?;
        let attn = OpKind::Attention {
            heads: cfg.heads,
            kv_heads: cfg.heads,
            scale: 1.0 / (cfg.head_dim() as f64).sqrt(),
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        };
        let a = b.op(attn, parts)?;
        let a = b.linear(a, "attn.c_proj", h, h, true)?;
        let a = dropout(&mut b, a)?;
        x = b.op(OpKind::Add, vec![x, a])?;
        let m = b.layer_norm(x, "ln_2", h)?;
        let m = b.linear(m, "mlp.c_fc", h, cfg.ffn, true)?;
        let m = b.op(OpKind::Gelu { tanh: true }, vec![m])?;
        let m = b.linear(m, "mlp.c_proj", cfg.ffn, h, true)?;
        let m = dropout(&mut b, m)?;
        x = b.op(OpKind::Add, vec![x, m])?;
    }
    b.layer = None;
    let x = b.layer_norm(x, "ln_f", h)?;
    let head = b.op(OpKind::Transpose { perm: vec![1, 0] }, vec![wte])?;
    let logits = b.op(OpKind::Linear { bias: false }, vec![x, head])?;
    b.finish(logits, targets)
}

/// A Llama-like forward graph: token embedding, pre-RMSNorm blocks with separate q/k/v
/// projections, rotary embeddings, causal grouped-query attention, a SwiGLU MLP (or a top-k
/// routed mixture of SwiGLU experts), a final RMSNorm and an untied LM head.
pub fn tiny_llama(cfg: &TinyConfig) -> Result<Graph, BuildError> {
    let (h, d) = (cfg.hidden, cfg.head_dim());
    let mut b = Builder {
        g: Graph::new("tiny_llama"),
        layer: None,
    };
    let (tokens, targets) = b.token_inputs();
    let embed = b.param("embed_tokens", &[cfg.vocab, h]);
    let mut x = b.op(OpKind::Embedding, vec![embed, tokens])?;
    for l in 0..cfg.layers {
        b.layer = Some(l);
        let a = b.rms_norm(x, "input_layernorm", h)?;
        let q = b.linear(a, "self_attn.q_proj", h, cfg.heads * d, false)?;
        let k = b.linear(a, "self_attn.k_proj", h, cfg.kv_heads * d, false)?;
        let v = b.linear(a, "self_attn.v_proj", h, cfg.kv_heads * d, false)?;
        let theta = 10_000.0;
        let q = b.op(
            OpKind::Rotary {
                heads: cfg.heads,
                theta,
                scaling: Default::default(),
            },
            vec![q],
        )?;
        let k = b.op(
            OpKind::Rotary {
                heads: cfg.kv_heads,
                theta,
                scaling: Default::default(),
            },
            vec![k],
        )?;
        let attn = OpKind::Attention {
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            scale: 1.0 / (d as f64).sqrt(),
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        };
        let a = b.op(attn, vec![q, k, v])?;
        let a = b.linear(a, "self_attn.o_proj", cfg.heads * d, h, false)?;
        x = b.op(OpKind::Add, vec![x, a])?;
        let m = b.rms_norm(x, "post_attention_layernorm", h)?;
        let m = match cfg.moe {
            None => {
                let gate = b.linear(m, "mlp.gate_proj", h, cfg.ffn, false)?;
                let up = b.linear(m, "mlp.up_proj", h, cfg.ffn, false)?;
                let gate = b.op(OpKind::Silu, vec![gate])?;
                let m = b.op(OpKind::Mul, vec![gate, up])?;
                b.linear(m, "mlp.down_proj", cfg.ffn, h, false)?
            }
            Some((experts, k)) => {
                let router = b.param("moe.router", &[h, experts]);
                let gates = b.op(
                    OpKind::TopKRouter {
                        experts,
                        k,
                        routing: Default::default(),
                        bias: false,
                    },
                    vec![m, router],
                )?;
                let w1 = b.param("moe.w1", &[experts, h, cfg.ffn]);
                let w3 = b.param("moe.w3", &[experts, h, cfg.ffn]);
                let w2 = b.param("moe.w2", &[experts, cfg.ffn, h]);
                b.op(
                    OpKind::MoeExperts {
                        experts,
                        form: Default::default(),
                    },
                    vec![m, gates, w1, w3, w2],
                )?
            }
        };
        x = b.op(OpKind::Add, vec![x, m])?;
    }
    b.layer = None;
    let x = b.rms_norm(x, "norm", h)?;
    let logits = b.linear(x, "lm_head", h, cfg.vocab, false)?;
    b.finish(logits, targets)
}

/// Random values for every `param` and `buffer` of `graph` (fixed shapes): norm gains
/// (`*.gamma`) near 1, everything else normal with standard deviation `scale`.
pub fn random_weights(graph: &Graph, rng: &mut Rng, scale: f64) -> Weights {
    let mut w = Weights::new();
    for &o in graph.order() {
        let op = graph.op(o);
        if let OpKind::Param { name } | OpKind::Buffer { name } = &op.kind {
            let Some(&v) = op.results.first() else {
                continue;
            };
            let shape: Vec<usize> = graph
                .ty(v)
                .shape
                .0
                .iter()
                .map(|d| d.fixed().unwrap_or(1) as usize)
                .collect();
            let mut t = rng.tensor(&shape, scale);
            if name.ends_with(".gamma") {
                t.data
                    .iter_mut()
                    .for_each(|x| *x = 1.0 + 0.2 * *x / scale.max(1e-300));
            }
            w.insert(name.clone(), t);
        }
    }
    w
}

/// Random `tokens` and `targets` of shape [batch, seq] with ids below `vocab`.
pub fn random_batch(rng: &mut Rng, binding: Binding, vocab: u64) -> BTreeMap<String, Tensor> {
    let shape = vec![binding.batch as usize, binding.seq as usize];
    let n = shape.iter().product::<usize>();
    let mut ids = || Tensor {
        shape: shape.clone(),
        data: (0..n).map(|_| rng.below(vocab) as f64).collect(),
    };
    let tokens = ids();
    let targets = ids();
    BTreeMap::from([
        ("tokens".to_string(), tokens),
        ("targets".to_string(), targets),
    ])
}
