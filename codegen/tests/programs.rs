//! The six small plans: verified, memory against the planner, listings snapshotted, and the
//! program files read back unchanged.
#![allow(clippy::unwrap_used)]

mod common;

use codegen::verify::{Options, verify_with};
use common::{Case, TINY, cases, programs};

#[test]
fn every_snapshot_case_verifies_and_fits_the_planners_memory() {
    for (name, c) in cases() {
        let set = programs(TINY, 32, c);
        let r = verify_with(
            &set,
            Options {
                memory_tolerance: Some(0.03),
            },
        );
        assert!(r.violations.is_empty(), "{name}: {:#?}", r.violations);
        for m in &r.memory {
            println!(
                "{name}: stage {} program {} planner {:.0} ({:+.2} %)",
                m.stage,
                m.program_peak_bytes,
                m.predicted_peak_bytes,
                (m.ratio() - 1.0) * 100.0
            );
        }
    }
}

#[test]
fn listings() {
    for (name, c) in cases() {
        let set = programs(TINY, 32, c);
        // The first rank of every template.
        let mut text = String::new();
        for t in &set.templates {
            let r = set.ranks.iter().find(|i| i.template == t.id).unwrap();
            text += &codegen::listing::show(&set, r.rank).unwrap();
            text += "\n";
        }
        insta::assert_snapshot!(name, text);
    }
}

#[test]
fn files_round_trip() {
    let mut c = Case::new(2, 2, 2);
    c.zero = 3;
    let set = programs(TINY, 32, c);
    let dir = std::env::temp_dir().join(format!("plait-codegen-rt-{}", std::process::id()));
    codegen::io::write(&set, &dir).unwrap();
    let back = codegen::io::read(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(set, back);
}

#[test]
fn every_zero_stage_recompute_and_schedule_verifies() {
    use planner::{Recompute, Schedule};
    for zero in 0..=3 {
        for recompute in [Recompute::None, Recompute::Selective, Recompute::Full] {
            for (schedule, v) in [
                (Schedule::Gpipe, 1),
                (Schedule::OneFOneB, 1),
                (Schedule::Interleaved, 2),
            ] {
                for precision in [planner::Precision::Fp32, planner::Precision::Bf16] {
                    let mut c = Case::new(2, 2, 2);
                    (c.zero, c.recompute, c.schedule, c.v, c.sp, c.precision) =
                        (zero, recompute, schedule, v, zero % 2 == 1, precision);
                    let set = programs(TINY, 32, c);
                    let r = codegen::verify(&set);
                    assert!(
                        r.violations.is_empty(),
                        "{c:?}: {:#?}",
                        &r.violations[..r.violations.len().min(5)]
                    );
                }
            }
        }
    }
}

/// The snapshot configurations on a model whose memory is not dominated by the 1 GiB reserve
/// (GPT 1.7B of Megatron-LM SC'21, seq 2048, bf16, 4 micro-batches).
#[test]
fn memory_matches_the_planner_on_a_real_model() {
    for (name, mut c) in cases() {
        c.precision = planner::Precision::Bf16;
        c.micro_batches = 4;
        let set = programs("gpt-1.7b", 2048, c);
        let r = verify_with(
            &set,
            Options {
                memory_tolerance: Some(0.03),
            },
        );
        assert!(
            r.violations.is_empty(),
            "{name}: {:#?}",
            &r.violations[..r.violations.len().min(5)]
        );
        for m in &r.memory {
            let reserve = planner::estimate::RESERVE_BYTES;
            println!(
                "{name}: stage {} program {:.3} GiB planner {:.3} GiB ({:+.2} %; without the reserve {:+.2} %)",
                m.stage,
                m.program_peak_bytes as f64 / 1073741824.0,
                m.predicted_peak_bytes / 1073741824.0,
                (m.ratio() - 1.0) * 100.0,
                ((m.program_peak_bytes as f64 - reserve) / (m.predicted_peak_bytes - reserve)
                    - 1.0)
                    * 100.0
            );
        }
    }
}
