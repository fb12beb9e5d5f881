//! The embedding's and the head's tensor-parallel layout is the sharding extraction of the ops
//! outside the layers (`sharding_costs::embedding_head_plan`), priced by the estimate as the
//! sum of its collectives.
//!
//! The oracle is Megatron-LM's vocabulary-parallel embedding and loss (Shoeybi et al. 2019,
//! §3; `VocabParallelEmbedding`, `vocab_parallel_cross_entropy`, Megatron-Core's
//! `reduce_scatter_embeddings` with SP): per micro-batch, the embedding's partial sums
//! all-reduced (reduce-scattered onto sequence shards with SP, all-gathered back in the
//! backward); the head column-parallel over the vocabulary, its input's gradient all-reduced
//! in the backward (with SP: its input all-gathered before it and the gradient
//! reduce-scattered), and the loss's three statistics (max, sum of exponentials, target logit:
//! B·S floats each) combined over the group (Megatron all-reduces each; plait's program
//! gathers all three once, codegen's `LossStats`, all-gather, `LossCombine`, and is priced
//! so); the final norm's weights, read on sequence shards under SP, reduced once per step. A tied table is held once, vocabulary-split, by both.

#![allow(clippy::unwrap_used)] // test helpers panic on purpose

mod common;

use ir::{DType, Graph, OpKind};
use planner::estimate::LayerTpComm;
use planner::sharding::{BlockPlan, CollectiveKind, CollectivePlan, Pass};
use planner::{Cluster, ModelInfo, estimate};

fn model(name: &str) -> Graph {
    let mut spec = import::zoo::find(name).unwrap();
    spec.layers = 2;
    import::build_forward(&spec, DType::F32).unwrap()
}

use common::as_run;
use common::tp_strategy as strategy;

/// The collectives after (or of a value of) the ops before the layers (`pre`), or after them.
fn mine<'b>(info: &ModelInfo, bp: &'b BlockPlan, pre: bool) -> Vec<&'b CollectivePlan> {
    let g = info.graph;
    bp.collectives
        .iter()
        .filter(|c| {
            let o = c.after_op.or_else(|| c.value.map(|v| g.def_op(v))).unwrap();
            info.pre_ops.contains(&o) == pre
        })
        .collect()
}

/// (kind, pass, once per step, bytes) of [`mine`], sorted.
fn part(info: &ModelInfo, bp: &BlockPlan, pre: bool) -> Vec<(CollectiveKind, Pass, bool, f64)> {
    let v = mine(info, bp, pre)
        .into_iter()
        .map(|c| (c.kind, c.pass, c.per_step, c.bytes))
        .collect();
    sorted(v)
}

fn sorted(mut v: Vec<(CollectiveKind, Pass, bool, f64)>) -> Vec<(CollectiveKind, Pass, bool, f64)> {
    v.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    v
}

/// Norm weights (and biases) after the last layer: reduced once per step under SP.
fn final_norm_params(g: &Graph, info: &ModelInfo) -> usize {
    info.post_ops
        .iter()
        .filter(|&&o| {
            matches!(
                g.op(o).kind,
                OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. }
            )
        })
        .map(|&o| g.op(o).inputs.len() - 1)
        .sum()
}

/// Llama 3 8B (untied, 128,256 tokens) and Megatron's 1.7B GPT (tied, 51,200 tokens, a learned
/// position table) at tp 2–8: the extraction is the vocabulary-parallel layout, with exactly
/// Megatron-LM's collectives. With SP and a position table Megatron-Core all-reduces the
/// token embedding, adds the positions and scatters the sum onto sequence pieces
/// (`scatter_to_sequence_parallel_region`), whose backward all-gathers the pieces' gradients:
/// the extraction prices a replicated value read only in pieces so. The final norm's output,
/// gathered for the head, is gathered again for the head's weight gradient.
#[test]
fn extraction_is_the_vocabulary_parallel_layout() {
    use CollectiveKind::{AllGather as Ag, AllReduce as Ar, ReduceScatter as Rs};
    use Pass::{Backward as Bwd, Forward as Fwd};
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    for name in ["llama3-8b", "gpt-1.7b"] {
        let g = model(name);
        let info = ModelInfo::new(&g).unwrap();
        let positions = info.max_seq != u64::MAX;
        let tokens = 2.0 * 1024.0; // B = 2, S = 1024
        let act = tokens * info.hidden as f64 * 4.0; // f32 graph
        let stats = tokens * 4.0;
        for tp in [2, 4, 8] {
            for sp in [false, true] {
                let s = strategy(tp, sp, 2);
                let bp = planner::sharding_costs::embedding_head_plan(&info, &cluster, &s).unwrap();
                let at = format!("{name} tp {tp} sp {sp}");
                // The token table (and a tied head) vocabulary-split; the position table whole.
                for op in bp.ops.iter().filter(|o| o.mnemonic == "param") {
                    let v = g.op(op.op).results[0];
                    let want = if info.vocabulary_matrix(v) {
                        let vocab_axis = g
                            .ty(v)
                            .shape
                            .dims()
                            .iter()
                            .position(|d| d.fixed() == Some(info.vocab));
                        format!("Some(Split {{ axis: {}, blocks: 1 }})", vocab_axis.unwrap())
                    } else {
                        "Some(Replicated)".into()
                    };
                    assert_eq!(format!("{:?}", op.output), want, "{at}: param {:?}", op.op);
                }
                let pre = part(&info, &bp, true);
                let pre_want = match (sp, positions) {
                    (false, _) => vec![(Ar, Fwd, false, act)],
                    (true, false) => vec![(Ag, Bwd, false, act), (Rs, Fwd, false, act)],
                    (true, true) => vec![(Ag, Bwd, false, act), (Ar, Fwd, false, act)],
                };
                assert_eq!(pre, sorted(pre_want), "{at}: embedding");
                // Every member's three statistics, gathered once.
                let mut head_want = vec![(Ag, Fwd, false, 3.0 * f64::from(tp) * stats)];
                if sp {
                    head_want.push((Ag, Fwd, false, act));
                    // Gathered again for the head's weight gradient (the shard is kept).
                    head_want.push((Ag, Bwd, false, act));
                    head_want.push((Rs, Bwd, false, act));
                    for c in bp.collectives.iter().filter(|c| c.per_step) {
                        head_want.push((Ar, Bwd, true, c.bytes));
                    }
                } else {
                    head_want.push((Ar, Bwd, false, act));
                }
                assert_eq!(part(&info, &bp, false), sorted(head_want), "{at}: head");
                let per_step = bp.collectives.iter().filter(|c| c.per_step).count();
                let want_per_step = if sp { final_norm_params(&g, &info) } else { 0 };
                assert_eq!(per_step, want_per_step, "{at}: per-step reductions");
            }
        }
    }
}

