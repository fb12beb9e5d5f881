//! The time bound that lets the search skip a candidate without simulating its pipeline.
//!
//! A candidate whose pipeline lower bound ([`crate::cost::pipeline::finish_lower_bound`])
//! exceeds the cutoff cannot change the answer: it is slower than the [`REBALANCED`] fastest
//! fitting plans already seen (so it is neither the winner nor one the search rebalances or
//! refines), and slower than a plan of its own mesh shape already seen or than the fastest
//! plans of `k + 1` mesh shapes (so it is not the fastest of a mesh shape the report lists
//! among its `k` alternatives). The runner-up with the
//! winner's own mesh shape is found by evaluating that shape's skipped candidates once the
//! winner is known ([`Cutoffs::skipped_of`]). Nothing that does not fit and is slower than the
//! winner is reported either. So the search stays exact and deterministic; only the work it
//! skips depends on the order candidates come in, which is fixed.

use std::collections::HashMap;

use crate::estimate::Estimate;
use crate::strategy::Strategy;

/// How many of the fastest fitting plans the search rebalances.
pub const REBALANCED: usize = 32;

type Mesh = (u32, u32, u32);

fn mesh(s: &Strategy) -> Mesh {
    (s.tp, s.pp, s.dp)
}

/// The fastest fitting iteration times seen so far, overall and per mesh shape, and the
/// candidates skipped so far.
#[derive(Debug)]
pub struct Cutoffs {
    /// Alternatives the report lists (`k`).
    listed: usize,
    /// The [`REBALANCED`] smallest, ascending.
    fastest: Vec<f64>,
    /// The fastest per (tp, pp, dp).
    mesh_best: HashMap<Mesh, f64>,
    /// Indices of skipped candidates, per mesh shape.
    skipped: HashMap<Mesh, Vec<usize>>,
}

impl Cutoffs {
    pub fn new(listed: usize) -> Cutoffs {
        Cutoffs {
            listed,
            fastest: Vec::new(),
            mesh_best: HashMap::new(),
            skipped: HashMap::new(),
        }
    }

    /// Records a plan that fits.
    pub fn record(&mut self, e: &Estimate) {
        let t = e.predicted.iteration_time_s;
        let at = self.fastest.partition_point(|&x| x <= t);
        if at < REBALANCED {
            self.fastest.insert(at, t);
            self.fastest.truncate(REBALANCED);
        }
        let best = self
            .mesh_best
            .entry(mesh(&e.strategy))
            .or_insert(f64::INFINITY);
        *best = best.min(t);
    }

    /// Records that candidate `index` (strategy `s`) was skipped.
    pub fn skip(&mut self, index: usize, s: &Strategy) {
        self.skipped.entry(mesh(s)).or_default().push(index);
    }

    /// The skipped candidates with the mesh shape of `s`, in order.
    pub fn skipped_of(&self, s: &Strategy) -> &[usize] {
        self.skipped.get(&mesh(s)).map_or(&[], Vec::as_slice)
    }

    /// The fastest fitting iteration time so far (infinite before the first).
    pub fn fastest_fitting(&self) -> f64 {
        self.fastest.first().copied().unwrap_or(f64::INFINITY)
    }

    /// The iteration time past which candidate `s` cannot matter (infinite until enough plans
    /// are known): slower than the [`REBALANCED`] fastest, and either slower than a plan of its
    /// own mesh shape already found (it cannot be that shape's fastest) or slower than the
    /// fastest plans of `k + 1` shapes (its shape's fastest is not listed).
    pub fn cutoff_for(&self, s: &Strategy) -> f64 {
        let own = self
            .mesh_best
            .get(&mesh(s))
            .copied()
            .unwrap_or(f64::INFINITY);
        let (overall, listed) = self.bounds();
        overall.max(listed.min(own))
    }

    /// (the [`REBALANCED`]-th fastest time, the fastest time of the `k + 1`-th fastest shape).
    fn bounds(&self) -> (f64, f64) {
        let overall = if self.fastest.len() >= REBALANCED {
            self.fastest[REBALANCED - 1]
        } else {
            f64::INFINITY
        };
        let mut meshes: Vec<f64> = self.mesh_best.values().copied().collect();
        let shapes = self.listed.saturating_add(1);
        let listed = if meshes.len() >= shapes {
            meshes.select_nth_unstable_by(shapes - 1, f64::total_cmp);
            meshes[shapes - 1]
        } else {
            f64::INFINITY
        };
        (overall, listed)
    }
}
