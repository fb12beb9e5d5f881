//! Whole-block plans: Megatron's layouts must fall out of the rules and the ILP.

#![allow(clippy::unwrap_used)] // test helpers panic on purpose

use std::time::Instant;

use ir::{Binding, DType, Graph, OpKind};
use planner::sharding::{
    BlockPlan, CollectiveKind, ComputeKind, CostOracle, Extraction, Layout, Pass, ShardOptions,
    SimpleCosts, plan_block,
};

fn model(name: &str) -> Graph {
    import::build_forward(&import::zoo::find(name).unwrap(), DType::F32).unwrap()
}

/// The zoo model with dropout off (the sequence-parallel tests read the layouts of the
/// residual stream's norms and adds, which dropout would interleave).
fn model_without_dropout(name: &str) -> Graph {
    let mut spec = import::zoo::find(name).unwrap();
    spec.dropout = 0.0;
    import::build_forward(&spec, DType::F32).unwrap()
}

const B8: Binding = Binding {
    batch: 8,
    seq: 1024,
};

/// [`SimpleCosts`] asked as the planner asks its own oracle (`sharding_costs`): weights'
/// gradients reduced once per step of 8 micro-batches, as the engines reduce them
/// (Megatron-LM's `finalize_model_grads`), and only parameters counted against the block's
/// memory budget.
struct AsPlanned(SimpleCosts);

impl CostOracle for AsPlanned {
    fn compute_seconds(&self, kind: ComputeKind, flops: f64, bytes: f64) -> f64 {
        self.0.compute_seconds(kind, flops, bytes)
    }
    fn collective_seconds(&self, kind: CollectiveKind, bytes: f64, group: u32) -> f64 {
        self.0.collective_seconds(kind, bytes, group)
    }
    fn activation_memory_bytes(&self, _bytes: f64) -> f64 {
        0.0
    }
    fn weight_gradient_share(&self) -> f64 {
        1.0 / 8.0
    }
}

/// The parameter storage per rank of Megatron-LM's layout: each matrix 1/tp of its bytes,
/// vectors and a router's weight (Megatron keeps it replicated) whole.
fn parameter_budget(g: &Graph, ops: &[ir::OpId], tp: u32) -> f64 {
    let router_weight = |v: ir::ValueId| {
        ops.iter().any(|&o| {
            matches!(g.op(o).kind, OpKind::TopKRouter { .. }) && g.op(o).inputs.get(1) == Some(&v)
        })
    };
    ops.iter()
        .filter(|&&o| matches!(g.op(o).kind, OpKind::Param { .. }))
        .map(|&o| {
            let v = g.op(o).results[0];
            let ty = g.ty(v);
            let bytes = ty.shape.fixed_numel().unwrap() as f64 * 4.0;
            if ty.shape.rank() >= 2 && !router_weight(v) {
                bytes / f64::from(tp)
            } else {
                bytes
            }
        })
        .sum()
}

/// The options the planner extracts a block with: its parameters within Megatron's storage.
fn options_at(g: &Graph, tp: u32, sp: bool, b: Binding) -> ShardOptions {
    let ops = g.layer_ops(0);
    ShardOptions {
        memory_limit_bytes: Some(parameter_budget(g, &ops, tp) * (1.0 + 1e-9)),
        ..ShardOptions::new(tp, sp, b)
    }
}

const ORACLE: AsPlanned = AsPlanned(SimpleCosts {
    matmul_flops: 0.6 * 495e12,
    vector_flops: 0.6 * 67e12,
    hbm_bytes_per_s: 0.8 * 3.35e12,
    link_bytes_per_s: 0.8 * 450e9,
    link_latency_s: 5e-6,
    launch_s: 4e-6,
});

fn plan_at(g: &Graph, tp: u32, sp: bool, b: Binding) -> BlockPlan {
    let ops = g.layer_ops(0);
    let opts = options_at(g, tp, sp, b);
    let t = Instant::now();
    let p = plan_block(g, &ops, &opts, &ORACLE).unwrap();
    eprintln!(
        "{} tp={tp} sp={sp}: {:.3e} s/pass, {} optimal={} ILP {:.3} s (plan_block {:.3} s); \
         {} classes, {} candidates, {} vars ({} binary), {} constraints; e-graph {} nodes, {}",
        g.name,
        p.solve.objective_seconds,
        p.solve.solver,
        p.solve.optimal,
        p.solve.seconds,
        t.elapsed().as_secs_f64(),
        p.solve.eclasses,
        p.solve.candidates,
        p.solve.variables,
        p.solve.binaries,
        p.solve.constraints,
        p.egraph_nodes,
        p.saturation
    );
    p
}

