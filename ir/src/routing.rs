//! How `TopKRouter` turns one token's router logits into expert weights, the way transformers'
//! routers do it:
//!
//! - Mixtral (`MixtralSparseMoeBlock`): softmax over all experts, the top k, renormalized;
//! - Qwen2-MoE / Qwen3-MoE: the same, renormalized only when `norm_topk_prob`;
//! - DeepSeek-V3 (`DeepseekV3TopkRouter`): a sigmoid per expert; the experts split into
//!   `n_group` groups, each scored by the sum of its two best experts; the top `topk_group`
//!   groups kept; the top k experts among them, renormalized when `norm_topk_prob`;
//! - DeepSeek-V2 (`DeepseekV2Moe`): a softmax over all experts, never renormalized; with
//!   `topk_method: group_limited_greedy`, groups scored by their best expert alone.
//!
//! The selection is locally constant, so the gradient flows through the chosen scores only.
//! DeepSeek-V3's `e_score_correction_bias` shifts the selection, not the weights; it is a buffer
//! that starts at zero and that transformers never updates in training, so plait's selection
//! is its selection with the bias at zero.
//!
//! Row functions compute in f64; the f32 kernels convert a row (`experts` values) in and out.

use serde::{Deserialize, Serialize};

/// The scoring, normalization and group limit of a top-k router. The default is Mixtral's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Routing {
    /// Scores are a sigmoid per expert (DeepSeek-V3), not a softmax over all experts.
    pub sigmoid: bool,
    /// The chosen scores are divided by their sum (`norm_topk_prob`; Mixtral always).
    pub normalize: bool,
    /// Expert groups (`n_group`); 1: no group limit.
    pub groups: u64,
    /// Groups a token may route into (`topk_group`).
    pub groups_kept: u64,
    /// A group is scored by the sum of its this many best experts' scores (DeepSeek-V3: 2;
    /// DeepSeek-V2: 1, its best expert). Read only when `groups` > 1. Program files written
    /// before the field existed hold V3's rule, its default.
    #[serde(default = "v3_group_top")]
    pub group_top: u64,
}

fn v3_group_top() -> u64 {
    2
}

impl Default for Routing {
    fn default() -> Self {
        Routing {
            sigmoid: false,
            normalize: true,
            groups: 1,
            groups_kept: 1,
            group_top: v3_group_top(),
        }
    }
}

/// One token's routing: every expert's score and the experts chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// Softmax or sigmoid of each logit.
    pub scores: Vec<f64>,
    /// The chosen experts, best first.
    pub chosen: Vec<usize>,
}

impl Routing {
    /// Checks the routing against the expert count and top-k; the error is a sentence.
    pub fn check(&self, experts: u64, k: u64) -> Result<(), String> {
        if k == 0 || k > experts {
            return Err(format!("top-k {k} must be in 1..={experts}"));
        }
        if self.groups == 0 || !experts.is_multiple_of(self.groups) {
            return Err(format!(
                "{experts} experts do not split into {} groups",
                self.groups
            ));
        }
        if self.groups_kept == 0 || self.groups_kept > self.groups {
            return Err(format!(
                "groups kept {} must be in 1..={}",
                self.groups_kept, self.groups
            ));
        }
        let size = experts / self.groups;
        if self.groups > 1 && (self.group_top == 0 || self.group_top > size) {
            return Err(format!(
                "a group's score sums its best {} experts, of the {size} in a group",
                self.group_top
            ));
        }
        let reachable = self.groups_kept * size;
        if k > reachable {
            return Err(format!(
                "top-k {k} exceeds the {reachable} experts of the {} groups kept",
                self.groups_kept
            ));
        }
        Ok(())
    }

    /// Routes one token: `logits` holds one value per expert. Ties go to the lower index.
    pub fn route(&self, logits: &[f64], k: usize) -> Route {
        let scores = self.scores(logits);
        let candidates = self.kept_experts(&scores);
        let chosen = best(&scores, candidates, k);
        Route { scores, chosen }
    }

    /// The weight of each expert (zero where not chosen) into `gates`.
    pub fn gates(&self, route: &Route, gates: &mut [f64]) {
        gates.iter_mut().for_each(|g| *g = 0.0);
        let sum = self.denominator(route);
        for &e in &route.chosen {
            gates[e] = route.scores[e] / sum;
        }
    }

