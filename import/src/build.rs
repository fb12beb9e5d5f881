//! Lowers a [`ModelSpec`] into a forward IR graph with a loss, layers tagged as one repeated
//! block. Batch and sequence stay symbolic (`B`, `S`) until a planner binds them.

use ir::{BuildError, DType, Dim, Graph, OpKind, Shape, Sym, TensorType, ValueId};

use crate::spec::{Family, Mla, ModelSpec, ParallelNorms, Ungated};

/// The name under which every decoder layer is tagged.
pub const BLOCK_NAME: &str = "decoder_layer";

/// Builds the forward graph: `input_ids`, `targets` → outputs `logits` and `loss`.
pub fn build_forward(spec: &ModelSpec, dtype: DType) -> Result<Graph, BuildError> {
    let mut b = Builder {
        g: Graph::new(spec.name.clone()),
        dtype,
        layer: None,
        dropouts: 0,
    };
    b.g.block_name = Some(BLOCK_NAME.into());
    let tokens = Shape::of(&[Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq)]);
    let ids = b.g.push_source(
        OpKind::Input {
            name: "input_ids".into(),
        },
        TensorType::new(DType::I64, tokens.clone()),
        None,
    );
    let targets = b.g.push_source(
        OpKind::Input {
            name: "targets".into(),
        },
        TensorType::new(DType::I64, tokens),
        None,
    );
    let (h, v) = (spec.hidden, spec.vocab);
    let (wte_name, final_norm, head_name) = match spec.family {
        Family::Gpt2 => ("wte", "ln_f", "lm_head.weight"),
        Family::Llama | Family::Mixtral => {
            ("model.embed_tokens.weight", "model.norm", "lm_head.weight")
        }
    };
    let wte = b.param(wte_name, &[v, h]);
    let mut x = b.op(OpKind::Embedding, vec![wte, ids])?;
    if spec.family == Family::Gpt2 {
        let wpe = b.param("wpe", &[spec.max_positions, h]);
        let pos = b.op(
            OpKind::Iota {
                len: Dim::Sym(Sym::Seq),
            },
            vec![],
        )?;
        let pe = b.op(OpKind::Embedding, vec![wpe, pos])?;
        x = b.op(OpKind::Add, vec![x, pe])?;
        x = b.dropout(spec, x)?;
    }
    if spec.variant.embed_scale {
        // Gemma multiplies the embedding by sqrt(hidden) (its `normalizer`).
        let factor = (h as f64).sqrt();
        x = b.op(OpKind::Scale { factor }, vec![x])?;
    }
    if let Some(m) = spec.variant.multipliers {
        x = b.op(
            OpKind::Scale {
                factor: m.embedding,
            },
            vec![x],
        )?;
    }
    if spec.variant.embed_norm {
        x = b.block_norm("model.embed_norm", spec, x)?;
    }
    // Runs of layers of one structure: DeepSeek-V3's leading dense layers, Llama 4's rotated
    // (q/k-normed) and unrotated ones, Maverick's dense and expert layers.
    b.g.kind_starts = spec.kind_starts();
    for layer in 0..spec.layers {
        b.layer = Some(layer as u32);
        x = match spec.family {
            Family::Gpt2 => b.gpt2_layer(spec, layer, x)?,
            Family::Llama | Family::Mixtral => b.llama_layer(spec, layer, x)?,
        };
    }
    b.layer = None;
    x = match spec.family {
        Family::Gpt2 => b.layernorm(final_norm, spec, x)?,
        Family::Llama | Family::Mixtral => b.block_norm(final_norm, spec, x)?,
    };
    let head = if spec.tied_embeddings {
        b.op(OpKind::Transpose { perm: vec![1, 0] }, vec![wte])?
    } else {
        b.param(head_name, &[h, v])
    };
    let mut head_inputs = vec![x, head];
    if spec.variant.head_bias {
        head_inputs.push(b.param("lm_head.bias", &[v]));
    }
    let bias = spec.variant.head_bias;
    let mut logits = b.op(OpKind::Linear { bias }, head_inputs)?;
    if let Some(m) = spec.variant.multipliers {
        let factor = 1.0 / m.logits;
        logits = b.op(OpKind::Scale { factor }, vec![logits])?;
    }
    if let Some(factor) = spec.variant.logit_scale {
        logits = b.op(OpKind::Scale { factor }, vec![logits])?;
    }
    if let Some(cap) = spec.variant.final_softcap {
        // Gemma 2: cap · tanh(logits / cap).
        let scaled = b.op(OpKind::Scale { factor: 1.0 / cap }, vec![logits])?;
        let squashed = b.op(OpKind::Tanh, vec![scaled])?;
        logits = b.op(OpKind::Scale { factor: cap }, vec![squashed])?;
    }
    let loss = b.op(OpKind::CrossEntropy, vec![logits, targets])?;
    b.g.add_output("logits", logits);
    b.g.add_output("loss", loss);
    Ok(b.g)
}

