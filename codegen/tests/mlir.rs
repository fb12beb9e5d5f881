//! MLIR export: every module passes MLIR's own verifier (run with `--features mlir`).
//!
//! Synthetic programs cover each instruction and lowering path (linalg forms, external
//! kernels, flat and axis collectives, padding, pipeline messages, the `@tied` grid); the six
//! snapshot cases of `common::cases` (DP2, TP2+SP, PP2 1F1B, PP2 interleaved, ZeRO-3 with DP2,
//! TP2×PP2×DP2) and every ZeRO stage × recompute × schedule × precision on the tiny model
//! cover the real lowering; the plans in `tests/plans/` (written by `plait compile`: gpt2 at
//! seq 1024, bf16, e-graph sharding for TP2 without SP) cover full-size shapes.

#![cfg(feature = "mlir")]
#![allow(clippy::unwrap_used)]

mod common;

use codegen::ids::{BucketId, BufferId, GroupId, ParamId, TemplateId};
use codegen::mlir::{MlirError, Verifier, emit_template, export};
use codegen::program::{
    Algorithm, BufferDecl, CollectiveOp, Coords, Elem, Group, Instr, MeshInfo, ParamInfo,
    ParamShard, Pass, Peer, Phase, ProgramSet, Purpose, RankInfo, Role, Slot, Template, tag,
};
use ir::OpKind;

/// A one-template program set over a pp × dp × tp mesh (every rank runs template 0).
struct Synth {
    buffers: Vec<BufferDecl>,
    init: Vec<Instr>,
    instrs: Vec<Instr>,
    shards: Vec<ParamShard>,
}

impl Synth {
    fn new() -> Synth {
        Synth {
            buffers: Vec::new(),
            init: Vec::new(),
            instrs: Vec::new(),
            shards: Vec::new(),
        }
    }

    fn buf(&mut self, name: &str, elem: Elem, shape: &[u64], role: Role) -> BufferId {
        self.buffers.push(BufferDecl {
            name: name.into(),
            elem,
            shape: shape.to_vec(),
            role,
            partial: false,
        });
        BufferId(self.buffers.len() as u32 - 1)
    }

    fn act(&mut self, name: &str, elem: Elem, shape: &[u64]) -> BufferId {
        let b = self.buf(name, elem, shape, Role::Activation);
        self.instrs.push(Instr::Alloc { buf: b });
        b
    }

    fn compute(&mut self, kind: OpKind, inputs: &[BufferId], outputs: &[BufferId]) {
        self.instrs.push(Instr::Compute {
            kind,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            saves: vec![],
            layer: Some(0),
        });
    }

    fn collective(
        &mut self,
        op: CollectiveOp,
        group: Slot,
        axis: Option<u8>,
        i: BufferId,
        o: BufferId,
    ) {
        self.instrs.push(Instr::Collective {
            op,
            group,
            algorithm: Algorithm::Ring,
            axis,
            pairs: vec![(i, o)],
            purpose: Purpose::Activation,
            bucket: None,
        });
    }

    fn set(self, pp: u32, dp: u32, tp: u32) -> ProgramSet {
        let n = pp * dp * tp;
        let ranks = (0..n)
            .map(|r| RankInfo {
                rank: r,
                coords: Coords {
                    tp: r % tp,
                    dp: (r / tp) % dp,
                    pp: r / (tp * dp),
                },
                template: TemplateId(0),
                groups: vec![Some(GroupId(0)), Some(GroupId(1)), Some(GroupId(2))],
                prev: r,
                next: r,
            })
            .collect();
        ProgramSet {
            format: "plait-program/1".into(),
            model: "synthetic".into(),
            mesh: MeshInfo {
                tp,
                dp,
                pp,
                virtual_stages: 1,
                micro_batches: 1,
                micro_batch: 2,
                seq: 8,
                schedule: "1f1b".into(),
                zero: 0,
                recompute: "none".into(),
                sequence_parallel: false,
                precision: "bf16".into(),
                ep: 1,
                cp: 1,
                attention: "materialized".into(),
            },
            params: vec![
                ParamInfo {
                    name: "w".into(),
                    shape: vec![16, 32],
                },
                ParamInfo {
                    name: "bias".into(),
                    shape: vec![32],
                },
            ],
            groups: vec![
                Group {
                    id: GroupId(0),
                    slot: Slot::Tp,
                    ranks: (0..tp).collect(),
                },
                Group {
                    id: GroupId(1),
                    slot: Slot::Dp,
                    ranks: (0..dp).map(|d| d * tp).collect(),
                },
                Group {
                    id: GroupId(2),
                    slot: Slot::Tied,
                    ranks: vec![0, (pp - 1) * tp * dp],
                },
            ],
            predicted: vec![],
            ranks,
            templates: vec![Template {
                id: TemplateId(0),
                stage: 0,
                chunks: vec![0],
                buffers: self.buffers,
                shards: self.shards,
                init: self.init,
                instrs: self.instrs,
            }],
        }
    }
}

