//! The per-rank program format (`plait-program/1`): plain data, serde, versioned.
//!
//! A [`ProgramSet`] holds the mesh, the communicator groups, the parameter table, one
//! [`Template`] per distinct instruction list, and one [`RankInfo`] per rank. Ranks that differ
//! only in their coordinates share a template: its instructions name communicators by *role*
//! ([`Slot`]: my tensor-parallel group, my data-parallel group, ...) and pipeline peers by
//! direction ([`Peer`]), and each rank's [`RankInfo`] resolves the roles to [`GroupId`]s and
//! ranks. Parameter shards ([`ParamShard`]) are likewise described once per template and
//! resolved by the rank's coordinates ([`ParamShard::slice`]).
//!
//! Execution semantics (what a runtime must do; no planning needed):
//! - Instructions run in order. Buffers are local tensors declared in [`Template::buffers`]
//!   (local shard shape, storage dtype); `Alloc` creates one (contents undefined unless written),
//!   `Free` releases it. Memory accounting counts a buffer from its `Alloc` to its `Free`.
//! - `Compute` applies an IR op ([`ir::OpKind`], attributes already local: e.g. attention heads
//!   ÷ tp) to its input buffers and writes its outputs (an output may name an input: in place).
//!   `Grad{of, wrt}` kinds are the backward (`kernels::backward`), with operands
//!   `inputs of of.., dy`. `saves` are memory-only buffers a GPU kernel keeps for the backward
//!   (attention scores, dropout masks); a CPU runtime may ignore them.
//! - Collectives are blocking over the group's members, which issue them in the same order.
//!   `axis: None` works on the row-major flattening: reduce-scatter and all-gather split it into
//!   `size` equal pieces of ⌈n / size⌉ elements (zero-padded), piece `i` belonging to the
//!   member with group index `i` (members are listed in [`Group::ranks`] order).
//!   `axis: Some(a)`: the pieces are the equal parts along axis `a`. A collective may carry
//!   several (input, output) pairs: one coalesced call (a gradient bucket).
//! - A buffer marked `partial` holds a partial sum (a row-parallel product, a column-parallel
//!   input gradient, an expert-parallel or context-parallel input gradient, or a sum of such)
//!   from the `Compute` that writes it to the `AllReduce` / `ReduceScatter` over the group
//!   that completes it. A runtime may carry it
//!   in wider precision than its `elem` there (so that the completed sum is rounded once, as
//!   one device's product is); everything else reads it at `elem`.
//! - `Vocab` runs on this rank's shard of the vocabulary (Megatron-LM's vocabulary-parallel
//!   embedding): member `i` of `group` holds table rows `i·n .. (i+1)·n`, `n` the local rows.
//!   `Embedding` (table, ids → out) writes the rows of the tokens in the shard and zeros for
//!   the others (a partial sum over the group); `EmbeddingGrad` (ids, dy → dtable) writes the
//!   shard's gradient, the sum of `dy` over the positions of each of its tokens. The
//!   cross-entropy over logits split by vocabulary column blocks (Megatron's
//!   `vocab_parallel_cross_entropy`): `LossStats` (logits, targets → stats `[1, N, 3]`: per
//!   position the shard's max logit, its sum of exp(logit − max), and the target's logit if
//!   the shard holds it, else 0), an all-gather of the stats over the group along axis 0,
//!   `LossCombine` (stats `[size, N, 3]` → the mean loss `[]` and the log-sum-exp `[N]`), and
//!   `LossGrad` (logits, targets, lse, dloss → dlogits = dloss/N · (exp(logit − lse) − onehot)).
//! - `Context` runs on this rank's share of the sequence under context parallelism
//!   (`MeshInfo::cp` > 1; Megatron-Core's load-balanced layout): the sequence is cut into
//!   `2·cp` equal chunks and member `i` of the `Cp` group holds chunks `i` and `2·cp − 1 − i`,
//!   in that order, as its local sequence. `Rotary` turns each local token by its
//!   whole-sequence position, `Iota` writes those positions, `Attention` takes this rank's
//!   queries and the group's keys and values all-gathered along the sequence (member order),
//!   each key visible to the causal queries at or after its position; `Grad` of attention or
//!   rotary is their backward (the keys' and values' gradients in the gathered order, partial
//!   sums over the group).
//! - `Send` is buffered (it does not wait for the receiver); `Recv` blocks until the peer's
//!   send with the same tag arrives. Tags are [`tag`]s of (chunk, micro-batch, direction).
//! - `LoadTokens` fills the micro-batch's rows: replica `r` (the dp coordinate ÷ cp) of
//!   `MeshInfo::batch_replicas`, micro-batch `i` of `m` reads global-batch rows
//!   `(r·m + i)·b .. +b`; under context parallelism only this rank's chunks of each row (the
//!   `Context` layout above, member = dp coordinate mod cp).
//! - `AdamW` updates `param`, `m`, `v` in place from `grad` at the runtime's step (1-based).
//! - `Loss{weight}`: the iteration's loss is the sum over all ranks and micro-batches of
//!   `weight` × the buffer (every tensor-parallel rank of the last stage reports a share).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{BucketId, BufferId, GroupId, ParamId, TemplateId};

