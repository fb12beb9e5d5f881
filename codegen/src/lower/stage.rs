//! The template of one pipeline stage: initialization, the iteration's tasks in schedule
//! order, and the optimizer step.

use super::*;

impl<'a> Stage<'a> {
    pub(super) fn build(mut self) -> Result<Template, CodegenError> {
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
            let Some(LocalShard {
                shape,
                split,
                expert,
            }) = self.local.get(&pid).cloned()
            else {
                continue;
            };
            let n: u64 = shape.iter().product();
            let replicas = if expert { Slot::Edp } else { Slot::Dp };
            let per = n.div_ceil(u64::from(self.replica_count(replicas)));
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
            if self.plan.strategy.precision.is_fp8() {
                // Transformer Engine's FP8 copy of the weight, as the planner counts it (its
                // transpose is rebuilt when needed): resident, one byte an element.
                let copy = if self.zero >= 3 {
                    vec![per]
                } else {
                    shape.clone()
                };
                self.b
                    .alloc(format!("w.{name}.fp8"), Elem::U8, copy, Role::Fp8Copy(pid));
            }
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
            } else if self.grads_per_step() {
                // Allocated at each step's start and freed once reduce-scattered (below).
                self.b
                    .declare(format!("g.{name}"), w, shape.clone(), Role::Grad(pid))
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
                expert,
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
                    replicas,
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
                        group: st.replicas,
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
            if self.grads_per_step() {
                self.b.push(Instr::Alloc { buf: st.grad });
            }
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
                self.flat_collective(
                    CollectiveOp::AllReduce,
                    Slot::Tied,
                    pairs,
                    Purpose::TiedGrad,
                    None,
                );
            }
        }
        if let Some(p) = self.tp_pending.keys().next() {
            return Err(CodegenError::plan(
                "sharding",
                format!(
                    "the tensor-parallel partial gradient of parameter {} was never reduced",
                    p.index()
                ),
            ));
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

    /// Whether the full gradient accumulators live only from the step's start to their
    /// reduce-scatter: ZeRO-1 over two or more replicas, where the optimizer reads this rank's
    /// reduced slice. Megatron's distributed optimizer reduce-scatters in place in its
    /// gradient buffer, so it never holds a second copy of the slice beside the whole
    /// gradient; freeing the whole gradient keeps the program's peak the same.
    pub(super) fn grads_per_step(&self) -> bool {
        self.zero == 1 && self.plan.strategy.dp >= 2
    }

    /// Members of a parameter's replica group (`Dp`: dp; `Edp`: dp ÷ ep).
    pub(super) fn replica_count(&self, slot: Slot) -> u32 {
        let dp = self.plan.strategy.dp;
        match slot {
            Slot::Edp => dp / self.cx.ep.max(1),
            _ => dp,
        }
    }

    pub(super) fn pids(&self, w: Which, l: u32) -> &[Option<ParamId>] {
        match w {
            Which::Pre => self.pre_pids,
            Which::Post => self.post_pids,
            Which::Layer => self
                .layer_pids
                .get(l as usize)
                .map_or(&[], |v| v.as_slice()),
        }
    }

    pub(super) fn bucket(&self, w: Which, l: u32) -> BucketId {
        let layers = self.layer_pids.len() as u32;
        BucketId(match w {
            Which::Pre => layers,
            Which::Layer => l,
            Which::Post => layers + 1,
        })
    }

    pub(super) fn pname(&self, p: ParamId) -> String {
        self.names
            .get(p.index())
            .cloned()
            .unwrap_or_else(|| p.to_string())
    }

    /// Layer `l`'s segment and emission plan: its run's.
    pub(super) fn layer_code(&self, l: u32) -> (&'a Segment, &'a emit::Plan) {
        let runs = self.layer_runs;
        let run = self.run_of_layer.get(l as usize).copied().unwrap_or(0);
        let (seg, plan) = &runs[run.min(runs.len() - 1)];
        (seg, plan)
    }

    /// Layer `l`'s own dropout seeds and attention masks (borrowed from the lowering, not
    /// from `self`).
    pub(super) fn instance(&self, l: u32) -> &'a Instance {
        self.layer_instances
            .get(l as usize)
            .unwrap_or(&emit::SEGMENT_INSTANCE)
    }

    pub(super) fn stage_has_embedding(&self) -> bool {
        self.plan
            .chunks
            .iter()
            .any(|c| c.stage == self.d && c.embedding)
    }
}