/// A layer's worth of forward, backward, communication and optimizer instructions.
fn synthetic(pp: u32, dp: u32, tp: u32) -> ProgramSet {
    let mut s = Synth::new();
    let (b, t, h, f) = (2, 8, 16, 32);
    let w = s.buf("w", Elem::Bf16, &[h, f], Role::Param(ParamId(0)));
    let bias = s.buf("bias", Elem::Bf16, &[f], Role::Param(ParamId(1)));
    let master = s.buf("w.master", Elem::F32, &[h, f], Role::Master(ParamId(0)));
    let m = s.buf("w.m", Elem::F32, &[h, f], Role::OptM(ParamId(0)));
    let v = s.buf("w.v", Elem::F32, &[h, f], Role::OptV(ParamId(0)));
    let g = s.buf("w.grad", Elem::F32, &[h, f], Role::Grad(ParamId(0)));
    for (p, buf) in [(0, w), (1, bias)] {
        s.shards.push(ParamShard {
            param: ParamId(p),
            tp: None,
            zero: false,
            expert: false,
            init: buf,
        });
    }
    for buf in [w, bias, master, m, v, g] {
        s.init.push(Instr::Alloc { buf });
    }
    s.init.push(Instr::InitParams {
        bufs: vec![w, bias],
    });
    s.init.push(Instr::Copy {
        src: w,
        dst: master,
    });
    s.init.push(Instr::Fill { buf: m, value: 0.0 });
    s.init.push(Instr::Fill { buf: v, value: 0.0 });

    s.instrs.push(Instr::Task {
        phase: Phase::WarmUp,
        chunk: 0,
        micro_batch: 0,
        pass: Pass::Forward,
    });
    let ids = s.buf("ids", Elem::I64, &[b, t], Role::Tokens);
    let tgt = s.buf("targets", Elem::I64, &[b, t], Role::Tokens);
    s.instrs.push(Instr::Alloc { buf: ids });
    s.instrs.push(Instr::Alloc { buf: tgt });
    s.instrs.push(Instr::LoadTokens {
        micro_batch: 0,
        input_ids: Some(ids),
        targets: Some(tgt),
    });
    let x = s.act("x", Elem::Bf16, &[b, t, h]);
    s.instrs.push(Instr::Recv {
        buf: x,
        peer: Peer::Prev,
        tag: tag(0, 0, Pass::Forward),
    });
    // Linear with bias, gelu, residual-style broadcast add, mean, softmax.
    let y = s.act("y", Elem::Bf16, &[b, t, f]);
    s.compute(OpKind::Linear { bias: true }, &[x, w, bias], &[y]);
    s.compute(OpKind::Gelu { tanh: true }, &[y], &[y]);
    s.compute(OpKind::Add, &[y, bias], &[y]);
    let mean = s.act("mean", Elem::F32, &[b, t, 1]);
    s.compute(OpKind::ReduceMean, &[y], &[mean]);
    s.compute(OpKind::Sub, &[y, mean], &[y]);
    s.compute(OpKind::Softmax { causal: false }, &[y], &[y]);
    s.compute(OpKind::Softmax { causal: true }, &[y], &[y]);
    // Transpose and batched matmul.
    let yt = s.act("yt", Elem::Bf16, &[b, f, t]);
    s.compute(
        OpKind::Transpose {
            perm: vec![0, 2, 1],
        },
        &[y],
        &[yt],
    );
    let sq = s.act("sq", Elem::Bf16, &[b, t, t]);
    s.compute(OpKind::MatMul, &[y, yt], &[sq]);
    // An op without a linalg form: an external kernel, with a saved buffer.
    let q = s.act("q", Elem::Bf16, &[b, t, h]);
    let scores = s.buf("scores", Elem::Bf16, &[b, 2, t, t], Role::Saved);
    s.instrs.push(Instr::Alloc { buf: scores });
    s.instrs.push(Instr::Compute {
        kind: OpKind::Attention {
            heads: 2,
            kv_heads: 2,
            scale: 0.125,
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        },
        inputs: vec![x, x, x],
        outputs: vec![q],
        saves: vec![scores],
        layer: Some(0),
    });
    // Split, slice, concat, reshape.
    let (p0, p1) = (
        s.act("p0", Elem::Bf16, &[b, t, 8]),
        s.act("p1", Elem::Bf16, &[b, t, 8]),
    );
    s.compute(
        OpKind::Split {
            axis: 2,
            sizes: vec![8, 8],
        },
        &[q],
        &[p0, p1],
    );
    s.compute(OpKind::Concat { axis: 2 }, &[p1, p0], &[q]);
    let flat = s.act("flat", Elem::Bf16, &[b * t, h]);
    s.compute(
        OpKind::Reshape {
            shape: vec![ir::Dim::Fixed(b * t), ir::Dim::Fixed(h)],
        },
        &[q],
        &[flat],
    );
    // Tensor-parallel collectives on axis 2: all-reduce, all-gather along an axis, flat
    // reduce-scatter of 250 elements (padded), chunk.
    s.collective(CollectiveOp::AllReduce, Slot::Tp, None, q, q);
    let gathered = s.act("gathered", Elem::Bf16, &[b, t * u64::from(tp), h]);
    s.collective(CollectiveOp::AllGather, Slot::Tp, Some(1), q, gathered);
    let odd = s.act("odd", Elem::F32, &[250]);
    s.instrs.push(Instr::Fill {
        buf: odd,
        value: 1.5,
    });
    let piece = s.act("piece", Elem::F32, &[250u64.div_ceil(u64::from(tp))]);
    s.collective(CollectiveOp::ReduceScatter, Slot::Tp, None, odd, piece);
    let back = s.act("back", Elem::F32, &[250]);
    s.collective(CollectiveOp::AllGather, Slot::Tp, None, piece, back);
    let chunk = s.act("chunk", Elem::Bf16, &[b, t / u64::from(tp), h]);
    s.instrs.push(Instr::Chunk {
        src: q,
        dst: chunk,
        axis: Some(1),
        group: Slot::Tp,
    });
    s.instrs.push(Instr::Send {
        buf: q,
        peer: Peer::Next,
        tag: tag(1, 0, Pass::Forward),
    });
    // Loss, backward (external), gradient reduction in a bucket, tied gradients, AdamW.
    let loss = s.act("loss", Elem::F32, &[]);
    s.compute(OpKind::CrossEntropy, &[y, tgt], &[loss]);
    s.instrs.push(Instr::Loss {
        buf: loss,
        weight: 0.25,
    });
    let dy = s.act("dy", Elem::Bf16, &[b, t, f]);
    s.instrs.push(Instr::Fill {
        buf: dy,
        value: f64::NEG_INFINITY,
    });
    let dx = s.act("dx", Elem::Bf16, &[b, t, h]);
    s.compute(
        OpKind::Grad {
            of: Box::new(OpKind::Linear { bias: true }),
            wrt: vec![0, 1],
        },
        &[x, w, bias, dy],
        &[dx, g],
    );
    // Backward of the batched matmul (lowered to batch_matmuls) and of attention (a kernel).
    let (dyt_a, dyt_b) = (
        s.act("d.y", Elem::Bf16, &[b, t, f]),
        s.act("d.yt", Elem::Bf16, &[b, f, t]),
    );
    s.compute(
        OpKind::Grad {
            of: Box::new(OpKind::MatMul),
            wrt: vec![0, 1],
        },
        &[y, yt, sq],
        &[dyt_a, dyt_b],
    );
    s.compute(
        OpKind::Grad {
            of: Box::new(OpKind::Attention {
                heads: 2,
                kv_heads: 2,
                scale: 0.125,
                causal: true,
                softcap: None,
                sinks: false,
                window: None,
                chunk: None,
            }),
            wrt: vec![0],
        },
        &[x, x, x, q],
        &[dx],
    );
    s.instrs.push(Instr::Collective {
        op: CollectiveOp::AllReduce,
        group: Slot::Dp,
        algorithm: Algorithm::Ring,
        axis: None,
        pairs: vec![(g, g), (bias, bias)],
        purpose: Purpose::GradReduce,
        bucket: Some(BucketId(0)),
    });
    s.collective(CollectiveOp::AllReduce, Slot::Tied, None, g, g);
    s.collective(CollectiveOp::Broadcast { root: 0 }, Slot::Dp, None, g, g);
    s.instrs.push(Instr::AdamW {
        config: ir::AdamWConfig::default(),
        param: master,
        grad: g,
        m,
        v,
    });
    s.instrs.push(Instr::Copy {
        src: master,
        dst: w,
    });
    for buf in [
        ids, tgt, x, y, mean, yt, sq, q, scores, p0, p1, flat, gathered, odd, piece, back, chunk,
        loss, dy, dx,
    ] {
        s.instrs.push(Instr::Free { buf });
    }
    s.set(pp, dp, tp)
}

