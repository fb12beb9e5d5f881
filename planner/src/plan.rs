//! `plan.json`: the plan a search chose, complete enough for codegen and for `plait report`.
//!
//! Plain data, versioned (`"format": "plait-plan/1"`), deterministic: the same inputs give a
//! byte-identical file (no timestamps, no timings, stable field and list order).

use serde::{Deserialize, Serialize};

use crate::cost::compute::{TpLayout, tp_layout};
use crate::error::PlanError;
use crate::estimate::{Estimate, Predicted};
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::search::Alternative;
use crate::strategy::Strategy;

pub const FORMAT: &str = "plait-plan/1";

/// `sharding.method` of a plan whose program runs Megatron-LM's per-op rules.
pub const RULES_METHOD: &str = "megatron-rules";

/// Where the model came from, so codegen and report can load it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRef {
    /// `zoo`, `config` or `onnx`.
    pub source: String,
    /// The zoo name or the file path as given.
    pub reference: String,
    pub name: String,
    pub params: u64,
    pub layers: u32,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    /// The forward graph the plan was made for, in plait's IR text form: codegen lowers it
    /// without reopening the model file, so a plan moved to another directory still lowers and
    /// runs. Absent in plans written before it was recorded (the CLI then loads `reference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ir: Option<String>,
}

impl ModelRef {
    /// The reference to the model `info` describes, loaded from `reference` (a `source`: `zoo`,
    /// `config` or `onnx`), with its forward graph's IR text.
    pub fn of(source: &str, reference: &str, info: &ModelInfo<'_>) -> ModelRef {
        ModelRef {
            source: source.into(),
            reference: reference.into(),
            name: info.graph.name.clone(),
            params: info.params(),
            layers: info.layers,
            hidden: info.hidden,
            heads: info.heads,
            kv_heads: info.kv_heads,
            vocab: info.vocab,
            ir: Some(ir::text::print(info.graph)),
        }
    }
}

/// How a segment's TP communication is priced from the method `compile` recorded for it.
fn recorded_pricing(
    tp: u32,
    recorded: bool,
    method: Option<&str>,
) -> crate::estimate::TpPricing<'_> {
    use crate::estimate::TpPricing;
    let Some(method) = method.filter(|_| tp > 1 && recorded) else {
        return TpPricing::Extraction;
    };
    if !method.starts_with(RULES_METHOD) {
        return TpPricing::Lowered;
    }
    let why = method[RULES_METHOD.len()..].trim_start();
    let why = why.strip_prefix('(').and_then(|w| w.strip_suffix(')'));
    TpPricing::Rules(why.unwrap_or("the program runs the rules"))
}

impl Plan {
    /// The plan's pipeline chunks against its strategy and model of `layers` layers: pp ×
    /// virtual stages chunks, chunk c on stage c mod pp, each a non-empty run of layers
    /// starting where the previous ended, together every layer once, the embedding on the
    /// first and the head on the last (a hand-edited plan is refused here, naming the field,
    /// not lowered or exported from a broken split).
    pub fn check_chunks(&self, layers: u32) -> Result<(), PlanError> {
        let s = &self.strategy;
        let expected = s.pp.saturating_mul(s.virtual_stages);
        let bad = |why: String| PlanError::invalid(format!("chunks: {why}"));
        if self.chunks.len() as u64 != u64::from(expected) {
            return Err(bad(format!(
                "{} chunks, where pp {} × virtual stages {} = {expected}",
                self.chunks.len(),
                s.pp,
                s.virtual_stages
            )));
        }
        // The strategy's split is what the plan was priced for: chunks edited apart from it
        // would lower a pipeline the plan never predicted.
        let split = s.chunk_layers(layers);
        let last = expected.saturating_sub(1);
        let mut next = 0;
        for (i, c) in self.chunks.iter().enumerate() {
            let i = i as u32;
            if c.chunk != i || c.stage != i % s.pp.max(1) {
                return Err(bad(format!(
                    "entry {i} is chunk {} on stage {}, where chunk {i} runs on stage {}",
                    c.chunk,
                    c.stage,
                    i % s.pp.max(1)
                )));
            }
            if c.layers[0] != next || c.layers[1] <= c.layers[0] {
                return Err(bad(format!(
                    "chunk {i} holds layers {:?}: each holds at least one layer, from where \
                     the previous ended ({next})",
                    c.layers
                )));
            }
            let held = c.layers[1] - c.layers[0];
            if let Some(&want) = split.get(i as usize)
                && held != want
            {
                return Err(bad(format!(
                    "chunk {i} holds {held} layers where the strategy's split gives it {want} \
                     (`strategy.stage_layers` {split:?}); edit both together, or compile again"
                )));
            }
            if (c.embedding && i != 0) || (c.head && i != last) {
                return Err(bad(format!(
                    "chunk {i} says it holds the {}: the embedding belongs on the first chunk \
                     only and the head on the last only",
                    if c.embedding && i != 0 {
                        "embedding"
                    } else {
                        "head"
                    }
                )));
            }
            next = c.layers[1];
        }
        let ends = (self.chunks.first(), self.chunks.last());
        if next != layers {
            return Err(bad(format!("the chunks hold {next} layers of {layers}")));
        }
        if let (Some(first), Some(last)) = ends
            && (!first.embedding || !last.head)
        {
            return Err(bad(
                "the embedding belongs on the first chunk and the head on the last".into(),
            ));
        }
        Ok(())
    }

