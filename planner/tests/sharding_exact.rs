//! The exact extraction against brute force: on small random extraction problems (shared
//! children, layout-conversion cycles, gradient reductions that an all-gather turns into a
//! reduce-scatter or that only slices' pieces need (an all-gather), a memory limit) it finds the cheapest valid program that enumerating every
//! choice finds.

#![allow(clippy::unwrap_used)] // test helpers panic on purpose

use egg::Id;
use ir::{DType, Dim, Shape, TensorType};
use planner::sharding::analysis::{Dist, TensorFact};
use planner::sharding::candidates::{Cand, Class, Comm, GradReduce, Problem};
use planner::sharding::lang::{Atom, Shard};
use planner::sharding::{CollectiveKind, Pass, ShardError, exact, ilp};

/// xorshift64*: a fixed stream, so every run checks the same problems.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn ty() -> TensorType {
    TensorType::new(DType::F32, Shape(vec![Dim::Fixed(4)]))
}

fn comm(kind: CollectiveKind, seconds: f64) -> Comm {
    Comm {
        kind,
        pass: Pass::Backward,
        bytes: 16.0,
        ty: ty(),
        divisor: 1.0,
        seconds,
        reason: "test",
        per_step: false,
    }
}

/// What a random candidate is: a plain node, an all-gather (its class's gradient then
/// reduce-scatters) or a slice (a rank-variant read whose gradient is a piece).
#[derive(Clone, Copy)]
enum Kind {
    Plain,
    Gather,
    Slice,
}

fn cand(class: usize, kids: Vec<usize>, kind: Kind, rng: &mut Rng) -> Cand {
    let node = match kind {
        Kind::Gather => Shard::AllGather([Id::from(0), Id::from(0)]),
        Kind::Slice => Shard::Shard([Id::from(0), Id::from(0)]),
        Kind::Plain => Shard::Atom(Atom::Val(class as u32)),
    };
    Cand {
        class,
        node,
        kids,
        compute_s: 0.1 + rng.unit(),
        fwd_flops: 0.0,
        bwd_flops: 0.0,
        param_bytes: 0.0,
        act_bytes: (1 + rng.below(9)) as f64,
        comms: Vec::new(),
    }
}

/// Classes 0..n; class 0 is the root. A node reads later classes (a DAG), and some nodes read
/// an earlier class of a neighbouring pair (a layout conversion: a cycle the search must
/// break). Leaves (the last two classes) read nothing.
fn problem(rng: &mut Rng, n: usize) -> Problem {
    let mut classes: Vec<Class> = (0..n)
        .map(|c| Class {
            id: Id::from(c),
            fact: TensorFact {
                ty: ty(),
                dist: if c % 2 == 0 {
                    Dist::Replicated
                } else {
                    Dist::Partial
                },
            },
            nodes: Vec::new(),
            grad_reduce: None,
            variant_readers: Vec::new(),
        })
        .collect();
    let mut cands: Vec<Cand> = Vec::new();
    for (c, class) in classes.iter_mut().enumerate() {
        let leaf = c + 2 >= n;
        let count = if leaf { 1 } else { 1 + rng.below(3) };
        for _ in 0..count {
            let mut kids = Vec::new();
            if !leaf {
                for _ in 0..1 + rng.below(2) {
                    kids.push(c + 1 + rng.below(n - c - 1));
                }
            }
            if c > 0 && rng.below(4) == 0 {
                kids = vec![c - 1]; // a conversion from the neighbouring layout
            }
            kids.sort_unstable();
            kids.dedup();
            let kind = match (kids.len(), rng.below(3)) {
                (1, 0) => Kind::Gather,
                (1, 1) => Kind::Slice,
                _ => Kind::Plain,
            };
            class.nodes.push(cands.len());
            cands.push(cand(c, kids, kind, rng));
        }
    }
    for (i, cand) in cands.iter().enumerate() {
        if classes[cand.class].fact.dist.rank_variant() {
            for &k in &cand.kids {
                if classes[k].fact.dist == Dist::Replicated {
                    classes[k].variant_readers.push(i);
                }
            }
        }
    }
    for c in &mut classes {
        if !c.variant_readers.is_empty() {
            // An all-gather or a reduce-scatter below the all-reduce of the same tensor, as in
            // every collective model plait has.
            let ar = 2.0 * rng.unit();
            c.grad_reduce = Some(GradReduce {
                all_reduce: comm(CollectiveKind::AllReduce, ar),
                reduce_scatter: comm(CollectiveKind::ReduceScatter, ar * rng.unit()),
                all_gather: comm(CollectiveKind::AllGather, ar * rng.unit()),
            });
        }
    }
    Problem {
        classes,
        cands,
        roots: vec![0],
        tp: 2,
        binding: ir::Binding { batch: 1, seq: 1 },
    }
}

