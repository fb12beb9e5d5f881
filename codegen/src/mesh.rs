//! The device mesh: ranks laid out tp-fastest, then dp, then pp (the planner's
//! `cost::comm::mesh` order), and the communicator groups of each rank. Under context
//! parallelism `dp` counts data parallelism × cp, the cp ranks of a sequence consecutive
//! (Megatron's tp-cp-dp-pp order).

use crate::ids::{GroupId, TemplateId};
use crate::program::{Coords, Group, RankInfo, Slot};

/// Rank of coordinates `c` in a (tp, dp, pp) mesh.
pub fn rank_of(c: Coords, tp: u32, dp: u32) -> u32 {
    c.tp + tp * (c.dp + dp * c.pp)
}

/// Coordinates of rank `r`.
pub fn coords_of(r: u32, tp: u32, dp: u32) -> Coords {
    Coords {
        tp: r % tp,
        dp: (r / tp) % dp,
        pp: r / (tp * dp),
    }
}

/// Every group and every rank's resolved roles. `tied`: whether first and last stage sum tied
/// embedding gradients. `template_of_stage[s]` is the template of stage `s`. With `ep` > 1
/// the data-parallel ranks also form expert-parallel groups (`ep` consecutive dp
/// coordinates) and expert-data-parallel groups (dp coordinates equal mod ep); with `cp` > 1
/// context-parallel groups (`cp` consecutive dp coordinates).
pub fn build(
    [tp, dp, pp, ep, cp]: [u32; 5],
    tied: bool,
    template_of_stage: &[TemplateId],
) -> (Vec<Group>, Vec<RankInfo>) {
    let mut groups: Vec<Group> = Vec::new();
    let n = tp * dp * pp;
    let mut slots = vec![[None; Slot::ALL.len()]; n as usize];
    let mut add = |slot: Slot, ranks: Vec<u32>, groups: &mut Vec<Group>| {
        if ranks.len() < 2 {
            return;
        }
        let id = GroupId(groups.len() as u32);
        let i = Slot::ALL.iter().position(|&s| s == slot).unwrap_or(0);
        for &r in &ranks {
            if let Some(s) = slots.get_mut(r as usize) {
                s[i] = Some(id);
            }
        }
        groups.push(Group { id, slot, ranks });
    };
    let at = |t: u32, d: u32, p: u32| {
        rank_of(
            Coords {
                tp: t,
                dp: d,
                pp: p,
            },
            tp,
            dp,
        )
    };
    for p in 0..pp {
        for d in 0..dp {
            add(
                Slot::Tp,
                (0..tp).map(|t| at(t, d, p)).collect(),
                &mut groups,
            );
        }
    }
    for p in 0..pp {
        for t in 0..tp {
            add(
                Slot::Dp,
                (0..dp).map(|d| at(t, d, p)).collect(),
                &mut groups,
            );
        }
    }
    // Consecutive dp coordinates: the expert-parallel and the context-parallel groups.
    for (slot, size) in [(Slot::Ep, ep.max(1)), (Slot::Cp, cp.max(1))] {
        for p in (0..pp).filter(|_| size > 1) {
            for t in 0..tp {
                for e in 0..dp / size {
                    let ranks = (0..size).map(|i| at(t, e * size + i, p)).collect();
                    add(slot, ranks, &mut groups);
                }
            }
        }
    }
    // Dp coordinates equal mod ep: the ranks holding the same experts.
    let ep = ep.max(1);
    for p in (0..pp).filter(|_| ep > 1) {
        for t in 0..tp {
            for i in 0..ep {
                let ranks = (0..dp / ep).map(|e| at(t, e * ep + i, p)).collect();
                add(Slot::Edp, ranks, &mut groups);
            }
        }
    }
    if tied && pp > 1 {
        for d in 0..dp {
            for t in 0..tp {
                add(Slot::Tied, vec![at(t, d, 0), at(t, d, pp - 1)], &mut groups);
            }
        }
    }
    let ranks = (0..n)
        .map(|r| {
            let c = coords_of(r, tp, dp);
            let at = |p: u32| rank_of(Coords { pp: p, ..c }, tp, dp);
            RankInfo {
                rank: r,
                coords: c,
                template: template_of_stage
                    .get(c.pp as usize)
                    .copied()
                    .unwrap_or(TemplateId(0)),
                groups: slots[r as usize].to_vec(),
                prev: at((c.pp + pp - 1) % pp),
                next: at((c.pp + 1) % pp),
            }
        })
        .collect();
    (groups, ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tp_fastest_then_dp_then_pp() {
        let c = coords_of(13, 2, 2);
        assert_eq!(
            c,
            Coords {
                tp: 1,
                dp: 0,
                pp: 3
            }
        );
        assert_eq!(rank_of(c, 2, 2), 13);
        let (groups, ranks) = build([2, 2, 2, 1, 1], true, &[TemplateId(0), TemplateId(1)]);
        // 4 tp groups, 4 dp groups, 4 tied groups.
        assert_eq!(groups.len(), 12);
        assert_eq!(ranks[5].next, 1);
        assert_eq!(groups[0].ranks, vec![0, 1]);
        assert_eq!(groups[4].ranks, vec![0, 2]);
    }

    #[test]
    fn expert_groups_split_the_data_parallel_ranks() {
        // tp 1, dp 4, pp 1, ep 2: experts split over dp {0, 1} and {2, 3}; the same experts
        // on {0, 2} and {1, 3}.
        let (groups, ranks) = build([1, 4, 1, 2, 1], false, &[TemplateId(0)]);
        let of = |s: Slot| -> Vec<Vec<u32>> {
            groups
                .iter()
                .filter(|g| g.slot == s)
                .map(|g| g.ranks.clone())
                .collect()
        };
        assert_eq!(of(Slot::Ep), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(of(Slot::Edp), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(of(Slot::Dp), vec![vec![0, 1, 2, 3]]);
        let ep_of_3 = ranks[3]
            .group(Slot::Ep)
            .map(|g| groups[g.index()].ranks.clone());
        assert_eq!(ep_of_3, Some(vec![2, 3]));
    }

    #[test]
    fn context_groups_are_consecutive_data_parallel_ranks() {
        // tp 2, dp × cp 4 (cp 2), pp 1: sequences split over dp coordinates {0, 1} and {2, 3}.
        let (groups, ranks) = build([2, 4, 1, 1, 2], false, &[TemplateId(0)]);
        let cp: Vec<Vec<u32>> = groups
            .iter()
            .filter(|g| g.slot == Slot::Cp)
            .map(|g| g.ranks.clone())
            .collect();
        assert_eq!(cp, vec![vec![0, 2], vec![4, 6], vec![1, 3], vec![5, 7]]);
        let dp_of_5: Option<Vec<u32>> = ranks[5]
            .group(Slot::Dp)
            .map(|g| groups[g.index()].ranks.clone());
        assert_eq!(dp_of_5, Some(vec![1, 3, 5, 7]));
    }
}
