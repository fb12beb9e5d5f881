//! Plans with fused (FlashAttention-style) attention, the default on GPU clusters: the program
//! keeps one fp32 log-sum-exp per query row and head, never the s x s scores, and its peak
//! memory is the planner's within 3 %.

mod common;

use codegen::program::{Instr, Role};
use codegen::verify::{Options, verify_with};
use common::{Case, plan};
use planner::cost::compute::AttentionKernel;
use planner::{Precision, Recompute};

const SEQ: u64 = 8192;

fn llama_case(recompute: Recompute) -> Case {
    let mut c = Case::new(1, 1, 2);
    c.zero = 1;
    c.precision = Precision::Bf16;
    c.attention = AttentionKernel::Fused;
    c.recompute = recompute;
    c
}

#[test]
fn fused_attention_saves_statistics_not_scores() {
    let (p, g) = plan("llama3-8b", SEQ, llama_case(Recompute::None));
    let set = codegen::lower(&p, &g, codegen::Options::default()).unwrap();
    assert_eq!(set.mesh.attention, "fused");
    let t = &set.templates[0];
    let saved: Vec<_> = t
        .instrs
        .iter()
        .filter_map(|i| match i {
            Instr::Compute { kind, saves, .. } if kind.mnemonic() == "attention" => Some(saves),
            _ => None,
        })
        .flatten()
        .map(|&b| t.buffer(b).unwrap())
        .collect();
    assert!(!saved.is_empty());
    for b in saved {
        assert_eq!(b.role, Role::Saved);
        // [micro-batch, heads, seq]: one statistic per query row and head.
        assert_eq!(b.shape, vec![1, 32, SEQ], "{}", b.name);
    }
}

#[test]
fn fused_attention_programs_match_the_planners_peak_within_3_percent() {
    for recompute in [Recompute::None, Recompute::Selective, Recompute::Full] {
        let (p, g) = plan("llama3-8b", SEQ, llama_case(recompute));
        let set = codegen::lower(&p, &g, codegen::Options::default()).unwrap();
        let r = verify_with(
            &set,
            Options {
                memory_tolerance: Some(0.03),
            },
        );
        assert!(r.violations.is_empty(), "{recompute:?}: {:?}", r.violations);
        assert!(!r.memory.is_empty());
        for m in &r.memory {
            eprintln!("{recompute:?}: program / planner = {:.4}", m.ratio());
        }
    }
}
