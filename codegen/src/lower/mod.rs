//! Lowering: training graph + plan + cluster → one program template per pipeline stage.
//!
//! Each template runs, once, an initialization (the reserve, persistent parameter, gradient
//! and optimizer buffers by ZeRO stage, parameter loading), then per iteration: zeroed gradient
//! accumulators; the device's (chunk, micro-batch, forward|backward) tasks in the schedule's
//! order (`planner::cost::pipeline::device_order`, with warm-up, steady state and cool-down
//! marked); tied-embedding gradient sums; the optimizer step on the rank's own state.
//!
//! ZeRO (Rajbhandari et al. SC'20), as the cost model counts it: stage 0 all-reduces each
//! layer's gradients (one bucket per layer, issued right after that layer's backward of the
//! last micro-batch, so it overlaps the remaining backward); stage 1 reduce-scatters them there
//! instead and all-gathers the updated weights; stage 2 reduce-scatters every micro-batch's
//! gradients of a layer right after its backward (they are never held whole); stage 3 also
//! keeps only the rank's slice of the weights and all-gathers a layer's parameters before its
//! forward, its recompute and its backward, freeing them after.

pub mod builder;
pub mod emit;
pub mod segment;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ir::{Graph, OpId, OpKind};
use planner::cost::pipeline::device_order;
use planner::plan::Plan;
use planner::{ModelInfo, Precision, Recompute};

use self::builder::Builder;
use self::emit::{Contribution, Env, Inst};
use self::segment::{Ctx, Kind, Lay, Segment, Source};
use crate::error::CodegenError;
use crate::ids::{BucketId, BufferId, ParamId, TemplateId};
use crate::program::{
    Algorithm, CollectiveOp, Elem, FORMAT, Instr, MeshInfo, ParamInfo, ParamShard, Pass, Peer,
    Phase, Predicted, ProgramSet, Purpose, Role, Slot, Template, TpSplit, tag,
};

/// Lowering options.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Options {
    pub adamw: ir::AdamWConfig,
}

/// Loads the plan's model (`import::load_model`) at the plan's micro-batch and sequence.
pub fn load_graph(plan: &Plan) -> Result<Graph, CodegenError> {
    let m = import::load_model(
        &plan.model.reference,
        plan.strategy.micro_batch,
        Some(plan.strategy.seq),
    )
    .map_err(|e| CodegenError::Model {
        reference: plan.model.reference.clone(),
        message: e.to_string(),
    })?;
    Ok(m.graph)
}

