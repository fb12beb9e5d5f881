//! The measured machine as a cluster description (docs/hardware.md), every figure commented
//! with what was measured.

use std::fmt::Write as _;

use super::MachineProfile;

/// `YYYY-MM-DD HH:MM UTC` from Unix seconds (Howard Hinnant's civil-from-days).
pub fn utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60
    )
}

/// Rounds to 4 significant digits for a readable file.
fn sig(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

pub(super) fn cluster_toml(p: &MachineProfile, name: &str) -> String {
    let ranks = p.threads.max(1) as f64;
    let per_rank_tflops = p.sgemm_rank_gflops / 1e3;
    let per_rank_gb_s = p.copy_all_gb_per_s / ranks;
    let mem_gib = p.memory_gib.map_or(4.0, |m| (m / ranks).max(0.25));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Measured by `plait profile` on {} ({}, {} hardware threads).",
        utc(p.unix_time),
        p.cpu,
        p.threads
    );
    let _ = writeln!(
        s,
        "# One rank per hardware thread: each \"GPU\" below is one rank's share of this machine when"
    );
    let _ = writeln!(
        s,
        "# every rank works at once; the node link is plait's threads communicator (shared memory)."
    );
    let _ = writeln!(s, "name = {name:?}");
    let _ = writeln!(
        s,
        "description = \"this machine ({}), one rank per thread, measured {}\"",
        p.cpu.replace('"', "'"),
        utc(p.unix_time)
    );
    let _ = writeln!(s, "gpus_per_node = {}", p.threads.max(1));
    let _ = writeln!(s, "max_nodes = 1");
    let _ = writeln!(
        s,
        "# plait's CPU runtime runs a collective on the rank's own thread, between computations."
    );
    let _ = writeln!(s, "comm_overlaps_compute = false");
    let _ = writeln!(s);
    let _ = writeln!(s, "[gpu]");
    let _ = writeln!(s, "name = \"cpu-thread\"");
    let _ = writeln!(s, "# A core runs one matmul tile at a time.");
    let _ = writeln!(s, "sm_count = 1");
    let _ = writeln!(
        s,
        "# Per-op dispatch cost on the CPU (allocation, thread-pool hand-off): assumed, not measured."
    );
    let _ = writeln!(s, "launch_overhead_us = 5");
    let _ = writeln!(
        s,
        "# plait's CPU runtime runs one kernel per IR op (no element-wise fusion)."
    );
    let _ = writeln!(s, "kernels = \"eager\"");
    let _ = writeln!(
        s,
        "# MemTotal {} GiB / {} ranks.",
        p.memory_gib
            .map_or("unknown (4 GiB per rank assumed)".into(), |m| format!(
                "{m:.1}"
            )),
        p.threads
    );
    let _ = writeln!(s, "memory_gib = {}", sig(mem_gib));
    let _ = writeln!(
        s,
        "# Copy bandwidth, every thread copying its own buffer at once: {:.1} GB/s in all (read +",
        p.copy_all_gb_per_s
    );
    let _ = writeln!(s, "# written), divided by {} ranks.", p.threads);
    let _ = writeln!(s, "hbm_gb_per_s = {}", sig(per_rank_gb_s));
    let _ = writeln!(
        s,
        "# Both rates below are measured sustained rates, so the efficiencies are 1."
    );
    let _ = writeln!(s, "matmul_efficiency = 1.0");
    let _ = writeln!(s, "memory_efficiency = 1.0");
    let _ = writeln!(
        s,
        "# matrixmultiply packs both operands into panels before multiplying (Goto & van de Geijn)."
    );
    let _ = writeln!(s, "matmul_packs_operands = true");
    let _ = writeln!(s, "[gpu.kernel_fractions]");
    let _ = writeln!(
        s,
        "# plait's own kernels, forward + backward on f32 activations, every thread at once:"
    );
    let _ = writeln!(
        s,
        "# bytes of the cost model (operands read, results written) per second over the copy's."
    );
    let k = &p.kernel_fractions;
    for (name, v, what) in [
        ("pointwise", k.pointwise, "add"),
        ("activation", k.activation, "GELU (tanh)"),
        ("norm", k.norm, "LayerNorm"),
        ("softmax", k.softmax, "softmax"),
        ("dropout", k.dropout, "dropout"),
    ] {
        let _ = writeln!(s, "{name} = {}  # {what}", sig(v));
    }
    let _ = writeln!(s, "[gpu.peak_tflops]");
    let _ = writeln!(
        s,
        "# kernels::sgemm at {n}x{n}x{n}, one thread per rank: {:.1} GFLOP/s each with all {} threads",
        p.sgemm_rank_gflops,
        p.threads,
        n = p.sgemm_size
    );
    let _ = writeln!(
        s,
        "# multiplying at once ({:.1} alone). fp32 only: the CPU kernels compute in f32.",
        p.sgemm_one_gflops
    );
    let _ = writeln!(s, "fp32 = {}", sig(per_rank_tflops));
    let _ = writeln!(s);
    let _ = writeln!(s, "[[link]]");
    let _ = writeln!(s, "name = \"shared-memory\"");
    let _ = writeln!(s, "scope = \"node\"");
    let _ = writeln!(
        s,
        "# Threads communicator, 2-rank all-reduce fitted as t = a + b*bytes: a = {:.2} us,",
        p.allreduce_alpha_us
    );
    let _ = writeln!(
        s,
        "# 1/b = {:.2} GB/s. The planner's 2-rank ring all-reduce costs bytes/bw + 2*latency, so",
        p.allreduce_gb_per_s
    );
    let _ = writeln!(s, "# gb_per_s = 1/b and latency_us = a/2.");
    let _ = writeln!(s, "gb_per_s = {}", sig(p.allreduce_gb_per_s));
    let _ = writeln!(s, "latency_us = {}", sig(p.allreduce_alpha_us / 2.0));
    let _ = writeln!(s, "efficiency = 1.0");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::utc(1_700_000_000), "2023-11-14 22:13 UTC");
    }
}
