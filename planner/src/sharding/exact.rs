//! Exact extraction by dynamic programming over frontiers: the ILP's optimum (same objective,
//! same constraints as [`super::ilp`]) found without a solver, so the answer depends only on the
//! problem, never on machine speed or load.
//!
//! The class graph's strongly connected components ([`super::ilp::sccs`]) are visited parents
//! first. A partial solution is summarised by its *frontier*: the classes some chosen node reads
//! that no visited component has computed yet, each with a level saying whether a rank-variant
//! chosen node reads it (its gradient then needs a reduction, Megatron's conjugate collectives):
//! only slices (the pieces' gradients all-gathered), or a split op (a partial gradient).
//! Every reader of a class lies in a component visited before the class's own, so the frontier
//! is all the future depends on: two partial solutions with the same frontier are merged, keeping
//! the cheaper (with a memory limit, every one not dominated in seconds and bytes). At each
//! component the frontier's classes in it are computed in every acyclic way its nodes allow.
//!
//! The frontier of a transformer block stays small (a few live values, a few layouts each) when
//! a component is visited as soon as its last reader has been (a depth-first topological order),
//! so the search is exact and takes milliseconds. A frontier count past [`MAX_STATES`] (a count,
//! not a clock) stops with an error.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::candidates::{Problem, is_slice};
use super::error::ShardError;
use super::ilp::{Selection, SolveReport, objective_of, sccs};
use super::lang::Shard;

/// Most frontiers kept at once before the search gives up (deterministically).
pub const MAX_STATES: usize = 200_000;

/// Most ways to compute one component's needed classes.
const MAX_PRODUCTIONS: usize = 20_000;

/// The solver name plans and reports carry.
pub const SOLVER: &str = "exact frontier DP";

/// A frontier entry: class index × 3 + its [`Read`] level.
type Slot = u32;
/// The sorted frontier.
type Frontier = Vec<Slot>;

/// How the chosen nodes read a class, by what its gradient then needs; two reads combine as
/// their maximum.
type Read = u8;
/// No rank-variant node reads it.
const WHOLE: Read = 0;
/// Only slices do: each rank's piece of the gradient, all-gathered.
const PIECES: Read = 1;
/// A split op does: a partial gradient, reduced.
const PARTIAL: Read = 2;

fn slot(class: usize, read: Read) -> Slot {
    (class as Slot) * 3 + Slot::from(read)
}

fn slot_class(s: Slot) -> usize {
    (s / 3) as usize
}

fn slot_read(s: Slot) -> Read {
    (s % 3) as Read
}

/// One way to compute a component's needed classes.
#[derive(Clone, Debug)]
struct Production {
    picks: Vec<usize>,
    seconds: f64,
    memory: f64,
    /// Classes of later components the picks read, with their flags.
    reads: Vec<Slot>,
}

/// A partial solution reaching a frontier.
#[derive(Clone, Copy, Debug)]
struct Entry {
    seconds: f64,
    memory: f64,
    trace: usize,
}

/// The choices behind an entry: a production's picks and the entry it extended.
struct Trace {
    picks: Vec<usize>,
    prev: Option<usize>,
}

/// The component structure the search walks.
struct Components {
    of_class: Vec<usize>,
    members: Vec<Vec<usize>>,
    /// Components in visiting order (every component after all components that read it).
    order: Vec<usize>,
}