/// Position of the `n`-th op (0-based) of a kind in the layer.
fn nth(g: &Graph, pred: impl Fn(&OpKind) -> bool, n: usize) -> usize {
    let ops = g.layer_ops(0);
    ops.iter()
        .enumerate()
        .filter(|(_, o)| pred(&g.op(**o).kind))
        .nth(n)
        .map(|(i, _)| i)
        .unwrap()
}

fn is_linear(k: &OpKind) -> bool {
    matches!(k, OpKind::Linear { .. })
}

fn forward(p: &BlockPlan) -> Vec<(CollectiveKind, Option<usize>)> {
    p.collectives
        .iter()
        .filter(|c| c.pass == Pass::Forward)
        .map(|c| (c.kind, c.after_position))
        .collect()
}

#[test]
fn gpt2_tp2_one_all_reduce_per_attention_and_mlp() {
    let g = model("gpt2");
    let p = plan_at(&g, 2, false, B8);
    assert!(p.solve.optimal, "{}", p.solve.solver);
    let attn_out = nth(&g, is_linear, 1);
    let mlp_out = nth(&g, is_linear, 3);
    assert_eq!(
        forward(&p),
        vec![
            (CollectiveKind::AllReduce, Some(attn_out)),
            (CollectiveKind::AllReduce, Some(mlp_out)),
        ],
        "{:#?}",
        p.collectives
    );
    // The conjugates: one backward all-reduce in front of each column-parallel block.
    assert_eq!(p.count(Pass::Backward, CollectiveKind::AllReduce), 2);
    // Column-parallel QKV (block-wise: q, k and v each split by heads) and MLP up-projection.
    let qkv = p.op_at(nth(&g, is_linear, 0)).unwrap();
    assert_eq!(qkv.output, Some(Layout::Split { axis: 2, blocks: 3 }));
    let up = p.op_at(nth(&g, is_linear, 2)).unwrap();
    assert_eq!(up.output, Some(Layout::Split { axis: 2, blocks: 1 }));
    let attn = p
        .op_at(nth(&g, |k| matches!(k, OpKind::Attention { .. }), 0))
        .unwrap();
    assert_eq!(attn.output, Some(Layout::Split { axis: 2, blocks: 1 }));
    // Row-parallel projections read split inputs and weights split by rows.
    let down = p.op_at(mlp_out).unwrap();
    assert_eq!(
        &down.inputs[..2],
        &[
            Layout::Split { axis: 2, blocks: 1 },
            Layout::Split { axis: 0, blocks: 1 }
        ]
    );
    // Bytes per all-reduce: B·S·h·4.
    for c in &p.collectives {
        assert_eq!(c.bytes_formula.to_string(), "3072·B·S");
        assert_eq!(c.bytes, (8 * 1024 * 768 * 4) as f64);
    }
    let json = serde_json::to_string(&p).unwrap();
    let back: BlockPlan = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p);
}

#[test]
fn gpt2_tp2_sequence_parallel_uses_reduce_scatter_and_all_gather() {
    let g = model_without_dropout("gpt2");
    let p = plan_at(
        &g,
        2,
        true,
        Binding {
            batch: 1,
            seq: 1024,
        },
    );
    let fwd = forward(&p);
    assert_eq!(
        p.count(Pass::Forward, CollectiveKind::AllReduce),
        0,
        "{fwd:?}"
    );
    assert_eq!(
        p.count(Pass::Forward, CollectiveKind::ReduceScatter),
        2,
        "{fwd:?}"
    );
    assert_eq!(
        p.count(Pass::Forward, CollectiveKind::AllGather),
        2,
        "{fwd:?}"
    );
    let (attn_out, mlp_out) = (nth(&g, is_linear, 1), nth(&g, is_linear, 3));
    assert!(fwd.contains(&(CollectiveKind::ReduceScatter, Some(attn_out))));
    assert!(fwd.contains(&(CollectiveKind::ReduceScatter, Some(mlp_out))));
    // Residual adds run on sequence shards.
    for n in 0..2 {
        let add = p.op_at(nth(&g, |k| matches!(k, OpKind::Add), n)).unwrap();
        assert_eq!(add.output, Some(Layout::Split { axis: 1, blocks: 1 }));
    }
}

#[test]
fn tp1_has_no_collectives() {
    for name in ["gpt2", "llama2-7b", "mixtral-8x7b"] {
        let g = model(name);
        for sp in [false, true] {
            let p = plan_at(&g, 1, sp, B8);
            assert!(p.collectives.is_empty(), "{name}: {:?}", p.collectives);
            assert!(p.solve.optimal);
        }
    }
}