/// The names of a block's three norms besides its input norm, where it has norms after
/// attention and the MLP as well (transformers' names: Gemma 2's and 3's, GLM-4's).
struct SandwichNames {
    after_attention: &'static str,
    before_mlp: &'static str,
    after_mlp: &'static str,
}

impl SandwichNames {
    fn of(spec: &ModelSpec) -> SandwichNames {
        if spec.model_type() == "glm4" {
            SandwichNames {
                after_attention: "post_self_attn_layernorm",
                before_mlp: "post_attention_layernorm",
                after_mlp: "post_mlp_layernorm",
            }
        } else {
            SandwichNames {
                after_attention: "post_attention_layernorm",
                before_mlp: "pre_feedforward_layernorm",
                after_mlp: "post_feedforward_layernorm",
            }
        }
    }
}

struct Builder {
    g: Graph,
    dtype: DType,
    layer: Option<u32>,
    dropouts: u64,
}

impl Builder {
    fn param(&mut self, name: &str, dims: &[u64]) -> ValueId {
        self.g.push_source(
            OpKind::Param { name: name.into() },
            TensorType::new(self.dtype, Shape::fixed(dims)),
            self.layer,
        )
    }

    /// A literal of the layer being built (its own source, as a parameter is).
    fn scalar(&mut self, value: f64) -> ValueId {
        self.g.push_source(
            OpKind::Scalar { value },
            TensorType::new(self.dtype, Shape::fixed(&[])),
            self.layer,
        )
    }

    fn op(&mut self, kind: OpKind, inputs: Vec<ValueId>) -> Result<ValueId, BuildError> {
        let r = self.g.push_op(kind, inputs, self.layer)?;
        Ok(r[0])
    }

    /// Dropout with a seed unique to this op, so masks differ between ops and layers.
    fn dropout(&mut self, spec: &ModelSpec, x: ValueId) -> Result<ValueId, BuildError> {
        if spec.dropout <= 0.0 {
            return Ok(x);
        }
        self.dropouts += 1;
        let seed = self.dropouts;
        self.op(
            OpKind::Dropout {
                p: spec.dropout,
                seed,
            },
            vec![x],
        )
    }

    fn linear(
        &mut self,
        name: &str,
        x: ValueId,
        k: u64,
        n: u64,
        bias: bool,
    ) -> Result<ValueId, BuildError> {
        let w = self.param(&format!("{name}.weight"), &[k, n]);
        let mut inputs = vec![x, w];
        if bias {
            inputs.push(self.param(&format!("{name}.bias"), &[n]));
        }
        self.op(OpKind::Linear { bias }, inputs)
    }

    fn layernorm(
        &mut self,
        name: &str,
        spec: &ModelSpec,
        x: ValueId,
    ) -> Result<ValueId, BuildError> {
        let g = self.param(&format!("{name}.weight"), &[spec.hidden]);
        let bias = self.param(&format!("{name}.bias"), &[spec.hidden]);
        self.op(
            OpKind::LayerNorm {
                eps: spec.norm_eps,
                bias: true,
            },
            vec![x, g, bias],
        )
    }

    fn rmsnorm(&mut self, name: &str, spec: &ModelSpec, x: ValueId) -> Result<ValueId, BuildError> {
        let g = self.param(name, &[spec.hidden]);
        self.op(OpKind::RmsNorm { eps: spec.norm_eps }, vec![x, g])
    }

    /// A Llama-structured model's norm named `prefix`: RMSNorm (`prefix.weight`), or LayerNorm
    /// (`prefix.weight`, `prefix.bias`) where the family uses it (Nemotron).
    fn block_norm(
        &mut self,
        prefix: &str,
        spec: &ModelSpec,
        x: ValueId,
    ) -> Result<ValueId, BuildError> {
        if spec.variant.weightless_norms {
            self.weightless_layer_norm(spec, x)
        } else if spec.variant.weightless_rms_norms {
            self.weightless_rms_norm(spec, x)
        } else if spec.variant.layer_norm {
            self.layernorm(prefix, spec, x)
        } else if spec.variant.bias_free_layer_norm {
            let g = self.param(&format!("{prefix}.weight"), &[spec.hidden]);
            let kind = OpKind::LayerNorm {
                eps: spec.norm_eps,
                bias: false,
            };
            self.op(kind, vec![x, g])
        } else {
            self.rmsnorm(&format!("{prefix}.weight"), spec, x)
        }
    }