impl Components {
    fn new(p: &Problem) -> Components {
        let (of_class, sizes) = sccs(p);
        let n = sizes.len();
        let mut members = vec![Vec::new(); n];
        for (c, &k) in of_class.iter().enumerate() {
            members[k].push(c);
        }
        // Edges reader component → read component, deduplicated in a fixed order.
        let mut reads: Vec<Vec<usize>> = vec![Vec::new(); n];
        for cand in &p.cands {
            let from = of_class[cand.class];
            for &k in &cand.kids {
                if of_class[k] != from {
                    reads[from].push(of_class[k]);
                }
            }
        }
        let mut readers = vec![0usize; n];
        for r in &mut reads {
            r.sort_unstable();
            r.dedup();
            for &to in r.iter() {
                readers[to] += 1;
            }
        }
        // Kahn's algorithm with a stack: a component whose last reader was just visited goes
        // next, so values leave the frontier soon after their last use.
        let mut stack: Vec<usize> = (0..n).rev().filter(|&k| readers[k] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(k) = stack.pop() {
            order.push(k);
            for &to in reads[k].iter().rev() {
                readers[to] -= 1;
                if readers[to] == 0 {
                    stack.push(to);
                }
            }
        }
        Components {
            of_class,
            members,
            order,
        }
    }
}

/// Solves the extraction exactly; `Err(OutOfMemory)` when no program fits `memory_limit`.
pub fn solve(p: &Problem, memory_limit: Option<f64>) -> Result<Selection, ShardError> {
    let start = Instant::now();
    let comps = Components::new(p);
    let flags = VariantReads::new(p);
    let mut traces: Vec<Trace> = Vec::new();
    let mut roots: Frontier = p.roots.iter().map(|&r| slot(r, WHOLE)).collect();
    roots.sort_unstable();
    roots.dedup();
    let mut states: BTreeMap<Frontier, Vec<Entry>> = BTreeMap::new();
    states.insert(
        roots,
        vec![Entry {
            seconds: 0.0,
            memory: 0.0,
            trace: usize::MAX,
        }],
    );
    let mut widest = 1;
    for &k in &comps.order {
        let mut productions: HashMap<Vec<Slot>, Vec<Production>> = HashMap::new();
        let mut next: BTreeMap<Frontier, Vec<Entry>> = BTreeMap::new();
        for (frontier, entries) in states {
            let (here, rest): (Vec<Slot>, Vec<Slot>) = frontier
                .iter()
                .partition(|&&s| comps.of_class[slot_class(s)] == k);
            if here.is_empty() {
                for e in entries {
                    insert(&mut next, frontier.clone(), e, memory_limit);
                }
                continue;
            }
            if !productions.contains_key(&here) {
                let made = produce(p, &comps, &flags, k, &here)?;
                productions.insert(here.clone(), made);
            }
            for prod in &productions[&here] {
                let reached = merge_frontier(&rest, &prod.reads);
                for e in &entries {
                    let memory = e.memory + prod.memory;
                    if memory_limit.is_some_and(|l| memory > l) {
                        continue;
                    }
                    traces.push(Trace {
                        picks: prod.picks.clone(),
                        prev: (e.trace != usize::MAX).then_some(e.trace),
                    });
                    let entry = Entry {
                        seconds: e.seconds + prod.seconds,
                        memory,
                        trace: traces.len() - 1,
                    };
                    insert(&mut next, reached.clone(), entry, memory_limit);
                }
            }
        }
        if next.len() > MAX_STATES {
            return Err(ShardError::Solver {
                solver: SOLVER.into(),
                message: format!(
                    "more than {MAX_STATES} frontiers; the block's e-graph is too wide for exact extraction"
                ),
            });
        }
        widest = widest.max(next.len());
        states = next;
    }
    let best = states
        .get(&Vec::new())
        .and_then(|es| es.iter().min_by(|a, b| a.seconds.total_cmp(&b.seconds)))
        .copied();
    let Some(best) = best else {
        return Err(match memory_limit {
            Some(limit_bytes) => ShardError::OutOfMemory {
                limit_bytes,
                needed_bytes: smallest_memory(p),
            },
            None => ShardError::Solver {
                solver: SOLVER.into(),
                message: "no acyclic choice of nodes computes the block's outputs".into(),
            },
        });
    };
    let mut chosen = vec![false; p.cands.len()];
    let mut at = (best.trace != usize::MAX).then_some(best.trace);
    while let Some(t) = at {
        for &i in &traces[t].picks {
            chosen[i] = true;
        }
        at = traces[t].prev;
    }
    let report = SolveReport {
        optimal: true,
        solver: SOLVER.into(),
        seconds: start.elapsed().as_secs_f64(),
        objective_seconds: objective_of(p, &chosen),
        eclasses: p.classes.len(),
        candidates: p.cands.len(),
        variables: p.cands.len(),
        binaries: p.cands.len(),
        constraints: widest,
        cyclic_classes: comps
            .members
            .iter()
            .filter(|m| m.len() > 1)
            .map(Vec::len)
            .sum(),
    };
    Ok(Selection { chosen, report })
}

/// The least resident bytes of any program (the same search, minimising bytes).
fn smallest_memory(p: &Problem) -> f64 {
    let mut bytes_only = p.clone();
    for c in &mut bytes_only.cands {
        c.compute_s = c.memory();
        c.comms.clear();
    }
    for c in &mut bytes_only.classes {
        c.grad_reduce = None;
    }
    solve(&bytes_only, None).map_or(f64::INFINITY, |s| s.report.objective_seconds)
}

/// Keeps `e` at `frontier` unless an entry there is at least as good; drops the ones it beats.
/// Without a memory limit only seconds count. Ties keep the earlier entry (deterministic).
fn insert(
    states: &mut BTreeMap<Frontier, Vec<Entry>>,
    frontier: Frontier,
    e: Entry,
    memory_limit: Option<f64>,
) {
    let entries = states.entry(frontier).or_default();
    let bytes_count = memory_limit.is_some();
    let covers =
        |a: &Entry, b: &Entry| a.seconds <= b.seconds && (!bytes_count || a.memory <= b.memory);
    if entries.iter().any(|x| covers(x, &e)) {
        return;
    }
    entries.retain(|x| !covers(&e, x));
    entries.push(e);
}

/// `rest` and `reads` as one sorted frontier, a class read several ways at its highest level.
fn merge_frontier(rest: &[Slot], reads: &[Slot]) -> Frontier {
    let mut all: Vec<Slot> = rest.iter().chain(reads).copied().collect();
    all.sort_unstable();
    let mut out: Frontier = Vec::with_capacity(all.len());
    for s in all {
        match out.last_mut() {
            // Sorted: a later slot of the same class has the higher level.
            Some(last) if slot_class(*last) == slot_class(s) => *last = s,
            _ => out.push(s),
        }
    }
    out
}

/// Which (candidate, kid class) reads carry a gradient reduction: a rank-variant node reading a
/// replicated float class ([`super::candidates::Class::variant_readers`]), a slice
/// ([`PIECES`]) or a split op ([`PARTIAL`]).
struct VariantReads {
    reads: Vec<Vec<(usize, Read)>>,
}

impl VariantReads {
    fn new(p: &Problem) -> VariantReads {
        let mut reads: Vec<Vec<(usize, Read)>> = p
            .cands
            .iter()
            .map(|c| {
                let mut kids = c.kids.clone();
                kids.sort_unstable();
                kids.dedup();
                kids.into_iter().map(|k| (k, WHOLE)).collect()
            })
            .collect();
        for (k, class) in p.classes.iter().enumerate() {
            for &i in &class.variant_readers {
                let level = if is_slice(p, i) { PIECES } else { PARTIAL };
                for r in reads[i].iter_mut().filter(|r| r.0 == k) {
                    r.1 = level;
                }
            }
        }
        VariantReads { reads }
    }
}

/// Every acyclic way to compute the needed classes `here` of component `k` (and the classes
/// of `k` those computations read in turn), with its cost.
fn produce(
    p: &Problem,
    comps: &Components,
    flags: &VariantReads,
    k: usize,
    here: &[Slot],
) -> Result<Vec<Production>, ShardError> {
    let mut search = Enumeration {
        p,
        comps,
        flags,
        k,
        pick: HashMap::new(),
        out: Vec::new(),
    };
    let needed: Vec<usize> = here.iter().map(|&s| slot_class(s)).collect();
    search.assign(needed)?;
    let initial: HashMap<usize, Read> = here
        .iter()
        .map(|&s| (slot_class(s), slot_read(s)))
        .collect();
    let assignments = std::mem::take(&mut search.out);
    Ok(assignments
        .into_iter()
        .filter(|a| acyclic(p, comps, k, a))
        .map(|a| price(p, comps, flags, k, &initial, &a))
        .collect())
}

/// Depth-first enumeration of node choices inside one component.
struct Enumeration<'a> {
    p: &'a Problem,
    comps: &'a Components,
    flags: &'a VariantReads,
    k: usize,
    pick: HashMap<usize, usize>,
    out: Vec<Vec<(usize, usize)>>,
}