pub const FORMAT: &str = "plait-program/1";

/// Storage element type of a buffer (what a GPU run would allocate; the CPU runtime uses f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Elem {
    F32,
    Bf16,
    F16,
    I64,
    /// One byte per element (dropout masks).
    U8,
}

impl Elem {
    pub fn bytes(self) -> u64 {
        match self {
            Elem::F32 => 4,
            Elem::Bf16 | Elem::F16 => 2,
            Elem::I64 => 8,
            Elem::U8 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::Bf16 => "bf16",
            Elem::F16 => "f16",
            Elem::I64 => "i64",
            Elem::U8 => "u8",
        }
    }
}

/// What a buffer holds (for listings, memory breakdowns and the verifier's gradient check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "role", content = "param")]
pub enum Role {
    /// The tensor-parallel shard of a parameter, in compute precision.
    Param(ParamId),
    /// The rank's ZeRO slice (flat) of a parameter in compute precision (ZeRO-3 storage).
    ParamSlice(ParamId),
    /// Transformer Engine's FP8 copy of a parameter's local shard (its ZeRO slice under
    /// ZeRO-3), kept beside the 16-bit one by an FP8 plan's GPU engine: memory only, as
    /// plait's kernels read the 16-bit weights.
    Fp8Copy(ParamId),
    /// fp32 master weights (mixed precision), full local shard (ZeRO-0) or ZeRO slice.
    Master(ParamId),
    OptM(ParamId),
    OptV(ParamId),
    /// The gradient of a parameter's local shard.
    Grad(ParamId),
    /// The rank's ZeRO slice of a reduced gradient.
    GradSlice(ParamId),
    /// One backward's contribution to a parameter's gradient (before accumulation).
    GradPart(ParamId),
    Activation,
    /// A gradient flowing backward.
    ActGrad,
    /// Memory-only state a kernel keeps for the backward (scores, masks).
    Saved,
    Tokens,
    Loss,
    /// CUDA context, library workspaces, fragmentation (the planner's reserve).
    Reserve,
    Temp,
}

impl Role {
    /// The role's name without its parameter, as listings and memory breakdowns print it.
    pub fn class(self) -> &'static str {
        match self {
            Role::Param(_) => "param",
            Role::ParamSlice(_) => "param_slice",
            Role::Fp8Copy(_) => "fp8_copy",
            Role::Master(_) => "master",
            Role::OptM(_) => "opt_m",
            Role::OptV(_) => "opt_v",
            Role::Grad(_) => "grad",
            Role::GradSlice(_) => "grad_slice",
            Role::GradPart(_) => "grad_part",
            Role::Activation => "activation",
            Role::ActGrad => "act_grad",
            Role::Saved => "saved",
            Role::Tokens => "tokens",
            Role::Loss => "loss",
            Role::Reserve => "reserve",
            Role::Temp => "temp",
        }
    }

    pub fn param(self) -> Option<ParamId> {
        match self {
            Role::Param(p)
            | Role::ParamSlice(p)
            | Role::Master(p)
            | Role::OptM(p)
            | Role::OptV(p)
            | Role::Grad(p)
            | Role::GradSlice(p)
            | Role::GradPart(p) => Some(p),
            _ => None,
        }
    }
}

