//! The sharding extraction's cost oracle, backed by plait's own cost model: the roofline of
//! [`crate::cost::compute::Device`] and the α–β collectives of [`crate::cost::comm`] over the
//! tensor-parallel group of the strategy's mesh (or its expert-parallel group).

use ir::{Binding, OpId};

use crate::cost::comm::{Collective, Group, collective_time, mesh_ep};
use crate::cost::compute::Device;
use crate::error::PlanError;
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::sharding::{
    BlockPlan, CollectiveKind, ComputeKind, CostOracle, ShardError, ShardOptions, plan_ops,
};
use crate::strategy::Strategy;

/// Seconds per kernel and per TP collective as the estimate sees them.
#[derive(Debug)]
pub struct ClusterCosts<'c> {
    device: Device<'c>,
    cluster: &'c Cluster,
    /// The group the block's collectives run over.
    group: Group,
    /// Element-size scale from the graph's dtype to the run's precision.
    act_scale: f64,
    /// A replicated weight's gradient is reduced once per step: the share of it one
    /// micro-batch pays (1/m for m micro-batches per step).
    gradient_share: f64,
    /// Whether kept activations count toward the extraction's memory limit (off when the limit
    /// is a parameter-storage budget, [`parameter_budget`]).
    count_activations: bool,
}

impl<'c> ClusterCosts<'c> {
    /// Costs over the strategy's tensor-parallel group.
    pub fn new(cluster: &'c Cluster, s: &Strategy, act_scale: f64) -> Option<ClusterCosts<'c>> {
        ClusterCosts::over(cluster, s, act_scale, |m| m.tp)
    }

    /// Costs over the group `pick` chooses from the strategy's mesh.
    fn over(
        cluster: &'c Cluster,
        s: &Strategy,
        act_scale: f64,
        pick: impl Fn(&crate::cost::comm::Mesh) -> Group,
    ) -> Option<ClusterCosts<'c>> {
        let u = u64::from;
        let mesh = mesh_ep(cluster, u(s.tp), 1, u(s.dp), u(s.pp), u(s.ep.max(1)));
        Some(ClusterCosts {
            device: Device::new(cluster, s.precision, s.attention, s.kernels, false)?,
            cluster,
            group: pick(&mesh),
            act_scale,
            gradient_share: 1.0 / s.micro_batches().max(1) as f64,
            count_activations: true,
        })
    }
}

/// The cost model's collective of the sharding's kind.
pub(crate) fn collective_of(kind: CollectiveKind) -> Collective {
    match kind {
        CollectiveKind::AllReduce => Collective::AllReduce,
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        CollectiveKind::AllToAll => Collective::AllToAll,
    }
}

/// Bytes a collective moves per byte an extraction lists (at the graph's dtype): the run's
/// activation bytes over the graph's element size.
pub(crate) fn traffic_scale(info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy) -> f64 {
    let g = info.graph;
    let elem = info
        .layer_ops
        .first()
        .and_then(|&o| g.op(o).results.first().map(|&v| g.ty(v).dtype.size_bytes()))
        .unwrap_or(4) as f64;
    cluster.activation_traffic_bytes(s.precision) / elem
}

impl CostOracle for ClusterCosts<'_> {
    fn compute_seconds(&self, kind: ComputeKind, flops: f64, bytes: f64) -> f64 {
        let compute = match kind {
            ComputeKind::Matmul => flops / self.device.matmul_peak,
            ComputeKind::Elementwise => flops / self.device.vector_peak,
        };
        compute.max(bytes * self.act_scale / self.device.hbm) + self.device.launch
    }

    fn collective_seconds(&self, kind: CollectiveKind, bytes: f64, _group: u32) -> f64 {
        let kind = collective_of(kind);
        collective_time(self.cluster, &self.group, kind, bytes * self.act_scale)
    }

    fn weight_gradient_share(&self) -> f64 {
        self.gradient_share
    }

    fn activation_memory_bytes(&self, bytes: f64) -> f64 {
        if self.count_activations { bytes } else { 0.0 }
    }
}

/// The parameter storage per rank that the estimate's memory model allots one block: each
/// matrix 1/tp of its bytes (`dense_params_per_layer / tp`) but those kept whole
/// ([`crate::model::whole`]: a router, MLA's latent down-projections), vectors (norm
/// weights, the bias a row-parallel product adds after its reduction) whole, as Megatron-LM
/// keeps them. The
/// extraction must store the block's parameters within it, so the memory the plan was
/// proven to fit holds for the layout it records; how the parameters are read (split,
/// gathered) stays the extraction's choice.
fn parameter_budget(info: &ModelInfo<'_>, tp: u32, b: Binding) -> f64 {
    let share = 1.0 / f64::from(tp.max(1));
    let whole = crate::model::whole::whole_at(info.graph, &info.layer_ops, tp);
    budget_of(info, &info.layer_ops, b, |v| {
        if g_rank(info, v) >= 2 && !whole.contains(&v) {
            share
        } else {
            1.0
        }
    })
}

