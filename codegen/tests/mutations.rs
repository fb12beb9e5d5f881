//! Broken programs the verifier must reject, naming the rank and the instruction.
#![allow(clippy::unwrap_used)]

mod common;

use codegen::program::{CollectiveOp, Instr, Purpose};
use codegen::verify::{Check, Loc, verify};
use common::{TINY, cases, programs};

fn mixed() -> codegen::ProgramSet {
    let (_, c) = cases()
        .into_iter()
        .find(|(n, _)| *n == "tp2_pp2_dp2")
        .unwrap();
    programs(TINY, 32, c)
}

#[test]
fn the_unbroken_programs_verify() {
    assert!(verify(&mixed()).violations.is_empty());
}

#[test]
fn a_dropped_recv_is_rejected() {
    let mut set = mixed();
    // Rank 4 is stage 1 (tp 0, dp 0): drop its first receive.
    let t = set.detach(4).unwrap();
    let k = t
        .instrs
        .iter()
        .position(|i| matches!(i, Instr::Recv { .. }))
        .unwrap();
    t.instrs.remove(k);
    let r = verify(&set);
    let v = r
        .violations
        .iter()
        .find(|v| v.check == Check::PointToPoint)
        .unwrap();
    println!("{v}");
    assert!(
        v.message.contains("never received") || v.message.contains("expects tag"),
        "{v}"
    );
    assert!(r.violations.iter().any(|v| v.rank == 0 || v.rank == 4));
}

#[test]
fn two_reordered_collectives_are_rejected() {
    let mut set = mixed();
    let t = set.detach(1).unwrap();
    // Swap the first tensor-parallel all-gather with the reduce-scatter after it.
    let is = |i: &Instr, op: CollectiveOp| matches!(i, Instr::Collective { op: o, purpose: Purpose::Activation, .. } if *o == op);
    let a = t
        .instrs
        .iter()
        .position(|i| is(i, CollectiveOp::AllGather))
        .unwrap();
    let b = a + t.instrs[a..]
        .iter()
        .position(|i| is(i, CollectiveOp::ReduceScatter))
        .unwrap();
    t.instrs.swap(a, b);
    let r = verify(&set);
    let v = r
        .violations
        .iter()
        .find(|v| v.check == Check::Collective)
        .unwrap();
    println!("{v}");
    assert_eq!(v.rank, 1);
    assert!(matches!(v.at, Loc::Step(k) if k == a || k == b), "{v}");
}

#[test]
fn a_dropped_gradient_reduction_is_rejected() {
    let mut set = mixed();
    let t = set.detach(0).unwrap();
    let k = t
        .instrs
        .iter()
        .position(|i| {
            matches!(
                i,
                Instr::Collective {
                    purpose: Purpose::GradReduce,
                    ..
                }
            )
        })
        .unwrap();
    t.instrs.remove(k);
    let r = verify(&set);
    let v = r
        .violations
        .iter()
        .find(|v| v.check == Check::Gradient)
        .unwrap();
    println!("{v}");
    assert_eq!(v.rank, 0);
    assert!(v.message.contains("never reduced"), "{v}");
    assert!(matches!(v.at, Loc::Step(_)));
}

#[test]
fn overlapping_shards_are_rejected() {
    let mut set = mixed();
    // Rank 1 (tp 1) takes tensor-parallel piece 0 of its first split parameter, as rank 0 does.
    let t = set.detach(1).unwrap();
    let k = t.shards.iter().position(|s| s.tp.is_some()).unwrap();
    if let Some(s) = t.shards[k].tp.as_mut() {
        s.part = Some(0);
    }
    let r = verify(&set);
    let v = r
        .violations
        .iter()
        .find(|v| v.check == Check::Shard)
        .unwrap();
    println!("{v}");
    assert!(v.message.contains("overlaps"), "{v}");
    assert!(v.rank == 1 || v.rank == 0);
    assert_eq!(v.at, Loc::Shard(k));
}

#[test]
fn a_parameter_no_rank_holds_is_rejected() {
    let mut set = mixed();
    // Every rank drops its shards of the last parameter; the others stay held.
    let last = set.templates[0]
        .shards
        .iter()
        .map(|s| s.param)
        .max()
        .unwrap();
    for t in &mut set.templates {
        t.shards.retain(|s| s.param != last);
    }
    let r = verify(&set);
    let name = &set.params[last.0 as usize].name;
    let unheld: Vec<_> = r
        .violations
        .iter()
        .filter(|v| v.check == Check::Shard && v.message.contains("held by no rank"))
        .collect();
    assert_eq!(unheld.len(), 1, "{unheld:?}");
    assert!(unheld[0].message.contains(name.as_str()), "{}", unheld[0]);
}

#[test]
fn an_all_gather_into_a_buffer_of_its_input_size_is_rejected() {
    let mut set = mixed();
    let t = set.detach(1).unwrap();
    // The tensor-parallel gather of a sequence-split activation, written back into its input:
    // one piece where the group's two belong.
    let k = t
        .instrs
        .iter()
        .position(|i| {
            matches!(
                i,
                Instr::Collective {
                    op: CollectiveOp::AllGather,
                    purpose: Purpose::Activation,
                    ..
                }
            )
        })
        .unwrap();
    if let Instr::Collective { pairs, .. } = &mut t.instrs[k] {
        pairs[0].1 = pairs[0].0;
    }
    let r = verify(&set);
    let v = r
        .violations
        .iter()
        .find(|v| v.message.contains("all_gather over 2 ranks"))
        .unwrap();
    println!("{v}");
    assert_eq!(v.check, Check::WellFormed);
    assert_eq!(v.rank, 1);
    assert_eq!(v.at, Loc::Step(k));
}

/// A context-parallel program (tp 1, dp 1, cp 2, fused attention).
fn context_parallel() -> codegen::ProgramSet {
    let mut c = common::Case::new(1, 1, 1);
    (c.cp, c.attention) = (2, planner::cost::compute::AttentionKernel::Fused);
    programs(TINY, 32, c)
}

#[test]
fn a_context_op_over_the_wrong_group_or_without_a_context_form_is_rejected() {
    let set = context_parallel();
    assert!(
        verify(&set).violations.is_empty(),
        "{:?}",
        verify(&set).violations
    );
    let first_context = |t: &codegen::program::Template| {
        t.instrs
            .iter()
            .position(|i| matches!(i, Instr::Context { .. }))
            .unwrap()
    };
    let mut wrong_group = set.clone();
    let t = wrong_group.detach(0).unwrap();
    let k = first_context(t);
    if let Instr::Context { group, .. } = &mut t.instrs[k] {
        *group = codegen::program::Slot::Tp;
    }
    let r = verify(&wrong_group);
    assert!(
        r.violations
            .iter()
            .any(|v| v.message.contains("context op over the tp group") && v.at == Loc::Step(k)),
        "{:?}",
        r.violations
    );
    let mut wrong_kind = set;
    let t = wrong_kind.detach(0).unwrap();
    let k = first_context(t);
    if let Instr::Context { kind, .. } = &mut t.instrs[k] {
        *kind = ir::OpKind::Softmax { causal: true };
    }
    let r = verify(&wrong_kind);
    assert!(
        r.violations
            .iter()
            .any(|v| v.message.contains("softmax has no context-parallel form")),
        "{:?}",
        r.violations
    );
}