/// One local buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BufferDecl {
    pub name: String,
    pub elem: Elem,
    /// Local shape (the rank's shard).
    pub shape: Vec<u64>,
    pub role: Role,
    /// Holds a tensor-parallel partial sum until the reduction that completes it (see the
    /// module's execution semantics).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl BufferDecl {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        self.numel() * self.elem.bytes()
    }
}

/// A communicator role, resolved per rank through [`RankInfo::groups`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Slot {
    /// The ranks of my tensor-parallel group.
    Tp,
    /// The ranks holding the same shard in the other data-parallel replicas.
    Dp,
    /// First and last pipeline stage (same tp, dp): tied embedding gradients.
    Tied,
    /// My expert-parallel group: the `ep` consecutive data-parallel ranks (same tp, pp) that
    /// split each layer's experts; member `i` is the rank with dp coordinate ≡ i (mod ep).
    Ep,
    /// The ranks holding the same experts (dp coordinates equal mod ep): the experts'
    /// gradients reduce, and their ZeRO slices are cut, over this group instead of `Dp`.
    Edp,
    /// My context-parallel group: the `cp` consecutive data-parallel ranks (same tp, pp) that
    /// split each sequence (`MeshInfo::cp`); member `i` is the rank with dp coordinate ≡ i
    /// (mod cp).
    Cp,
}

impl Slot {
    pub const ALL: [Slot; 6] = [
        Slot::Tp,
        Slot::Dp,
        Slot::Tied,
        Slot::Ep,
        Slot::Edp,
        Slot::Cp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Slot::Tp => "tp",
            Slot::Dp => "dp",
            Slot::Tied => "tied",
            Slot::Ep => "ep",
            Slot::Edp => "edp",
            Slot::Cp => "cp",
        }
    }
}

/// A pipeline neighbour, resolved per rank through [`RankInfo::prev`] / [`RankInfo::next`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Peer {
    /// Stage (s − 1) mod pp.
    Prev,
    /// Stage (s + 1) mod pp.
    Next,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollectiveOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast {
        root: u32,
    },
    /// An all-to-all that moves a tensor's split from axis `from` to the instruction's axis:
    /// each member sends its piece `j` along the new axis to member `j` and concatenates what
    /// it receives along `from` (MLIR shard's `all_to_all` with `split_axis` the new axis and
    /// `concat_axis = from`; DeepSpeed-Ulysses's sequence-to-heads exchange).
    Reshard {
        from: u8,
    },
}

impl CollectiveOp {
    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::ReduceScatter => "reduce_scatter",
            CollectiveOp::AllToAll => "all_to_all",
            CollectiveOp::Broadcast { .. } => "broadcast",
            CollectiveOp::Reshard { .. } => "reshard",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    Ring,
    Tree,
}

/// What a collective is for (listings and the gradient check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Purpose {
    /// Tensor/sequence-parallel activation collective (forward or backward).
    Activation,
    /// Data-parallel gradient reduction (one bucket).
    GradReduce,
    /// Tensor-parallel reduction of a replicated parameter's partial gradient (sequence parallel).
    TpGradReduce,
    /// Tied-embedding gradient sum between the first and last stage.
    TiedGrad,
    /// ZeRO parameter gather (before use, or after the optimizer step).
    ParamGather,
}

/// The direction of a pipeline message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    Forward,
    Backward,
}

/// One message tag: unique per (chunk it feeds, micro-batch, direction).
pub fn tag(chunk: u32, micro_batch: u32, pass: Pass) -> u64 {
    (u64::from(chunk) << 33) | (u64::from(micro_batch) << 1) | u64::from(pass == Pass::Backward)
}

/// The ops of a vocabulary-parallel embedding ([`Instr::Vocab`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VocabOp {
    /// (table shard [n, h], ids [..]) → out [.., h].
    Embedding,
    /// (ids [..], dy [.., h]) → dtable shard [n, h].
    EmbeddingGrad,
    /// (logits [.., n], targets [..]) → stats [1, N, 3].
    LossStats,
    /// (stats [size, N, 3]) → (loss [], lse [N]).
    LossCombine,
    /// (logits [.., n], targets [..], lse [N], dloss []) → dlogits [.., n].
    LossGrad,
}

impl VocabOp {
    pub fn name(self) -> &'static str {
        match self {
            VocabOp::Embedding => "vocab_embedding",
            VocabOp::EmbeddingGrad => "vocab_embedding_grad",
            VocabOp::LossStats => "vocab_loss_stats",
            VocabOp::LossCombine => "vocab_loss_combine",
            VocabOp::LossGrad => "vocab_loss_grad",
        }
    }
}

