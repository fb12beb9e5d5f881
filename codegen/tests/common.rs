//! Plans built in code (no search) for the program tests.
#![allow(dead_code, clippy::unwrap_used)]

use codegen::ProgramSet;
use ir::Graph;
use planner::cost::compute::AttentionKernel;
use planner::plan::{ModelRef, Plan, SearchSummary};
use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule, Strategy};

pub const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-gpt2.json");

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub v: u32,
    pub micro_batches: u64,
    pub micro_batch: u64,
    pub zero: u8,
    pub sp: bool,
    pub schedule: Schedule,
    pub recompute: Recompute,
    pub precision: Precision,
    pub attention: AttentionKernel,
    /// Context-parallel degree (beside dp).
    pub cp: u32,
}

impl Case {
    pub fn new(tp: u32, pp: u32, dp: u32) -> Case {
        Case {
            tp,
            pp,
            dp,
            v: 1,
            micro_batches: 2,
            micro_batch: 1,
            zero: 0,
            sp: false,
            schedule: Schedule::OneFOneB,
            recompute: Recompute::None,
            precision: Precision::Fp32,
            attention: AttentionKernel::Materialized,
            cp: 1,
        }
    }
}

/// The plan `plait compile` would write for this strategy, and the model's graph.
pub fn plan(model: &str, seq: u64, c: Case) -> (Plan, Graph) {
    let m = import::load_model(model, c.micro_batch, Some(seq)).unwrap();
    let info = ModelInfo::new(&m.graph).unwrap();
    let cluster = Cluster::load("dgx-a100-80gb").unwrap();
    let s = Strategy {
        tp: c.tp,
        pp: c.pp,
        dp: c.dp,
        micro_batch: c.micro_batch,
        global_batch: c.micro_batches * c.micro_batch * u64::from(c.dp),
        seq: m.binding.seq,
        zero: c.zero,
        recompute: c.recompute,
        schedule: c.schedule,
        virtual_stages: c.v,
        sequence_parallel: c.sp,
        precision: c.precision,
        attention: c.attention,
        kernels: cluster.default_kernels(),
        cp: c.cp,
        ep: 1,
        engine: planner::engine::Engine::Megatron,
        overlap: planner::engine::Overlap::LEGACY,
        stage_layers: None,
        dp_comm: Default::default(),
    };
    let gpus = s.gpus();
    let est = planner::estimate(&info, &cluster, gpus, &s).unwrap();
    let r = ModelRef::of("config", model, &info);
    let plan = Plan::new(
        r,
        &info,
        &cluster,
        gpus,
        &est,
        SearchSummary {
            candidates_evaluated: 1,
            candidates_pruned: 0,
            target: None,
        },
        vec![],
    );
    (plan, m.graph)
}

pub fn programs(model: &str, seq: u64, c: Case) -> ProgramSet {
    let (p, g) = plan(model, seq, c);
    codegen::lower(&p, &g, codegen::Options::default()).unwrap()
}

/// The six snapshot configurations.
pub fn cases() -> Vec<(&'static str, Case)> {
    let mut tp2 = Case::new(2, 1, 1);
    tp2.sp = true;
    let mut pp2i = Case::new(1, 2, 1);
    pp2i.schedule = Schedule::Interleaved;
    pp2i.v = 2;
    let mut z3 = Case::new(1, 1, 2);
    z3.zero = 3;
    let mut mixed = Case::new(2, 2, 2);
    mixed.sp = true;
    mixed.zero = 1;
    vec![
        ("dp2", Case::new(1, 1, 2)),
        ("tp2_sp", tp2),
        ("pp2_1f1b", Case::new(1, 2, 1)),
        ("pp2_interleaved", pp2i),
        ("zero3_dp2", z3),
        ("tp2_pp2_dp2", mixed),
    ]
}
