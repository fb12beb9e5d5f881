//! The device mesh: ranks laid out tp-fastest, then dp, then pp (the planner's
//! `cost::comm::mesh` order), and the communicator groups of each rank.

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
/// embedding gradients. `template_of_stage[s]` is the template of stage `s`.
pub fn build(
    tp: u32,
    dp: u32,
    pp: u32,
    tied: bool,
    template_of_stage: &[TemplateId],
) -> (Vec<Group>, Vec<RankInfo>) {
    let mut groups: Vec<Group> = Vec::new();
    let n = tp * dp * pp;
    let mut slots = vec![[None; 3]; n as usize];
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
    for p in 0..pp {
        for d in 0..dp {
            let ranks = (0..tp)
                .map(|t| {
                    rank_of(
                        Coords {
                            tp: t,
                            dp: d,
                            pp: p,
                        },
                        tp,
                        dp,
                    )
                })
                .collect();
            add(Slot::Tp, ranks, &mut groups);
        }
    }
    for p in 0..pp {
        for t in 0..tp {
            let ranks = (0..dp)
                .map(|d| {
                    rank_of(
                        Coords {
                            tp: t,
                            dp: d,
                            pp: p,
                        },
                        tp,
                        dp,
                    )
                })
                .collect();
            add(Slot::Dp, ranks, &mut groups);
        }
    }
    if tied && pp > 1 {
        for d in 0..dp {
            for t in 0..tp {
                let ranks = [0, pp - 1]
                    .iter()
                    .map(|&p| {
                        rank_of(
                            Coords {
                                tp: t,
                                dp: d,
                                pp: p,
                            },
                            tp,
                            dp,
                        )
                    })
                    .collect();
                add(Slot::Tied, ranks, &mut groups);
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
        let (groups, ranks) = build(2, 2, 2, true, &[TemplateId(0), TemplateId(1)]);
        // 4 tp groups, 4 dp groups, 4 tied groups.
        assert_eq!(groups.len(), 12);
        assert_eq!(ranks[5].next, 1);
        assert_eq!(groups[0].ranks, vec![0, 1]);
        assert_eq!(groups[4].ranks, vec![0, 2]);
    }
}
