//! What the planner needs to know about a model, read off its forward IR graph: the repeated
//! block (planned once, replicated), the ops before it (embedding) and after it (head, loss).

use ir::{Graph, OpId, OpKind};

use crate::error::PlanError;

pub mod latent;
mod vocab;
pub mod whole;

/// A forward graph split into pre-block ops, one representative layer, and post-block ops.
#[derive(Debug, Clone)]
pub struct ModelInfo<'g> {
    pub graph: &'g Graph,
    pub layers: u32,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    /// Longest sequence the model accepts (learned position table rows), or `u64::MAX`.
    pub max_seq: u64,
    /// Ops of layer 0, in order (every layer is structurally identical).
    pub layer_ops: Vec<OpId>,
    /// Untagged ops before the first layer (embeddings).
    pub pre_ops: Vec<OpId>,
    /// Untagged ops after the last layer (final norm, head, loss).
    pub post_ops: Vec<OpId>,
    pub params_per_layer: u64,
    /// Of `params_per_layer`: the routed experts' weights (what expert parallelism shards).
    pub expert_params_per_layer: u64,
    /// Routed experts of a mixture-of-experts layer (0 for a dense model).
    pub experts: u64,
    /// Of `params_per_layer`: those tensor parallelism keeps whole on every rank
    /// ([`ModelInfo::tp_whole_params_per_layer`]).
    pub whole_params: whole::WholeParams,
    pub pre_params: u64,
    pub post_params: u64,
    /// Of `pre_params` and `post_params`: those tensor parallelism keeps whole on every rank
    /// (a learned position table, the final norm), all but the vocabulary-sized matrices
    /// ([`ModelInfo::vocabulary_matrix`]).
    pub pre_whole_params: u64,
    pub post_whole_params: u64,
    /// The embedding and head have the shape that splits by vocabulary
    /// ([`ModelInfo::vocabulary_splits`]).
    pub vocab_parallel_shape: bool,
    /// Parameters used both before and after the block (tied embeddings): a pipeline keeps a
    /// copy on the first and on the last stage.
    pub tied_params: u64,
    /// The graph's shapes fix the sequence length (an ONNX import, folded per batch and seq)
    /// rather than keeping it symbolic; sequence parallelism's per-rank shards of the head
    /// need it symbolic.
    pub static_seq: bool,
    /// `layer_ops`, `pre_ops` and `post_ops` grouped into the kernels a fusing runtime launches
    /// ([`crate::cost::compute::fuse_pointwise`]).
    pub layer_groups: Vec<Vec<OpId>>,
    pub pre_groups: Vec<Vec<OpId>>,
    pub post_groups: Vec<Vec<OpId>>,
    /// The block's sharding extractions, per tensor-parallel shape, as the estimate prices
    /// them ([`crate::layer_tp`]).
    /// Shared by the runs whose layers are structurally identical (Llama 4's rotated and
    /// unrotated runs alternate), whose extractions are the same.
    pub tp_extractions: std::sync::Arc<crate::layer_tp::TpCache>,
    /// Where the block changes structure ([`ir::Graph::kind_starts`]: DeepSeek-V3's dense
    /// layers, then its expert layers), each run of identical layers as a model of its own
    /// (its first layer's ops and parameters, `layers` its length); empty where every layer
    /// repeats layer 0. The fields above describe layer 0 ([`ModelInfo::runs`]).
    pub layer_runs: Vec<LayerRun<'g>>,
    /// The layer's norms that span every head of q or k at once (OLMo 2's and OLMoE's `q_norm`
    /// and `k_norm` over the whole projections): their statistics need every tensor-parallel
    /// rank's heads, which Megatron-LM's layout splits, so at tp > 1 only the sharding
    /// extraction's layout runs them (on sequence shards or whole rows); the estimate refuses
    /// the rules'.
    pub norms_across_heads: Vec<OpId>,
    /// The layer's multi-head latent attention (DeepSeek-V2 and V3), its widths.
    pub latent: Option<latent::Latent>,
    /// The layers' sliding attention windows, as the representative layer's attention is
    /// priced for all (none: every layer attends to every earlier key).
    pub layer_windows: Option<crate::cost::compute::WindowMix>,
}

/// A run of structurally identical layers of a block that changes structure.
#[derive(Debug, Clone)]
pub struct LayerRun<'g> {
    /// Its first layer.
    pub first: u32,
    /// The model seen through this run: its layer fields describe the run's first layer,
    /// `layers` is the run's length; no runs of its own.
    pub info: ModelInfo<'g>,
}

