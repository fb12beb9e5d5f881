//! Extraction as a 0-1 ILP, after Tensat (Yang et al., MLSys 2021, §4) with Alpa's resharding
//! and memory terms (Zheng et al., OSDI 2022, §4.2).
//!
//! Variables: `x_i ∈ {0,1}` per candidate e-node `i` (chosen or not); `y_m ∈ [0,1]` per replicated class read by split nodes
//! (its gradient needs a reduction in the backward pass); `u_m ∈ [0,1]` per such class that an
//! all-gather can produce (the reduction is then a reduce-scatter).
//!
//! Objective (Tensat eq. 1, Alpa eq. 1 with the resharding cost on nodes):
//! `min Σ_i c_i x_i + Σ_m AR_m y_m − Σ_m (AR_m − RS_m) u_m`, with `c_i` the node's forward +
//! backward compute time and its own collectives.
//!
//! Cycles: the `all-gather` rule makes `x → allgather(shard(x)) → x` cycles, and a cyclic choice
//! would "compute" a tensor from itself for free. Tensat forbids them with an order variable per
//! class and big-M constraints (its eq. 4). On the GPT block with sequence parallelism that
//! made microlp take 5 s (big-M rows give a weak LP relaxation), and lazily added
//! cycle-elimination cuts needed dozens of rounds. Cycles only ever run through layout changes
//! of one value (compute nodes read earlier values), i.e. inside small strongly connected
//! components (SCCs) of the class graph. So we *level* them: a node whose child lies in its own
//! SCC of `n` classes gets one copy `x_{i,ℓ}` per level `ℓ = 1..n−1`, every other node is level
//! 0, and a level-`ℓ` copy may only read copies of level `< ℓ` in that SCC:
//! `x_{i,ℓ} ≤ Σ_{j ∈ k, level(j) < ℓ} x_j` (replacing Tensat eq. 3 on those edges, and eq. 4
//! entirely). Every acyclic choice has such a levelling (a chain inside an SCC of `n` classes
//! has at most `n − 1` conversions) and every levelled choice is acyclic, so the formulation is
//! exact, with no big-M and no order variables.

use std::collections::HashMap;
use std::time::Instant;

use good_lp::{
    Expression, ProblemVariables, ResolutionError, Solution, SolutionStatus, SolverModel, Variable,
    WithTimeLimit, constraint, variable,
};
use serde::{Deserialize, Serialize};

use super::candidates::Problem;
use super::error::ShardError;
use super::lang::Shard;

/// The size of the ILP and how it was solved.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SolveReport {
    /// Whether the solver proved the chosen program optimal.
    pub optimal: bool,
    /// `microlp`, `highs`, or the fallback used and why.
    pub solver: String,
    pub seconds: f64,
    /// The objective: seconds per block pass (forward + backward) under the cost oracle.
    pub objective_seconds: f64,
    pub eclasses: usize,
    pub candidates: usize,
    pub variables: usize,
    pub binaries: usize,
    pub constraints: usize,
    pub cyclic_classes: usize,
}

/// The chosen candidates.
#[derive(Clone, Debug)]
pub struct Selection {
    pub chosen: Vec<bool>,
    pub report: SolveReport,
}

#[cfg(feature = "highs")]
const SOLVER: &str = "highs";
#[cfg(not(feature = "highs"))]
const SOLVER: &str = "microlp";

/// Strongly connected components of the class graph (Tarjan), as a component index per class.
pub(super) fn sccs(p: &Problem) -> (Vec<usize>, Vec<usize>) {
    let n = p.classes.len();
    let succ: Vec<Vec<usize>> = p
        .classes
        .iter()
        .map(|c| {
            let mut v: Vec<usize> = c
                .nodes
                .iter()
                .flat_map(|&i| p.cands[i].kids.iter().copied())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on = vec![false; n];
    let mut comp = vec![usize::MAX; n];
    let mut sizes = Vec::new();
    let mut stack = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // Iterative Tarjan: (node, next successor position).
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut pos)) = work.last_mut() {
            if *pos == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(*pos) {
                *pos += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let id = sizes.len();
                let mut size = 0;
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp[w] = id;
                    size += 1;
                    if w == v {
                        break;
                    }
                }
                sizes.push(size);
            }
        }
    }
    (comp, sizes)
}