    /// The recorded extraction of run `run` of identical layers (0: the first, `block_plan`).
    pub fn run_block_plan(&self, run: usize) -> Option<&crate::sharding::BlockPlan> {
        match run {
            0 => self.block_plan.as_ref(),
            r => self.run_block_plans.get(r - 1),
        }
    }
}

/// One model chunk: a contiguous range of decoder layers on one pipeline stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkPlan {
    pub chunk: u32,
    pub stage: u32,
    /// First layer and one past the last.
    pub layers: [u32; 2],
    pub embedding: bool,
    pub head: bool,
}

/// How one op of the repeated block is laid out across the tensor-parallel group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSharding {
    /// Position of the op in the block's op list.
    pub index: u32,
    pub op: String,
    /// `replicated`, `split` (heads, columns or rows), or `sequence` (sequence parallel).
    pub layout: String,
    /// Collective that follows the op in the forward pass, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward_collective: Option<String>,
    /// Collective its gradient needs in the backward pass, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backward_collective: Option<String>,
}

/// The per-layer sharding (identical for every layer) as the program runs it: the e-graph
/// extraction's layouts and collectives where `method` names the e-graph
/// ([`extracted_ops`]), Megatron-LM's rule ([`megatron_sharding`]) otherwise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockSharding {
    pub tp: u32,
    pub sequence_parallel: bool,
    /// What produced it: `megatron-rules` or the e-graph extraction with its solver status.
    pub method: String,
    /// What laid out the embedding and the head (the ops outside the layers), in the same
    /// terms: `e-graph + …` where the program runs their recorded extraction
    /// (`embedding_head_plan`), `megatron-rules (why)` where it runs the rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_head: Option<String>,
    pub ops: Vec<OpSharding>,
}

/// Summary of the search that produced the plan (no timings: they would break determinism).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchSummary {
    pub candidates_evaluated: u64,
    pub candidates_pruned: u64,
    /// The engine the search kept to (`plait compile --target`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<crate::engine::Engine>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub format: String,
    pub model: ModelRef,
    pub cluster: Cluster,
    pub gpus: u64,
    pub strategy: Strategy,
    pub chunks: Vec<ChunkPlan>,
    pub sharding: BlockSharding,
    /// The per-op sharding and collectives extracted from the e-graph (at tp 1, the whole
    /// block on every rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_plan: Option<crate::sharding::BlockPlan>,
    /// The extraction of each later run of identical layers, in order (a block that changes
    /// structure: DeepSeek-V3's expert layers after its dense ones); `block_plan` is the first
    /// run's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_block_plans: Vec<crate::sharding::BlockPlan>,
    /// The expert-parallel group's extraction (ep > 1) of the first run of layers with routed
    /// experts: where the expert layer's tokens are gathered and its output reduced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_block_plan: Option<crate::sharding::BlockPlan>,
    /// The extraction of the ops outside the layers (embedding before them; final norm, head
    /// and loss after them), as one list: [`crate::sharding_costs::outer_ops`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_head_plan: Option<crate::sharding::BlockPlan>,
    pub predicted: Predicted,
    pub search: SearchSummary,
    pub alternatives: Vec<Alternative>,
}

