//! Invariant 1, sizes: each collective's and chunk's output has the element count its op
//! makes of its input over the rank's group.

use super::{Check, Loc, Violation};
use crate::{CollectiveOp, Instr, ProgramSet, Slot, Template};

/// What `op` over `n` ranks makes of `input` elements into `output` elements, or why not.
/// An axis-less (flat) gather or scatter pads the whole buffer to a multiple of `n`, as ZeRO's
/// flat slices of ⌈len / n⌉ elements do.
fn sizes_agree(op: CollectiveOp, axis: Option<u8>, n: u64, input: u64, output: u64) -> bool {
    let scattered = |whole: u64, piece: u64| match axis {
        Some(_) => whole == piece * n,
        None => whole.div_ceil(n) == piece,
    };
    match op {
        CollectiveOp::AllReduce
        | CollectiveOp::AllToAll
        | CollectiveOp::Broadcast { .. }
        | CollectiveOp::Reshard { .. } => input == output,
        CollectiveOp::AllGather => scattered(output, input),
        CollectiveOp::ReduceScatter => scattered(input, output),
    }
}

/// Checks the sizes of `t`'s collectives and chunks as rank `rank` runs them.
pub fn check(set: &ProgramSet, t: &Template, rank: u32, out: &mut Vec<Violation>) {
    let Some(info) = set.rank(rank) else { return };
    let size = |slot: Slot| {
        info.group(slot)
            .and_then(|g| set.group(g))
            .map(|g| g.ranks.len() as u64)
    };
    let numel = |b| t.buffer(b).map(|d| d.numel());
    let sections = [(true, &t.init), (false, &t.instrs)];
    for (is_init, list) in sections {
        for (k, i) in list.iter().enumerate() {
            let at = if is_init { Loc::Init(k) } else { Loc::Step(k) };
            let mut bad = |message: String| {
                out.push(Violation {
                    check: Check::WellFormed,
                    rank,
                    at,
                    message,
                })
            };
            match i {
                Instr::Collective {
                    op,
                    group,
                    axis,
                    pairs,
                    ..
                } => {
                    let Some(n) = size(*group) else { continue };
                    for &(x, y) in pairs {
                        let (Some(a), Some(b)) = (numel(x), numel(y)) else {
                            continue;
                        };
                        if !sizes_agree(*op, *axis, n, a, b) {
                            bad(format!(
                                "{} over {n} ranks of {x} ({a} elements) into {y} ({b} elements)",
                                op.name()
                            ));
                        }
                    }
                }
                Instr::Chunk {
                    src, dst, group, ..
                } => {
                    let (Some(n), Some(a), Some(b)) = (size(*group), numel(*src), numel(*dst))
                    else {
                        continue;
                    };
                    if !sizes_agree(CollectiveOp::ReduceScatter, None, n, a, b) {
                        bad(format!(
                            "chunk over {n} ranks of {src} ({a} elements) into {dst} ({b} elements)"
                        ));
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gather_makes_n_pieces_and_a_scatter_one() {
        assert!(sizes_agree(CollectiveOp::AllGather, Some(1), 2, 8, 16));
        assert!(!sizes_agree(CollectiveOp::AllGather, Some(1), 2, 8, 8));
        assert!(sizes_agree(CollectiveOp::ReduceScatter, Some(1), 4, 16, 4));
        assert!(!sizes_agree(CollectiveOp::ReduceScatter, Some(1), 4, 16, 8));
        assert!(sizes_agree(CollectiveOp::AllReduce, None, 8, 5, 5));
        assert!(!sizes_agree(CollectiveOp::AllReduce, None, 8, 5, 10));
    }

    #[test]
    fn flat_slices_pad_to_a_multiple_of_the_group() {
        // 10 elements over 4 ranks: slices of 3.
        assert!(sizes_agree(CollectiveOp::ReduceScatter, None, 4, 10, 3));
        assert!(sizes_agree(CollectiveOp::AllGather, None, 4, 3, 10));
        assert!(!sizes_agree(CollectiveOp::AllGather, None, 4, 2, 10));
    }
}