#[test]
fn synthetic_programs_verify() {
    let v = Verifier::new();
    for (pp, dp, tp) in [(1, 1, 1), (2, 2, 2), (4, 2, 2), (1, 4, 1)] {
        let set = synthetic(pp, dp, tp);
        let m = emit_template(&set, &set.templates[0]).unwrap();
        if let Err(e) = v.check(&m.name, &m.text) {
            panic!("pp {pp} dp {dp} tp {tp}: {e}\n{}", m.text);
        }
        if (pp, dp, tp) == (2, 2, 2) {
            println!("---- synthetic layer, pp 2 x dp 2 x tp 2 ----\n{}", m.text);
        }
        // pp 4: the tied group is the first and last stage, not the whole axis.
        assert_eq!(m.text.contains("shard.grid @tied"), pp > 2, "{}", m.text);
        for op in [
            "linalg.matmul",
            "linalg.batch_matmul",
            "linalg.generic",
            "linalg.softmax",
            "linalg.transpose",
            "shard.all_reduce",
            "shard.all_gather",
            "shard.reduce_scatter",
            "shard.all_slice",
            "shard.send",
            "shard.recv",
            "func.call @plait.attention",
            "func.call @plait.grad.attention",
            "func.call @plait.adamw",
        ] {
            assert!(m.text.contains(op), "{op} missing");
        }
    }
}

