//! `plait profile`'s measurement in quick mode writes a cluster file the planner accepts.
#![allow(clippy::unwrap_used)]

use runtime::profile::{ProfileOptions, measure};

#[test]
fn quick_profile_writes_a_loadable_cluster() {
    let p = measure(&ProfileOptions {
        quick: true,
        sgemm_one_thread_gflops: Some(12.5),
    })
    .unwrap();
    assert!(p.sgemm_all_gflops > 0.0 && p.copy_all_gb_per_s > 0.0);
    assert!(p.allreduce_alpha_us > 0.0 && p.allreduce_gb_per_s > 0.0);
    let text = p.to_cluster_toml("this-machine");
    let dir = std::env::temp_dir().join(format!("plait-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cpu.toml");
    std::fs::write(&path, &text).unwrap();
    let c = planner::Cluster::load(path.to_str().unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(c.name, "this-machine");
    assert_eq!(c.gpus_per_node as usize, p.threads);
    assert!(c.gpu.peak_tflops.fp32.unwrap() > 0.0);
    assert!(c.gpu.peak_tflops.bf16.is_none());
    assert!(text.contains("12.5 GFLOP/s"), "{text}");
}