impl<'g> ModelInfo<'g> {
    pub fn new(graph: &'g Graph) -> Result<ModelInfo<'g>, PlanError> {
        let layers = graph.num_layers();
        if layers == 0 {
            return Err(PlanError::NoLayers);
        }
        let mut info = Self::seen_through_layer(graph, 0, layers)?;
        if graph.kind_starts.is_empty() {
            return Ok(info);
        }
        let mut firsts = vec![0];
        firsts.extend(graph.kind_starts.iter().copied());
        if firsts.windows(2).any(|w| w[0] >= w[1]) || firsts.last() >= Some(&layers) {
            return Err(PlanError::KindStarts {
                starts: graph.kind_starts.clone(),
                layers,
            });
        }
        let mut runs = Vec::new();
        for (i, &first) in firsts.iter().enumerate() {
            let end = firsts.get(i + 1).copied().unwrap_or(layers);
            runs.push(LayerRun {
                first,
                info: Self::seen_through_layer(graph, first, end - first)?,
            });
        }
        // A run whose layers repeat an earlier run's structure prices its extractions from
        // the same cache: they are the same layer.
        let alike = ir::blocks::earlier_alike(graph, &firsts);
        for (i, earlier) in alike.into_iter().enumerate() {
            if let Some(j) = earlier {
                runs[i].info.tp_extractions = runs[j].info.tp_extractions.clone();
            }
        }
        // The expert count a strategy's expert parallelism must divide: the expert runs'.
        info.experts = runs.iter().map(|r| r.info.experts).max().unwrap_or(0);
        info.layer_runs = runs;
        Ok(info)
    }

    /// The model with layer `representative` standing for `layers` layers.
    fn seen_through_layer(
        graph: &'g Graph,
        representative: u32,
        layers: u32,
    ) -> Result<ModelInfo<'g>, PlanError> {
        let order = graph.order();
        let first = order
            .iter()
            .position(|&o| graph.op(o).layer.is_some())
            .unwrap_or(0);
        let last = order
            .iter()
            .rposition(|&o| graph.op(o).layer.is_some())
            .unwrap_or(0);
        let untagged = |o: &&OpId| graph.op(**o).layer.is_none();
        let pre_ops: Vec<OpId> = order[..first].iter().filter(untagged).copied().collect();
        let post_ops: Vec<OpId> = order[last + 1..].iter().filter(untagged).copied().collect();
        let layer_ops = graph.layer_ops(representative);
        let numel = |o: OpId| {
            graph
                .ty(graph.op(o).results[0])
                .shape
                .fixed_numel()
                .unwrap_or(0)
        };
        let is_param = |o: &OpId| matches!(graph.op(*o).kind, OpKind::Param { .. });
        let params_per_layer = layer_ops
            .iter()
            .filter(|o| is_param(o))
            .map(|&o| numel(o))
            .sum();
        let (expert_params_per_layer, experts) = routed_expert_params(graph, &layer_ops);
        let whole_params = whole::WholeParams::of(graph, &layer_ops);
        let pre_params: u64 = pre_ops
            .iter()
            .filter(|o| is_param(o))
            .map(|&o| numel(o))
            .sum();
        let post_params: u64 = post_ops
            .iter()
            .filter(|o| is_param(o))
            .map(|&o| numel(o))
            .sum();
        // A pre-block parameter read by a post-block op is tied (GPT's embedding and head).
        let uses = graph.uses();
        let tied_params = pre_ops
            .iter()
            .filter(|o| is_param(o))
            .filter(|&&o| {
                let v = graph.op(o).results[0];
                uses[v.index()].iter().any(|u| post_ops.contains(u))
            })
            .map(|&o| numel(o))
            .sum();
        let fuse = |ops: &[OpId]| crate::cost::compute::fuse_pointwise(graph, ops, &uses);
        let (layer_groups, pre_groups, post_groups) =
            (fuse(&layer_ops), fuse(&pre_ops), fuse(&post_ops));
        let mut info = ModelInfo {
            pre_whole_params: 0,
            post_whole_params: 0,
            graph,
            layers,
            hidden: 0,
            heads: 0,
            kv_heads: 0,
            vocab: 0,
            max_seq: u64::MAX,
            layer_ops,
            pre_ops,
            post_ops,
            params_per_layer,
            expert_params_per_layer,
            experts,
            whole_params,
            pre_params,
            post_params,
            tied_params,
            vocab_parallel_shape: false,
            static_seq: !graph.value_ids().any(|v| {
                graph
                    .ty(v)
                    .shape
                    .dims()
                    .contains(&ir::Dim::Sym(ir::Sym::Seq))
            }),
            layer_groups,
            pre_groups,
            post_groups,
            tp_extractions: Default::default(),
            layer_runs: Vec::new(),
            norms_across_heads: Vec::new(),
            latent: None,
            layer_windows: crate::cost::compute::WindowMix::of_graph(graph),
        };
        info.norms_across_heads = norms_across_heads(graph, &info.layer_ops, &uses);
        info.latent = latent::read(graph, &info.layer_ops);
        for &o in order {
            let op = graph.op(o);
            match &op.kind {
                OpKind::Embedding => {
                    let table = graph.ty(op.inputs[0]).shape.dims().to_vec();
                    let positions = matches!(
                        graph.op(graph.def_op(op.inputs[1])).kind,
                        OpKind::Iota { .. }
                    );
                    let rows = table.first().and_then(|d| d.fixed()).unwrap_or(0);
                    if positions {
                        info.max_seq = info.max_seq.min(rows);
                    } else if info.hidden == 0 {
                        info.hidden = table.get(1).and_then(|d| d.fixed()).unwrap_or(0);
                        info.vocab = rows;
                    }
                }
                OpKind::Attention {
                    heads, kv_heads, ..
                } if info.heads == 0 => {
                    info.heads = *heads;
                    info.kv_heads = *kv_heads;
                }
                _ => {}
            }
        }
        let whole = |ops: &[OpId], info: &ModelInfo<'_>| -> u64 {
            ops.iter()
                .filter(|o| is_param(o))
                .filter(|&&o| !info.vocabulary_matrix(graph.op(o).results[0]))
                .map(|&o| numel(o))
                .sum()
        };
        info.pre_whole_params = whole(&info.pre_ops, &info);
        info.post_whole_params = whole(&info.post_ops, &info);
        info.vocab_parallel_shape = vocab::vocab_parallel_shape(&info);
        Ok(info)
    }

    /// Whether a norm of the layer spans every head of q or k ([`Self::norms_across_heads`]).
    pub fn norm_across_heads(&self) -> bool {
        !self.norms_across_heads.is_empty()
    }

    /// Whether parameter `v` is a vocabulary-sized matrix (the token table, the head's weight)
    /// or the head's bias: one of its axes is the vocabulary and no position lookup reads it
    /// (a vector only as the head's bias). Tensor parallelism
    /// stores these 1/tp per rank (Megatron-LM's vocabulary-parallel embedding and head); the
    /// other parameters outside the layers stay whole.
    pub fn vocabulary_matrix(&self, v: ir::ValueId) -> bool {
        let g = self.graph;
        let ty = g.ty(v);
        let position_table = self.pre_ops.iter().any(|&u| {
            let op = g.op(u);
            matches!(op.kind, OpKind::Embedding)
                && op.inputs.first() == Some(&v)
                && op
                    .inputs
                    .get(1)
                    .is_some_and(|&i| matches!(g.op(g.def_op(i)).kind, OpKind::Iota { .. }))
        });
        let matrix = ty.shape.rank() >= 2
            && ty
                .shape
                .dims()
                .iter()
                .any(|d| d.fixed() == Some(self.vocab));
        self.vocab > 0 && (matrix || vocab::head_bias(self, v)) && !position_table
    }

    /// Parameters of one layer that every one of `tp` tensor-parallel ranks holds whole
    /// (norms, the router, MLA's latent down-projections, key/value projections of fewer
    /// heads than ranks); the layer's other dense parameters are split 1/tp.
    pub fn tp_whole_params_per_layer(&self, tp: u32) -> u64 {
        if tp <= 1 {
            return 0;
        }
        self.whole_params.at(tp)
    }

    /// One layer's parameters on one of `tp` tensor-parallel ranks, outside the routed
    /// experts: the split ones 1/tp, the whole ones ([`Self::tp_whole_params_per_layer`]).
    pub fn dense_params_per_tp_rank(&self, tp: u32) -> f64 {
        let whole = self.tp_whole_params_per_layer(tp);
        (self.dense_params_per_layer() - whole) as f64 / f64::from(tp.max(1)) + whole as f64
    }

    /// Parameters of one layer outside the routed experts (what every expert-parallel rank
    /// holds whole).
    pub fn dense_params_per_layer(&self) -> u64 {
        self.params_per_layer - self.expert_params_per_layer
    }

    /// Total trainable parameters.
    pub fn params(&self) -> u64 {
        let layers: u64 = self
            .runs()
            .iter()
            .map(|r| u64::from(r.count) * r.info.params_per_layer)
            .sum();
        self.pre_params + self.post_params + layers
    }

    /// The routed experts' weights over all layers.
    pub fn expert_params(&self) -> u64 {
        self.runs()
            .iter()
            .map(|r| u64::from(r.count) * r.info.expert_params_per_layer)
            .sum()
    }

    /// The block's runs of identical layers, in order: one run of every layer for a block
    /// that repeats one structure.
    pub fn runs(&self) -> Vec<Run<'_, 'g>> {
        if self.layer_runs.is_empty() {
            return vec![Run {
                first: 0,
                count: self.layers,
                info: self,
            }];
        }
        self.layer_runs
            .iter()
            .map(|r| Run {
                first: r.first,
                count: r.info.layers,
                info: &r.info,
            })
            .collect()
    }

    /// How many of layers `start..end` fall in each run ([`ModelInfo::runs`]).
    pub fn run_counts(&self, start: u32, end: u32) -> Vec<u32> {
        self.runs()
            .iter()
            .map(|r| {
                let (a, b) = (start.max(r.first), end.min(r.first + r.count));
                b.saturating_sub(a)
            })
            .collect()
    }

    /// Each chunk's layers (consecutive, chunk after chunk) counted per run.
    pub fn chunk_run_counts(&self, chunk_layers: &[u32]) -> Vec<Vec<u32>> {
        let mut start = 0;
        chunk_layers
            .iter()
            .map(|&n| {
                let counts = self.run_counts(start, start + n);
                start += n;
                counts
            })
            .collect()
    }
}