/// One instruction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "instr")]
pub enum Instr {
    Alloc {
        buf: BufferId,
    },
    Free {
        buf: BufferId,
    },
    /// Start of a pipeline task: the listing's schedule markers (warm-up, steady, cool-down).
    Task {
        phase: Phase,
        chunk: u32,
        micro_batch: u32,
        pass: Pass,
    },
    /// The parameters' initial values: the runtime initializes each full tensor (seed or ONNX
    /// weights) and copies the rank's slice ([`ParamShard`]) into these buffers.
    InitParams {
        bufs: Vec<BufferId>,
    },
    LoadTokens {
        micro_batch: u32,
        input_ids: Option<BufferId>,
        targets: Option<BufferId>,
    },
    /// Writes `value` to every element.
    Fill {
        buf: BufferId,
        value: f64,
    },
    /// Copies (and converts) `src` into `dst` element by element (same element count).
    Copy {
        src: BufferId,
        dst: BufferId,
    },
    Compute {
        kind: ir::OpKind,
        inputs: Vec<BufferId>,
        outputs: Vec<BufferId>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        saves: Vec<BufferId>,
        /// Forward layer (or `None` for embedding/head ops) this computes, for listings.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layer: Option<u32>,
    },
    Collective {
        op: CollectiveOp,
        group: Slot,
        algorithm: Algorithm,
        axis: Option<u8>,
        /// (input, output) pairs; all-reduce may be in place.
        pairs: Vec<(BufferId, BufferId)>,
        purpose: Purpose,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bucket: Option<BucketId>,
    },
    /// An op on this rank's vocabulary shard of `group` (see the module docs).
    Vocab {
        op: VocabOp,
        group: Slot,
        inputs: Vec<BufferId>,
        outputs: Vec<BufferId>,
        /// The whole vocabulary, where it does not divide by the group: every rank holds
        /// ⌈vocab / size⌉ rows (columns) and those past `vocab` are zero padding that the
        /// loss leaves out (`None`: the shards split it evenly).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vocab: Option<u64>,
    },
    /// `kind` on this rank's share of the sequence in the context-parallel `group`
    /// (`kernels::context_forward`: Megatron-Core's load-balanced chunks): rotary and iota at
    /// the tokens' whole-sequence positions, attention with this rank's queries against the
    /// group's gathered keys and values, or the `grad` of either.
    Context {
        kind: ir::OpKind,
        group: Slot,
        inputs: Vec<BufferId>,
        outputs: Vec<BufferId>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        saves: Vec<BufferId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layer: Option<u32>,
    },
    /// Copies this rank's piece of `src` along `axis` (the group index of `size` equal parts)
    /// into `dst`; no communication.
    /// `axis: None`: the flat piece of ⌈n / size⌉ elements, as the flat collectives cut it.
    Chunk {
        src: BufferId,
        dst: BufferId,
        axis: Option<u8>,
        group: Slot,
    },
    Send {
        buf: BufferId,
        peer: Peer,
        tag: u64,
    },
    Recv {
        buf: BufferId,
        peer: Peer,
        tag: u64,
    },
    /// Start of a recompute region: the forward of `layer` re-run to rebuild its saved buffers
    /// (full recompute) or its attention scores (selective).
    RecomputeBegin {
        layer: u32,
    },
    RecomputeEnd {
        layer: u32,
    },
    AdamW {
        config: ir::AdamWConfig,
        param: BufferId,
        grad: BufferId,
        m: BufferId,
        v: BufferId,
    },
    /// The reported loss is the sum over ranks and micro-batches of `weight` × the buffer.
    Loss {
        buf: BufferId,
        weight: f64,
    },
}

/// Where a pipeline task sits in the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    WarmUp,
    Steady,
    CoolDown,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::WarmUp => "warm-up",
            Phase::Steady => "steady",
            Phase::CoolDown => "cool-down",
        }
    }
}

