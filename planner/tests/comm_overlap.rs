//! `comm_overlaps_compute`: GPU clusters (NCCL on its own stream) hide data-parallel
//! reductions behind the backward and ZeRO-3 gathers behind compute; plait's CPU runtime runs
//! collectives on the rank's one thread, so a `cpu` cluster pays them in full.
#![allow(clippy::unwrap_used)]

mod common;

use import::build_forward;
use planner::{Cluster, ModelInfo, Precision, Recompute, Schedule, Strategy, estimate};

fn strategy(dp: u32, zero: u8) -> Strategy {
    Strategy {
        tp: 1,
        pp: 1,
        dp,
        micro_batch: 1,
        global_batch: 8,
        seq: 128,
        zero,
        recompute: Recompute::None,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        sequence_parallel: false,
        precision: Precision::Fp32,
        attention: Default::default(),
        kernels: Default::default(),
        cp: 1,
        ep: 1,
        engine: planner::engine::Engine::Megatron,
        overlap: planner::engine::Overlap::LEGACY,
        stage_layers: None,
        dp_comm: Default::default(),
    }
}

#[test]
fn only_gpu_clusters_hide_data_parallel_communication() {
    let spec = common::small_gpt2();
    let g = build_forward(&spec, ir::DType::F32).unwrap();
    let info = ModelInfo::new(&g).unwrap();
    let cpu = Cluster::load("cpu").unwrap();
    assert!(!cpu.comm_overlaps_compute);
    for name in planner::hardware::preset_names() {
        let c = Cluster::load(name).unwrap();
        assert_eq!(c.comm_overlaps_compute, name != "cpu", "{name}");
    }
    let mut overlapping = cpu.clone();
    overlapping.comm_overlaps_compute = true;
    for zero in [0, 3] {
        let s = strategy(2, zero);
        let serial = estimate(&info, &cpu, 2, &s).unwrap().predicted;
        let hidden = estimate(&info, &overlapping, 2, &s).unwrap().predicted;
        println!(
            "ZeRO-{zero}: dp_comm {:.4} s serial, {:.4} s overlapped; iteration {:.4} vs {:.4} s",
            serial.time.dp_comm,
            hidden.time.dp_comm,
            serial.iteration_time_s,
            hidden.iteration_time_s
        );
        assert!(serial.time.dp_comm > 0.0);
        assert!(hidden.time.dp_comm < serial.time.dp_comm, "ZeRO-{zero}");
        // What is no longer hidden is added to the iteration, nothing else changes.
        let gap = serial.iteration_time_s - hidden.iteration_time_s;
        let more = serial.time.dp_comm - hidden.time.dp_comm;
        assert!(
            (gap - more).abs() <= 1e-9 * serial.iteration_time_s,
            "{gap} vs {more}"
        );
    }
}