impl Enumeration<'_> {
    /// Assigns a node to the first unassigned class of `todo`, then recurses.
    fn assign(&mut self, mut todo: Vec<usize>) -> Result<(), ShardError> {
        while todo.first().is_some_and(|c| self.pick.contains_key(c)) {
            todo.remove(0);
        }
        let Some(&class) = todo.first() else {
            let mut a: Vec<(usize, usize)> = self.pick.iter().map(|(&c, &i)| (c, i)).collect();
            a.sort_unstable();
            self.out.push(a);
            if self.out.len() > MAX_PRODUCTIONS {
                return Err(ShardError::Solver {
                    solver: SOLVER.into(),
                    message: format!(
                        "more than {MAX_PRODUCTIONS} ways to compute one group of layouts"
                    ),
                });
            }
            return Ok(());
        };
        for &i in &self.p.classes[class].nodes {
            let cand = &self.p.cands[i];
            if cand.kids.contains(&class) {
                continue; // reads itself: never part of an acyclic program
            }
            self.pick.insert(class, i);
            let mut more = todo[1..].to_vec();
            more.extend(
                self.flags.reads[i]
                    .iter()
                    .map(|&(kid, _)| kid)
                    .filter(|&kid| self.comps.of_class[kid] == self.k),
            );
            self.assign(more)?;
            self.pick.remove(&class);
        }
        Ok(())
    }
}

