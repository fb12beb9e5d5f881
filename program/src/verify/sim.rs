//! Invariants 2–4: collectives match, sends meet receives, and the programs run to their end.
//!
//! Every simulated rank runs its iteration's communication instructions in order. A rank at a
//! collective waits until every member of the group is at a collective on it; they must be the
//! same collective. A send is buffered; a receive takes the oldest message from its peer, which
//! must carry its tag and byte count. When no rank can move, the ones left are deadlocked.

use std::collections::{HashMap, VecDeque};

use super::{Check, Loc, Violation};
use crate::ids::GroupId;
use crate::{CollectiveOp, Elem, Instr, ProgramSet, Purpose, Slot, Template};

/// (from, to) → messages in flight: (tag, bytes, sender's step).
type Mailboxes = HashMap<(u32, u32), VecDeque<(u64, u64, usize)>>;

#[derive(Clone, Debug, PartialEq)]
struct Sig {
    op: CollectiveOp,
    axis: Option<u8>,
    purpose: Purpose,
    bucket: Option<u32>,
    pairs: Vec<(u64, Elem)>,
}

enum Ev {
    Coll { slot: Slot, sig: Sig },
    Send { peer: u32, tag: u64, bytes: u64 },
    Recv { peer: u32, tag: u64, bytes: u64 },
}

fn sig(t: &Template, i: &Instr) -> Option<(Slot, Sig)> {
    if let Instr::Collective {
        op,
        group,
        axis,
        pairs,
        purpose,
        bucket,
        ..
    } = i
    {
        let pairs = pairs
            .iter()
            .map(|(x, _)| t.buffer(*x).map_or((0, Elem::U8), |d| (d.numel(), d.elem)))
            .collect();
        return Some((
            *group,
            Sig {
                op: *op,
                axis: *axis,
                purpose: *purpose,
                bucket: bucket.map(|b| b.0),
                pairs,
            },
        ));
    }
    None
}

/// Runs the check; returns the number of ranks simulated.
pub fn check(set: &ProgramSet, out: &mut Vec<Violation>) -> usize {
    // Slots resolve to the group that lists the rank.
    for info in &set.ranks {
        for (k, g) in info.groups.iter().enumerate() {
            if let Some(g) = g
                && !set.group(*g).is_some_and(|gr| {
                    gr.ranks.contains(&info.rank) && Some(&gr.slot) == Slot::ALL.get(k)
                })
            {
                out.push(Violation {
                    check: Check::Collective,
                    rank: info.rank,
                    at: Loc::None,
                    message: format!(
                        "its {} group {g} does not list it",
                        Slot::ALL.get(k).map_or("?", |s| s.name())
                    ),
                });
            }
        }
    }
    // Symmetric: every tp and dp group's members share one template.
    let symmetric = set.groups.iter().all(|g| {
        g.slot == Slot::Tied
            || g.ranks
                .iter()
                .map(|&r| set.rank(r).map(|i| i.template))
                .collect::<Vec<_>>()
                .windows(2)
                .all(|w| w[0] == w[1])
    });
    let sim: Vec<u32> = if symmetric {
        set.ranks
            .iter()
            .filter(|i| i.coords.tp == 0 && i.coords.dp == 0)
            .map(|i| i.rank)
            .collect()
    } else {
        set.ranks.iter().map(|i| i.rank).collect()
    };
    let in_sim: HashMap<u32, usize> = sim.iter().enumerate().map(|(k, &r)| (r, k)).collect();
    // Communication events per simulated rank.
    let mut events: Vec<Vec<(usize, Ev)>> = Vec::with_capacity(sim.len());
    for &r in &sim {
        let Some(info) = set.rank(r) else { continue };
        let Some(t) = set.template(info.template) else {
            events.push(Vec::new());
            continue;
        };
        let mut ev = Vec::new();
        for (k, i) in t.instrs.iter().enumerate() {
            let bytes = |b: &crate::ids::BufferId| t.buffer(*b).map_or(0, |d| d.bytes());
            match i {
                Instr::Collective { .. } => {
                    if let Some((slot, s)) = sig(t, i) {
                        ev.push((k, Ev::Coll { slot, sig: s }));
                    }
                }
                Instr::Chunk { group, .. }
                | Instr::Vocab { group, .. }
                | Instr::Context { group, .. }
                    if info.group(*group).is_none() && needs_group(set, *group) =>
                {
                    out.push(Violation {
                        check: Check::Collective,
                        rank: r,
                        at: Loc::Step(k),
                        message: format!(
                            "chunk, vocabulary or context op over its {} group, which it does not have",
                            group.name()
                        ),
                    });
                }
                Instr::Send { buf, peer, tag } => ev.push((
                    k,
                    Ev::Send {
                        peer: info.peer(*peer),
                        tag: *tag,
                        bytes: bytes(buf),
                    },
                )),
                Instr::Recv { buf, peer, tag } => ev.push((
                    k,
                    Ev::Recv {
                        peer: info.peer(*peer),
                        tag: *tag,
                        bytes: bytes(buf),
                    },
                )),
                _ => {}
            }
        }
        events.push(ev);
    }
    let n = sim.len();
    let mut pc = vec![0usize; n];
    let mut waiting: Vec<Option<GroupId>> = vec![None; n];
    let mut arrived: HashMap<GroupId, Vec<usize>> = HashMap::new();
    let mut mail: Mailboxes = HashMap::new();
    let mut bad_group_reported = vec![false; n];
    loop {
        let mut progress = false;
        for s in 0..n {
            let r = sim[s];
            let Some(info) = set.rank(r) else { continue };
            while waiting[s].is_none() {
                let Some((k, ev)) = events[s].get(pc[s]) else {
                    break;
                };
                match ev {
                    Ev::Coll { slot, sig: _ } => {
                        let Some(g) = info.group(*slot) else {
                            if !bad_group_reported[s] {
                                bad_group_reported[s] = true;
                                out.push(Violation {
                                    check: Check::Collective,
                                    rank: r,
                                    at: Loc::Step(*k),
                                    message: format!(
                                        "collective on its {} group, which it does not have",
                                        slot.name()
                                    ),
                                });
                            }
                            pc[s] += 1;
                            progress = true;
                            continue;
                        };
                        let members = set.group(g).map_or(&[][..], |gr| gr.ranks.as_slice());
                        if symmetric && *slot != Slot::Tied {
                            // All members run this same list: it matches by construction.
                            pc[s] += 1;
                            progress = true;
                            continue;
                        }
                        let list = arrived.entry(g).or_default();
                        list.push(s);
                        waiting[s] = Some(g);
                        progress = true;
                        if list.len() == members.len() {
                            let ready = std::mem::take(list);
                            match_collective(set, &sim, &events, &pc, &ready, g, out);
                            for &m in &ready {
                                waiting[m] = None;
                                pc[m] += 1;
                            }
                        }
                        let _ = in_sim.len();
                    }
                    Ev::Send { peer, tag, bytes } => {
                        mail.entry((r, *peer))
                            .or_default()
                            .push_back((*tag, *bytes, *k));
                        pc[s] += 1;
                        progress = true;
                    }
                    Ev::Recv { peer, tag, bytes } => {
                        let Some((t2, b2, k2)) =
                            mail.get_mut(&(*peer, r)).and_then(|q| q.pop_front())
                        else {
                            break;
                        };
                        if t2 != *tag || b2 != *bytes {
                            out.push(Violation {
                                check: Check::PointToPoint,
                                rank: r,
                                at: Loc::Step(*k),
                                message: format!("recv from rank {peer} expects tag {tag:#x} ({bytes} bytes) but rank {peer}'s next message (its step #{k2}) is tag {t2:#x} ({b2} bytes)"),
                            });
                        }
                        pc[s] += 1;
                        progress = true;
                    }
                }
            }
        }
        if !progress {
            break;
        }
    }
    for s in 0..n {
        if let Some((k, ev)) = events[s].get(pc[s]) {
            let what = match ev {
                Ev::Coll { slot, sig } => format!("{} on its {} group", sig.op.name(), slot.name()),
                Ev::Send { peer, .. } => format!("send to rank {peer}"),
                Ev::Recv { peer, tag, .. } => {
                    format!("recv tag {tag:#x} from rank {peer}, which never sends it")
                }
            };
            out.push(Violation {
                check: Check::Deadlock,
                rank: sim[s],
                at: Loc::Step(*k),
                message: format!("deadlock: stuck at {what}"),
            });
        }
    }
    for ((from, to), q) in &mail {
        for (tag, bytes, k) in q {
            out.push(Violation {
                check: Check::PointToPoint,
                rank: *from,
                at: Loc::Step(*k),
                message: format!(
                    "send of tag {tag:#x} ({bytes} bytes) to rank {to} is never received"
                ),
            });
        }
    }
    n
}