#[test]
fn llama_tp2_one_all_reduce_per_attention_and_mlp() {
    let g = model("llama2-7b");
    let p = plan_at(&g, 2, false, B8);
    assert!(p.solve.optimal, "{}", p.solve.solver);
    let o_proj = nth(&g, is_linear, 3);
    let down = nth(&g, is_linear, 6);
    assert_eq!(
        forward(&p),
        vec![
            (CollectiveKind::AllReduce, Some(o_proj)),
            (CollectiveKind::AllReduce, Some(down)),
        ]
    );
    // SwiGLU: gate and up column-parallel, silu and mul on the split.
    for n in [4, 5] {
        let l = p.op_at(nth(&g, is_linear, n)).unwrap();
        assert_eq!(l.output, Some(Layout::Split { axis: 2, blocks: 1 }));
    }
}

#[test]
fn gqa_llama3_8b_tp8_splits_kv_heads() {
    let g = model("llama3-8b");
    let p = plan_at(&g, 8, false, B8);
    assert!(p.solve.optimal);
    // q, k, v projections column-parallel: 32 query heads and 8 kv heads over 8 ranks.
    for n in 0..3 {
        let l = p.op_at(nth(&g, is_linear, n)).unwrap();
        assert_eq!(
            l.output,
            Some(Layout::Split { axis: 2, blocks: 1 }),
            "linear {n}"
        );
    }
    let attn = p
        .op_at(nth(&g, |k| matches!(k, OpKind::Attention { .. }), 0))
        .unwrap();
    assert_eq!(attn.inputs, vec![Layout::Split { axis: 2, blocks: 1 }; 3]);
    assert_eq!(p.count(Pass::Forward, CollectiveKind::AllReduce), 2);
}

#[test]
fn mixtral_tp2_splits_experts_or_their_ffn() {
    let g = model("mixtral-8x7b");
    let p = plan_at(&g, 2, false, B8);
    let moe = p
        .op_at(nth(&g, |k| matches!(k, OpKind::MoeExperts { .. }), 0))
        .unwrap();
    let w = &moe.inputs[2..];
    let experts = w.iter().all(|l| *l == Layout::Split { axis: 0, blocks: 1 });
    let ffn = w
        == [
            Layout::Split { axis: 2, blocks: 1 },
            Layout::Split { axis: 2, blocks: 1 },
            Layout::Split { axis: 1, blocks: 1 },
        ];
    assert!(experts || ffn, "{moe:?}");
    assert_eq!(moe.output, Some(Layout::Partial));
    assert_eq!(p.count(Pass::Forward, CollectiveKind::AllReduce), 2);
}

/// Beside expert parallelism (the experts already split over `--ep` ranks) the TP group splits
/// each expert's FFN, Megatron-Core's expert tensor parallelism, never the experts again; on
/// sequence shards too, where the extraction alone would split the experts.
/// gpt-oss's biased experts alike (their gate and up biases split with the FFN's columns).
#[test]
fn mixtral_tp2_beside_expert_parallelism_splits_each_experts_ffn() {
    let oss = import::hf::read_config(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/hf/gpt-oss-20b/config.json"
    )))
    .unwrap();
    let oss = import::build_forward(&oss, DType::F32).unwrap();
    for (g, sp) in [
        (model("mixtral-8x7b"), false),
        (model("mixtral-8x7b"), true),
        (oss.clone(), false),
        (oss, true),
    ] {
        let ops = g.layer_ops(0);
        let opts = ShardOptions {
            experts_split_outside: true,
            ..options_at(&g, 2, sp, B8)
        };
        let p = plan_block(&g, &ops, &opts, &ORACLE).unwrap();
        let moe = p
            .op_at(nth(&g, |k| matches!(k, OpKind::MoeExperts { .. }), 0))
            .unwrap();
        let by_ffn = [2, 2, 1, 1, 1].map(|axis| Layout::Split { axis, blocks: 1 });
        assert_eq!(
            moe.inputs[2..],
            by_ffn[..moe.inputs.len() - 2],
            "sp {sp}: {moe:?}"
        );
        assert_eq!(moe.output, Some(Layout::Partial), "sp {sp}");
    }
}

/// The exact extraction proves every block optimal in milliseconds, sequence parallelism
/// included (the ILP needed 15 s under microlp for GPT-2 at tp 2 with SP).
#[test]
fn extraction_is_optimal_and_fast_for_gpt_and_llama() {
    for name in ["gpt2", "llama2-7b"] {
        let g = model(name);
        for tp in [1, 2, 4, 8] {
            for sp in [false, true] {
                let p = plan_at(&g, tp, sp, B8);
                assert!(p.solve.optimal, "{name} tp={tp}: {}", p.solve.solver);
                assert!(
                    p.solve.seconds < 1.0,
                    "{name} tp={tp} sp={sp}: {} s",
                    p.solve.seconds
                );
            }
        }
    }
}

