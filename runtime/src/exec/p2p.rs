//! Whether a program set's point-to-point messages may go device to device under NCCL's
//! semantics, decided before the first step and alike on every rank.
//!
//! On the host a send is buffered: it returns once copied. Under NCCL a send is done only once
//! its receiver has taken it, a pair's messages match in issue order, and each rank's
//! communication runs in its program order on one stream (collectives included). The executor
//! issues a stage's pending sends together with its next receive as one NCCL group (as
//! Megatron-LM batches a send with a receive), at a collective, and at the step's end. That
//! suffices for 1F1B; the interleaved schedule's programs, whose stages send ahead of what
//! they receive, would wait on each other. [`deadlock_free`] plays every rank's
//! communication under those rules; where it finds a wait that never ends, the executor keeps
//! point-to-point messages on the host communicator (collectives still run on the device).

use std::collections::{HashMap, VecDeque};

use program::{Instr, ProgramSet};

/// One rank's communication in order, as the executor issues it on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    /// One NCCL group: sends to and receives from these world ranks.
    Group { sends: Vec<u32>, recvs: Vec<u32> },
    /// A collective over these world ranks (all must reach it together).
    Sync(Vec<u32>),
}

/// Rank `rank`'s ops: pending sends flushed with the next receive, at a collective and at the
/// step's end (where the loss is gathered over the world).
fn rank_ops(set: &ProgramSet, rank: u32) -> Option<Vec<Op>> {
    let info = set.rank(rank)?;
    let tpl = set.template(info.template)?;
    let members = |slot| {
        let id = info.group(slot)?;
        set.groups
            .iter()
            .find(|g| g.id == id)
            .map(|g| g.ranks.clone())
    };
    let mut ops = Vec::new();
    let mut pending = Vec::new();
    for ins in &tpl.instrs {
        match ins {
            Instr::Send { peer, .. } => pending.push(info.peer(*peer)),
            Instr::Recv { peer, .. } => ops.push(Op::Group {
                sends: std::mem::take(&mut pending),
                recvs: vec![info.peer(*peer)],
            }),
            Instr::Collective { group, .. } => {
                flush(&mut ops, &mut pending);
                if let Some(m) = members(*group) {
                    ops.push(Op::Sync(m));
                }
            }
            _ => {}
        }
    }
    flush(&mut ops, &mut pending);
    ops.push(Op::Sync((0..set.ranks.len() as u32).collect()));
    Some(ops)
}

fn flush(ops: &mut Vec<Op>, pending: &mut Vec<u32>) {
    if !pending.is_empty() {
        ops.push(Op::Group {
            sends: std::mem::take(pending),
            recvs: Vec::new(),
        });
    }
}

/// Where one rank is in its ops.
#[derive(Default)]
struct Cursor {
    op: usize,
    /// The current group's sends are posted.
    posted: bool,
    /// Receives of the current group taken.
    taken: usize,
    /// Receipts of the current group's sends taken.
    receipts: usize,
}

/// The messages and receipts in flight, and the ranks waiting at each collective.
#[derive(Default)]
struct Wires {
    /// (from, to) → messages posted and not yet received.
    data: HashMap<(u32, u32), usize>,
    /// (from, to) → receipts sent by `from` for messages `to` sent it, not yet taken.
    receipts: HashMap<(u32, u32), usize>,
}

impl Wires {
    fn take(map: &mut HashMap<(u32, u32), usize>, key: (u32, u32)) -> bool {
        match map.get_mut(&key) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

/// Whether every rank's communication of one step completes under NCCL's rules (see the
/// module doc); `false` also where a rank's program is missing.
pub fn deadlock_free(set: &ProgramSet) -> bool {
    let n = set.ranks.len() as u32;
    let Some(ops) = (0..n).map(|r| rank_ops(set, r)).collect::<Option<Vec<_>>>() else {
        return false;
    };
    let mut at: Vec<Cursor> = (0..n).map(|_| Cursor::default()).collect();
    let mut wires = Wires::default();
    let mut queue: VecDeque<u32> = (0..n).collect();
    while let Some(r) = queue.pop_front() {
        advance(r, &ops, &mut at, &mut wires, &mut queue);
    }
    at.iter().zip(&ops).all(|(c, o)| c.op == o.len())
}

/// Moves rank `r` as far as it can go, queueing the ranks its moves may unblock.
fn advance(
    r: u32,
    ops: &[Vec<Op>],
    at: &mut [Cursor],
    wires: &mut Wires,
    queue: &mut VecDeque<u32>,
) {
    let mine = &ops[r as usize];
    loop {
        let c = &mut at[r as usize];
        let Some(op) = mine.get(c.op) else { return };
        match op {
            Op::Group { sends, recvs } => {
                if !c.posted {
                    for &p in sends {
                        *wires.data.entry((r, p)).or_default() += 1;
                        queue.push_back(p);
                    }
                    c.posted = true;
                }
                while c.taken < recvs.len() && Wires::take(&mut wires.data, (recvs[c.taken], r)) {
                    *wires.receipts.entry((r, recvs[c.taken])).or_default() += 1;
                    queue.push_back(recvs[c.taken]);
                    c.taken += 1;
                }
                while c.taken == recvs.len()
                    && c.receipts < sends.len()
                    && Wires::take(&mut wires.receipts, (sends[c.receipts], r))
                {
                    c.receipts += 1;
                }
                if c.taken < recvs.len() || c.receipts < sends.len() {
                    return;
                }
                *c = Cursor {
                    op: c.op + 1,
                    ..Cursor::default()
                };
            }
            Op::Sync(members) => {
                // Every member's current op is this collective: all move on together.
                let here = members
                    .iter()
                    .all(|&m| ops[m as usize].get(at[m as usize].op) == Some(op));
                if !here {
                    return;
                }
                for &m in members {
                    at[m as usize].op += 1;
                    if m != r {
                        queue.push_back(m);
                    }
                }
            }
        }
    }
}