fn g_rank(info: &ModelInfo<'_>, v: ir::ValueId) -> usize {
    info.graph.ty(v).shape.rank()
}

/// The parameter storage per rank the memory model allots the ops outside the layers: the
/// vocabulary-sized matrices ([`ModelInfo::vocabulary_matrix`]: the token table, the head)
/// ⌈vocab / tp⌉ rows where the vocabulary splits, everything else (a learned position table,
/// the final norm) whole, as Megatron-LM keeps them.
fn outer_parameter_budget(info: &ModelInfo<'_>, ops: &[OpId], tp: u32, b: Binding) -> f64 {
    budget_of(info, ops, b, |v| info.outer_param_share(v, tp))
}

/// The bytes per rank of the parameters among `ops`, each at the `share` of it a rank stores.
fn budget_of(
    info: &ModelInfo<'_>,
    ops: &[OpId],
    b: Binding,
    share: impl Fn(ir::ValueId) -> f64,
) -> f64 {
    let g = info.graph;
    ops.iter()
        .filter(|&&o| matches!(g.op(o).kind, ir::OpKind::Param { .. }))
        .map(|&o| {
            let v = g.op(o).results[0];
            let ty = g.ty(v);
            ty.bytes(b) as f64 * share(v)
        })
        .sum()
}

/// Extracts the sharding of the strategy's block by equality saturation + exact extraction,
/// at the rank's share of the sequence (`seq / cp`: the block's tensor-parallel collectives
/// carry the rank's tokens, as the estimate prices them). Solver timings are cleared so that plans stay byte-identical across runs.
pub fn block_plan(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
) -> Result<BlockPlan, PlanError> {
    block_plan_with_share(info, cluster, s, None)
}

/// [`block_plan`] with a replicated weight's gradient reduction priced at `share` of its
/// time per micro-batch instead of the strategy's 1/m ([`crate::layer_tp`] solves the two
/// ends, 0 and 1, to find the layout of every m at once).
pub fn block_plan_with_share(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    share: Option<f64>,
) -> Result<BlockPlan, PlanError> {
    let b = binding(s);
    let opts = ShardOptions {
        memory_limit_bytes: Some(parameter_budget(info, s.tp, b)),
        experts_split_outside: s.ep > 1,
        ..ShardOptions::new(s.tp, s.sequence_parallel, b)
    };
    extract(
        info,
        cluster,
        s,
        &info.layer_ops,
        &opts,
        |m| m.tp,
        false,
        share,
    )
}

/// The ops outside the layers as one list: the embedding before them, then the final norm,
/// head and loss after them. One extraction lays both out, so a tied table is one parameter
/// held in one layout by the embedding and the head.
pub fn outer_ops(info: &ModelInfo<'_>) -> Vec<OpId> {
    info.pre_ops.iter().chain(&info.post_ops).copied().collect()
}

/// The sharding extraction of the embedding and head ([`outer_ops`]) under strategy `s`, over
/// its tensor-parallel group, with a replicated weight's gradient reduction priced at `share`
/// of its time (the strategy's 1/m where `None`). The tables and weights with a vocabulary axis
/// must be stored 1/tp per rank ([`outer_parameter_budget`]), or as little as any layout
/// stores them where the vocabulary does not split.
pub fn embedding_head_plan_with_share(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    share: Option<f64>,
) -> Result<BlockPlan, PlanError> {
    let ops = outer_ops(info);
    let b = binding(s);
    let opts = ShardOptions {
        memory_limit_bytes: Some(outer_parameter_budget(info, &ops, s.tp, b)),
        padded_dim: info.vocabulary_padding(s.tp),
        ..ShardOptions::new(s.tp, s.sequence_parallel, b)
    };
    extract(info, cluster, s, &ops, &opts, |m| m.tp, false, share)
}

/// [`embedding_head_plan_with_share`] at the strategy's own micro-batch count.
pub fn embedding_head_plan(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
) -> Result<BlockPlan, PlanError> {
    embedding_head_plan_with_share(info, cluster, s, None)
}

