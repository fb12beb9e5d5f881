//! Lowers a [`ModelSpec`] into a forward IR graph with a loss, layers tagged as one repeated
//! block. Batch and sequence stay symbolic (`B`, `S`) until a planner binds them.

use ir::{BuildError, DType, Dim, Graph, OpKind, Shape, Sym, TensorType, ValueId};

use crate::spec::{Family, ModelSpec};

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
        Family::Llama | Family::Mixtral => b.rmsnorm(&format!("{final_norm}.weight"), spec, x)?,
    };
    let head = if spec.tied_embeddings {
        b.op(OpKind::Transpose { perm: vec![1, 0] }, vec![wte])?
    } else {
        b.param(head_name, &[h, v])
    };
    let logits = b.op(OpKind::Linear { bias: false }, vec![x, head])?;
    let loss = b.op(OpKind::CrossEntropy, vec![logits, targets])?;
    b.g.add_output("logits", logits);
    b.g.add_output("loss", loss);
    Ok(b.g)
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
        self.op(OpKind::LayerNorm { eps: spec.norm_eps }, vec![x, g, bias])
    }

    fn rmsnorm(&mut self, name: &str, spec: &ModelSpec, x: ValueId) -> Result<ValueId, BuildError> {
        let g = self.param(name, &[spec.hidden]);
        self.op(OpKind::RmsNorm { eps: spec.norm_eps }, vec![x, g])
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
        let (h, f) = (spec.hidden, spec.ffn);
        let kv = spec.kv_heads * spec.head_dim();
        let p = format!("model.layers.{i}");
        let a = self.rmsnorm(&format!("{p}.input_layernorm.weight"), spec, x)?;
        let q = self.linear(&format!("{p}.self_attn.q_proj"), a, h, h, false)?;
        let k = self.linear(&format!("{p}.self_attn.k_proj"), a, h, kv, false)?;
        let v = self.linear(&format!("{p}.self_attn.v_proj"), a, h, kv, false)?;
        let q = self.op(
            OpKind::Rotary {
                heads: spec.heads,
                theta: spec.rope_theta,
            },
            vec![q],
        )?;
        let k = self.op(
            OpKind::Rotary {
                heads: spec.kv_heads,
                theta: spec.rope_theta,
            },
            vec![k],
        )?;
        let attn = self.op(
            OpKind::Attention {
                heads: spec.heads,
                kv_heads: spec.kv_heads,
                scale: 1.0 / (spec.head_dim() as f64).sqrt(),
                causal: true,
            },
            vec![q, k, v],
        )?;
        let o = self.linear(&format!("{p}.self_attn.o_proj"), attn, h, h, false)?;
        let x = self.op(OpKind::Add, vec![x, o])?;
        let m = self.rmsnorm(&format!("{p}.post_attention_layernorm.weight"), spec, x)?;
        let y = if spec.family == Family::Mixtral {
            let e = spec.experts;
            let router = self.param(&format!("{p}.block_sparse_moe.gate.weight"), &[h, e]);
            let gates = self.op(
                OpKind::TopKRouter {
                    experts: e,
                    k: spec.experts_per_token,
                },
                vec![m, router],
            )?;
            let w1 = self.param(&format!("{p}.block_sparse_moe.experts.w1"), &[e, h, f]);
            let w3 = self.param(&format!("{p}.block_sparse_moe.experts.w3"), &[e, h, f]);
            let w2 = self.param(&format!("{p}.block_sparse_moe.experts.w2"), &[e, f, h]);
            self.op(
                OpKind::MoeExperts { experts: e },
                vec![m, gates, w1, w3, w2],
            )?
        } else {
            let gate = self.linear(&format!("{p}.mlp.gate_proj"), m, h, f, false)?;
            let up = self.linear(&format!("{p}.mlp.up_proj"), m, h, f, false)?;
            let act = self.op(OpKind::Silu, vec![gate])?;
            let prod = self.op(OpKind::Mul, vec![act, up])?;
            self.linear(&format!("{p}.mlp.down_proj"), prod, f, h, false)?
        };
        self.op(OpKind::Add, vec![x, y])
    }
}
