//! Communication volume of one iteration, per GPU, per collective and per link level.
//!
//! Derived from the strategy, the model (hidden size, layers, parameters) and the device mesh
//! ([`mesh`]), with the same accounting as the cost model (docs/cost-model.md §3): what each
//! collective's buffer is, how often it runs, and which link it crosses. Traffic is what one GPU
//! sends under the ring algorithms: all-reduce 2(n−1)/n·S, reduce-scatter and all-gather
//! (n−1)/n·S, point-to-point S.

use serde::{Deserialize, Serialize};

use crate::cost::comm::{Collective, Group, Mesh, collective_time, mesh, mesh_ep, p2p_time};
use crate::estimate::row_parallel_ops;
use crate::hardware::Cluster;
use crate::model::ModelInfo;
use crate::strategy::{Recompute, Strategy};

pub use super::tp_volume::TpSource;
use super::tp_volume::{TpLayouts, TpTally};

/// The topology level a collective runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkLevel {
    /// `node` (inside a node) or `network` (across nodes).
    pub level: String,
    /// The cluster file's name for the link (e.g. `nvlink`, `infiniband`).
    pub name: String,
}

impl LinkLevel {
    pub fn of(cluster: &Cluster, cross_node: bool) -> LinkLevel {
        if cross_node {
            LinkLevel {
                level: "network".into(),
                name: cluster
                    .network_link()
                    .map_or_else(|| "network".into(), |l| l.name.clone()),
            }
        } else {
            LinkLevel {
                level: "node".into(),
                name: cluster
                    .node_link()
                    .map_or_else(|| "node".into(), |l| l.name.clone()),
            }
        }
    }
}

/// One kind of communication of one GPU in one iteration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeRow {
    /// `tp`, `pp`, `ep` or `dp`.
    pub parallelism: String,
    /// `all-reduce`, `reduce-scatter`, `all-gather` or `p2p`.
    pub collective: String,
    /// What the buffer holds (activations, gradients, weights, layer parameters...).
    pub payload: String,
    pub link: LinkLevel,
    /// Ranks in the group (2 for point-to-point).
    pub group_size: u64,
    /// Calls per iteration on this GPU.
    pub calls: u64,
    /// Buffer size of one call (the full buffer per rank), bytes.
    pub buffer_bytes: f64,
    /// Bytes this GPU sends per iteration.
    pub bytes_per_gpu: f64,
    /// Seconds the calls take per iteration (before any overlap with compute).
    pub seconds: f64,
}

/// The communication of a GPU of one pipeline stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageVolume {
    pub stage: u32,
    pub rows: Vec<VolumeRow>,
}

impl StageVolume {
    /// Bytes sent per iteration over each link level, in order of first appearance.
    pub fn by_link(&self) -> Vec<(LinkLevel, f64)> {
        let mut out: Vec<(LinkLevel, f64)> = Vec::new();
        for r in &self.rows {
            match out.iter_mut().find(|(l, _)| *l == r.link) {
                Some((_, b)) => *b += r.bytes_per_gpu,
                None => out.push((r.link.clone(), r.bytes_per_gpu)),
            }
        }
        out
    }

    pub fn total_bytes(&self) -> f64 {
        self.rows.iter().map(|r| r.bytes_per_gpu).sum()
    }
}

/// Fraction of a buffer one rank sends in a ring collective over `n` ranks.
pub fn traffic_factor(kind: Collective, n: u64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let frac = (n - 1) as f64 / n as f64;
    match kind {
        Collective::AllReduce => 2.0 * frac,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => frac,
    }
}

fn name(kind: Collective) -> &'static str {
    match kind {
        Collective::AllReduce => "all-reduce",
        Collective::AllGather => "all-gather",
        Collective::ReduceScatter => "reduce-scatter",
        Collective::AllToAll => "all-to-all",
    }
}