impl Plan {
    pub fn new(
        model: ModelRef,
        info: &ModelInfo<'_>,
        cluster: &Cluster,
        gpus: u64,
        best: &Estimate,
        search: SearchSummary,
        alternatives: Vec<Alternative>,
    ) -> Plan {
        let s = &best.strategy;
        let layers = s.chunk_layers(info.layers);
        let n = layers.len() as u32;
        let mut start = 0;
        let chunks = layers
            .iter()
            .enumerate()
            .map(|(c, &l)| {
                let c = c as u32;
                let chunk = ChunkPlan {
                    chunk: c,
                    stage: c % s.pp,
                    layers: [start, start + l],
                    embedding: c == 0,
                    head: c + 1 == n,
                };
                start += l;
                chunk
            })
            .collect();
        Plan {
            format: FORMAT.into(),
            model,
            cluster: cluster.clone(),
            gpus,
            strategy: s.clone(),
            chunks,
            sharding: megatron_sharding(info, s),
            block_plan: None,
            run_block_plans: Vec::new(),
            expert_block_plan: None,
            embedding_head_plan: None,
            predicted: best.predicted.clone(),
            search,
            alternatives,
        }
    }

    /// How the plan's TP communication is priced, from what `compile` recorded its program
    /// runs: the extraction it lowered (`sharding.method`, or `sharding.embedding_head` for the
    /// ops outside the layers, names the e-graph), Megatron-LM's rule (`megatron-rules
    /// (why)`), or, where no extraction was recorded, as the search prices a candidate.
    pub fn tp_pricing(&self) -> crate::estimate::Pricing<'_> {
        let tp = self.strategy.tp;
        crate::estimate::Pricing {
            layer: recorded_pricing(tp, self.block_plan.is_some(), Some(&self.sharding.method)),
            embedding_head: recorded_pricing(
                tp,
                self.embedding_head_plan.is_some(),
                self.sharding.embedding_head.as_deref(),
            ),
        }
    }

    /// Reads a plan, checking its format version.
    pub fn from_json(text: &str, file: &str) -> Result<Plan, PlanError> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PlanError::ClusterFile {
                file: file.into(),
                message: format!("not a valid plan (JSON error at line {}: {e})", e.line()),
            })?;
        match v.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT) => {}
            Some(other) => {
                return Err(PlanError::ClusterFile {
                    file: file.into(),
                    message: format!(
                        "plan format `{other}` is not supported; this plait reads `{FORMAT}`"
                    ),
                });
            }
            None => {
                return Err(PlanError::ClusterFile {
                    file: file.into(),
                    message: format!(
                        "no `format` field; expected \"{FORMAT}\" (is this a plan.json?)"
                    ),
                });
            }
        }
        let mut unknown = Vec::new();
        let plan: Plan = serde_ignored::deserialize(v, |path| unknown.push(path.to_string()))
            .map_err(|e| PlanError::ClusterFile {
                file: file.into(),
                message: format!("not a valid {FORMAT} plan: {e}"),
            })?;
        // A key plait does not read is refused, not dropped: a hand edit's `zer0` would
        // otherwise leave the plan as it was without a word.
        if let Some(first) = unknown.first() {
            return Err(PlanError::ClusterFile {
                file: file.into(),
                message: format!(
                    "`{first}` is no field of a {FORMAT} plan{}; remove it or fix its name",
                    if unknown.len() > 1 {
                        format!(" (nor are {})", unknown[1..].join(", "))
                    } else {
                        String::new()
                    }
                ),
            });
        }
        // The cluster it carries, as a cluster file is checked (a plan edited to a negative
        // memory would otherwise be reported and run against it).
        plan.cluster.validate(&format!("{file} (its `cluster`)"))?;
        Ok(plan)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// The per-op table of an extraction (`plan.block_plan`): each computed op's layout
