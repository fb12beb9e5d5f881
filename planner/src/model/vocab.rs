//! Whether the embedding and head split by vocabulary under tensor parallelism, and what
//! padding a vocabulary that does not divide costs. One decision, read by the memory model,
//! the sharding extraction and codegen alike.

use ir::{Graph, OpKind, ValueId};

use super::ModelInfo;

impl ModelInfo<'_> {
    /// Whether the embedding and head run vocabulary-parallel over `tp` ranks (Megatron-LM's
    /// `VocabParallelEmbedding` and vocabulary-parallel cross-entropy): the model has that
    /// shape (a token embedding read by `input_ids`, a bias-free linear head) and at least
    /// `tp` tokens. A vocabulary that does not divide is padded to ⌈vocab / tp⌉ rows per rank,
    /// as Megatron-LM pads it (its `make_vocab_size_divisible_by`). Otherwise the table and
    /// the head stay whole.
    pub fn vocabulary_splits(&self, tp: u32) -> bool {
        tp <= 1 || (self.vocab_parallel_shape && self.vocab >= u64::from(tp))
    }

    /// The vocabulary as `tp` ranks hold it: rounded up to a multiple of `tp` where it splits.
    pub fn padded_vocab(&self, tp: u32) -> u64 {
        if self.vocabulary_splits(tp) {
            self.vocab.div_ceil(u64::from(tp.max(1))) * u64::from(tp.max(1))
        } else {
            self.vocab
        }
    }

    /// The vocabulary where its split over `tp` ranks pads it (`None`: it divides, or does not
    /// split).
    pub fn vocabulary_padding(&self, tp: u32) -> Option<u64> {
        (self.padded_vocab(tp) != self.vocab).then_some(self.vocab)
    }

    /// Of a vocabulary-sized matrix, the share one of `tp` ranks stores: ⌈vocab / tp⌉ / vocab
    /// (1/tp where the vocabulary divides).
    pub fn vocabulary_share(&self, tp: u32) -> f64 {
        if self.vocab == 0 {
            return 1.0 / f64::from(tp.max(1));
        }
        self.padded_vocab(tp) as f64 / self.vocab as f64 / f64::from(tp.max(1))
    }

    /// The share of parameter `v` (outside the layers) one of `tp` ranks stores: a
    /// vocabulary-sized matrix its ⌈vocab / tp⌉ rows where the vocabulary splits, anything
    /// else (a learned position table, the final norm) whole, as Megatron-LM keeps them.
    pub fn outer_param_share(&self, v: ir::ValueId, tp: u32) -> f64 {
        if self.vocabulary_splits(tp) && self.vocabulary_matrix(v) {
            self.vocabulary_share(tp)
        } else {
            1.0
        }
    }

    /// The padding rows' elements ⌈vocab / tp⌉·tp − vocab rows of each vocabulary-sized
    /// matrix ([`ModelInfo::vocabulary_matrix`]) among `ops`, over all `tp` ranks.
    pub fn vocabulary_padding_params(&self, tp: u32, ops: &[ir::OpId]) -> u64 {
        let extra = self.padded_vocab(tp) - self.vocab;
        if extra == 0 {
            return 0;
        }
        let g = self.graph;
        ops.iter()
            .filter(|&&o| matches!(g.op(o).kind, OpKind::Param { .. }))
            .map(|&o| g.op(o).results[0])
            .filter(|&v| self.vocabulary_matrix(v))
            .map(|v| g.ty(v).shape.fixed_numel().unwrap_or(0) / self.vocab * extra)
            .sum()
    }
}

/// Whether `graph` has the shape of a vocabulary-parallel model: a token embedding read by
/// `input_ids`, and a head whose `linear` logits (bias-free, or biased by a parameter: Phi)
/// feed the cross-entropy (directly or
/// through element-wise ops of one operand, as Gemma 2's soft-capping) with a weight that is a
/// parameter (untied) or the transposed table (tied). Other shapes (an ONNX head with a
/// reshape) keep both whole on every rank.
pub(super) fn vocab_parallel_shape(info: &ModelInfo<'_>) -> bool {
    let graph = info.graph;
    let def = |v: ValueId| graph.op(graph.def_op(v));
    let embedding = info.pre_ops.iter().any(|&o| {
        let op = graph.op(o);
        matches!(op.kind, OpKind::Embedding)
            && op.inputs.get(1).is_some_and(
                |&i| matches!(&def(i).kind, OpKind::Input { name } if name == "input_ids"),
            )
    });
    let head = info.post_ops.iter().any(|&o| {
        let op = graph.op(o);
        matches!(op.kind, OpKind::CrossEntropy)
            && op.inputs.first().is_some_and(|&l| {
                let lin = head_product(graph, l);
                let bias_param = |&b: &ValueId| matches!(def(b).kind, OpKind::Param { .. });
                let bias_free_or_param = match lin.kind {
                    OpKind::Linear { bias: false } => true,
                    // Phi's biased head: the bias splits with the weight's columns.
                    OpKind::Linear { bias: true } => lin.inputs.get(2).is_some_and(bias_param),
                    _ => false,
                };
                bias_free_or_param
                    && lin
                        .inputs
                        .get(1)
                        .is_some_and(|&w| head_weight(info, def(w)))
            })
    });
    embedding && head
}

/// A head weight: an untied parameter, or the transposed table of a tied model.
fn head_weight(info: &ModelInfo<'_>, w: &ir::OpData) -> bool {
    let graph = info.graph;
    match &w.kind {
        OpKind::Param { .. } => info.tied_params == 0,
        OpKind::Transpose { perm } => {
            perm.as_slice() == [1, 0]
                && w.inputs.first().is_some_and(|&t| {
                    matches!(graph.op(graph.def_op(t)).kind, OpKind::Param { .. })
                })
        }
        _ => false,
    }
}

/// Whether `v` is the bias of a vocabulary-sized head (Phi's `lm_head.bias`, `[vocab]`).
pub(super) fn head_bias(info: &ModelInfo<'_>, v: ValueId) -> bool {
    let graph = info.graph;
    info.post_ops.iter().any(|&o| {
        let op = graph.op(o);
        matches!(op.kind, OpKind::Linear { bias: true })
            && op.inputs.get(2) == Some(&v)
            && graph.ty(op.results[0]).shape.last().and_then(|d| d.fixed()) == Some(info.vocab)
    })
}

/// The op that makes the logits `l` the cross-entropy reads, looking through element-wise ops
/// of one operand between them (Gemma 2's soft-capping: scale, tanh, scale), which run on
/// vocabulary shards as they are.
fn head_product(graph: &Graph, mut l: ValueId) -> &ir::OpData {
    loop {
        let op = graph.op(graph.def_op(l));
        match op.inputs.as_slice() {
            [x] if op.kind.is_pointwise() => l = *x,
            _ => return op,
        }
    }
}
