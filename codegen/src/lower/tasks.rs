//! One (chunk, micro-batch) task: its forward and backward over the chunk's segments, with
//! the pipeline-boundary sends and receives.

use super::*;

impl<'a> Stage<'a> {
    pub(super) fn forward(&mut self, c: u32, mb: u32) -> Result<ChunkState, CodegenError> {
        let ch = self.plan.chunks[c as usize].clone();
        let sp = self.cx.sp;
        let [pre, first_layer, post] = self.segs;
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
        let layer_in = first_layer.input.map(|i| first_layer.vals[i].clone());
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
            let scattered = matches!(pre.vals[pre.output].lay, Lay::Split { axis: 1, .. });
            if sp
                && !scattered
                && let Some(li) = &layer_in
            {
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
            let env = Env::layer(&params, l, self.instance(l), format!("l{l}.m{mb}"));
            let (layer, p) = self.layer_code(l);
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
            // A sequence-sharded head reads its shard of the targets.
            if sp
                && !self.cx.vocab_parallel
                && let Some(t) = st.targets
            {
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

    pub(super) fn backward(
        &mut self,
        c: u32,
        mb: u32,
        mut st: ChunkState,
        last: bool,
    ) -> Result<(), CodegenError> {
        let ch = self.plan.chunks[c as usize].clone();
        let sp = self.cx.sp;
        let [pre, _, post] = self.segs;
        let s = &self.plan.strategy;
        // d(mean loss)/d(this micro-batch's loss): the mean over micro-batches and replicas,
        // and with a sequence-sharded head over the tensor-parallel group's shard means.
        let shards = if sp && !self.cx.vocab_parallel {
            f64::from(s.tp)
        } else {
            1.0
        };
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
            let mut env = Env::edge(&params, st.ids, st.targets, format!("c{c}.m{mb}.head"));
            env.accumulators = self.accumulators(&params);
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
            let mut env = Env::layer(&params, l, self.instance(l), format!("l{l}.m{mb}"));
            env.accumulators = self.accumulators(&params);
            let (layer, layer_plan) = self.layer_code(l);
            if full {
                self.b.push(Instr::RecomputeBegin { layer: l });
                let input = layer.input.and_then(|i| inst.bufs[i]);
                let re = emit::forward(
                    &mut self.b,
                    layer,
                    &env,
                    input,
                    &layer_plan.keep,
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
                emit::backward(&mut self.b, layer, layer_plan, &env, &mut inst, dy);
            self.contribute(&contribs, bucket, last, &params, &BTreeSet::new());
            self.release(&params);
            dy =
                dx.ok_or_else(|| CodegenError::plan("model", "a layer's input gets no gradient"))?;
        }
        if let Some(mut inst) = st.pre.take() {
            // A pre segment that ends sequence-split (its dropout after the scatter) takes
            // the first layer's input gradient as it is.
            if sp
                && let Some(pi) = pre.vals.get(pre.output)
                && !matches!(pi.lay, Lay::Split { axis: 1, .. })
            {
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
            let mut env = Env::edge(&params, st.ids, st.targets, format!("c{c}.m{mb}.emb"));
            env.accumulators = self.accumulators(&params);
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

    /// Receives a tensor shaped like a layer's input (an activation from the previous stage,
    /// or its gradient from the next) from a pipeline neighbour.
    pub(super) fn recv_boundary(
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
}