/// Solves the extraction ILP; falls back to greedy extraction (reported as such) if the solver
/// fails or stops without a solution.
pub fn solve(
    p: &Problem,
    memory_limit: Option<f64>,
    time_limit_s: f64,
) -> Result<Selection, ShardError> {
    let start = Instant::now();
    let (comp, sizes) = sccs(p);
    let mut report = SolveReport {
        solver: SOLVER.into(),
        eclasses: p.classes.len(),
        candidates: p.cands.len(),
        cyclic_classes: (0..p.classes.len()).filter(|&c| sizes[comp[c]] > 1).count(),
        ..SolveReport::default()
    };
    let (outcome, vars, binaries, constraints) =
        solve_levelled(p, &comp, &sizes, memory_limit, time_limit_s);
    report.variables = vars;
    report.binaries = binaries;
    report.constraints = constraints;
    let chosen = match outcome {
        Ok((chosen, status)) => {
            report.optimal = proven_optimal(status);
            if let Some(why) = status_note(status, time_limit_s) {
                report.solver = format!("{SOLVER} ({why})");
            }
            if find_cycle(p, &chosen).is_some() {
                fallback(
                    p,
                    memory_limit,
                    &mut report,
                    "the ILP returned a cyclic choice",
                )?
            } else {
                chosen
            }
        }
        Err(ResolutionError::Infeasible) => {
            return Err(ShardError::OutOfMemory {
                limit_bytes: memory_limit.unwrap_or(f64::INFINITY),
                needed_bytes: greedy(p, |c| c.memory()).map_or(f64::INFINITY, |s| memory(p, &s)),
            });
        }
        Err(e) => fallback(p, memory_limit, &mut report, &e.to_string())?,
    };
    report.objective_seconds = objective_of(p, &chosen);
    report.seconds = start.elapsed().as_secs_f64();
    Ok(Selection { chosen, report })
}

/// Whether the solver proved its answer optimal. HiGHS stops a MIP once the relative gap between
/// its incumbent and its bound is within `mip_rel_gap` (default 1e-4, HiGHS options reference);
/// good_lp reports that as `GapLimit` whenever the final gap is positive, even though HiGHS itself
/// calls the model `Optimal`. The selection is then optimal to within 0.01 % of the objective,
/// far below the cost model's own error, so it counts as proven.
fn proven_optimal(status: SolutionStatus) -> bool {
    matches!(status, SolutionStatus::Optimal | SolutionStatus::GapLimit)
}

/// What the report says about a solve that did not end with a plain optimality proof.
fn status_note(status: SolutionStatus, time_limit_s: f64) -> Option<String> {
    match status {
        SolutionStatus::Optimal => None,
        SolutionStatus::GapLimit => Some("optimal within its 1e-4 relative MIP gap".into()),
        SolutionStatus::TimeLimit => Some(format!(
            "stopped at the {time_limit_s} s time limit, or an iteration/solution limit"
        )),
    }
}

fn fallback(
    p: &Problem,
    memory_limit: Option<f64>,
    report: &mut SolveReport,
    why: &str,
) -> Result<Vec<bool>, ShardError> {
    let chosen = greedy(p, |c| c.seconds()).ok_or_else(|| ShardError::Solver {
        solver: SOLVER.into(),
        message: format!("{why}; and greedy extraction found no program"),
    })?;
    if let Some(limit) = memory_limit
        && memory(p, &chosen) > limit
    {
        return Err(ShardError::Solver {
            solver: SOLVER.into(),
            message: format!("{why}; the greedy fallback exceeds the memory limit"),
        });
    }
    report.optimal = false;
    report.solver = format!("greedy (egg-style bottom-up) after {SOLVER}: {why}");
    Ok(chosen)
}

type Outcome = Result<(Vec<bool>, SolutionStatus), ResolutionError>;