/// The expert-parallel group's extraction of the strategy's block
/// ([`ShardOptions::expert_group`]): where the expert layer's tokens are gathered and its
/// output reduced, priced over the expert-parallel group. One micro-batch per rank of the
/// group, whole sequences (tensor parallelism, if any, gathers them first). The block is the
/// first run of layers with routed experts (DeepSeek's dense first layers have none).
pub fn expert_block_plan(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
) -> Result<BlockPlan, PlanError> {
    let runs = info.runs();
    let info = runs
        .iter()
        .map(|r| r.info)
        .find(|i| i.expert_params_per_layer > 0)
        .unwrap_or(info);
    let b = binding(s);
    let opts = ShardOptions::expert_group(
        s.ep,
        Binding {
            batch: b.batch * u64::from(s.ep),
            ..b
        },
    );
    extract(
        info,
        cluster,
        s,
        &info.layer_ops,
        &opts,
        |m| m.ep,
        true,
        None,
    )
}

fn binding(s: &Strategy) -> Binding {
    Binding {
        batch: s.micro_batch,
        seq: s.local_seq(),
    }
}

#[allow(clippy::too_many_arguments)] // the one place the extraction's inputs meet
fn extract(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    ops: &[OpId],
    opts: &ShardOptions,
    group: impl Fn(&crate::cost::comm::Mesh) -> Group,
    count_activations: bool,
    share: Option<f64>,
) -> Result<BlockPlan, PlanError> {
    let g = info.graph;
    let scale = traffic_scale(info, cluster, s);
    let mut costs = ClusterCosts::over(cluster, s, scale, group).ok_or_else(|| {
        PlanError::invalid(format!(
            "{} has no {} support",
            cluster.gpu.name, s.precision
        ))
    })?;
    costs.count_activations = count_activations;
    if let Some(share) = share {
        costs.gradient_share = share;
    }
    // Parameters no rule can split (a router's weight) may leave every program above the
    // budget: then the least storage any program needs is the budget.
    let mut plan = match plan_ops(g, ops, opts, &costs) {
        Err(ShardError::OutOfMemory { needed_bytes, .. }) => {
            let relaxed = ShardOptions {
                memory_limit_bytes: Some(needed_bytes * (1.0 + 1e-9)),
                ..*opts
            };
            plan_ops(g, ops, &relaxed, &costs)
        }
        done => done,
    }
    .map_err(|e| PlanError::Sharding {
        message: e.to_string(),
    })?;
    plan.solve.seconds = 0.0;
    Ok(plan)
}

/// Whether an expert-parallel extraction chose the layout `plait codegen` lowers (Megatron-Core's
/// all-gather dispatcher): each expert layer reads the group's whole tokens and gates sliced to
/// its experts, holds its experts' block of every weight, and leaves a partial sum; its tokens
/// and their routing weights are all-gathered along the batch before it and its output
/// reduce-scattered along the batch after it, and nothing else of the block communicates in
/// the forward (every other op on the rank's own sequences). `Err` says what the extraction
/// chose instead.
pub fn expert_layout_is_lowered(bp: &BlockPlan) -> Result<(), String> {
    use crate::sharding::{CollectiveKind, Layout, Pass};
    let experts_split = Layout::Split { axis: 0, blocks: 1 };
    let mut found = false;
    for op in bp.ops.iter().filter(|o| o.mnemonic == "moe_experts") {
        found = true;
        let inputs = &op.inputs;
        let gates_sliced = matches!(inputs.get(1), Some(Layout::Split { blocks: 1, .. }));
        if inputs.first() != Some(&Layout::Replicated)
            || !gates_sliced
            || inputs.iter().skip(2).any(|l| *l != experts_split)
            || op.output != Some(Layout::Partial)
        {
            return Err(format!(
                "expert layer at position {} reads {:?} and writes {:?}",
                op.position, inputs, op.output
            ));
        }
    }
    if !found {
        return Err("the block has no expert layer".into());
    }
    let layers = bp
        .ops
        .iter()
        .filter(|o| o.mnemonic == "moe_experts")
        .count();
    let forward: Vec<_> = bp
        .collectives
        .iter()
        .filter(|c| c.pass == Pass::Forward)
        .collect();
    let of = |kind| {
        forward
            .iter()
            .filter(|c| c.kind == kind && c.axis == Some(0))
            .count()
    };
    if of(CollectiveKind::AllGather) != 2 * layers
        || of(CollectiveKind::ReduceScatter) != layers
        || forward.len() != 3 * layers
    {
        let list: Vec<String> = forward
            .iter()
            .map(|c| format!("{} after op {:?}", c.kind.name(), c.after_position))
            .collect();
        return Err(format!(
            "the forward communicates beyond the dispatch: {}",
            list.join(", ")
        ));
    }
    Ok(())
}