    /// The gradient of the logits from that of the gates (`dgates` where not chosen is
    /// ignored: those gates are constant zero).
    pub fn logits_grad(&self, route: &Route, dgates: &[f64], dlogits: &mut [f64]) {
        let sum = self.denominator(route);
        // d(s_c / S)/ds_j = (δ_cj − w_c) / S over the chosen; without normalization, δ_cj.
        let pulled: f64 = if self.normalize {
            route
                .chosen
                .iter()
                .map(|&e| dgates[e] * route.scores[e] / sum)
                .sum()
        } else {
            0.0
        };
        let mut dscores = vec![0.0; route.scores.len()];
        for &e in &route.chosen {
            dscores[e] = (dgates[e] - pulled) / sum;
        }
        let s = &route.scores;
        if self.sigmoid {
            for ((d, &ds), &si) in dlogits.iter_mut().zip(&dscores).zip(s) {
                *d = ds * si * (1.0 - si);
            }
        } else {
            let dot: f64 = dscores.iter().zip(s).map(|(a, b)| a * b).sum();
            for ((d, &ds), &si) in dlogits.iter_mut().zip(&dscores).zip(s) {
                *d = si * (ds - dot);
            }
        }
    }

    fn denominator(&self, route: &Route) -> f64 {
        if self.normalize {
            route.chosen.iter().map(|&e| route.scores[e]).sum()
        } else {
            1.0
        }
    }

    fn scores(&self, logits: &[f64]) -> Vec<f64> {
        if self.sigmoid {
            return logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
        }
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        exps.into_iter().map(|x| x / sum).collect()
    }

    /// The experts of the `groups_kept` best groups, a group scored by the sum of its
    /// `group_top` best experts' scores (all experts when there is one group).
    fn kept_experts(&self, scores: &[f64]) -> Vec<usize> {
        let groups = usize::try_from(self.groups).unwrap_or(1).max(1);
        if groups == 1 {
            return (0..scores.len()).collect();
        }
        let size = scores.len() / groups;
        let group_scores: Vec<f64> = scores
            .chunks(size)
            .map(|group| {
                let top = usize::try_from(self.group_top).unwrap_or(usize::MAX);
                let top = best(group, (0..group.len()).collect(), top);
                top.iter().map(|&i| group[i]).sum()
            })
            .collect();
        let kept = usize::try_from(self.groups_kept).unwrap_or(groups);
        let mut experts: Vec<usize> = best(&group_scores, (0..groups).collect(), kept)
            .into_iter()
            .flat_map(|g| g * size..(g + 1) * size)
            .collect();
        experts.sort_unstable();
        experts
    }
}

