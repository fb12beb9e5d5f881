//! Invariant 6: parameter shards tile the full tensor exactly once per replica, and ZeRO
//! slices tile each shard exactly once. A replica is a tensor-parallel group (for an expert
//! shard: the tensor- and expert-parallel ranks that split the experts between them); ZeRO
//! slices a shard over the data-parallel group (an expert shard: over the ranks holding the
//! same experts).

use std::collections::{BTreeMap, HashMap};

use super::{Check, Loc, Violation};
use crate::{Box, ProgramSet};

type Key = Vec<(u32, usize, u32, u32)>;
/// (rank, template, shard index, tp coordinate, dp coordinate).
type Member = (u32, u32, usize, u32, u32);
type Groups = BTreeMap<(u32, u32, u32, u32), Vec<Member>>;
/// A cached verdict: (rank, shard index, message).
type Memo = HashMap<(u32, Key), Option<(u32, usize, String)>>;

fn volume(b: &Box) -> u64 {
    b.iter().map(|(s, e)| e.saturating_sub(*s)).product()
}

fn overlap(a: &Box, b: &Box) -> bool {
    a.iter().zip(b).all(|(x, y)| x.0 < y.1 && y.0 < x.1)
}

pub fn check(set: &ProgramSet, out: &mut Vec<Violation>) {
    let ep = set.mesh.ep.max(1);
    let at = |tp_rank: u32, dp_rank: u32| crate::ShardAt {
        tp: set.mesh.tp,
        tp_rank,
        dp: set.mesh.dp,
        dp_rank,
        ep,
    };
    // (param, replica, pp, 0) → its members, and (param, pp, tp, expert coord) → the ranks
    // ZeRO slices over.
    let mut replicas: Groups = BTreeMap::new();
    let mut zero: Groups = BTreeMap::new();
    for info in &set.ranks {
        let Some(t) = set.template(info.template) else {
            continue;
        };
        let c = info.coords;
        for (k, s) in t.shards.iter().enumerate() {
            let (replica, expert_coord) = if s.expert {
                (c.dp / ep, c.dp % ep)
            } else {
                (c.dp, 0)
            };
            let member = (info.rank, t.id.0, k, c.tp, c.dp);
            replicas
                .entry((s.param.0, replica, c.pp, 0))
                .or_default()
                .push(member);
            if s.zero {
                zero.entry((s.param.0, c.pp, c.tp, expert_coord))
                    .or_default()
                    .push(member);
            }
        }
    }
    // The groups are keyed by parameter first, so one range probe per parameter says whether
    // any rank holds it (a scan of every key per parameter took seconds at 1024 ranks).
    for (p, info) in set.params.iter().enumerate() {
        let p = p as u32;
        let mut held = replicas.range((p, 0, 0, 0)..=(p, u32::MAX, u32::MAX, u32::MAX));
        if held.next().is_none() {
            out.push(Violation {
                check: Check::Shard,
                rank: 0,
                at: Loc::None,
                message: format!("parameter {} is held by no rank", info.name),
            });
        }
    }
    let shard = |t: u32, k: usize| set.templates.get(t as usize).and_then(|t| t.shards.get(k));
    let mut memo: Memo = HashMap::new();
    for ((p, d, pp, _), members) in &replicas {
        let full = set
            .params
            .get(*p as usize)
            .map(|i| i.shape.clone())
            .unwrap_or_default();
        let key: Key = members.iter().map(|m| (m.1, m.2, m.3, m.4)).collect();
        let verdict = memo.entry((*p, key)).or_insert_with(|| {
            // Copies replicated across the tensor-parallel group count once; split shards tile.
            let split: Vec<_> = members
                .iter()
                .filter(|m| shard(m.1, m.2).is_some_and(|s| s.tp.is_some() || s.expert))
                .collect();
            if split.is_empty() {
                return None;
            }
            if split.len() != members.len() {
                return Some((
                    members[0].0,
                    members[0].2,
                    "some tensor-parallel ranks hold it whole, others a shard".to_string(),
                ));
            }
            let mut boxes: Vec<(u32, usize, Box)> = Vec::new();
            for &&(rank, t, k, c, d) in &split {
                if let Some(s) = shard(t, k) {
                    for b in s.slice_at(&full, at(c, d)).boxes {
                        boxes.push((rank, k, b));
                    }
                }
            }
            for i in 0..boxes.len() {
                for j in 0..i {
                    if boxes[i].0 != boxes[j].0 && overlap(&boxes[i].2, &boxes[j].2) {
                        return Some((
                            boxes[i].0,
                            boxes[i].1,
                            format!(
                                "its shard {:?} overlaps rank {}'s {:?}",
                                boxes[i].2, boxes[j].0, boxes[j].2
                            ),
                        ));
                    }
                }
            }
            let total: u64 = boxes.iter().map(|b| volume(&b.2)).sum();
            let want: u64 = full.iter().product();
            (total != want).then(|| {
                (
                    members[0].0,
                    members[0].2,
                    format!("the tensor-parallel shards cover {total} of {want} elements"),
                )
            })
        });
        if let Some((rank, k, msg)) = verdict {
            let name = set.params.get(*p as usize).map_or("?", |i| i.name.as_str());
            out.push(Violation {
                check: Check::Shard,
                rank: *rank,
                at: Loc::Shard(*k),
                message: format!("parameter {name} (replica dp {d}, stage {pp}): {msg}"),
            });
        }
    }
    let mut memo: Memo = HashMap::new();
    for ((p, pp, c, _), members) in &zero {
        let full = set
            .params
            .get(*p as usize)
            .map(|i| i.shape.clone())
            .unwrap_or_default();
        let key: Key = members.iter().map(|m| (m.1, m.2, m.3, m.4)).collect();
        let verdict = memo.entry((*p, key)).or_insert_with(|| {
            let mut ranges = Vec::new();
            let mut n = 0;
            for &(rank, t, k, _, d) in members {
                if let Some(s) = shard(t, k) {
                    let sl = s.slice_at(&full, at(*c, d));
                    n = sl.len();
                    ranges.push((sl.owned, rank, k));
                }
            }
            ranges.sort();
            let mut at = 0;
            for &((s, e), rank, k) in &ranges {
                if s < at {
                    return Some((
                        rank,
                        k,
                        format!(
                            "its ZeRO slice [{s}, {e}) overlaps the previous slice ending at {at}"
                        ),
                    ));
                }
                if s > at {
                    return Some((
                        rank,
                        k,
                        format!("elements [{at}, {s}) of the shard belong to no ZeRO slice"),
                    ));
                }
                at = e;
            }
            (at != n).then(|| {
                (
                    members[0].0,
                    members[0].2,
                    format!("ZeRO slices end at {at} of {n}"),
                )
            })
        });
        if let Some((rank, k, msg)) = verdict {
            let name = set.params.get(*p as usize).map_or("?", |i| i.name.as_str());
            out.push(Violation {
                check: Check::Shard,
                rank: *rank,
                at: Loc::Shard(*k),
                message: format!("parameter {name} (stage {pp}, tp {c}): {msg}"),
            });
        }
    }
}