/// Whether a choice (one node or none per class) is a program: roots computed, every chosen
/// node's children computed, no cycle.
fn valid(p: &Problem, pick: &[Option<usize>]) -> bool {
    if p.roots.iter().any(|&r| pick[r].is_none()) {
        return false;
    }
    let kids = |c: usize| pick[c].map_or(&[][..], |i| &p.cands[i].kids[..]);
    if (0..pick.len()).any(|c| kids(c).iter().any(|&k| pick[k].is_none())) {
        return false;
    }
    // Acyclic: repeatedly remove chosen classes whose children are all removed.
    let mut left: Vec<usize> = (0..pick.len()).filter(|&c| pick[c].is_some()).collect();
    loop {
        let before = left.len();
        let snapshot = left.clone();
        left.retain(|&c| kids(c).iter().any(|k| snapshot.contains(k)));
        if left.is_empty() {
            return true;
        }
        if left.len() == before {
            return false;
        }
    }
}

/// The cheapest valid choice within the memory limit, by enumerating all of them.
fn brute_force(p: &Problem, limit: Option<f64>) -> Option<f64> {
    let n = p.classes.len();
    let mut pick: Vec<Option<usize>> = vec![None; n];
    let mut best: Option<f64> = None;
    fn go(
        c: usize,
        p: &Problem,
        limit: Option<f64>,
        pick: &mut Vec<Option<usize>>,
        best: &mut Option<f64>,
    ) {
        if c == p.classes.len() {
            if !valid(p, pick) {
                return;
            }
            let chosen = chosen_of(p, pick);
            if limit.is_some_and(|l| ilp::memory(p, &chosen) > l) {
                return;
            }
            let v = ilp::objective_of(p, &chosen);
            if best.is_none_or(|b| v < b) {
                *best = Some(v);
            }
            return;
        }
        pick[c] = None;
        go(c + 1, p, limit, pick, best);
        for &i in &p.classes[c].nodes {
            pick[c] = Some(i);
            go(c + 1, p, limit, pick, best);
        }
        pick[c] = None;
    }
    go(0, p, limit, &mut pick, &mut best);
    best
}

fn chosen_of(p: &Problem, pick: &[Option<usize>]) -> Vec<bool> {
    let mut chosen = vec![false; p.cands.len()];
    for i in pick.iter().flatten() {
        chosen[*i] = true;
    }
    chosen
}

fn pick_of(p: &Problem, chosen: &[bool]) -> Vec<Option<usize>> {
    let mut pick = vec![None; p.classes.len()];
    for (i, c) in p.cands.iter().enumerate() {
        if chosen[i] {
            assert!(
                pick[c.class].is_none(),
                "two nodes chosen in class {}",
                c.class
            );
            pick[c.class] = Some(i);
        }
    }
    pick
}

#[test]
fn exact_extraction_equals_brute_force() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0;
    for trial in 0..300 {
        let n = 4 + trial % 4;
        let p = problem(&mut rng, n);
        let unlimited = brute_force(&p, None);
        // A limit between the smallest and the largest program's bytes, so it sometimes binds.
        let limit = 6.0 + rng.below(20) as f64;
        for lim in [None, Some(limit)] {
            let want = if lim.is_none() {
                unlimited
            } else {
                brute_force(&p, lim)
            };
            match (exact::solve(&p, lim), want) {
                (Ok(sel), Some(w)) => {
                    let pick = pick_of(&p, &sel.chosen);
                    assert!(valid(&p, &pick), "trial {trial}: invalid program {pick:?}");
                    if let Some(l) = lim {
                        assert!(ilp::memory(&p, &sel.chosen) <= l, "trial {trial}");
                    }
                    let got = sel.report.objective_seconds;
                    assert!(
                        (got - w).abs() < 1e-9,
                        "trial {trial}: exact {got}, best {w}"
                    );
                    checked += 1;
                }
                (Err(ShardError::OutOfMemory { .. } | ShardError::Solver { .. }), None) => {}
                (got, w) => {
                    panic!("trial {trial} (limit {lim:?}): exact {got:?}, brute force {w:?}")
                }
            }
        }
    }
    assert!(checked > 400, "only {checked} problems had a program");
}

#[test]
fn exact_extraction_is_deterministic() {
    let mut rng = Rng(7);
    for _ in 0..20 {
        let p = problem(&mut rng, 7);
        let a = exact::solve(&p, None).map(|s| s.chosen);
        let b = exact::solve(&p, None).map(|s| s.chosen);
        assert_eq!(a, b);
    }
}