/// Whether the picks inside component `k` read each other without a cycle.
fn acyclic(p: &Problem, comps: &Components, k: usize, picks: &[(usize, usize)]) -> bool {
    let pick: HashMap<usize, usize> = picks.iter().copied().collect();
    // 0 unvisited, 1 on the path, 2 done.
    let mut state: HashMap<usize, u8> = HashMap::new();
    fn visit(
        c: usize,
        p: &Problem,
        comps: &Components,
        k: usize,
        pick: &HashMap<usize, usize>,
        state: &mut HashMap<usize, u8>,
    ) -> bool {
        match state.get(&c) {
            Some(1) => return false,
            Some(2) => return true,
            _ => {}
        }
        state.insert(c, 1);
        let kids = pick.get(&c).map_or(&[][..], |&i| &p.cands[i].kids[..]);
        for &kid in kids {
            if comps.of_class[kid] == k && !visit(kid, p, comps, k, pick, state) {
                return false;
            }
        }
        state.insert(c, 2);
        true
    }
    picks
        .iter()
        .all(|&(c, _)| visit(c, p, comps, k, &pick, &mut state))
}

/// The seconds, bytes and outside reads of one assignment, gradient reductions included.
fn price(
    p: &Problem,
    comps: &Components,
    flags: &VariantReads,
    k: usize,
    initial: &HashMap<usize, Read>,
    picks: &[(usize, usize)],
) -> Production {
    let mut flagged: HashMap<usize, Read> = picks
        .iter()
        .map(|&(c, _)| (c, initial.get(&c).copied().unwrap_or(WHOLE)))
        .collect();
    let mut reads: Vec<Slot> = Vec::new();
    let (mut seconds, mut memory) = (0.0, 0.0);
    for &(_, i) in picks {
        let cand = &p.cands[i];
        seconds += cand.seconds();
        memory += cand.memory();
        for &(kid, read) in &flags.reads[i] {
            if comps.of_class[kid] == k {
                let level = flagged.entry(kid).or_default();
                *level = (*level).max(read);
            } else {
                reads.push(slot(kid, read));
            }
        }
    }
    for &(c, i) in picks {
        if let (read, Some(gr)) = (flagged[&c], &p.classes[c].grad_reduce)
            && read != WHOLE
        {
            let gathered = matches!(p.cands[i].node, Shard::AllGather(_));
            seconds += gr.pick(read == PIECES, gathered).seconds;
        }
    }
    Production {
        picks: picks.iter().map(|&(_, i)| i).collect(),
        seconds,
        memory,
        reads: merge_frontier(&[], &reads),
    }
}