    fn gpt2_layer(&mut self, spec: &ModelSpec, i: u64, x: ValueId) -> Result<ValueId, BuildError> {
        let (h, f) = (spec.hidden, spec.ffn);
        let p = format!("h.{i}");
        let a = self.layernorm(&format!("{p}.ln_1"), spec, x)?;
        let qkv = self.linear(&format!("{p}.attn.c_attn"), a, h, 3 * h, true)?;
        let parts = self.g.push_op(
            OpKind::Split {
                axis: 2,
                sizes: vec![h, h, h],
            },
            vec![qkv],
            self.layer,
        )?;
        let attn = self.op(
            OpKind::Attention {
                heads: spec.heads,
                kv_heads: spec.heads,
                scale: 1.0 / (spec.head_dim() as f64).sqrt(),
                causal: true,
                softcap: None,
                sinks: false,
                window: None,
                chunk: None,
            },
            parts,
        )?;
        let proj = self.linear(&format!("{p}.attn.c_proj"), attn, h, h, true)?;
        let proj = self.dropout(spec, proj)?;
        let x = self.op(OpKind::Add, vec![x, proj])?;
        let m = self.layernorm(&format!("{p}.ln_2"), spec, x)?;
        let up = self.linear(&format!("{p}.mlp.c_fc"), m, h, f, true)?;
        let act = self.op(OpKind::Gelu { tanh: true }, vec![up])?;
        let down = self.linear(&format!("{p}.mlp.c_proj"), act, f, h, true)?;
        let down = self.dropout(spec, down)?;
        self.op(OpKind::Add, vec![x, down])
    }

    fn llama_layer(&mut self, spec: &ModelSpec, i: u64, x: ValueId) -> Result<ValueId, BuildError> {
        let var = &spec.variant;
        let p = format!("model.layers.{i}");
        if var.post_norms {
            return self.post_norm_layer(spec, i, &p, x);
        }
        let a = self.block_norm(&format!("{p}.input_layernorm"), spec, x)?;
        if let Some(mla) = &var.mla {
            let o = self.latent_attention(spec, mla, &p, a)?;
            let x = self.op(OpKind::Add, vec![x, o])?;
            let m = self.block_norm(&format!("{p}.post_attention_layernorm"), spec, x)?;
            let y = self.mlp_of_layer(spec, i, &p, m)?;
            return self.op(OpKind::Add, vec![x, y]);
        }
        if let Some(norms) = var.parallel {
            return self.parallel_layer(spec, i, &p, x, a, norms);
        }
        let names = SandwichNames::of(spec);
        let mut o = self.self_attention(spec, &p, a)?;
        if var.sandwich_norms {
            o = self.block_norm(&format!("{p}.{}", names.after_attention), spec, o)?;
        }
        let o = self.residual_scale(spec, o)?;
        let o = self.dropout(spec, o)?;
        let x = self.op(OpKind::Add, vec![x, o])?;
        // VaultGemma keeps Gemma 2's name for the norm before the MLP, without its sandwich.
        let pre_mlp = if var.sandwich_norms || spec.model_type() == "vaultgemma" {
            names.before_mlp
        } else {
            "post_attention_layernorm"
        };
        let m = self.block_norm(&format!("{p}.{pre_mlp}"), spec, x)?;
        let mut y = self.mlp_of_layer(spec, i, &p, m)?;
        if var.sandwich_norms {
            y = self.block_norm(&format!("{p}.{}", names.after_mlp), spec, y)?;
        }
        let y = self.residual_scale(spec, y)?;
        let y = self.dropout(spec, y)?;
        self.op(OpKind::Add, vec![x, y])
    }

    /// q's and k's norms where the family has them: per head (Qwen3, Gemma 3) or over the
    /// whole projections (OLMo 2, OLMoE).
    fn qk_norms(
        &mut self,
        spec: &ModelSpec,
        p: &str,
        q: ValueId,
        k: ValueId,
    ) -> Result<(ValueId, ValueId), BuildError> {
        let var = &spec.variant;
        let (q_name, k_name) = (
            format!("{p}.self_attn.q_norm.weight"),
            format!("{p}.self_attn.k_norm.weight"),
        );
        if !var.qk_norm {
            return Ok((q, k));
        }
        if !var.qk_norm_whole {
            let q = self.head_norm(&q_name, spec, q, spec.heads)?;
            let k = self.head_norm(&k_name, spec, k, spec.kv_heads)?;
            return Ok((q, k));
        }
        let (qw, kw) = (spec.q_width(), spec.kv_heads * spec.head_dim());
        let gq = self.param(&q_name, &[qw]);
        let q = self.op(OpKind::RmsNorm { eps: spec.norm_eps }, vec![q, gq])?;
        let gk = self.param(&k_name, &[kw]);
        let k = self.op(OpKind::RmsNorm { eps: spec.norm_eps }, vec![k, gk])?;
        Ok((q, k))
    }

