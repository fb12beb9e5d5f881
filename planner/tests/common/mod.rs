//! Helpers shared by the planner's integration tests.

use planner::engine::{Engine, Overlap};
use planner::{Precision, Recompute, Schedule, Strategy};

/// One pipeline stage, one data-parallel rank, 4 micro-batches of `micro_batch` sequences of
/// 1,024 tokens, bf16, no ZeRO or recompute, the legacy (no) overlap: a tensor-parallel group
/// of `tp` with sequence parallelism `sp`.
pub fn tp_strategy(tp: u32, sp: bool, micro_batch: u64) -> Strategy {
    Strategy {
        tp,
        pp: 1,
        dp: 1,
        micro_batch,
        global_batch: 4 * micro_batch,
        seq: 1024,
        zero: 0,
        recompute: Recompute::None,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        sequence_parallel: sp,
        precision: Precision::Bf16,
        attention: Default::default(),
        kernels: Default::default(),
        cp: 1,
        ep: 1,
        engine: Engine::Megatron,
        overlap: Overlap::LEGACY,
        stage_layers: None,
        dp_comm: Default::default(),
    }
}