/// The exact extraction and the ILP (an independent formulation, solved by good_lp) agree on
/// the optimum of every block the ILP proves quickly.
#[test]
fn exact_extraction_equals_the_ilp_optimum() {
    for name in ["gpt2", "llama2-7b", "mixtral-8x7b"] {
        let g = model(name);
        let ops = g.layer_ops(0);
        for tp in [2, 4, 8] {
            let exact = plan_at(&g, tp, false, B8);
            let mut opts = options_at(&g, tp, false, B8);
            opts.extraction = Extraction::Ilp {
                time_limit_s: 600.0,
            };
            let ilp = plan_block(&g, &ops, &opts, &ORACLE).unwrap();
            assert!(ilp.solve.optimal, "{name} tp={tp}: {}", ilp.solve.solver);
            let (a, b) = (exact.solve.objective_seconds, ilp.solve.objective_seconds);
            // Never worse than the ILP; the ILP within its solver's proof tolerance (HiGHS
            // stops at a relative MIP gap of 1e-4).
            assert!(
                a <= b * (1.0 + 1e-12) && b <= a * (1.0 + 1e-4),
                "{name} tp={tp}: exact {a:e} s, ILP {b:e} s"
            );
        }
    }
}

#[test]
fn memory_limit_is_respected_or_reported() {
    let g = model("gpt2");
    let ops = g.layer_ops(0);
    let mut opts = ShardOptions::new(2, false, B8);
    let free = plan_block(&g, &ops, &opts, &SimpleCosts::h100_tf32()).unwrap();
    let used = free.totals.param_bytes_per_rank + free.totals.activation_bytes_per_rank;
    opts.memory_limit_bytes = Some(used * 0.9);
    match plan_block(&g, &ops, &opts, &SimpleCosts::h100_tf32()) {
        Ok(p) => {
            let m = p.totals.param_bytes_per_rank + p.totals.activation_bytes_per_rank;
            assert!(m <= used * 0.9 + 1.0, "{m} > {}", used * 0.9);
            assert!(p.solve.objective_seconds >= free.solve.objective_seconds - 1e-12);
        }
        Err(e) => assert!(matches!(
            e,
            planner::sharding::ShardError::OutOfMemory { .. }
        )),
    }
    opts.memory_limit_bytes = Some(1.0);
    assert!(matches!(
        plan_block(&g, &ops, &opts, &SimpleCosts::h100_tf32()),
        Err(planner::sharding::ShardError::OutOfMemory { .. })
    ));
}

/// Over an expert-parallel group (ranks holding a batch shard each and their experts' block of
/// every expert weight), the extraction re-derives Megatron-Core's all-gather dispatcher for
/// Mixtral-8x7B at ep 2, 4 and 8: tokens all-gathered along the batch before the expert layer,
/// the experts run on the gathered tokens with gates sliced to them, the partial output
/// reduce-scattered back; attention and norms stay on the rank's own sequences, with no
/// activation collective.
#[test]
fn expert_groups_rederive_the_all_gather_dispatcher() {
    let g = model("mixtral-8x7b");
    let ops = g.layer_ops(0);
    for ep in [2, 4, 8] {
        let b = Binding {
            batch: ep,
            seq: 1024,
        };
        let opts = ShardOptions::expert_group(ep as u32, b);
        let p = plan_block(&g, &ops, &opts, &SimpleCosts::h100_tf32()).unwrap();
        planner::sharding_costs::expert_layout_is_lowered(&p)
            .unwrap_or_else(|why| panic!("ep {ep}: {why}\n{:#?}", p.program));
        let moe = nth(&g, |k| matches!(k, OpKind::MoeExperts { .. }), 0);
        let router = nth(&g, |k| matches!(k, OpKind::TopKRouter { .. }), 0);
        let norm = nth(&g, |k| matches!(k, OpKind::RmsNorm { .. }), 1);
        let forward: Vec<_> = p
            .collectives
            .iter()
            .filter(|c| c.pass == Pass::Forward)
            .map(|c| (c.kind, c.after_position, c.axis))
            .collect();
        // The tokens (the norm's output) and their routing weights gathered, the experts'
        // output reduce-scattered; nothing else.
        assert_eq!(
            forward,
            vec![
                (CollectiveKind::AllGather, Some(norm), Some(0)),
                (CollectiveKind::AllGather, Some(router), Some(0)),
                (CollectiveKind::ReduceScatter, Some(moe), Some(0)),
            ],
            "ep {ep}"
        );
    }
}