/// (`replicated`; `sequence` for a piece along the sequence under sequence parallelism;
/// `split` for any other piece or partial sum) and the collectives the extraction places after
/// it in each pass (a once-per-step gradient reduction marked so), joined in order.
pub fn extracted_ops(graph: &ir::Graph, bp: &crate::sharding::BlockPlan) -> Vec<OpSharding> {
    use crate::sharding::{Layout, Pass};
    let after = |position: usize, pass: Pass| -> Option<String> {
        let names: Vec<String> = bp
            .collectives
            .iter()
            .filter(|c| c.after_position == Some(position) && c.pass == pass)
            .map(|c| {
                let name = c.kind.name();
                if c.per_step {
                    format!("{name} (once per step)")
                } else {
                    name.to_string()
                }
            })
            .collect();
        (!names.is_empty()).then(|| names.join(", "))
    };
    bp.ops
        .iter()
        .filter_map(|op| {
            // A parameter is listed where its gradient is reduced (an SP norm weight).
            let reduced = bp
                .collectives
                .iter()
                .any(|c| c.after_position == Some(op.position));
            if graph.op(op.op).kind.is_source() && !reduced {
                return None;
            }
            let layout = match op.output.as_ref()? {
                Layout::Replicated => "replicated",
                Layout::Split { axis: 1, .. } if bp.sequence_parallel => "sequence",
                Layout::Split { .. } | Layout::Partial => "split",
            };
            Some(OpSharding {
                index: op.position as u32,
                op: op.mnemonic.clone(),
                layout: layout.into(),
                forward_collective: after(op.position, Pass::Forward),
                backward_collective: after(op.position, Pass::Backward),
            })
        })
        .collect()
}

/// Megatron-LM's sharding of the block (the cost model's rule), written out per op.
pub fn megatron_sharding(info: &ModelInfo<'_>, s: &Strategy) -> BlockSharding {
    let g = info.graph;
    let ops = info
        .layer_ops
        .iter()
        .enumerate()
        .filter(|(_, o)| !g.op(**o).kind.is_source())
        .map(|(i, &o)| {
            let op = g.op(o);
            let layout = tp_layout(g, o, info.hidden, s.sequence_parallel);
            let width = |v| g.ty(v).shape.last().and_then(|d| d.fixed());
            let producer = g.def_op(op.inputs.first().copied().unwrap_or(op.results[0]));
            let row_parallel = matches!(op.kind, ir::OpKind::Linear { .. })
                && width(op.results[0]) == Some(info.hidden)
                && tp_layout(g, producer, info.hidden, false) == TpLayout::Split
                && !g.op(producer).kind.is_source();
            let column_parallel = matches!(op.kind, ir::OpKind::Linear { .. })
                && width(op.inputs[0]) == Some(info.hidden)
                && width(op.results[0]) != Some(info.hidden);
            let tp = s.tp > 1;
            let (fwd, bwd) = match (tp, row_parallel, column_parallel, s.sequence_parallel) {
                (true, true, _, false) => (Some("all-reduce".into()), None),
                (true, true, _, true) => (Some("reduce-scatter".into()), None),
                (true, _, true, false) => (None, Some("all-reduce".into())),
                (true, _, true, true) => (
                    Some("all-gather (input)".into()),
                    Some("reduce-scatter".into()),
                ),
                _ => (None, None),
            };
            let layout = match (layout, s.tp > 1, s.sequence_parallel) {
                (_, false, _) => "replicated",
                (TpLayout::Split, true, true)
                    if !row_parallel
                        && !column_parallel
                        && width(op.results[0]) == Some(info.hidden) =>
                {
                    "sequence"
                }
                (TpLayout::Split, true, _) => "split",
                (TpLayout::Replicated, true, _) => "replicated",
            };
            OpSharding {
                index: i as u32,
                op: op.kind.mnemonic().into(),
                layout: layout.into(),
                forward_collective: fwd,
                backward_collective: bwd,
            }
        })
        .collect();
    BlockSharding {
        tp: s.tp,
        sequence_parallel: s.sequence_parallel,
        method: RULES_METHOD.into(),
        embedding_head: None,
        ops,
    }
}
