//! GPT-3 175B on 1024 GPUs: the plan `plait compile` chooses (pinned here so the test does not
//! depend on the search): tp 8, pp 1, dp 128, micro-batch 6, ZeRO-3, selective recompute, SP, bf16.
#![allow(clippy::unwrap_used)]

mod common;

use codegen::verify::{Options, verify_with};
use common::{Case, plan};
use planner::{Precision, Recompute};

#[test]
fn gpt3_175b_on_1024_gpus_verifies_and_fits_the_planners_memory() {
    let mut c = Case::new(8, 1, 128);
    (
        c.micro_batch,
        c.micro_batches,
        c.zero,
        c.recompute,
        c.sp,
        c.precision,
    ) = (6, 2, 3, Recompute::Selective, true, Precision::Bf16);
    let (p, g) = plan("gpt3-175b", 2048, c);
    let t = std::time::Instant::now();
    let set = codegen::lower(&p, &g, codegen::Options::default()).unwrap();
    let r = verify_with(
        &set,
        Options {
            memory_tolerance: Some(0.03),
        },
    );
    println!(
        "lower + verify {:.2} s (debug build)",
        t.elapsed().as_secs_f64()
    );
    assert!(
        r.violations.is_empty(),
        "{:#?}",
        &r.violations[..r.violations.len().min(5)]
    );
    assert_eq!(set.ranks.len(), 1024);
    assert_eq!(set.templates.len(), 1);
    for m in &r.memory {
        println!(
            "program {} planner {:.0} ({:+.2} %)",
            m.program_peak_bytes,
            m.predicted_peak_bytes,
            (m.ratio() - 1.0) * 100.0
        );
    }
}