    /// Attention from the normed input `a` through the output projection: q, k and v (with
    /// Qwen3's per-head norms), the rotary embedding, and `o_proj`.
    fn self_attention(
        &mut self,
        spec: &ModelSpec,
        p: &str,
        a: ValueId,
    ) -> Result<ValueId, BuildError> {
        let var = &spec.variant;
        let (q, k, v) = self.qkv(spec, p, a)?;
        let (q, k, v) = if var.qk_norm_after_rotary {
            let (q, k) = self.rotaries(spec, q, k)?;
            let (q, k) = self.qk_norms(spec, p, q, k)?;
            (q, k, v)
        } else {
            let (q, k) = self.qk_norms(spec, p, q, k)?;
            let (q, k, v) = self.clip_qkv(spec, (q, k, v))?;
            let (q, k) = self.rotaries(spec, q, k)?;
            (q, k, v)
        };
        let (q, k) = self.qk_l2_norms(spec, q, k)?;
        let scale_base = var.query_scale.unwrap_or(spec.head_dim() as f64);
        let scale = var
            .multipliers
            .map_or(1.0 / scale_base.sqrt(), |m| m.attention);
        let mut operands = vec![q, k, v];
        if var.attention_sinks {
            operands.push(self.param(&format!("{p}.self_attn.sinks"), &[spec.heads]));
        }
        let attn = self.op(
            OpKind::Attention {
                heads: spec.heads,
                kv_heads: spec.kv_heads,
                scale,
                causal: true,
                softcap: var.attn_softcap,
                sinks: var.attention_sinks,
                window: self.window(spec),
                chunk: self.chunk(spec),
            },
            operands,
        )?;
        self.linear(
            &format!("{p}.self_attn.o_proj"),
            attn,
            spec.q_width(),
            spec.hidden,
            var.o_bias,
        )
    }

    /// A parallel block (GPT-NeoX, Falcon, Phi): attention and the MLP both read the layer's
    /// input, through one shared norm (`a`) or each through its own, and their outputs are
    /// added to the input together.
    fn parallel_layer(
        &mut self,
        spec: &ModelSpec,
        i: u64,
        p: &str,
        x: ValueId,
        a: ValueId,
        norms: ParallelNorms,
    ) -> Result<ValueId, BuildError> {
        let o = self.self_attention(spec, p, a)?;
        let m = match norms {
            ParallelNorms::Shared => a,
            ParallelNorms::Separate => {
                self.block_norm(&format!("{p}.post_attention_layernorm"), spec, x)?
            }
        };
        let y = self.mlp_of_layer(spec, i, p, m)?;
        let branches = self.op(OpKind::Add, vec![o, y])?;
        self.op(OpKind::Add, vec![x, branches])
    }

    /// The sliding window of the layer being built (none: full attention).
    fn window(&self, spec: &ModelSpec) -> Option<u64> {
        let sliding = spec.variant.sliding_window.as_ref()?;
        sliding.of_layer(u64::from(self.layer?))
    }

    /// The attention chunk of the layer being built (none: every earlier key).
    fn chunk(&self, spec: &ModelSpec) -> Option<u64> {
        let chunked = spec.variant.chunked_attention.as_ref()?;
        chunked.of_layer(u64::from(self.layer?))
    }

    /// q and k turned by the layer's rotaries: the queries' own where the layer scales them
    /// by the attention temperature (Llama 4's NoPE layers).
    fn rotaries(
        &mut self,
        spec: &ModelSpec,
        q: ValueId,
        k: ValueId,
    ) -> Result<(ValueId, ValueId), BuildError> {
        let q = self.rotary(spec, q, spec.heads, spec.query_rope_of_layer(self.layer))?;
        let k = self.rotary(spec, k, spec.kv_heads, spec.rope_of_layer(self.layer))?;
        Ok((q, k))
    }

    /// Llama 4's `Llama4TextL2Norm` of q and k after the rotary, where the layer has it: each
    /// head divided by its root mean square, x·rsqrt(mean(x²) + eps), with no weight.
    fn qk_l2_norms(
        &mut self,
        spec: &ModelSpec,
        q: ValueId,
        k: ValueId,
    ) -> Result<(ValueId, ValueId), BuildError> {
        if !spec.qk_l2_norm_in(self.layer) {
            return Ok((q, k));
        }
        let q = self.l2_norm(spec, q, spec.heads)?;
        let k = self.l2_norm(spec, k, spec.kv_heads)?;
        Ok((q, k))
    }

    /// `x[B, S, heads·d]` with each head divided by its root mean square (no weight).
    fn l2_norm(&mut self, spec: &ModelSpec, x: ValueId, heads: u64) -> Result<ValueId, BuildError> {
        let d = spec.head_dim();
        let per_head = self.heads_view(x, heads, d)?;
        let normed = self.weightless_rms_norm(spec, per_head)?;
        self.flat_view(normed, heads * d)
    }

    /// OLMo 1's `OlmoLayerNorm` of `x[B, S, H]`: `F.layer_norm` with no weight or bias,
    /// (x − mean)·rsqrt(mean((x − mean)²) + eps), composed of ops every backend has.
    fn weightless_layer_norm(
        &mut self,
        spec: &ModelSpec,
        x: ValueId,
    ) -> Result<ValueId, BuildError> {
        let mean = self.op(OpKind::ReduceMean, vec![x])?;
        let centred = self.op(OpKind::Sub, vec![x, mean])?;
        self.weightless_rms_norm(spec, centred)
    }