/// How the tensor-parallel shard of a parameter is cut from the full tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TpSplit {
    pub axis: u8,
    /// The axis holds `blocks` equal blocks (fused QKV: 3); each is split `tp` ways and the
    /// rank's pieces are concatenated.
    pub blocks: u32,
    /// Which piece: the rank's tp coordinate (`None`), or a fixed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<u32>,
    /// The axis (one block) does not divide by tp: every rank's piece is ⌈dim / tp⌉ long, the
    /// part past the tensor's end zero padding (a vocabulary-parallel table or head whose
    /// vocabulary does not divide, as Megatron-LM pads it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub padded: bool,
}

impl TpSplit {
    /// The boxes of `whole` (the tensor, or an expert block of it) that tp coordinate
    /// `tp_rank` of `tp` holds, and the zero padding after them.
    fn boxes(self, whole: &Box, tp: u32, tp_rank: u32) -> (Vec<Box>, Option<Pad>) {
        let axis = usize::from(self.axis);
        let (base, end) = whole.get(axis).copied().unwrap_or((0, 0));
        let dim = end - base;
        let blocks = u64::from(self.blocks.max(1));
        let block = dim / blocks;
        let tp = u64::from(tp.max(1));
        let piece = if self.padded {
            block.div_ceil(tp)
        } else {
            block / tp
        };
        let part = u64::from(self.part.unwrap_or(tp_rank));
        let mut pad = 0;
        let boxes = (0..blocks)
            .map(|k| {
                let mut b = whole.clone();
                let start = (base + k * block + part * piece).min(base + (k + 1) * block);
                let stop = (start + piece).min(base + (k + 1) * block);
                pad = piece - (stop - start);
                if let Some(r) = b.get_mut(axis) {
                    *r = (start, stop);
                }
                b
            })
            .collect();
        (boxes, (pad > 0).then_some(Pad { axis, rows: pad }))
    }
}

/// A parameter shard a template's ranks own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamShard {
    pub param: ParamId,
    /// `None`: replicated across the tensor-parallel group.
    pub tp: Option<TpSplit>,
    /// Optimizer state (and with ZeRO-2/3 the gradient, with ZeRO-3 the weight) is the rank's
    /// flat slice ⌈n / dp⌉ of the local shard's n elements, at its dp coordinate (for an
    /// expert shard: ⌈n / (dp / ep)⌉ at its coordinate in the `Edp` group, dp ÷ ep).
    pub zero: bool,
    /// A routed-experts weight `[experts, ..]` split along axis 0 over the `Ep` group: the
    /// rank holds experts `i·E/ep .. (i+1)·E/ep`, `i` its dp coordinate mod ep.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expert: bool,
    /// The buffer the runtime initializes with this shard.
    pub init: BufferId,
}

/// A half-open box of the full tensor, one range per axis.
pub type Box = Vec<(u64, u64)>;

/// A shard resolved for one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Boxes of the full tensor forming the rank's tensor-parallel shard, in order.
    pub boxes: Vec<Box>,
    /// The rank's owned flat range of the local shard (ZeRO), `[start, end)` clamped to n.
    pub owned: (u64, u64),
    /// Zero padding after the boxes along the split axis ([`TpSplit::padded`]).
    pub pad: Option<Pad>,
}

/// Zero rows after a shard's box along its split axis: the local shard is `rows` longer there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pad {
    pub axis: usize,
    pub rows: u64,
}

impl Slice {
    /// Elements of the local shard, padding included.
    pub fn len(&self) -> u64 {
        let boxes: u64 = self.boxes.iter().map(volume).sum();
        boxes + self.pad_elements()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements of the padding: `rows` of the shard's cross-section.
    fn pad_elements(&self) -> u64 {
        match (self.pad, self.boxes.first()) {
            (Some(p), Some(b)) => b
                .iter()
                .enumerate()
                .map(|(a, r)| if a == p.axis { p.rows } else { r.1 - r.0 })
                .product(),
            _ => 0,
        }
    }
}

fn volume(b: &Box) -> u64 {
    b.iter().map(|(s, e)| e - s).product()
}

/// Where a rank sits in the mesh, as a parameter shard needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardAt {
    pub tp: u32,
    pub tp_rank: u32,
    pub dp: u32,
    pub dp_rank: u32,
    /// Expert-parallel degree (1: experts whole on every rank).
    pub ep: u32,
}