/// The `k` candidates of highest value, best first; ties go to the lower index.
fn best(values: &[f64], mut candidates: Vec<usize>, k: usize) -> Vec<usize> {
    candidates.sort_by(|&i, &j| values[j].total_cmp(&values[i]).then(i.cmp(&j)));
    candidates.truncate(k);
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Central differences of `f` around `logits`, against `logits_grad`.
    fn check_grad(r: Routing, logits: &[f64], k: usize, dgates: &[f64]) {
        let route = r.route(logits, k);
        let mut analytic = vec![0.0; logits.len()];
        r.logits_grad(&route, dgates, &mut analytic);
        let loss = |l: &[f64]| {
            let route = r.route(l, k);
            let mut g = vec![0.0; l.len()];
            r.gates(&route, &mut g);
            g.iter().zip(dgates).map(|(a, b)| a * b).sum::<f64>()
        };
        for i in 0..logits.len() {
            let (mut up, mut down) = (logits.to_vec(), logits.to_vec());
            up[i] += 1e-6;
            down[i] -= 1e-6;
            let numeric = (loss(&up) - loss(&down)) / 2e-6;
            assert!(
                (numeric - analytic[i]).abs() < 1e-6,
                "{r:?} logit {i}: numeric {numeric}, analytic {}",
                analytic[i]
            );
        }
    }

    const LOGITS: [f64; 8] = [0.3, -1.2, 2.0, 0.7, -0.4, 1.1, 0.05, -2.0];
    const DGATES: [f64; 8] = [0.5, -0.3, 1.0, 0.2, -0.7, 0.9, 0.4, -0.1];

    #[test]
    fn mixtral_routing_is_a_softmax_over_the_top_k_logits() {
        let r = Routing::default();
        let route = r.route(&LOGITS, 2);
        assert_eq!(route.chosen, vec![2, 5]);
        let mut g = [0.0; 8];
        r.gates(&route, &mut g);
        let (a, b) = (LOGITS[2].exp(), LOGITS[5].exp());
        assert!((g[2] - a / (a + b)).abs() < 1e-15 && (g[5] - b / (a + b)).abs() < 1e-15);
        assert_eq!(g.iter().filter(|&&x| x != 0.0).count(), 2);
    }

    #[test]
    fn unnormalized_softmax_keeps_each_experts_share_of_all() {
        let r = Routing {
            normalize: false,
            ..Routing::default()
        };
        let mut g = [0.0; 8];
        r.gates(&r.route(&LOGITS, 2), &mut g);
        let all: f64 = LOGITS.iter().map(|l| l.exp()).sum();
        assert!((g[2] - LOGITS[2].exp() / all).abs() < 1e-15);
    }

    #[test]
    fn group_limit_skips_an_expert_outside_the_kept_groups() {
        // Groups of two, scored by their sigmoids' sum: {2,3} 1.55 and {4,5} 1.15 lead {0,1}
        // 0.81 and {6,7} 0.63. Keeping two groups leaves {2,3,4,5}: expert 0 (logit 0.3) is
        // out although it beats expert 4 (−0.4).
        let r = Routing {
            sigmoid: true,
            normalize: true,
            groups: 4,
            groups_kept: 2,
            group_top: 2,
        };
        let route = r.route(&LOGITS, 4);
        assert_eq!(route.chosen, vec![2, 5, 3, 4]);
        let mut g = [0.0; 8];
        r.gates(&route, &mut g);
        assert!((g.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let sum: f64 = [2, 5, 3, 4].iter().map(|&e| sig(LOGITS[e])).sum();
        assert!((g[4] - sig(LOGITS[4]) / sum).abs() < 1e-15);
    }

    #[test]
    fn a_group_scored_by_its_best_expert_alone_can_lose_to_one_scored_by_two() {
        // Groups of two: {0,1} has the better best expert (1.5 against {4,5}'s 1.1), {4,5}
        // the better pair (e^1.1 + e^1.05 = 5.86 against e^1.5 + e^-3 = 4.53); {2,3} leads both.
        let logits = [1.5, -3.0, 2.0, 0.7, 1.05, 1.1, 0.05, -2.0];
        let v2 = Routing {
            normalize: false,
            groups: 4,
            groups_kept: 2,
            group_top: 1,
            ..Routing::default()
        };
        let v3_scored = Routing { group_top: 2, ..v2 };
        // Best alone (DeepSeek-V2): {2,3} and {0,1} kept, expert 5 (1.1) is out.
        assert_eq!(v2.route(&logits, 2).chosen, vec![2, 0]);
        // Best two (DeepSeek-V3): {2,3} and {4,5} kept, expert 0 (1.5) is out.
        assert_eq!(v3_scored.route(&logits, 2).chosen, vec![2, 5]);
    }

    #[test]
    fn gradients_match_central_differences() {
        for sigmoid in [false, true] {
            for normalize in [false, true] {
                for (groups, groups_kept, group_top) in [(1, 1, 2), (4, 2, 2), (4, 2, 1)] {
                    let r = Routing {
                        sigmoid,
                        normalize,
                        groups,
                        groups_kept,
                        group_top,
                    };
                    check_grad(r, &LOGITS, 3, &DGATES);
                }
            }
        }
    }

    #[test]
    fn a_routing_written_before_group_top_reads_as_deepseek_v3s() {
        let old = r#"{"sigmoid":true,"normalize":true,"groups":8,"groups_kept":4}"#;
        let r: Routing = serde_json::from_str(old).expect("reads");
        assert_eq!(r.group_top, 2);
    }

    #[test]
    fn check_names_the_rule_broken() {
        let r = Routing {
            groups: 3,
            ..Routing::default()
        };
        assert!(r.check(8, 2).unwrap_err().contains("3 groups"));
        let r = Routing {
            groups: 4,
            groups_kept: 1,
            ..Routing::default()
        };
        assert!(r.check(8, 3).unwrap_err().contains("exceeds the 2 experts"));
        let wide = Routing { group_top: 3, ..r };
        assert!(wide.check(8, 2).unwrap_err().contains("best 3 experts"));
        assert!(Routing::default().check(8, 9).is_err());
        assert!(r.check(8, 2).is_ok());
    }
}