/// Bytes of the activation one stage sends to the next per micro-batch (÷ tp with SP).
pub fn p2p_bytes(info: &ModelInfo<'_>, s: &Strategy) -> f64 {
    let act = (s.micro_batch * s.seq * info.hidden) as f64 * s.precision.activation_bytes();
    if s.sequence_parallel {
        act / f64::from(s.tp)
    } else {
        act
    }
}

/// Seconds of one point-to-point activation transfer between consecutive stages.
pub fn p2p_seconds(info: &ModelInfo<'_>, cluster: &Cluster, s: &Strategy) -> f64 {
    let m = mesh(cluster, u64::from(s.tp), u64::from(s.dp), u64::from(s.pp));
    p2p_time(cluster, p2p_bytes(info, s), m.pp_cross_node, m.pp_sharing)
}

/// Parameters held by one GPU of stage `d` (already divided by tp), as the cost model counts them.
pub fn stage_local_params(info: &ModelInfo<'_>, s: &Strategy, d: u32) -> f64 {
    let (dense, experts) = stage_local_split(info, s, d);
    dense + experts
}

pub use crate::estimate::stage_local_split;

struct Builder<'a> {
    cluster: &'a Cluster,
    rows: Vec<VolumeRow>,
}

impl Builder<'_> {
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &mut self,
        parallelism: &str,
        kind: Collective,
        payload: &str,
        group: &Group,
        calls: u64,
        buffer: f64,
    ) {
        if calls == 0 || group.size <= 1 || buffer <= 0.0 {
            return;
        }
        self.rows.push(VolumeRow {
            parallelism: parallelism.into(),
            collective: name(kind).into(),
            payload: payload.into(),
            link: LinkLevel::of(self.cluster, group.nodes > 1),
            group_size: group.size,
            calls,
            buffer_bytes: buffer,
            bytes_per_gpu: calls as f64 * traffic_factor(kind, group.size) * buffer,
            seconds: calls as f64 * collective_time(self.cluster, group, kind, buffer),
        });
    }

    fn p2p(&mut self, payload: &str, m: &Mesh, calls: u64, buffer: f64) {
        if calls == 0 || buffer <= 0.0 {
            return;
        }
        self.rows.push(VolumeRow {
            parallelism: "pp".into(),
            collective: "p2p".into(),
            payload: payload.into(),
            link: LinkLevel::of(self.cluster, m.pp_cross_node),
            group_size: 2,
            calls,
            buffer_bytes: buffer,
            bytes_per_gpu: calls as f64 * buffer,
            seconds: calls as f64 * p2p_time(self.cluster, buffer, m.pp_cross_node, m.pp_sharing),
        });
    }
}