/// One run of identical layers: its first layer, its length, and the model seen through it.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a, 'g> {
    pub first: u32,
    pub count: u32,
    pub info: &'a ModelInfo<'g>,
}

/// Whether op `o` reads a router's output, the routing weights (gpt-oss's experts' down-
/// projection bias, Σₑ gateₑ·b2ₑ, is a `Linear` of them): a product every tensor-parallel
/// rank computes whole, as Megatron-Core adds the experts' biases, with no collective.
pub fn reads_routing_weights(g: &Graph, o: OpId) -> bool {
    g.op(o)
        .inputs
        .first()
        .is_some_and(|&x| matches!(g.op(g.def_op(x)).kind, OpKind::TopKRouter { .. }))
}

/// The routed experts' weights in `layer_ops` (the weight operands of its expert ops) and their
/// expert count.
fn routed_expert_params(graph: &Graph, layer_ops: &[OpId]) -> (u64, u64) {
    let mut params = 0;
    let mut experts = 0;
    for &o in layer_ops {
        let op = graph.op(o);
        if let OpKind::MoeExperts { experts: e, .. } = op.kind {
            experts = experts.max(e);
            params += op
                .inputs
                .iter()
                .skip(2)
                .filter(|&&w| matches!(graph.op(graph.def_op(w)).kind, OpKind::Param { .. }))
                .map(|&w| graph.ty(w).shape.fixed_numel().unwrap_or(0))
                .sum::<u64>();
        }
    }
    (params, experts)
}