/// Builds and solves the levelled ILP: (outcome, variables, binaries, constraints).
fn solve_levelled(
    p: &Problem,
    comp: &[usize],
    sizes: &[usize],
    memory_limit: Option<f64>,
    time_limit_s: f64,
) -> (Outcome, usize, usize, usize) {
    let mut vars = ProblemVariables::new();
    let bin = || variable().binary();
    // Copies of each candidate: (level, variable).
    let levels = |i: usize| -> usize {
        let c = &p.cands[i];
        let own_scc = c.kids.iter().any(|&k| comp[k] == comp[c.class]);
        if own_scc && sizes[comp[c.class]] > 1 {
            sizes[comp[c.class]] - 1
        } else {
            0
        }
    };
    let copies: Vec<Vec<(usize, Variable)>> = (0..p.cands.len())
        .map(|i| match levels(i) {
            0 => vec![(0, vars.add(bin()))],
            n => (1..=n).map(|l| (l, vars.add(bin()))).collect(),
        })
        .collect();
    let binaries: usize = copies.iter().map(Vec::len).sum();
    let x = |i: usize| -> Expression { copies[i].iter().map(|&(_, v)| v).sum() };
    // Per class with a gradient reduction: which of all-reduce, reduce-scatter, all-gather
    // completes it ([`GradReduce::pick`]), and whether a split op (not a slice) reads it;
    // each in [0, 1].
    let mut o: HashMap<usize, [Variable; 4]> = HashMap::new();
    for (c, class) in p.classes.iter().enumerate() {
        if class.grad_reduce.is_some() {
            o.insert(c, [(); 4].map(|_| vars.add(variable().min(0).max(1))));
        }
    }
    let n_vars = binaries + 4 * o.len();

    // Objective (Tensat eq. 1 / Alpa eq. 1).
    let mut objective = Expression::from(0.0);
    for (i, c) in p.cands.iter().enumerate() {
        objective += c.seconds() * x(i);
    }
    for (&c, vs) in &o {
        if let Some(gr) = &p.classes[c].grad_reduce {
            for (comm, &v) in gr.options().iter().zip(&vs[..3]) {
                objective += comm.seconds * v;
            }
        }
    }

    let mut constraints = Vec::new();
    let class_sum = |c: usize| -> Expression { p.classes[c].nodes.iter().map(|&i| x(i)).sum() };
    // Tensat eq. 2: every root class computes exactly one node.
    for &r in &p.roots {
        constraints.push(constraint!(class_sum(r) == 1));
    }
    // One-hot: at most one node (and level) per class.
    for c in 0..p.classes.len() {
        let n: usize = p.classes[c].nodes.iter().map(|&i| copies[i].len()).sum();
        if !p.roots.contains(&c) && n > 1 {
            constraints.push(constraint!(class_sum(c) <= 1));
        }
    }
    // Tensat eq. 3, aggregated per (parent class, child class): the nodes of class m that read
    // class k are chosen only if k is computed, Σ_{i ∈ m, k ∈ ch(i)} x_i ≤ Σ_{j ∈ k} x_j. With
    // at most one node per class this is equivalent to Tensat's per-node form for 0-1 points,
    // but much tighter for the LP relaxation (alternatives of one class cannot share a child
    // fractionally). Inside an SCC the levelled form: level-ℓ copies read lower levels only.
    let mut readers: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    for (i, cand) in p.cands.iter().enumerate() {
        let mut kids = cand.kids.clone();
        kids.sort_unstable();
        kids.dedup();
        for &k in &kids {
            if k == cand.class {
                // A node that reads its own class is never part of an acyclic program.
                constraints.push(constraint!(x(i) == 0));
            } else {
                readers.entry((cand.class, k)).or_default().push(i);
            }
        }
    }
    let mut edges: Vec<_> = readers.into_iter().collect();
    edges.sort_unstable();
    for ((m, k), nodes) in edges {
        if comp[k] == comp[m] {
            let max_level = nodes.iter().map(|&i| copies[i].len()).max().unwrap_or(0);
            for l in 1..=max_level {
                let lhs: Expression = nodes
                    .iter()
                    .flat_map(|&i| copies[i].iter())
                    .filter(|&&(li, _)| li == l)
                    .map(|&(_, v)| v)
                    .sum();
                let below: Expression = p.classes[k]
                    .nodes
                    .iter()
                    .flat_map(|&j| copies[j].iter())
                    .filter(|&&(lj, _)| lj < l)
                    .map(|&(_, vj)| vj)
                    .sum();
                constraints.push(constraint!(lhs <= below));
            }
        } else {
            let lhs: Expression = nodes.iter().map(|&i| x(i)).sum();
            constraints.push(constraint!(lhs <= class_sum(k)));
        }
    }
    // Gradient reductions (Alpa's resharding edge cost, here on the backward edge): some
    // option completes class m's gradient when a rank-variant node i reads it,
    // Σ o_m ≥ x_i, and only the one the program runs ([`GradReduce::pick`]) is allowed:
    // z_m = whether a split op (a reader other than a slice) is chosen, pinned both ways; the
    // pieces' all-gather only without one; with one, a reduce-scatter where an all-gather made
    // m, an all-reduce where none did.
    for (&c, &[ar, rs, ag, z]) in &o {
        let class = &p.classes[c];
        let mut split_readers = Expression::from(0.0);
        for &i in &class.variant_readers {
            constraints.push(constraint!(ar + rs + ag >= x(i)));
            if !super::candidates::is_slice(p, i) {
                constraints.push(constraint!(z >= x(i)));
                split_readers += x(i);
            }
        }
        constraints.push(constraint!(z <= split_readers));
        let gathers: Expression = class
            .nodes
            .iter()
            .filter(|&&i| matches!(p.cands[i].node, Shard::AllGather(_)))
            .map(|&i| x(i))
            .sum();
        constraints.push(constraint!(ag <= 1.0 - z));
        constraints.push(constraint!(rs <= z));
        constraints.push(constraint!(rs <= gathers.clone()));
        constraints.push(constraint!(ar <= z));
        constraints.push(constraint!(ar <= 1.0 - gathers));
    }
    // Alpa's memory constraint: resident bytes per rank within the limit.
    if let Some(limit) = memory_limit {
        let mem: Expression = p
            .cands
            .iter()
            .enumerate()
            .map(|(i, c)| c.memory() * x(i))
            .sum();
        constraints.push(constraint!(mem <= limit));
    }
    let n_constraints = constraints.len();

    #[cfg(feature = "highs")]
    let mut model = vars
        .minimise(objective)
        .using(good_lp::solvers::highs::highs)
        .with_time_limit(time_limit_s);
    #[cfg(not(feature = "highs"))]
    let mut model = vars
        .minimise(objective)
        .using(good_lp::solvers::microlp::microlp)
        .with_time_limit(time_limit_s);
    for c in constraints {
        model.add_constraint(c);
    }
    let outcome = model.solve().map(|sol| {
        let status = sol.status();
        let chosen = copies
            .iter()
            .map(|cs| cs.iter().any(|&(_, v)| sol.value(v) > 0.5))
            .collect();
        (chosen, status)
    });
    (outcome, n_vars, binaries, n_constraints)
}