#[test]
fn broken_module_is_reported() {
    let v = Verifier::new();
    // A reduce-scatter whose result shape ignores the group size: MLIR's verifier says so.
    let text = "shard.grid @mesh(shape = 1x1x2)\n\
        func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n\
          %r = shard.reduce_scatter %x on @mesh grid_axes = [2] scatter_axis = 0 : tensor<4xf32> -> tensor<4xf32>\n\
          return %r : tensor<4xf32>\n\
        }\n";
    let err = v.check("broken", text).unwrap_err();
    assert!(
        matches!(err, MlirError::Parse { .. } | MlirError::Verify { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("broken"), "{err}");
    // Unregistered dialects are refused.
    let err = v
        .check("unregistered", "\"plait.all_reduce\"() : () -> ()\n")
        .unwrap_err();
    assert!(
        matches!(err, MlirError::Parse { .. } | MlirError::Verify { .. }),
        "{err}"
    );
}

fn plan_programs(name: &str) -> ProgramSet {
    let path = format!("{}/tests/plans/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut plan = planner::plan::Plan::from_json(&text, &path).unwrap();
    // These plans predate `model.ir`: load their model as the CLI does for such plans.
    if plan.model.ir.is_none() {
        let m = import::load_model(
            &plan.model.reference,
            plan.strategy.micro_batch,
            Some(plan.strategy.seq),
        )
        .unwrap();
        plan.model.ir = Some(ir::text::print(&m.graph));
    }
    let graph = codegen::load_graph(&plan).unwrap();
    codegen::lower(&plan, &graph, codegen::Options::default()).unwrap()
}

#[test]
fn snapshot_cases_verify() {
    let v = Verifier::new();
    for (name, c) in common::cases() {
        let set = common::programs(common::TINY, 32, c);
        for t in &set.templates {
            let m = emit_template(&set, t).unwrap();
            if let Err(e) = v.check(&m.name, &m.text) {
                panic!("{name} {}: {e}", m.name);
            }
            println!(
                "{name} {}: ranks {:?}, {} lines, verified",
                m.name,
                m.ranks,
                m.text.lines().count()
            );
        }
    }
}

#[test]
fn every_zero_stage_recompute_schedule_and_precision_verifies() {
    use planner::{Precision, Recompute, Schedule};
    let v = Verifier::new();
    let mut modules = 0;
    for zero in 0..=3 {
        for recompute in [Recompute::None, Recompute::Selective, Recompute::Full] {
            for (schedule, vs) in [
                (Schedule::Gpipe, 1),
                (Schedule::OneFOneB, 1),
                (Schedule::Interleaved, 2),
            ] {
                for precision in [Precision::Fp32, Precision::Bf16] {
                    let mut c = common::Case::new(2, 2, 2);
                    (c.zero, c.recompute, c.schedule, c.v, c.sp, c.precision) =
                        (zero, recompute, schedule, vs, zero % 2 == 1, precision);
                    let set = common::programs(common::TINY, 32, c);
                    for t in &set.templates {
                        let m = emit_template(&set, t).unwrap();
                        if let Err(e) = v.check(&m.name, &m.text) {
                            panic!("{c:?} {}: {e}", m.name);
                        }
                        modules += 1;
                    }
                }
            }
        }
    }
    println!("{modules} modules verified");
}

#[test]
fn gpt2_plans_verify() {
    for name in [
        "dp2",
        "tp2",
        "tp2_sp",
        "pp2_1f1b",
        "pp2_interleaved",
        "zero3_dp2",
        "tp2_pp2_dp2",
    ] {
        let set = plan_programs(name);
        let modules = match export(&set) {
            Ok(m) => m,
            Err(e) => panic!("{name}: {e}"),
        };
        assert_eq!(modules.len(), set.templates.len(), "{name}");
        let ranks: usize = modules.iter().map(|m| m.ranks.len()).sum();
        assert_eq!(ranks, set.ranks.len(), "{name}: every rank runs one module");
        let lines: usize = modules.iter().map(|m| m.text.lines().count()).sum();
        println!(
            "{name}: {} module(s) for {} ranks verified, {lines} lines",
            modules.len(),
            set.ranks.len()
        );
        let mut kernels: Vec<&str> = modules
            .iter()
            .flat_map(|m| m.text.lines())
            .filter_map(|l| l.trim().strip_prefix("func.func private @"))
            .filter_map(|l| l.split('(').next())
            // One name per kernel: `@plait.adamw.3` is adamw at another shape.
            .map(|l| {
                l.trim_end_matches(|c: char| c.is_ascii_digit())
                    .trim_end_matches('.')
            })
            .collect();
        kernels.sort_unstable();
        kernels.dedup();
        println!("  external kernels: {}", kernels.join(" "));
        if set.mesh.pp > 1 {
            assert!(
                modules.iter().all(|m| m.text.contains("shard.send")),
                "{name}"
            );
        }
        if set.mesh.tp > 1 || set.mesh.dp > 1 {
            assert!(
                modules.iter().all(|m| m.text.contains("grid_axes")),
                "{name}"
            );
        }
    }
}

#[test]
fn write_files() {
    let set = plan_programs("pp2_1f1b");
    let dir = std::env::temp_dir().join(format!("plait-mlir-{}", std::process::id()));
    let paths = codegen::mlir::write(&set, &dir).unwrap();
    assert_eq!(paths.len(), set.templates.len());
    for p in &paths {
        let text = std::fs::read_to_string(p).unwrap();
        assert!(text.contains("func.func @step"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