/// The norms among `ops` that read a projection's output whole and feed attention (through
/// reshapes, the rotary embedding and a partial rotary's slice and concat): q or k normed over
/// all their heads at once.
fn norms_across_heads(graph: &Graph, ops: &[OpId], uses: &ir::Uses) -> Vec<OpId> {
    let feeds_attention = |v: ir::ValueId| {
        let mut frontier = vec![v];
        // A partial rotary reaches attention through a slice, the rotary and a concat.
        for _ in 0..6 {
            let mut next = Vec::new();
            for v in frontier {
                for &u in &uses[v.index()] {
                    match graph.op(u).kind {
                        OpKind::Attention { .. } => return true,
                        OpKind::Reshape { .. }
                        | OpKind::Rotary { .. }
                        | OpKind::Slice { .. }
                        | OpKind::Concat { .. } => next.extend(graph.op(u).results.iter().copied()),
                        _ => {}
                    }
                }
            }
            frontier = next;
        }
        false
    };
    ops.iter()
        .copied()
        .filter(|&o| {
            let op = graph.op(o);
            matches!(op.kind, OpKind::RmsNorm { .. } | OpKind::LayerNorm { .. })
                && matches!(
                    graph.op(graph.def_op(op.inputs[0])).kind,
                    OpKind::Linear { .. }
                )
                && op.results.first().is_some_and(|&r| feeds_attention(r))
        })
        .collect()
}
