//! Parameters and gradients by ZeRO stage: gathering a layer's weights, contributing and
//! reducing its gradients in buckets, and the AdamW step on the rank's own state.

use super::*;

impl<'a> Stage<'a> {
    /// Parameter buffers of a segment instance (gathered first at ZeRO-3).
    pub(super) fn gather(
        &mut self,
        w: Which,
        l: u32,
        bucket: BucketId,
    ) -> Vec<Option<(ParamId, BufferId)>> {
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
                    pairs.push((p, st.slice.unwrap_or(st.param), st.param));
                }
                Some((p, st.param))
            })
            .collect();
        self.replica_collective(
            CollectiveOp::AllGather,
            pairs,
            Purpose::ParamGather,
            Some(bucket),
        );
        out
    }

    pub(super) fn release(&mut self, env: &[Option<(ParamId, BufferId)>]) {
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

    /// Where a backward adds its parameters' whole gradients as it computes them: the local
    /// accumulators below ZeRO-2 (above it each gradient is reduce-scattered first).
    pub(super) fn accumulators(
        &self,
        env: &[Option<(ParamId, BufferId)>],
    ) -> BTreeMap<ParamId, BufferId> {
        if self.zero >= 2 {
            return BTreeMap::new();
        }
        env.iter()
            .flatten()
            .filter_map(|(p, _)| self.ps.get(p).map(|st| (*p, st.grad)))
            .collect()
    }

    /// Accumulates a segment instance's parameter gradients; reduces them across the
    /// data-parallel group per ZeRO stage.
    ///
    /// A vector parameter held whole on every tensor-parallel rank whose gradient is a partial
    /// sum over the group (a norm weight read on sequence shards, a bias added after a
    /// row-parallel reduction) is summed locally over the chunk's micro-batches and all-reduced
    /// once, after its last micro-batch, as Megatron-LM's `finalize_model_grads` does and as
    /// the planner prices it (once per step). Other partial gradients are all-reduced per
    /// micro-batch: a weight gathered from its shards (as priced), and a whole matrix read in
    /// pieces (a head kept whole on sequence shards, priced once per step: holding its partial
    /// sum across micro-batches would cost a matrix the memory model does not count); so are
    /// all under ZeRO-2 and 3, which reduce-scatter each micro-batch's gradient at once.
    pub(super) fn contribute(
        &mut self,
        contribs: &[Contribution],
        bucket: BucketId,
        last: bool,
        env: &[Option<(ParamId, BufferId)>],
        later: &BTreeSet<ParamId>,
    ) {
        let (zero, local) = (self.zero, self.local);
        let per_step = move |c: &Contribution| {
            zero < 2
                && local
                    .get(&c.param)
                    .is_some_and(|l| l.split.is_none() && l.shape.len() == 1)
        };
        let partial: Vec<(BufferId, BufferId)> = contribs
            .iter()
            .filter(|c| c.partial && !per_step(c))
            .map(|c| (c.buf, c.buf))
            .collect();
        self.flat_collective(
            CollectiveOp::AllReduce,
            Slot::Tp,
            partial,
            Purpose::TpGradReduce,
            Some(bucket),
        );
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
                pairs.push((c.param, c.buf, sl));
                adds.push((c.buf, sl, st.grad));
            }
            self.replica_collective(
                CollectiveOp::ReduceScatter,
                pairs,
                Purpose::GradReduce,
                Some(bucket),
            );
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
            if c.partial && per_step(c) {
                self.pend_partial(c);
                continue;
            }
            let Some(st) = self.ps.get(&c.param).copied() else {
                continue;
            };
            self.add_into(st.grad, c.buf);
        }
        if !last {
            return;
        }
        self.reduce_partials(env, later, bucket);
        if self.plan.strategy.dp < 2 {
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
                pairs.push((*p, st.grad, st.grad));
            } else {
                let sl = self.b.alloc(
                    format!("g.{}.slice", self.pname(*p)),
                    self.cx.weight,
                    vec![st.per],
                    Role::GradSlice(*p),
                );
                self.reduced.insert(*p, sl);
                pairs.push((*p, st.grad, sl));
            }
        }
        if !pairs.is_empty() {
            let op = if self.zero == 0 {
                CollectiveOp::AllReduce
            } else {
                CollectiveOp::ReduceScatter
            };
            let whole: Vec<BufferId> = pairs.iter().map(|(_, g, _)| *g).collect();
            self.replica_collective(op, pairs, Purpose::GradReduce, Some(bucket));
            if self.grads_per_step() {
                for g in whole {
                    self.b.free(g);
                }
            }
        }
    }

    /// `acc += part`, freeing `part`.
    fn add_into(&mut self, acc: BufferId, part: BufferId) {
        self.b.push(Instr::Compute {
            kind: OpKind::Add,
            inputs: vec![acc, part],
            outputs: vec![acc],
            saves: vec![],
            layer: None,
        });
        self.b.free(part);
    }

    /// Sums a tensor-parallel partial gradient into its parameter's pending sum (the first
    /// one becomes the sum).
    fn pend_partial(&mut self, c: &Contribution) {
        match self.tp_pending.get(&c.param).copied() {
            Some(acc) => self.add_into(acc, c.buf),
            None => {
                self.tp_pending.insert(c.param, c.buf);
            }
        }
    }

    /// All-reduces over the tensor-parallel group the pending partial sums of the segment's
    /// parameters whose last use this was, and adds them into their accumulators.
    fn reduce_partials(
        &mut self,
        env: &[Option<(ParamId, BufferId)>],
        later: &BTreeSet<ParamId>,
        bucket: BucketId,
    ) {
        let mut done = Vec::new();
        for (p, _) in env.iter().flatten() {
            if later.contains(p) {
                continue;
            }
            if let Some(buf) = self.tp_pending.remove(p) {
                done.push((*p, buf));
            }
        }
        let pairs = done.iter().map(|&(_, b)| (b, b)).collect();
        self.flat_collective(
            CollectiveOp::AllReduce,
            Slot::Tp,
            pairs,
            Purpose::TpGradReduce,
            Some(bucket),
        );
        for (p, buf) in done {
            match self.ps.get(&p).copied() {
                Some(st) => self.add_into(st.grad, buf),
                None => self.b.free(buf),
            }
        }
    }

    pub(super) fn optimizer(&mut self) {
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
                            group: st.replicas,
                        });
                    }
                    self.adamw(&st, grad, tmp);
                    self.replica_collective(
                        CollectiveOp::AllGather,
                        vec![(pid, tmp, st.param)],
                        Purpose::ParamGather,
                        None,
                    );
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
    pub(super) fn adamw(&mut self, st: &PState, grad: BufferId, weights: BufferId) {
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

    /// A data-parallel collective on parameters' flat buffers, each over its own replicas (the
    /// dense weights' over `Dp`, the experts' over `Edp`); where a group has one member (the
    /// experts at ep = dp) the collective is the identity: a copy, or nothing in place.
    pub(super) fn replica_collective(
        &mut self,
        op: CollectiveOp,
        pairs: Vec<(ParamId, BufferId, BufferId)>,
        purpose: Purpose,
        bucket: Option<BucketId>,
    ) {
        for slot in [Slot::Dp, Slot::Edp] {
            let mine: Vec<(BufferId, BufferId)> = pairs
                .iter()
                .filter(|(p, ..)| self.ps.get(p).map_or(Slot::Dp, |st| st.replicas) == slot)
                .map(|&(_, x, y)| (x, y))
                .collect();
            if self.replica_count(slot) >= 2 {
                self.flat_collective(op, slot, mine, purpose, bucket);
                continue;
            }
            for (x, y) in mine.into_iter().filter(|(x, y)| x != y) {
                self.b.push(Instr::Copy { src: x, dst: y });
            }
        }
    }

    /// A ring collective on flat buffers over `group`; none when `pairs` is empty.
    pub(super) fn flat_collective(
        &mut self,
        op: CollectiveOp,
        group: Slot,
        pairs: Vec<(BufferId, BufferId)>,
        purpose: Purpose,
        bucket: Option<BucketId>,
    ) {
        if pairs.is_empty() {
            return;
        }
        self.b.push(Instr::Collective {
            op,
            group,
            algorithm: Algorithm::Ring,
            axis: None,
            pairs,
            purpose,
            bucket,
        });
    }
}