/// Per-GPU communication of every pipeline stage for strategy `s`, the tensor-parallel
/// collectives read off the sharding extraction where `src` says (else by Megatron-LM's rule).
pub fn volumes(
    info: &ModelInfo<'_>,
    cluster: &Cluster,
    s: &Strategy,
    src: TpSource,
) -> Vec<StageVolume> {
    let layouts = TpLayouts::of(info, cluster, s, src);
    let (tp, dp, pp) = (u64::from(s.tp), u64::from(s.dp), u64::from(s.pp));
    let m = mesh_ep(cluster, tp, 1, dp, pp, u64::from(s.ep));
    let mb = s.micro_batches();
    let g = info.graph;
    let runs = info.runs();
    // Per run of identical layers: row-parallel products and expert layers in one layer.
    let per_layer: Vec<(u64, u64)> = runs
        .iter()
        .map(|r| {
            let ops = &r.info.layer_ops;
            let experts = ops
                .iter()
                .filter(|&&o| matches!(g.op(o).kind, ir::OpKind::MoeExperts { .. }))
                .count() as u64;
            (row_parallel_ops(g, ops, info.hidden) as u64, experts)
        })
        .collect();
    let act = (s.micro_batch * s.seq * info.hidden) as f64 * s.precision.activation_bytes();
    // Expert parallelism's all-gather dispatcher: the group's whole-sequence tokens.
    let gathered = act * s.ep as f64;
    // Forward, backward, and the forward again under full recompute.
    let passes: u64 = if s.recompute == Recompute::Full { 3 } else { 2 };
    let n_pre = row_parallel_ops(g, &info.pre_ops, info.hidden) as u64;
    let n_post = row_parallel_ops(g, &info.post_ops, info.hidden) as u64;
    let chunk_layers = s.chunk_layers(info.layers);
    let chunk_runs = info.chunk_run_counts(&chunk_layers);
    let n_chunks = chunk_layers.len();
    let gbytes = s.precision.grad_bytes();
    (0..s.pp)
        .map(|d| {
            let mine: Vec<usize> = (0..n_chunks)
                .filter(|c| *c % s.pp as usize == d as usize)
                .collect();
            let layers: u64 = mine.iter().map(|&c| u64::from(chunk_layers[c])).sum();
            let run_layers: Vec<u64> = (0..runs.len())
                .map(|k| mine.iter().map(|&c| u64::from(chunk_runs[c][k])).sum())
                .collect();
            let first = mine.contains(&0);
            let last = mine.contains(&(n_chunks - 1));
            let mut b = Builder {
                cluster,
                rows: Vec::new(),
            };
            // Tensor parallelism: the extraction's collectives where it laid them out; else
            // per row-parallel product and pass, the B·S·h activation.
            let mut extracted = TpTally::default();
            let mut per_mb = 0;
            let mut expert_layers = 0;
            for (k, (&l, &(rows, experts))) in run_layers.iter().zip(&per_layer).enumerate() {
                expert_layers += l * experts;
                match layouts.runs.get(k).and_then(Option::as_ref) {
                    Some(t) => extracted.add(t, l, mb, s.recompute),
                    None => per_mb += l * rows,
                }
            }
            for (here, rule_ops, side) in [
                (first, n_pre, layouts.outer.as_ref().map(|o| &o.pre)),
                (last, n_post, layouts.outer.as_ref().map(|o| &o.post)),
            ] {
                match (here, side) {
                    (false, _) => {}
                    (true, Some(t)) => extracted.add(t, 1, mb, s.recompute),
                    (true, None) => per_mb += rule_ops,
                }
            }
            for (kind, payload, calls, buffer) in extracted.rows(&layouts) {
                b.collective("tp", kind, payload, &m.tp, calls, buffer);
            }
            let tp_calls = mb * passes * per_mb;
            if s.sequence_parallel {
                b.collective(
                    "tp",
                    Collective::ReduceScatter,
                    "activations",
                    &m.tp,
                    tp_calls,
                    act,
                );
                // Each column-parallel product's input is gathered again for its weight
                // gradient (`Setup::tp_regather`).
                b.collective(
                    "tp",
                    Collective::AllGather,
                    "activations",
                    &m.tp,
                    tp_calls + mb * per_mb,
                    act,
                );
            } else {
                b.collective(
                    "tp",
                    Collective::AllReduce,
                    "activations",
                    &m.tp,
                    tp_calls,
                    act,
                );
            }
            // Pipeline: activations forward, their gradients backward, per micro-batch.
            if pp > 1 {
                let fwd_sends = mine.iter().filter(|&&c| c + 1 < n_chunks).count() as u64;
                let bwd_sends = mine.iter().filter(|&&c| c > 0).count() as u64;
                let bytes = p2p_bytes(info, s);
                b.p2p("activations", &m, mb * fwd_sends, bytes);
                b.p2p("activation gradients", &m, mb * bwd_sends, bytes);
                if info.tied_params > 0 && (first || last) {
                    let tied = info.tied_params as f64 / tp as f64 * gbytes;
                    b.p2p("tied embedding gradients", &m, 1, tied);
                }
            }
            // Expert parallelism: per expert layer and pass, the tokens gathered (the output
            // gradient in the backward) and the partial sums reduce-scattered (the input
            // gradient in the backward), and the routing weights gathered (their gradient by
            // expert in the backward).
            if s.ep > 1 {
                let calls = mb * passes * expert_layers;
                let routing = gathered / info.hidden as f64 * info.experts as f64;
                for (kind, what, bytes) in [
                    (Collective::AllGather, "dispatch tokens", gathered),
                    (Collective::ReduceScatter, "combine tokens", gathered),
                    (Collective::AllGather, "routing weights", routing),
                ] {
                    b.collective("ep", kind, what, &m.ep, calls, bytes);
                }
            }
            // Data parallelism, by ZeRO stage: the dense weights over dp, the experts over the
            // ranks holding the same ones.
            let (dense, experts) = stage_local_split(info, s, d);
            let tp_f = tp as f64;
            // ZeRO-3's per-layer gathers: one layer's weights (the stage's mean layer where
            // the block changes structure).
            let (dense_layer, expert_layer) = if runs.len() == 1 || layers == 0 {
                (
                    info.dense_params_per_tp_rank(s.tp),
                    info.expert_params_per_layer as f64 / tp_f / f64::from(s.ep),
                )
            } else {
                let mean = |per_layer: &dyn Fn(&crate::model::ModelInfo<'_>) -> f64| {
                    let total: f64 = runs
                        .iter()
                        .zip(&run_layers)
                        .map(|(r, &l)| l as f64 * per_layer(r.info))
                        .sum();
                    total / layers as f64
                };
                (
                    mean(&|r| r.dense_params_per_tp_rank(s.tp)),
                    mean(&|r| r.expert_params_per_layer as f64 / tp_f) / f64::from(s.ep),
                )
            };
            let counts = (mb, layers, passes);
            if s.ep > 1 {
                dp_rows(&mut b, s, &m.dp, (dense, dense_layer, ""), counts);
                let experts_of = (experts, expert_layer, "expert ");
                dp_rows(&mut b, s, &m.edp, experts_of, counts);
            } else {
                let all = (dense + experts, dense_layer + expert_layer, "");
                dp_rows(&mut b, s, &m.dp, all, counts);
            }
            StageVolume {
                stage: d,
                rows: b.rows,
            }
        })
        .collect()
}