/// Generates every rank's program for `plan` on the model's forward `graph`.
pub fn lower(plan: &Plan, graph: &Graph, opts: Options) -> Result<ProgramSet, CodegenError> {
    let s = &plan.strategy;
    let info = ModelInfo::new(graph).map_err(|e| CodegenError::plan("model", e.to_string()))?;
    let (tp, dp, pp) = (s.tp, s.dp, s.pp);
    if u64::from(tp) * u64::from(dp) * u64::from(pp) != plan.gpus {
        return Err(CodegenError::plan(
            "strategy",
            "tp x dp x pp differs from gpus",
        ));
    }
    let m = u32::try_from(s.micro_batches())
        .map_err(|_| CodegenError::plan("strategy", "too many micro-batches"))?;
    if m == 0 {
        return Err(CodegenError::plan("strategy", "no micro-batches"));
    }
    let zero = if dp > 1 { s.zero } else { 0 };
    let (act, weight) = match s.precision {
        Precision::Fp32 => (Elem::F32, Elem::F32),
        Precision::Fp16 => (Elem::F16, Elem::F16),
        Precision::Bf16 | Precision::Fp8 => (Elem::Bf16, Elem::Bf16),
    };
    let mixed = s.precision != Precision::Fp32;
    let cx = Ctx {
        graph,
        tp,
        sp: s.sequence_parallel && tp > 1,
        batch: s.micro_batch,
        seq: s.seq,
        act,
        weight,
        seq_shard: false,
    };
    let pre = segment::lower(&cx, &info.pre_ops, Kind::Pre)?;
    let layer = segment::lower(&cx, &info.layer_ops, Kind::Layer)?;
    // With sequence parallelism the head and loss run on the rank's sequence shard: the
    // logits are [b, s/tp, V] and the loss is the mean of the shards' means.
    let post_cx = Ctx {
        seq: if cx.sp { s.seq / u64::from(tp) } else { s.seq },
        seq_shard: cx.sp,
        ..cx
    };
    let post = segment::lower(&post_cx, &info.post_ops, Kind::Post)?;
    if layer.input.is_none() || post.input.is_none() {
        return Err(CodegenError::plan(
            "model",
            "a layer or the head reads no activation",
        ));
    }
    // Parameters.
    let params_list = graph.params();
    let pid_of: HashMap<OpId, ParamId> = params_list
        .iter()
        .enumerate()
        .map(|(i, (_, v))| (graph.def_op(*v), ParamId(i as u32)))
        .collect();
    let params: Vec<ParamInfo> = params_list
        .iter()
        .map(|(name, v)| ParamInfo {
            name: name.clone(),
            shape: graph.ty(*v).shape.eval(ir::Binding {
                batch: s.micro_batch,
                seq: s.seq,
            }),
        })
        .collect();
    let seg_params = |seg: &Segment, ops: &[OpId]| -> Vec<Option<ParamId>> {
        seg.vals
            .iter()
            .filter_map(|v| match v.source {
                Source::Param { pos } => Some(pos),
                _ => None,
            })
            .fold(vec![None; seg.ops.len()], |mut acc, pos| {
                if let Some(o) = ops.get(pos).or(seg.ops.get(pos)) {
                    acc[pos] = pid_of.get(o).copied();
                }
                acc
            })
    };
    let pre_pids = seg_params(&pre, &pre.ops);
    let post_pids = seg_params(&post, &post.ops);
    let layer_pids: Vec<Vec<Option<ParamId>>> = (0..info.layers)
        .map(|l| seg_params(&layer, &graph.layer_ops(l)))
        .collect();
    // Local shard shape and split of every parameter.
    let mut local: HashMap<ParamId, (Vec<u64>, Option<TpSplit>)> = HashMap::new();
    let mut note = |seg: &Segment, pids: &[Option<ParamId>]| {
        for v in &seg.vals {
            if let Source::Param { pos } = v.source
                && let Some(Some(p)) = pids.get(pos)
            {
                let split = match v.lay {
                    Lay::Split { axis, blocks } => Some(TpSplit {
                        axis,
                        blocks,
                        part: None,
                    }),
                    _ => None,
                };
                local.insert(*p, (v.shape.clone(), split));
            }
        }
    };
    note(&pre, &pre_pids);
    note(&post, &post_pids);
    for pids in &layer_pids {
        note(&layer, pids);
    }
    // Chunks.
    let n_chunks = plan.chunks.len() as u32;
    if n_chunks != pp * s.virtual_stages
        || plan
            .chunks
            .iter()
            .enumerate()
            .any(|(i, c)| c.chunk != i as u32 || c.stage != c.chunk % pp)
    {
        return Err(CodegenError::plan(
            "chunks",
            "expected pp x virtual stages chunks, chunk c on stage c mod pp",
        ));
    }
    let tied: BTreeSet<ParamId> = pre_pids
        .iter()
        .flatten()
        .filter(|p| post_pids.contains(&Some(**p)))
        .copied()
        .collect();
    let plans = [
        emit::plan(&pre, Recompute::None),
        emit::plan(&layer, s.recompute),
        emit::plan(&post, Recompute::None),
    ];
    let names: Vec<String> = params.iter().map(|p| p.name.clone()).collect();
    let layer_seeds: Vec<Vec<u64>> = (0..info.layers)
        .map(|l| {
            graph
                .layer_ops(l)
                .iter()
                .filter_map(|&o| match graph.op(o).kind {
                    OpKind::Dropout { seed, .. } => Some(seed),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut templates = Vec::new();
    for d in 0..pp {
        let st = Stage {
            plan,
            cx: &cx,
            segs: [&pre, &layer, &post],
            plans: &plans,
            pre_pids: &pre_pids,
            post_pids: &post_pids,
            layer_pids: &layer_pids,
            layer_seeds: &layer_seeds,
            local: &local,
            tied: &tied,
            zero,
            mixed,
            m,
            d,
            opts,
            names: &names,
            b: Builder::default(),
            ps: BTreeMap::new(),
            reduced: HashMap::new(),
        };
        templates.push(st.build()?);
    }
    let ids: Vec<TemplateId> = (0..pp).map(TemplateId).collect();
    let (groups, ranks) = crate::mesh::build(tp, dp, pp, !tied.is_empty(), &ids);
    Ok(ProgramSet {
        format: FORMAT.into(),
        model: plan.model.name.clone(),
        mesh: MeshInfo {
            tp,
            dp,
            pp,
            virtual_stages: s.virtual_stages,
            micro_batches: m,
            micro_batch: s.micro_batch,
            seq: s.seq,
            schedule: s.schedule.name().into(),
            zero: s.zero,
            recompute: s.recompute.name().into(),
            sequence_parallel: cx.sp,
            precision: s.precision.name().into(),
        },
        params,
        groups,
        predicted: plan
            .predicted
            .stages
            .iter()
            .map(|st| Predicted {
                stage: st.stage,
                peak_memory_bytes: st.peak_memory_bytes,
            })
            .collect(),
        ranks,
        templates,
    })
}

/// Persistent buffers of one parameter on one stage.
#[derive(Debug, Clone, Copy)]
struct PState {
    /// Local shard (persistent below ZeRO-3; gathered per use at ZeRO-3).
    param: BufferId,
    slice: Option<BufferId>,
    master: Option<BufferId>,
    m: BufferId,
    v: BufferId,
    /// Gradient accumulator: full local (`Grad`) below ZeRO-2, the slice (`GradSlice`) above.
    grad: BufferId,
    /// Flat slice length ⌈n / dp⌉.
    per: u64,
}

struct Stage<'a> {
    plan: &'a Plan,
    cx: &'a Ctx<'a>,
    segs: [&'a Segment; 3],
    plans: &'a [emit::Plan; 3],
    pre_pids: &'a [Option<ParamId>],
    post_pids: &'a [Option<ParamId>],
    layer_pids: &'a [Vec<Option<ParamId>>],
    /// Each layer's dropout seeds in op order.
    layer_seeds: &'a [Vec<u64>],
    local: &'a HashMap<ParamId, (Vec<u64>, Option<TpSplit>)>,
    tied: &'a BTreeSet<ParamId>,
    zero: u8,
    mixed: bool,
    m: u32,
    d: u32,
    opts: Options,
    names: &'a [String],
    b: Builder,
    ps: BTreeMap<ParamId, PState>,
    /// Where each parameter's reduced gradient ends up (ZeRO-1: a slice made at reduction).
    reduced: HashMap<ParamId, BufferId>,
}

/// What a forward left for the backward of one (chunk, micro-batch).
struct ChunkState {
    ids: Option<BufferId>,
    targets: Option<BufferId>,
    pre: Option<Inst>,
    layers: Vec<Inst>,
    post: Option<Inst>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Pre = 0,
    Layer = 1,
    Post = 2,
}

impl<'a> Stage<'a> {
    fn build(mut self) -> Result<Template, CodegenError> {
        let s = &self.plan.strategy;
        let p = s.pp;
        let v = s.virtual_stages;
        let my_chunks: Vec<u32> = self
            .plan
            .chunks
            .iter()
            .filter(|c| c.stage == self.d)
            .map(|c| c.chunk)
            .collect();
        // Parameters held.
        let mut held: BTreeSet<ParamId> = BTreeSet::new();
        for &c in &my_chunks {
            let ch = &self.plan.chunks[c as usize];
            if ch.embedding {
                held.extend(self.pre_pids.iter().flatten());
            }
            for l in ch.layers[0]..ch.layers[1] {
                held.extend(
                    self.layer_pids
                        .get(l as usize)
                        .into_iter()
                        .flatten()
                        .flatten(),
                );
            }
            if ch.head {
                held.extend(self.post_pids.iter().flatten());
            }
        }
        // Initialization.
        let reserve = self.b.alloc(
            "reserve".into(),
            Elem::U8,
            vec![planner::estimate::RESERVE_BYTES as u64],
            Role::Reserve,
        );
        let _ = reserve;
        let mut shards = Vec::new();
        let mut init = Vec::new();
        for &pid in &held {
            let Some((shape, split)) = self.local.get(&pid).cloned() else {
                continue;
            };
            let n: u64 = shape.iter().product();
            let dp = u64::from(s.dp);
            let per = n.div_ceil(dp);
            let name = self
                .names
                .get(pid.index())
                .cloned()
                .unwrap_or_else(|| pid.to_string());
            let w = self.cx.weight;
            let (param, slice) = if self.zero >= 3 {
                let param = self
                    .b
                    .declare(format!("w.{name}"), w, shape.clone(), Role::Param(pid));
                (
                    param,
                    Some(self.b.alloc(
                        format!("w.{name}.slice"),
                        w,
                        vec![per],
                        Role::ParamSlice(pid),
                    )),
                )
            } else {
                (
                    self.b
                        .alloc(format!("w.{name}"), w, shape.clone(), Role::Param(pid)),
                    None,
                )
            };
            let state_shape = if self.zero >= 1 {
                vec![per]
            } else {
                shape.clone()
            };
            let master = self.mixed.then(|| {
                self.b.alloc(
                    format!("master.{name}"),
                    Elem::F32,
                    state_shape.clone(),
                    Role::Master(pid),
                )
            });
            let mm = self.b.alloc(
                format!("m.{name}"),
                Elem::F32,
                state_shape.clone(),
                Role::OptM(pid),
            );
            let vv = self.b.alloc(
                format!("v.{name}"),
                Elem::F32,
                state_shape.clone(),
                Role::OptV(pid),
            );
            let grad = if self.zero >= 2 {
                self.b.alloc(
                    format!("g.{name}.slice"),
                    w,
                    vec![per],
                    Role::GradSlice(pid),
                )
            } else {
                self.b
                    .alloc(format!("g.{name}"), w, shape.clone(), Role::Grad(pid))
            };
            let first = slice.unwrap_or(param);
            init.push(first);
            shards.push(ParamShard {
                param: pid,
                tp: split,
                zero: self.zero >= 1,
                init: first,
            });
            self.ps.insert(
                pid,
                PState {
                    param,
                    slice,
                    master,
                    m: mm,
                    v: vv,
                    grad,
                    per,
                },
            );
        }
        self.b.push(Instr::InitParams { bufs: init });
        let states: Vec<(ParamId, PState)> = self.ps.iter().map(|(a, b)| (*a, *b)).collect();
        for (_, st) in &states {
            if let Some(master) = st.master {
                match (self.zero, st.slice) {
                    (0, _) => self.b.push(Instr::Copy {
                        src: st.param,
                        dst: master,
                    }),
                    (_, Some(sl)) => self.b.push(Instr::Copy {
                        src: sl,
                        dst: master,
                    }),
                    _ => self.b.push(Instr::Chunk {
                        src: st.param,
                        dst: master,
                        axis: None,
                        group: Slot::Dp,
                    }),
                }
            }
            self.b.push(Instr::Fill {
                buf: st.m,
                value: 0.0,
            });
            self.b.push(Instr::Fill {
                buf: st.v,
                value: 0.0,
            });
        }
        let step_start = self.b.instrs.len();
        for (_, st) in &states {
            self.b.push(Instr::Fill {
                buf: st.grad,
                value: 0.0,
            });
        }
        // The schedule.
        let order = device_order(s.schedule, p, v, self.m, self.d);
        let first_b = order.iter().position(|t| !t.2).unwrap_or(order.len());
        let last_f = order.iter().rposition(|t| t.2).unwrap_or(0);
        let mut last_mb: HashMap<u32, u32> = HashMap::new();
        for &(c, mb, f) in &order {
            if !f {
                last_mb.insert(c, mb);
            }
        }
        let mut state: HashMap<(u32, u32), ChunkState> = HashMap::new();
        for (k, &(c, mb, fwd)) in order.iter().enumerate() {
            let phase = if k < first_b {
                Phase::WarmUp
            } else if k > last_f {
                Phase::CoolDown
            } else {
                Phase::Steady
            };
            let pass = if fwd { Pass::Forward } else { Pass::Backward };
            self.b.push(Instr::Task {
                phase,
                chunk: c,
                micro_batch: mb,
                pass,
            });
            if fwd {
                let st = self.forward(c, mb)?;
                state.insert((c, mb), st);
            } else {
                let st = state.remove(&(c, mb)).ok_or_else(|| {
                    CodegenError::plan(
                        "schedule",
                        format!("backward of chunk {c} micro-batch {mb} before its forward"),
                    )
                })?;
                self.backward(c, mb, st, last_mb.get(&c) == Some(&mb))?;
            }
        }
        // Tied embedding gradients: summed between the first and the last stage.
        if p > 1 {
            let tied: Vec<ParamId> = self
                .tied
                .iter()
                .filter(|t| self.ps.contains_key(t))
                .copied()
                .collect();
            if !tied.is_empty() {
                let pairs = tied
                    .iter()
                    .map(|t| {
                        let g = self
                            .reduced
                            .get(t)
                            .copied()
                            .or(self.ps.get(t).map(|s| s.grad))
                            .unwrap_or(BufferId(u32::MAX));
                        (g, g)
                    })
                    .collect();
                self.b.push(Instr::Collective {
                    op: CollectiveOp::AllReduce,
                    group: Slot::Tied,
                    algorithm: Algorithm::Ring,
                    axis: None,
                    pairs,
                    purpose: Purpose::TiedGrad,
                    bucket: None,
                });
            }
        }
        self.optimizer();
        let mut instrs = std::mem::take(&mut self.b.instrs);
        // Keep the step boundary as the first instruction of the iteration.
        let step = instrs.split_off(step_start);
        Ok(Template {
            id: TemplateId(self.d),
            stage: self.d,
            chunks: my_chunks,
            buffers: std::mem::take(&mut self.b.buffers),
            shards,
            init: instrs,
            instrs: step,
        })
    }

    fn optimizer(&mut self) {
        let states: Vec<(ParamId, PState)> = self.ps.iter().map(|(a, b)| (*a, *b)).collect();
        for (pid, st) in states {
            let grad = self.reduced.get(&pid).copied().unwrap_or(st.grad);
            match self.zero {
                0 => self.adamw(&st, grad, st.param),
                1 | 2 => {
                    let w = self.cx.weight;
                    let tmp = self.b.alloc(
                        format!("w.{}.new", self.pname(pid)),
                        w,
                        vec![st.per],
                        Role::ParamSlice(pid),
                    );
                    if st.master.is_none() {
                        // This rank's slice of the replicated weights, updated in place.
                        self.b.push(Instr::Chunk {
                            src: st.param,
                            dst: tmp,
                            axis: None,
                            group: Slot::Dp,
                        });
                    }
                    self.adamw(&st, grad, tmp);
                    self.b.push(Instr::Collective {
                        op: CollectiveOp::AllGather,
                        group: Slot::Dp,
                        algorithm: Algorithm::Ring,
                        axis: None,
                        pairs: vec![(tmp, st.param)],
                        purpose: Purpose::ParamGather,
                        bucket: None,
                    });
                    self.b.free(tmp);
                    if self.zero == 1 && grad != st.grad {
                        self.b.free(grad);
                    }
                }
                _ => self.adamw(&st, grad, st.slice.unwrap_or(st.param)),
            }
        }
        self.reduced.clear();
    }

    /// AdamW on `weights`, or with mixed precision on the fp32 master copy, then copied into
    /// `weights`.
    fn adamw(&mut self, st: &PState, grad: BufferId, weights: BufferId) {
        let config = self.opts.adamw;
        self.b.push(Instr::AdamW {
            config,
            param: st.master.unwrap_or(weights),
            grad,
            m: st.m,
            v: st.v,
        });
        if let Some(master) = st.master {
            self.b.push(Instr::Copy {
                src: master,
                dst: weights,
            });
        }
    }

    fn pids(&self, w: Which, l: u32) -> &[Option<ParamId>] {
        match w {
            Which::Pre => self.pre_pids,
            Which::Post => self.post_pids,
            Which::Layer => self
                .layer_pids
                .get(l as usize)
                .map_or(&[], |v| v.as_slice()),
        }
    }

    /// Parameter buffers of a segment instance (gathered first at ZeRO-3).
    fn gather(&mut self, w: Which, l: u32, bucket: BucketId) -> Vec<Option<(ParamId, BufferId)>> {
        let pids: Vec<Option<ParamId>> = self.pids(w, l).to_vec();
        let mut pairs = Vec::new();
        let mut seen = BTreeSet::new();
        let out = pids
            .iter()
            .map(|p| {
                let p = (*p)?;
                let st = self.ps.get(&p)?;
                if self.zero >= 3 && seen.insert(p) {
                    self.b.push(Instr::Alloc { buf: st.param });
                    pairs.push((st.slice.unwrap_or(st.param), st.param));
                }
                Some((p, st.param))
            })
            .collect();
        if !pairs.is_empty() {
            self.b.push(Instr::Collective {
                op: CollectiveOp::AllGather,
                group: Slot::Dp,
                algorithm: Algorithm::Ring,
                axis: None,
                pairs,
                purpose: Purpose::ParamGather,
                bucket: Some(bucket),
            });
        }
        out
    }

    fn release(&mut self, env: &[Option<(ParamId, BufferId)>]) {
        if self.zero < 3 {
            return;
        }
        let mut seen = BTreeSet::new();
        for (p, b) in env.iter().flatten() {
            if seen.insert(*p) {
                self.b.free(*b);
            }
        }
    }

    fn bucket(&self, w: Which, l: u32) -> BucketId {
        let layers = self.layer_pids.len() as u32;
        BucketId(match w {
            Which::Pre => layers,
            Which::Layer => l,
            Which::Post => layers + 1,
        })
    }

    fn forward(&mut self, c: u32, mb: u32) -> Result<ChunkState, CodegenError> {
        let ch = self.plan.chunks[c as usize].clone();
        let sp = self.cx.sp;
        let [pre, layer, post] = self.segs;
        let mut st = ChunkState {
            ids: None,
            targets: None,
            pre: None,
            layers: Vec::new(),
            post: None,
        };
        let (b, sq) = (self.cx.batch, self.cx.seq);
        if ch.embedding {
            st.ids = Some(self.b.alloc(
                format!("c{c}.m{mb}.input_ids"),
                Elem::I64,
                vec![b, sq],
                Role::Tokens,
            ));
        }
        if ch.head {
            st.targets = Some(self.b.alloc(
                format!("c{c}.m{mb}.targets"),
                Elem::I64,
                vec![b, sq],
                Role::Tokens,
            ));
        }
        if st.ids.is_some() || st.targets.is_some() {
            self.b.push(Instr::LoadTokens {
                micro_batch: mb,
                input_ids: st.ids,
                targets: st.targets,
            });
        }
        let layer_in = layer.input.map(|i| layer.vals[i].clone());
        let mut x = if ch.embedding {
            let params = self.gather(Which::Pre, 0, self.bucket(Which::Pre, 0));
            let env = Env::edge(&params, st.ids, st.targets, format!("c{c}.m{mb}.emb"));
            let inst = emit::forward(
                &mut self.b,
                pre,
                &env,
                None,
                &self.plans[0].keep,
                true,
                true,
            );
            self.release(&params);
            let out = inst.bufs[pre.output].unwrap_or(BufferId(u32::MAX));
            st.pre = Some(inst);
            if sp && let Some(li) = &layer_in {
                let xs = self.b.alloc(
                    format!("c{c}.m{mb}.x"),
                    li.elem,
                    li.shape.clone(),
                    Role::Activation,
                );
                self.b.push(Instr::Chunk {
                    src: out,
                    dst: xs,
                    axis: Some(1),
                    group: Slot::Tp,
                });
                self.b.free(out);
                xs
            } else {
                out
            }
        } else {
            self.recv_boundary(
                format!("c{c}.m{mb}.x"),
                Role::Activation,
                Peer::Prev,
                tag(c, mb, Pass::Forward),
            )?
        };
        let full = self.plan.strategy.recompute == Recompute::Full;
        for l in ch.layers[0]..ch.layers[1] {
            let params = self.gather(Which::Layer, l, self.bucket(Which::Layer, l));
            let env = Env::layer(&params, l, self.seeds(l), format!("l{l}.m{mb}"));
            let p = &self.plans[1];
            let keep: Vec<bool> = if full {
                (0..layer.vals.len())
                    .map(|v| Some(v) == layer.input)
                    .collect()
            } else {
                p.keep.clone()
            };
            let inst = emit::forward(
                &mut self.b,
                layer,
                &env,
                Some(x),
                &keep,
                p.keep_scores && !full,
                !full,
            );
            self.release(&params);
            x = inst.bufs[layer.output].unwrap_or(BufferId(u32::MAX));
            st.layers.push(inst);
        }
        if ch.head {
            if sp && let Some(t) = st.targets {
                let ts = self.b.alloc(
                    format!("c{c}.m{mb}.targets.s"),
                    Elem::I64,
                    vec![b, sq / u64::from(self.plan.strategy.tp)],
                    Role::Tokens,
                );
                self.b.push(Instr::Chunk {
                    src: t,
                    dst: ts,
                    axis: Some(1),
                    group: Slot::Tp,
                });
                self.b.free(t);
                st.targets = Some(ts);
            }
            let params = self.gather(Which::Post, 0, self.bucket(Which::Post, 0));
            let env = Env::edge(&params, st.ids, st.targets, format!("c{c}.m{mb}.head"));
            let inst = emit::forward(
                &mut self.b,
                post,
                &env,
                Some(x),
                &self.plans[2].keep,
                true,
                true,
            );
            self.release(&params);
            let loss = inst.bufs[post.output].unwrap_or(BufferId(u32::MAX));
            let weight = 1.0
                / (f64::from(self.m)
                    * f64::from(self.plan.strategy.dp)
                    * f64::from(self.plan.strategy.tp));
            self.b.push(Instr::Loss { buf: loss, weight });
            self.b.free(loss);
            st.post = Some(inst);
        } else {
            self.b.push(Instr::Send {
                buf: x,
                peer: Peer::Next,
                tag: tag(c + 1, mb, Pass::Forward),
            });
            self.b.free(x);
        }
        Ok(st)
    }

    fn backward(
        &mut self,
        c: u32,
        mb: u32,
        mut st: ChunkState,
        last: bool,
    ) -> Result<(), CodegenError> {
        let ch = self.plan.chunks[c as usize].clone();
        let sp = self.cx.sp;
        let [pre, layer, post] = self.segs;
        let s = &self.plan.strategy;
        // d(mean loss)/d(this micro-batch's loss): the mean over micro-batches and replicas,
        // and with a sequence-sharded head over the tensor-parallel group's shard means.
        let shards = if sp { f64::from(s.tp) } else { 1.0 };
        let scale = 1.0 / (f64::from(self.m) * f64::from(s.dp) * shards);
        let mut dy = if let Some(mut inst) = st.post.take() {
            let seed = self.b.alloc(
                format!("c{c}.m{mb}.dloss"),
                Elem::F32,
                vec![],
                Role::ActGrad,
            );
            self.b.push(Instr::Fill {
                buf: seed,
                value: scale,
            });
            let bucket = self.bucket(Which::Post, 0);
            let params = self.gather(Which::Post, 0, bucket);
            let env = Env::edge(&params, st.ids, st.targets, format!("c{c}.m{mb}.head"));
            let (dx, contribs) =
                emit::backward(&mut self.b, post, &self.plans[2], &env, &mut inst, seed);
            // The embedding's own backward reduces a tied parameter when it runs on this stage.
            let later: BTreeSet<ParamId> = if self.stage_has_embedding() {
                self.tied.clone()
            } else {
                BTreeSet::new()
            };
            self.contribute(&contribs, bucket, last, &params, &later);
            self.release(&params);
            if let Some(t) = st.targets.take() {
                self.b.free(t);
            }
            dx.ok_or_else(|| CodegenError::plan("model", "the loss does not depend on the layers"))?
        } else {
            self.recv_boundary(
                format!("c{c}.m{mb}.dy"),
                Role::ActGrad,
                Peer::Next,
                tag(c, mb, Pass::Backward),
            )?
        };
        let full = s.recompute == Recompute::Full;
        let layers: Vec<u32> = (ch.layers[0]..ch.layers[1]).collect();
        for &l in layers.iter().rev() {
            let mut inst = st
                .layers
                .pop()
                .ok_or_else(|| CodegenError::plan("schedule", "missing layer state"))?;
            let bucket = self.bucket(Which::Layer, l);
            let params = self.gather(Which::Layer, l, bucket);
            let env = Env::layer(&params, l, self.seeds(l), format!("l{l}.m{mb}"));
            if full {
                self.b.push(Instr::RecomputeBegin { layer: l });
                let input = layer.input.and_then(|i| inst.bufs[i]);
                let re = emit::forward(
                    &mut self.b,
                    layer,
                    &env,
                    input,
                    &self.plans[1].keep,
                    true,
                    true,
                );
                if let Some(o) = re.bufs[layer.output] {
                    self.b.free(o);
                }
                inst = re;
                self.b.push(Instr::RecomputeEnd { layer: l });
            }
            let (dx, contribs) =
                emit::backward(&mut self.b, layer, &self.plans[1], &env, &mut inst, dy);
            self.contribute(&contribs, bucket, last, &params, &BTreeSet::new());
            self.release(&params);
            dy =
                dx.ok_or_else(|| CodegenError::plan("model", "a layer's input gets no gradient"))?;
        }
        if let Some(mut inst) = st.pre.take() {
            if sp && let Some(pi) = pre.vals.get(pre.output) {
                let df = self.b.alloc(
                    format!("c{c}.m{mb}.dxf"),
                    pi.elem,
                    pi.shape.clone(),
                    Role::ActGrad,
                );
                self.b.push(Instr::Collective {
                    op: CollectiveOp::AllGather,
                    group: Slot::Tp,
                    algorithm: Algorithm::Ring,
                    axis: Some(1),
                    pairs: vec![(dy, df)],
                    purpose: Purpose::Activation,
                    bucket: None,
                });
                self.b.free(dy);
                dy = df;
            }
            let bucket = self.bucket(Which::Pre, 0);
            let params = self.gather(Which::Pre, 0, bucket);
            let env = Env::edge(&params, st.ids, st.targets, format!("c{c}.m{mb}.emb"));
            let (_, contribs) =
                emit::backward(&mut self.b, pre, &self.plans[0], &env, &mut inst, dy);
            self.contribute(&contribs, bucket, last, &params, &BTreeSet::new());
            self.release(&params);
            if let Some(t) = st.ids.take() {
                self.b.free(t);
            }
        } else {
            self.b.push(Instr::Send {
                buf: dy,
                peer: Peer::Prev,
                tag: tag(c.wrapping_sub(1), mb, Pass::Backward),
            });
            self.b.free(dy);
        }
        if let Some(t) = st.ids.take().or(st.targets.take()) {
            self.b.free(t);
        }
        Ok(())
    }

    fn pname(&self, p: ParamId) -> String {
        self.names
            .get(p.index())
            .cloned()
            .unwrap_or_else(|| p.to_string())
    }

    /// Receives a tensor shaped like a layer's input (an activation from the previous stage,
    /// or its gradient from the next) from a pipeline neighbour.
    fn recv_boundary(
        &mut self,
        name: String,
        role: Role,
        peer: Peer,
        tag: u64,
    ) -> Result<BufferId, CodegenError> {
        let layer = self.segs[1];
        let li = layer
            .input
            .and_then(|i| layer.vals.get(i))
            .ok_or_else(|| CodegenError::plan("model", "no layer input"))?;
        let buf = self.b.alloc(name, li.elem, li.shape.clone(), role);
        self.b.push(Instr::Recv { buf, peer, tag });
        Ok(buf)
    }

    /// Layer `l`'s dropout seeds (borrowed from the lowering, not from `self`).
    fn seeds(&self, l: u32) -> &'a [u64] {
        self.layer_seeds
            .get(l as usize)
            .map_or(&[], |v| v.as_slice())
    }

    fn stage_has_embedding(&self) -> bool {
        self.plan
            .chunks
            .iter()
            .any(|c| c.stage == self.d && c.embedding)
    }

    /// Accumulates a segment instance's parameter gradients; reduces them across the
    /// data-parallel group per ZeRO stage.
    fn contribute(
        &mut self,
        contribs: &[Contribution],
        bucket: BucketId,
        last: bool,
        env: &[Option<(ParamId, BufferId)>],
        later: &BTreeSet<ParamId>,
    ) {
        let partial: Vec<(BufferId, BufferId)> = contribs
            .iter()
            .filter(|c| c.partial)
            .map(|c| (c.buf, c.buf))
            .collect();
        if !partial.is_empty() {
            self.b.push(Instr::Collective {
                op: CollectiveOp::AllReduce,
                group: Slot::Tp,
                algorithm: Algorithm::Ring,
                axis: None,
                pairs: partial,
                purpose: Purpose::TpGradReduce,
                bucket: Some(bucket),
            });
        }
        if self.zero >= 2 {
            let mut pairs = Vec::new();
            let mut adds = Vec::new();
            for c in contribs {
                let Some(st) = self.ps.get(&c.param).copied() else {
                    continue;
                };
                let w = self.cx.weight;
                let sl = self.b.alloc(
                    format!("g.{}.part", self.pname(c.param)),
                    w,
                    vec![st.per],
                    Role::Temp,
                );
                pairs.push((c.buf, sl));
                adds.push((c.buf, sl, st.grad));
            }
            if !pairs.is_empty() {
                self.b.push(Instr::Collective {
                    op: CollectiveOp::ReduceScatter,
                    group: Slot::Dp,
                    algorithm: Algorithm::Ring,
                    axis: None,
                    pairs,
                    purpose: Purpose::GradReduce,
                    bucket: Some(bucket),
                });
            }
            for (full, sl, acc) in adds {
                self.b.free(full);
                self.b.push(Instr::Compute {
                    kind: OpKind::Add,
                    inputs: vec![acc, sl],
                    outputs: vec![acc],
                    saves: vec![],
                    layer: None,
                });
                self.b.free(sl);
            }
            return;
        }
        for c in contribs {
            let Some(st) = self.ps.get(&c.param).copied() else {
                continue;
            };
            self.b.push(Instr::Compute {
                kind: OpKind::Add,
                inputs: vec![st.grad, c.buf],
                outputs: vec![st.grad],
                saves: vec![],
                layer: None,
            });
            self.b.free(c.buf);
        }
        if !last || self.plan.strategy.dp < 2 {
            return;
        }
        // The last micro-batch of this chunk: this segment's gradient bucket is complete.
        let mut seen = BTreeSet::new();
        let mut pairs = Vec::new();
        for (p, _) in env.iter().flatten() {
            if later.contains(p) || !seen.insert(*p) {
                continue;
            }
            let Some(st) = self.ps.get(p).copied() else {
                continue;
            };
            if self.zero == 0 {
                pairs.push((st.grad, st.grad));
            } else {
                let sl = self.b.alloc(
                    format!("g.{}.slice", self.pname(*p)),
                    self.cx.weight,
                    vec![st.per],
                    Role::GradSlice(*p),
                );
                self.reduced.insert(*p, sl);
                pairs.push((st.grad, sl));
            }
        }
        if !pairs.is_empty() {
            let op = if self.zero == 0 {
                CollectiveOp::AllReduce
            } else {
                CollectiveOp::ReduceScatter
            };
            self.b.push(Instr::Collective {
                op,
                group: Slot::Dp,
                algorithm: Algorithm::Ring,
                axis: None,
                pairs,
                purpose: Purpose::GradReduce,
                bucket: Some(bucket),
            });
        }
    }
}