impl ShardAt {
    /// The position in `mesh` of the rank at `coords`.
    pub fn of(mesh: &MeshInfo, coords: Coords) -> ShardAt {
        ShardAt {
            tp: mesh.tp,
            tp_rank: coords.tp,
            dp: mesh.dp,
            dp_rank: coords.dp,
            ep: mesh.ep,
        }
    }
}

impl ParamShard {
    /// The rank's slice at tp coordinate `tp_rank` of `tp`, dp coordinate `dp_rank` of `dp`.
    pub fn slice(&self, full: &[u64], tp: u32, tp_rank: u32, dp: u32, dp_rank: u32) -> Slice {
        self.slice_at(
            full,
            ShardAt {
                tp,
                tp_rank,
                dp,
                dp_rank,
                ep: 1,
            },
        )
    }

    /// The rank's slice at `at` (expert shards by its expert-parallel coordinate).
    pub fn slice_at(&self, full: &[u64], at: ShardAt) -> Slice {
        let ShardAt {
            tp,
            tp_rank,
            mut dp,
            mut dp_rank,
            ep,
        } = at;
        let ep = ep.max(1);
        let mut whole: Box = full.iter().map(|&d| (0, d)).collect();
        if self.expert {
            if let Some(r) = whole.first_mut() {
                let per = r.1 / u64::from(ep);
                let start = per * u64::from(dp_rank % ep);
                *r = (start, start + per);
            }
            // ZeRO slices over the ranks that hold the same experts.
            dp = (dp / ep).max(1);
            dp_rank /= ep;
        }
        let (boxes, pad) = match self.tp {
            None => (vec![whole], None),
            Some(s) => s.boxes(&whole, tp, tp_rank),
        };
        let n = Slice {
            boxes: boxes.clone(),
            owned: (0, 0),
            pad,
        }
        .len();
        let owned = if self.zero {
            let per = n.div_ceil(u64::from(dp.max(1)));
            let s = (per * u64::from(dp_rank)).min(n);
            (s, (s + per).min(n))
        } else {
            (0, n)
        };
        Slice { boxes, owned, pad }
    }
}

/// A parameter of the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamInfo {
    pub name: String,
    pub shape: Vec<u64>,
}

/// One instruction list shared by every rank that points to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Template {
    pub id: TemplateId,
    /// Pipeline stage of its ranks.
    pub stage: u32,
    /// Model chunks it runs (pipeline order).
    pub chunks: Vec<u32>,
    pub buffers: Vec<BufferDecl>,
    pub shards: Vec<ParamShard>,
    /// Run once before the first iteration (persistent buffers, initial values).
    pub init: Vec<Instr>,
    /// Run every iteration.
    pub instrs: Vec<Instr>,
}

impl Template {
    pub fn buffer(&self, b: BufferId) -> Option<&BufferDecl> {
        self.buffers.get(b.index())
    }
}

/// Mesh coordinates of a rank (rank = tp + tp_size·(dp + dp_size·pp)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Coords {
    pub tp: u32,
    pub dp: u32,
    pub pp: u32,
}

/// One rank: its coordinates, template and resolved roles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub coords: Coords,
    pub template: TemplateId,
    /// Group per [`Slot`] (`tp`, `dp`, `tied`), `None` where the rank has no such group.
    pub groups: Vec<Option<GroupId>>,
    pub prev: u32,
    pub next: u32,
}

impl RankInfo {
    pub fn group(&self, s: Slot) -> Option<GroupId> {
        let i = Slot::ALL.iter().position(|&x| x == s)?;
        self.groups.get(i).copied().flatten()
    }

    pub fn peer(&self, p: Peer) -> u32 {
        match p {
            Peer::Prev => self.prev,
            Peer::Next => self.next,
        }
    }
}

/// A communicator: its members in group-index order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub id: GroupId,
    pub slot: Slot,
    pub ranks: Vec<u32>,
}