/// The data-parallel rows of a stage's `local` parameters over `group`, `layer` of them per
/// layer (ZeRO-3 gathers layer by layer); `what` prefixes the payload ("expert ").
fn dp_rows(
    b: &mut Builder<'_>,
    s: &Strategy,
    group: &Group,
    (local, layer, what): (f64, f64, &str),
    (mb, layers, passes): (u64, u64, u64),
) {
    let (wbytes, gbytes) = (s.precision.weight_bytes(), s.precision.grad_bytes());
    let (grads, weights) = (local * gbytes, local * wbytes);
    let mut row = |kind, payload: &str, calls, buffer| {
        b.collective(
            "dp",
            kind,
            &format!("{what}{payload}"),
            group,
            calls,
            buffer,
        );
    };
    match s.zero {
        0 => row(Collective::AllReduce, "gradients", 1, grads),
        1 | 2 => {
            // ZeRO-2 reduce-scatters every micro-batch's gradients.
            let reductions = if s.zero == 2 { mb } else { 1 };
            row(Collective::ReduceScatter, "gradients", reductions, grads);
            row(Collective::AllGather, "weights", 1, weights);
        }
        _ => {
            // ZeRO-3: each layer's parameters as one flat buffer, gathered before its
            // forward, its recompute and its backward; its gradients reduce-scattered.
            let flat = layer * wbytes;
            row(
                Collective::AllGather,
                "layer parameters",
                mb * layers * passes,
                flat,
            );
            row(
                Collective::ReduceScatter,
                "layer gradients",
                mb * layers,
                flat,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::precision::Precision;
    use crate::strategy::Schedule;
    use ir::{DType, Graph};

    fn gpt2() -> Graph {
        let spec = import::zoo::find("gpt2").unwrap();
        import::build_forward(&spec, DType::F32).unwrap()
    }

    fn strategy(tp: u32, pp: u32, dp: u32, zero: u8) -> Strategy {
        Strategy {
            tp,
            pp,
            dp,
            micro_batch: 4,
            global_batch: 64,
            seq: 1024,
            zero,
            recompute: Recompute::None,
            schedule: Schedule::OneFOneB,
            virtual_stages: 1,
            sequence_parallel: false,
            precision: Precision::Bf16,
            attention: Default::default(),
            kernels: Default::default(),
            cp: 1,
            ep: 1,
            engine: crate::engine::Engine::Megatron,
            overlap: crate::engine::Overlap::LEGACY,
            stage_layers: None,
            dp_comm: Default::default(),
        }
    }

    fn row<'a>(v: &'a StageVolume, par: &str, coll: &str, payload: &str) -> &'a VolumeRow {
        v.rows
            .iter()
            .find(|r| r.parallelism == par && r.collective == coll && r.payload == payload)
            .unwrap()
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}");
    }

    fn cluster() -> Cluster {
        Cluster::load("dgx-a100-80gb").unwrap()
    }

    #[test]
    fn tp_all_reduce_moves_two_t_minus_one_over_t_of_the_activation() {
        let g = gpt2();
        let info = ModelInfo::new(&g).unwrap();
        let s = strategy(4, 1, 2, 0);
        let v = volumes(&info, &cluster(), &s, TpSource::RULES);
        let r = row(&v[0], "tp", "all-reduce", "activations");
        let (t, b, seq, h) = (4.0, 4.0, 1024.0, 768.0);
        // Per call: 2(t−1)/t·b·s·h·2 bytes (bf16).
        close(
            r.bytes_per_gpu / r.calls as f64,
            2.0 * (t - 1.0) / t * b * seq * h * 2.0,
        );
        // Per micro-batch, each row-parallel product of a layer (GPT-2: the attention output
        // projection and the MLP down projection) and the vocabulary-parallel embedding, in the
        // forward and once in the backward.
        let n_layer = row_parallel_ops(&g, &info.layer_ops, info.hidden) as u64;
        assert_eq!(n_layer, 2);
        let m = s.micro_batches();
        assert_eq!(r.calls, m * 2 * (12 * n_layer + 1));
        assert_eq!(r.link.level, "node");
        assert_eq!(r.link.name, "nvlink");
    }

    #[test]
    fn sequence_parallel_splits_the_all_reduce_into_halves_and_gathers_again_in_the_backward() {
        let g = gpt2();
        let info = ModelInfo::new(&g).unwrap();
        let mut s = strategy(4, 1, 2, 0);
        let ar = volumes(&info, &cluster(), &s, TpSource::RULES)[0].rows[0].bytes_per_gpu;
        s.sequence_parallel = true;
        let v = volumes(&info, &cluster(), &s, TpSource::RULES);
        let rs = row(&v[0], "tp", "reduce-scatter", "activations").bytes_per_gpu;
        let ag = row(&v[0], "tp", "all-gather", "activations").bytes_per_gpu;
        close(2.0 * rs, ar);
        // The backward gathers each column-parallel product's input again: one all-gather
        // more per reduce-scatter pair.
        close(ag, 1.5 * rs);
    }

    #[test]
    fn full_recompute_repeats_the_forward_collectives() {
        let g = gpt2();
        let info = ModelInfo::new(&g).unwrap();
        let mut s = strategy(2, 1, 4, 0);
        let none = row(
            &volumes(&info, &cluster(), &s, TpSource::RULES)[0],
            "tp",
            "all-reduce",
            "activations",
        )
        .calls;
        s.recompute = Recompute::Full;
        let full = row(
            &volumes(&info, &cluster(), &s, TpSource::RULES)[0],
            "tp",
            "all-reduce",
            "activations",
        )
        .calls;
        assert_eq!(full * 2, none * 3);
    }

    #[test]
    fn dp_volumes_follow_the_zero_stage() {
        let g = gpt2();
        let info = ModelInfo::new(&g).unwrap();
        let c = cluster();
        let psi = info.params() as f64;
        let d = 8.0;
        // ZeRO-0: all-reduce of the bf16 gradients, 2(d−1)/d·2Ψ.
        let v = volumes(&info, &c, &strategy(1, 1, 8, 0), TpSource::RULES);
        close(
            row(&v[0], "dp", "all-reduce", "gradients").bytes_per_gpu,
            2.0 * (d - 1.0) / d * 2.0 * psi,
        );
        // ZeRO-1: reduce-scatter + all-gather, the same total.
        let v = volumes(&info, &c, &strategy(1, 1, 8, 1), TpSource::RULES);
        let total: f64 = v[0].rows.iter().map(|r| r.bytes_per_gpu).sum();
        close(total, 2.0 * (d - 1.0) / d * 2.0 * psi);
        // ZeRO-2: the gradients every micro-batch.
        let s = strategy(1, 1, 8, 2);
        let v = volumes(&info, &c, &s, TpSource::RULES);
        let rs = row(&v[0], "dp", "reduce-scatter", "gradients");
        assert_eq!(rs.calls, s.micro_batches());
        // ZeRO-3: a layer's parameters gathered twice (forward, backward) per micro-batch.
        let s = strategy(1, 1, 8, 3);
        let v = volumes(&info, &c, &s, TpSource::RULES);
        let ag = row(&v[0], "dp", "all-gather", "layer parameters");
        assert_eq!(ag.calls, s.micro_batches() * 12 * 2);
        close(ag.buffer_bytes, info.params_per_layer as f64 * 2.0);
    }

    #[test]
    fn pipeline_sends_activations_and_crosses_nodes_when_a_stage_fills_one() {
        let g = gpt2();
        let info = ModelInfo::new(&g).unwrap();
        let c = cluster();
        let s = strategy(2, 2, 2, 0);
        let v = volumes(&info, &c, &s, TpSource::RULES);
        let fwd = row(&v[0], "pp", "p2p", "activations");
        close(fwd.buffer_bytes, 4.0 * 1024.0 * 768.0 * 2.0);
        assert_eq!(fwd.calls, s.micro_batches());
        assert_eq!(fwd.link.level, "node");
        // The first stage only sends forward, the last only backward.
        assert!(
            v[0].rows
                .iter()
                .all(|r| r.payload != "activation gradients")
        );
        assert!(
            v[1].rows
                .iter()
                .all(|r| r.payload != "activations" || r.parallelism != "pp")
        );
        // Tied embedding gradients between the end stages, once.
        assert_eq!(row(&v[1], "pp", "p2p", "tied embedding gradients").calls, 1);
        // 8 GPUs per stage: consecutive stages sit on different nodes.
        let s = strategy(8, 2, 1, 0);
        let v = volumes(&info, &c, &s, TpSource::RULES);
        assert_eq!(
            row(&v[0], "pp", "p2p", "activations").link.name,
            "infiniband"
        );
    }

    #[test]
    fn dp_across_nodes_uses_the_network() {
        let g = gpt2();
        let info = ModelInfo::new(&g).unwrap();
        let v = volumes(&info, &cluster(), &strategy(4, 1, 4, 0), TpSource::RULES);
        let r = row(&v[0], "dp", "all-reduce", "gradients");
        assert_eq!(r.link.level, "network");
        assert_eq!(r.group_size, 4);
        let by = v[0].by_link();
        assert_eq!(by.len(), 2);
        close(by.iter().map(|(_, b)| b).sum(), v[0].total_bytes());
    }
}