    /// `F.rms_norm` with no weight over the last axis of `x`, x·rsqrt(mean(x²) + eps),
    /// composed of ops every backend has: NanoChat's norms, Llama 4's per head, and OLMo 1's
    /// LayerNorm of the centred input.
    fn weightless_rms_norm(&mut self, spec: &ModelSpec, x: ValueId) -> Result<ValueId, BuildError> {
        let squares = self.op(OpKind::Mul, vec![x, x])?;
        let mean = self.op(OpKind::ReduceMean, vec![squares])?;
        let eps = self.scalar(spec.norm_eps);
        let shifted = self.op(OpKind::Add, vec![mean, eps])?;
        let inverse = self.op(OpKind::Rsqrt, vec![shifted])?;
        self.op(OpKind::Mul, vec![x, inverse])
    }

    /// q, k and v clamped to ±`clip_qkv` (OLMo's and OLMoE's), where the config sets it.
    fn clip_qkv(
        &mut self,
        spec: &ModelSpec,
        qkv: (ValueId, ValueId, ValueId),
    ) -> Result<(ValueId, ValueId, ValueId), BuildError> {
        let Some(limit) = spec.variant.clip_qkv else {
            return Ok(qkv);
        };
        let (q, k, v) = qkv;
        Ok((
            self.op(OpKind::Clamp { limit }, vec![q])?,
            self.op(OpKind::Clamp { limit }, vec![k])?,
            self.op(OpKind::Clamp { limit }, vec![v])?,
        ))
    }

    /// A branch's output times Granite's `residual_multiplier` before its residual add.
    fn residual_scale(&mut self, spec: &ModelSpec, y: ValueId) -> Result<ValueId, BuildError> {
        match spec.variant.multipliers {
            Some(m) => self.op(OpKind::Scale { factor: m.residual }, vec![y]),
            None => Ok(y),
        }
    }

    /// OLMo 2's layer (transformers' `Olmo2DecoderLayer`): attention and the MLP read the
    /// residual stream as it is, and their outputs are normed before each add; q and k are
    /// normed over their whole projections before the rotary embedding.
    fn post_norm_layer(
        &mut self,
        spec: &ModelSpec,
        i: u64,
        p: &str,
        x: ValueId,
    ) -> Result<ValueId, BuildError> {
        let (q, k, v) = self.qkv(spec, p, x)?;
        let (q, k) = self.qk_norms(spec, p, q, k)?;
        let (q, k) = self.rotaries(spec, q, k)?;
        let attn = self.op(
            OpKind::Attention {
                heads: spec.heads,
                kv_heads: spec.kv_heads,
                scale: 1.0 / (spec.head_dim() as f64).sqrt(),
                causal: true,
                softcap: None,
                sinks: false,
                window: self.window(spec),
                chunk: None,
            },
            vec![q, k, v],
        )?;
        let o = self.linear(
            &format!("{p}.self_attn.o_proj"),
            attn,
            spec.q_width(),
            spec.hidden,
            spec.variant.o_bias,
        )?;
        let o = self.block_norm(&format!("{p}.post_attention_layernorm"), spec, o)?;
        let x = self.op(OpKind::Add, vec![x, o])?;
        let y = self.mlp_of_layer(spec, i, p, x)?;
        let y = self.block_norm(&format!("{p}.post_feedforward_layernorm"), spec, y)?;
        self.op(OpKind::Add, vec![x, y])
    }

    /// Layer `i`'s MLP: the experts (a leading dense layer's SwiGLU MLP), Nemotron's squared
    /// ReLU, or a gated MLP.
    fn mlp_of_layer(
        &mut self,
        spec: &ModelSpec,
        i: u64,
        p: &str,
        m: ValueId,
    ) -> Result<ValueId, BuildError> {
        let dense = spec.variant.dense_layers.as_ref().filter(|d| d.is_dense(i));
        if let Some(d) = dense {
            self.gated_mlp(spec, &format!("{p}.{}", mlp_name(spec)), m, d.ffn)
        } else if spec.family == Family::Mixtral {
            self.moe(spec, p, m)
        } else if let Some(act) = spec.variant.ungated_mlp {
            self.ungated_mlp(spec, &format!("{p}.mlp"), m, act)
        } else {
            self.gated_mlp(spec, &format!("{p}.mlp"), m, spec.ffn)
        }
    }

