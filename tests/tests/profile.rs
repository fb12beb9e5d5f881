//! `plait profile`'s measurement in quick mode writes a cluster file the planner accepts.
#![allow(clippy::unwrap_used)]

use runtime::profile::{ProfileOptions, measure};

#[test]
fn quick_profile_writes_a_loadable_cluster() {
    let p = measure(&ProfileOptions { quick: true }).unwrap();
    assert!(p.sgemm_rank_gflops > 0.0 && p.sgemm_one_gflops > 0.0 && p.copy_all_gb_per_s > 0.0);
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
    // The measured kernel classes and the packing pass reach the planner.
    let k = c.gpu.kernel_fractions.unwrap();
    let f = p.kernel_fractions;
    for (loaded, measured) in [
        (k.pointwise, f.pointwise),
        (k.activation, f.activation),
        (k.norm, f.norm),
        (k.softmax, f.softmax),
        (k.dropout, f.dropout),
    ] {
        let loaded = loaded.unwrap();
        assert!(loaded > 0.0 && (loaded - measured).abs() <= 1e-3 * measured);
    }
    assert!(c.gpu.matmul_packs_operands);
}