/// The mesh shape and schedule the programs implement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeshInfo {
    pub tp: u32,
    pub dp: u32,
    pub pp: u32,
    pub virtual_stages: u32,
    pub micro_batches: u32,
    pub micro_batch: u64,
    pub seq: u64,
    pub schedule: String,
    pub zero: u8,
    pub recompute: String,
    pub sequence_parallel: bool,
    pub precision: String,
    /// Expert-parallel degree (programs written before it existed: 1).
    #[serde(default = "one")]
    pub ep: u32,
    /// Context-parallel degree (programs written before it existed: 1). With `cp` > 1 each
    /// sequence is split over `cp` consecutive dp coordinates (`Slot::Cp`), so `dp` counts
    /// the ranks that share the weights and reduce their gradients (Megatron's data-parallel
    /// group with context parallelism: data parallelism × cp); the batch is split over
    /// `dp / cp` of them.
    #[serde(default = "one")]
    pub cp: u32,
    /// `fused` (FlashAttention-style: the backward rebuilds the scores from the saved
    /// log-sum-exp) or `materialized` (the scores are saved). Programs written before this
    /// field read as `materialized`.
    #[serde(default = "materialized")]
    pub attention: String,
}

impl MeshInfo {
    /// The data-parallel replicas the global batch is split over: `dp / cp` (each sequence's
    /// `cp` chunk holders count once).
    pub fn batch_replicas(&self) -> u32 {
        self.dp / self.cp.max(1)
    }
}

fn one() -> u32 {
    1
}

fn materialized() -> String {
    "materialized".into()
}

/// What the plan predicted per stage, for the verifier's memory comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    pub stage: u32,
    pub peak_memory_bytes: f64,
}

/// Every rank's program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgramSet {
    pub format: String,
    pub model: String,
    pub mesh: MeshInfo,
    pub params: Vec<ParamInfo>,
    pub groups: Vec<Group>,
    pub predicted: Vec<Predicted>,
    pub ranks: Vec<RankInfo>,
    pub templates: Vec<Template>,
}

impl ProgramSet {
    pub fn template(&self, t: TemplateId) -> Option<&Template> {
        self.templates.get(t.index())
    }

    pub fn rank(&self, r: u32) -> Option<&RankInfo> {
        self.ranks.get(r as usize)
    }

    pub fn group(&self, g: GroupId) -> Option<&Group> {
        self.groups.get(g.index())
    }

    /// Gives rank `r` its own copy of its template (so a test can mutate one rank alone).
    pub fn detach(&mut self, r: u32) -> Option<&mut Template> {
        let info = self.ranks.get(r as usize)?;
        let mut t = self.templates.get(info.template.index())?.clone();
        let id = TemplateId(self.templates.len() as u32);
        t.id = id;
        self.templates.push(t);
        self.ranks.get_mut(r as usize)?.template = id;
        self.templates.last_mut()
    }
}

impl fmt::Display for Coords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp {} dp {} pp {}", self.tp, self.dp, self.pp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An expert weight [experts 4, in 2, out 6] at ep 2 within dp 4, split by columns over tp
    /// 2, ZeRO-sliced: each rank holds its two experts' column block, and its ZeRO slice is cut
    /// over the two ranks holding the same experts.
    #[test]
    fn expert_shards_split_the_expert_axis_and_slice_over_their_replicas() {
        let sh = ParamShard {
            param: ParamId(0),
            tp: Some(TpSplit {
                axis: 2,
                blocks: 1,
                part: None,
                padded: false,
            }),
            zero: true,
            expert: true,
            init: BufferId(0),
        };
        let at = |tp_rank, dp_rank| ShardAt {
            tp: 2,
            tp_rank,
            dp: 4,
            dp_rank,
            ep: 2,
        };
        let full = [4, 2, 6];
        // dp 3: expert block 3 mod 2 = 1 (experts 2..4), tp 1: columns 3..6.
        let s = sh.slice_at(&full, at(1, 3));
        assert_eq!(s.boxes, vec![vec![(2, 4), (0, 2), (3, 6)]]);
        // 12 local elements over dp / ep = 2 replicas; dp 3 is replica 1.
        assert_eq!(s.owned, (6, 12));
        // dp 2 holds experts 0..2 again, as replica 1; dp 1 holds experts 2..4 as replica 0.
        assert_eq!(sh.slice_at(&full, at(0, 2)).boxes[0][0], (0, 2));
        assert_eq!(sh.slice_at(&full, at(0, 1)).owned, (0, 6));
        // A dense shard ignores ep.
        let dense = ParamShard {
            expert: false,
            ..sh
        };
        assert_eq!(dense.slice_at(&full, at(1, 3)).boxes[0][0], (0, 4));
        assert_eq!(dense.slice_at(&full, at(1, 3)).owned, (18, 24));
    }
}