    /// Multi-head latent attention (transformers' `DeepseekV3Attention`), through `o_proj`:
    /// queries from `a` (through the low-rank `q_a_proj`, `q_a_layernorm`, `q_b_proj` where
    /// `q_lora_rank` is set), keys and values from one compressed latent per token
    /// (`kv_a_proj_with_mqa` → `kv_a_layernorm` → `kv_b_proj`), each query and key head the
    /// concatenation of a part without and a part with the rotary embedding, the key's rotary
    /// part shared by every head.
    fn latent_attention(
        &mut self,
        spec: &ModelSpec,
        mla: &Mla,
        p: &str,
        a: ValueId,
    ) -> Result<ValueId, BuildError> {
        let (h, heads) = (spec.hidden, spec.heads);
        let (nope, rope, dv) = (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim);
        let qk = mla.qk_head_dim();
        let att = format!("{p}.self_attn");
        let q = match mla.q_lora_rank {
            Some(r) => {
                let down = self.linear(&format!("{att}.q_a_proj"), a, h, r, false)?;
                let normed = self.norm_of_width(&format!("{att}.q_a_layernorm"), spec, down, r)?;
                self.linear(&format!("{att}.q_b_proj"), normed, r, heads * qk, false)?
            }
            None => self.linear(&format!("{att}.q_proj"), a, h, heads * qk, false)?,
        };
        let q_heads = self.heads_view(q, heads, qk)?;
        let q_pass = self.slice(q_heads, 3, 0, nope)?;
        let q_rot = self.slice(q_heads, 3, nope, qk)?;
        let q_rot = self.rotary_per_head(q_rot, heads, rope, spec.rope_of_layer(self.layer))?;
        let q = self.op(OpKind::Concat { axis: 3 }, vec![q_pass, q_rot])?;
        let q = self.flat_view(q, heads * qk)?;
        let latent_width = mla.kv_lora_rank + rope;
        let kv_a = format!("{att}.kv_a_proj_with_mqa");
        let compressed = self.linear(&kv_a, a, h, latent_width, false)?;
        let latent = self.slice(compressed, 2, 0, mla.kv_lora_rank)?;
        let k_rot = self.slice(compressed, 2, mla.kv_lora_rank, latent_width)?;
        let latent = self.norm_of_width(
            &format!("{att}.kv_a_layernorm"),
            spec,
            latent,
            mla.kv_lora_rank,
        )?;
        let kv_b = format!("{att}.kv_b_proj");
        let kv = self.linear(&kv_b, latent, mla.kv_lora_rank, heads * (nope + dv), false)?;
        let kv_heads = self.heads_view(kv, heads, nope + dv)?;
        let k_pass = self.slice(kv_heads, 3, 0, nope)?;
        let v = self.slice(kv_heads, 3, nope, nope + dv)?;
        let v = self.flat_view(v, heads * dv)?;
        // The one rotary key head, rotated once and then read by every head.
        let k_rot = self.op(
            OpKind::Rotary {
                heads: 1,
                theta: spec.rope_theta,
                scaling: spec.rope_scaling,
            },
            vec![k_rot],
        )?;
        let k_rot = self.heads_view(k_rot, 1, rope)?;
        let (bd, sd) = (Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq));
        let every_head = vec![bd, sd, Dim::Fixed(heads), Dim::Fixed(rope)];
        let k_rot = self.op(OpKind::Expand { shape: every_head }, vec![k_rot])?;
        let k = self.op(OpKind::Concat { axis: 3 }, vec![k_pass, k_rot])?;
        let k = self.flat_view(k, heads * qk)?;
        let attn = self.op(
            OpKind::Attention {
                heads,
                kv_heads: heads,
                scale: mla.scale,
                causal: true,
                softcap: None,
                sinks: false,
                window: None,
                chunk: None,
            },
            vec![q, k, v],
        )?;
        self.linear(&format!("{att}.o_proj"), attn, heads * dv, h, false)
    }

    /// `x[B, S, heads·d]` viewed as `[B, S, heads, d]`.
    fn heads_view(&mut self, x: ValueId, heads: u64, d: u64) -> Result<ValueId, BuildError> {
        let (b, s) = (Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq));
        let shape = vec![b, s, Dim::Fixed(heads), Dim::Fixed(d)];
        self.op(OpKind::Reshape { shape }, vec![x])
    }

    /// `x[B, S, ..]` viewed as `[B, S, width]`.
    fn flat_view(&mut self, x: ValueId, width: u64) -> Result<ValueId, BuildError> {
        let (b, s) = (Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq));
        let shape = vec![b, s, Dim::Fixed(width)];
        self.op(OpKind::Reshape { shape }, vec![x])
    }

    fn slice(
        &mut self,
        x: ValueId,
        axis: usize,
        start: u64,
        end: u64,
    ) -> Result<ValueId, BuildError> {
        self.op(OpKind::Slice { axis, start, end }, vec![x])
    }

    /// The rotary embedding of `x[B, S, heads, d]` per head, as `[B, S, heads, d]`.
    fn rotary_per_head(
        &mut self,
        x: ValueId,
        heads: u64,
        d: u64,
        (theta, scaling): (f64, ir::RopeScaling),
    ) -> Result<ValueId, BuildError> {
        let flat = self.flat_view(x, heads * d)?;
        let turned = self.op(
            OpKind::Rotary {
                heads,
                theta,
                scaling,
            },
            vec![flat],
        )?;
        self.heads_view(turned, heads, d)
    }

    /// An RMSNorm named `prefix` over a last axis of `width` (MLA's latent norms).
    fn norm_of_width(
        &mut self,
        prefix: &str,
        spec: &ModelSpec,
        x: ValueId,
        width: u64,
    ) -> Result<ValueId, BuildError> {
        let g = self.param(&format!("{prefix}.weight"), &[width]);
        self.op(OpKind::RmsNorm { eps: spec.norm_eps }, vec![x, g])
    }

    /// The query, key and value projections (with biases in Qwen2).
    fn qkv(
        &mut self,
        spec: &ModelSpec,
        p: &str,
        a: ValueId,
    ) -> Result<(ValueId, ValueId, ValueId), BuildError> {
        let (h, q_w) = (spec.hidden, spec.q_width());
        let kv = spec.kv_heads * spec.head_dim();
        let bias = spec.variant.qkv_bias;
        let q = self.linear(&format!("{p}.self_attn.q_proj"), a, h, q_w, bias)?;
        let k = self.linear(&format!("{p}.self_attn.k_proj"), a, h, kv, bias)?;
        let v = self.linear(&format!("{p}.self_attn.v_proj"), a, h, kv, bias)?;
        Ok((q, k, v))
    }

    fn rotary(
        &mut self,
        spec: &ModelSpec,
        x: ValueId,
        heads: u64,
        (theta, scaling): (f64, ir::RopeScaling),
    ) -> Result<ValueId, BuildError> {
        let Some(r) = spec.variant.rotary_dims else {
            return self.op(
                OpKind::Rotary {
                    heads,
                    theta,
                    scaling,
                },
                vec![x],
            );
        };
        // Partial rotary (transformers' Nemotron): each head's first `r` dimensions rotate,
        // with frequencies over `r`, and the rest pass through.
        let d = spec.head_dim();
        let (b, s) = (Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq));
        let view = |w: u64| vec![b, s, Dim::Fixed(heads), Dim::Fixed(w)];
        let per_head = self.op(OpKind::Reshape { shape: view(d) }, vec![x])?;
        let part = |this: &mut Self, start: u64, end: u64| {
            this.op(
                OpKind::Slice {
                    axis: 3,
                    start,
                    end,
                },
                vec![per_head],
            )
        };
        let rot = part(self, 0, r)?;
        let pass = part(self, r, d)?;
        let back = self.rotary_per_head(rot, heads, r, (theta, scaling))?;
        let joined = self.op(OpKind::Concat { axis: 3 }, vec![back, pass])?;
        self.op(
            OpKind::Reshape {
                shape: vec![b, s, Dim::Fixed(heads * d)],
            },
            vec![joined],
        )
    }

    /// An ungated MLP, act(x·up)·down: Nemotron's squared ReLU, GPT-NeoX's, Falcon's and Phi's
    /// GELU (with biases where the family has them).
    fn ungated_mlp(
        &mut self,
        spec: &ModelSpec,
        p: &str,
        m: ValueId,
        act: Ungated,
    ) -> Result<ValueId, BuildError> {
        let (h, f, bias) = (spec.hidden, spec.ffn, spec.variant.mlp_bias);
        let up = self.linear(&format!("{p}.up_proj"), m, h, f, bias)?;
        let activated = match act {
            Ungated::SquaredRelu => {
                let relu = self.op(OpKind::Relu, vec![up])?;
                self.op(OpKind::Pow { exponent: 2.0 }, vec![relu])?
            }
            Ungated::Gelu { tanh } => self.op(OpKind::Gelu { tanh }, vec![up])?,
        };
        self.linear(&format!("{p}.down_proj"), activated, f, h, bias)
    }

    /// RMSNorm over each head of `x[B, S, heads·d]` with one weight of size d (Qwen3's q_norm
    /// and k_norm): viewed as `[B, S, heads, d]`, normalized along d, viewed back.
    fn head_norm(
        &mut self,
        name: &str,
        spec: &ModelSpec,
        x: ValueId,
        heads: u64,
    ) -> Result<ValueId, BuildError> {
        let d = spec.head_dim();
        let (b, s) = (Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq));
        let split = vec![b, s, Dim::Fixed(heads), Dim::Fixed(d)];
        let heads_view = self.op(OpKind::Reshape { shape: split }, vec![x])?;
        let g = self.param(name, &[d]);
        let normed = self.op(OpKind::RmsNorm { eps: spec.norm_eps }, vec![heads_view, g])?;
        let flat = vec![b, s, Dim::Fixed(heads * d)];
        self.op(OpKind::Reshape { shape: flat }, vec![normed])
    }

    /// A gated MLP: act(x·gate) ⊙ (x·up), then ·down; the gate's activation is SiLU (SwiGLU)
    /// or GELU-tanh (GeGLU).
    fn gated_mlp(
        &mut self,
        spec: &ModelSpec,
        p: &str,
        m: ValueId,
        f: u64,
    ) -> Result<ValueId, BuildError> {
        let h = spec.hidden;
        let gate = self.linear(&format!("{p}.gate_proj"), m, h, f, false)?;
        let up = self.linear(&format!("{p}.up_proj"), m, h, f, false)?;
        let act = if spec.variant.gelu_gate {
            self.op(OpKind::Gelu { tanh: true }, vec![gate])?
        } else {
            self.op(OpKind::Silu, vec![gate])?
        };
        let prod = self.op(OpKind::Mul, vec![act, up])?;
        self.linear(&format!("{p}.down_proj"), prod, f, h, false)
    }

    /// Top-k routed SwiGLU experts (Mixtral, Qwen-MoE, DeepSeek-V3), scaled where the model
    /// scales them, plus a shared expert (Qwen2-MoE's gated, DeepSeek-V3's not).
    fn moe(&mut self, spec: &ModelSpec, p: &str, m: ValueId) -> Result<ValueId, BuildError> {
        let (h, f, e) = (spec.hidden, spec.ffn, spec.experts);
        let var = &spec.variant;
        let (moe, router) = match spec.model_type() {
            "mixtral" => ("block_sparse_moe", "gate"),
            "granitemoe" | "granitemoeshared" => ("block_sparse_moe", "router.layer"),
            "gpt_oss" => ("mlp", "router"),
            "llama4_text" => ("feed_forward", "router"),
            _ => ("mlp", "gate"),
        };
        let mut routing = vec![
            m,
            self.param(&format!("{p}.{moe}.{router}.weight"), &[h, e]),
        ];
        if var.router_bias {
            routing.push(self.param(&format!("{p}.{moe}.{router}.bias"), &[e]));
        }
        let gates = self.op(
            OpKind::TopKRouter {
                experts: e,
                k: spec.experts_per_token,
                routing: var.routing,
                bias: var.router_bias,
            },
            routing,
        )?;
        let experts = format!("{p}.{moe}.experts");
        let w1 = self.param(&format!("{experts}.w1"), &[e, h, f]);
        let w3 = self.param(&format!("{experts}.w3"), &[e, h, f]);
        let w2 = self.param(&format!("{experts}.w2"), &[e, f, h]);
        let mut operands = vec![m, gates, w1, w3, w2];
        if var.expert_form.bias {
            operands.push(self.param(&format!("{experts}.b1"), &[e, f]));
            operands.push(self.param(&format!("{experts}.b3"), &[e, f]));
        }
        let form = var.expert_form;
        let mut routed = self.op(OpKind::MoeExperts { experts: e, form }, operands)?;
        if form.bias {
            // The down projection's bias, Σₑ gateₑ·b2ₑ: a product of the gates outside the
            // experts' op, so that a split of their sum over ranks cannot count it twice.
            let b2 = self.param(&format!("{experts}.b2"), &[e, h]);
            let biased = self.op(OpKind::Linear { bias: false }, vec![gates, b2])?;
            routed = self.op(OpKind::Add, vec![routed, biased])?;
        }
        if let Some(factor) = spec.variant.routed_scale {
            routed = self.op(OpKind::Scale { factor }, vec![routed])?;
        }
        let Some(shared) = spec.variant.shared_expert_ffn else {
            return Ok(routed);
        };
        if !spec.variant.shared_expert_gate {
            let name = match spec.model_type() {
                "llama4_text" => format!("{p}.{moe}.shared_expert"),
                // GraniteMoeShared's is the layer's own `shared_mlp`.
                "granitemoeshared" => format!("{p}.shared_mlp"),
                _ => format!("{p}.{moe}.shared_experts"),
            };
            let dense = self.gated_mlp(spec, &name, m, shared)?;
            return self.op(OpKind::Add, vec![routed, dense]);
        }
        let dense = self.gated_mlp(spec, &format!("{p}.{moe}.shared_expert"), m, shared)?;
        let logit = self.linear(&format!("{p}.{moe}.shared_expert_gate"), m, h, 1, false)?;
        let weight = self.op(OpKind::Sigmoid, vec![logit])?;
        let gated = self.op(OpKind::Mul, vec![dense, weight])?;
        self.op(OpKind::Add, vec![routed, gated])
    }
}

/// The name of a layer's MLP module (transformers' attribute): Llama 4's `feed_forward`,
/// elsewhere `mlp`.
fn mlp_name(spec: &ModelSpec) -> &'static str {
    match spec.model_type() {
        "llama4_text" => "feed_forward",
        _ => "mlp",
    }
}