/// The estimate's embedding and head TP communication (`embedding_tp_comm`, `head_tp_comm`)
/// is the sum over the extraction's collectives as the program runs them (`as_run`): forward
/// and backward seconds per micro-batch, the per-step reductions bucketed and shared over the
/// m micro-batches.
#[test]
fn estimate_prices_the_embedding_and_head_as_extracted() {
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    for name in ["llama3-8b", "gpt-1.7b"] {
        let g = model(name);
        let info = ModelInfo::new(&g).unwrap();
        for tp in [2, 8] {
            for sp in [false, true] {
                let s = strategy(tp, sp, 2);
                let bp = planner::sharding_costs::embedding_head_plan(&info, &cluster, &s).unwrap();
                let e = estimate(&info, &cluster, u64::from(tp), &s).unwrap();
                let at = format!("{name} tp {tp} sp {sp}");
                for (pre, got) in [
                    (true, e.predicted.embedding_tp_comm.clone().unwrap()),
                    (false, e.predicted.head_tp_comm.clone().unwrap()),
                ] {
                    assert_eq!(got.source, LayerTpComm::EXTRACTION, "{at}");
                    let mine = mine(&info, &bp, pre);
                    let ((fwd, bwd), collectives) = as_run(&mine, &cluster, &s);
                    assert_eq!(got.collectives, Some(collectives), "{at}");
                    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-12);
                    assert!(close(got.fwd_s, fwd), "{at}: {got:?}");
                    assert!(close(got.bwd_s, bwd), "{at}: {got:?}");
                }
            }
        }
    }
}

/// GPT-2's 50,257 tokens do not divide by 2 or 8: the vocabulary is padded, as Megatron-LM
/// pads it (to ⌈V / tp⌉ rows per rank, 25,129 at tp 2 and 6,283 at tp 8), and the extraction
/// is still the vocabulary-parallel layout with Megatron's collectives; the memory model
/// counts each rank's padded rows of the (tied) table, the position table and the norms whole.
#[test]
fn a_vocabulary_that_does_not_divide_is_padded() {
    use CollectiveKind::AllReduce as Ar;
    use Pass::Forward as Fwd;
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let g = model("gpt2");
    let info = ModelInfo::new(&g).unwrap();
    assert_eq!(info.vocab, 50_257);
    let tokens = 2.0 * 1024.0;
    for (tp, rows) in [(2u32, 25_129u64), (8, 6_283)] {
        assert_eq!(info.padded_vocab(tp), rows * u64::from(tp));
        let s = strategy(tp, false, 2);
        let bp = planner::sharding_costs::embedding_head_plan(&info, &cluster, &s).unwrap();
        let table = bp
            .ops
            .iter()
            .find(|o| o.mnemonic == "param" && info.vocabulary_matrix(g.op(o.op).results[0]));
        assert_eq!(
            format!("{:?}", table.unwrap().output),
            "Some(Split { axis: 0, blocks: 1 })",
            "tp {tp}"
        );
        let act = tokens * info.hidden as f64 * 4.0;
        assert_eq!(
            part(&info, &bp, true),
            vec![(Ar, Fwd, false, act)],
            "tp {tp}: embedding"
        );
        let (dense, _) = planner::estimate::stage_local_split(&info, &s, 0);
        // Each GPT-2 layer's two LayerNorms (weight and bias) stay whole, as Megatron-LM
        // keeps them; the rest of the layer is split.
        let norms = 4 * info.hidden;
        let split = (info.dense_params_per_layer() - norms) as f64 / f64::from(tp);
        let layers = 2.0 * (split + norms as f64);
        let table = rows * info.hidden;
        let whole = info.pre_params + info.post_params - info.vocab * info.hidden;
        let want = layers + (table + whole) as f64;
        assert!((dense - want).abs() < 1.0, "tp {tp}: {dense} vs {want}");
    }
}