fn needs_group(set: &ProgramSet, slot: Slot) -> bool {
    match slot {
        Slot::Tp => set.mesh.tp > 1,
        Slot::Dp => set.mesh.dp > 1,
        Slot::Tied => set.mesh.pp > 1,
        Slot::Ep => set.mesh.ep > 1,
        Slot::Edp => set.mesh.dp / set.mesh.ep.max(1) > 1,
        Slot::Cp => set.mesh.cp > 1,
    }
}

fn match_collective(
    set: &ProgramSet,
    sim: &[u32],
    events: &[Vec<(usize, Ev)>],
    pc: &[usize],
    ready: &[usize],
    g: GroupId,
    out: &mut Vec<Violation>,
) {
    let get = |s: usize| match events[s].get(pc[s]) {
        Some((k, Ev::Coll { sig, .. })) => Some((*k, sig)),
        _ => None,
    };
    // Members in group order; the first is the reference.
    let order: Vec<usize> = set
        .group(g)
        .map(|gr| {
            gr.ranks
                .iter()
                .filter_map(|r| ready.iter().copied().find(|&s| sim[s] == *r))
                .collect()
        })
        .unwrap_or_default();
    let Some(&first) = order.first() else { return };
    let Some((k0, s0)) = get(first) else { return };
    for &s in &order[1..] {
        if let Some((k, sg)) = get(s)
            && sg != s0
        {
            out.push(Violation {
                check: Check::Collective,
                rank: sim[s],
                at: Loc::Step(k),
                message: format!(
                    "collective {} ({:?}, bucket {:?}, {} pair(s)) on group {g} does not match rank {}'s {} ({:?}, bucket {:?}, {} pair(s)) at its step #{k0}",
                    sg.op.name(), sg.purpose, sg.bucket, sg.pairs.len(), sim[first], s0.op.name(), s0.purpose, s0.bucket, s0.pairs.len()
                ),
            });
        }
    }
}