/// A cycle among the chosen nodes (each class has at most one), as candidate indices.
fn find_cycle(p: &Problem, chosen: &[bool]) -> Option<Vec<usize>> {
    let n = p.classes.len();
    let mut pick = vec![None; n];
    for (i, c) in p.cands.iter().enumerate() {
        if chosen[i] {
            pick[c.class] = Some(i);
        }
    }
    // 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state = vec![0u8; n];
    for start in 0..n {
        if state[start] != 0 || pick[start].is_none() {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = 1;
        while let Some(&mut (c, ref mut pos)) = path.last_mut() {
            let kids = pick[c].map_or(&[][..], |i| &p.cands[i].kids[..]);
            if let Some(&k) = kids.get(*pos) {
                *pos += 1;
                match state[k] {
                    0 if pick[k].is_some() => {
                        state[k] = 1;
                        path.push((k, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(c, _)| c == k)?;
                        return Some(path[from..].iter().filter_map(|&(c, _)| pick[c]).collect());
                    }
                    _ => {}
                }
            } else {
                state[c] = 2;
                path.pop();
            }
        }
    }
    None
}

/// Resident bytes of a selection.
pub fn memory(p: &Problem, chosen: &[bool]) -> f64 {
    p.cands
        .iter()
        .zip(chosen)
        .filter(|(_, c)| **c)
        .map(|(c, _)| c.memory())
        .sum()
}

/// The objective of a selection, recomputed from the chosen nodes.
pub fn objective_of(p: &Problem, chosen: &[bool]) -> f64 {
    let mut s: f64 = p
        .cands
        .iter()
        .zip(chosen)
        .filter(|(_, c)| **c)
        .map(|(c, _)| c.seconds())
        .sum();
    for c in 0..p.classes.len() {
        if let Some(comm) = super::candidates::grad_comm(p, c, chosen) {
            s += comm.seconds;
        }
    }
    s
}

/// Bottom-up extraction by a per-node cost (egg's `Extractor` scheme: iterate to a fixed point
/// of the cheapest cost per class, then read the choices from the roots). Acyclic because a
/// class only changes its choice on a strict improvement and every node costs > 0.
pub fn greedy(p: &Problem, cost: impl Fn(&super::candidates::Cand) -> f64) -> Option<Vec<bool>> {
    let n = p.classes.len();
    let mut best: Vec<Option<(f64, usize)>> = vec![None; n];
    loop {
        let mut changed = false;
        for (i, c) in p.cands.iter().enumerate() {
            let mut total = cost(c) + 1e-12;
            let mut ok = true;
            for &k in &c.kids {
                match best[k] {
                    Some((v, _)) => total += v,
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok && best[c.class].is_none_or(|(v, _)| total < v) {
                best[c.class] = Some((total, i));
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut chosen = vec![false; p.cands.len()];
    let mut done = vec![false; n];
    let mut stack: Vec<usize> = p.roots.clone();
    while let Some(c) = stack.pop() {
        if std::mem::replace(&mut done[c], true) {
            continue;
        }
        let (_, i) = best[c]?;
        chosen[i] = true;
        stack.extend(&p.cands[i].kids);
    }
    Some(chosen)
}
