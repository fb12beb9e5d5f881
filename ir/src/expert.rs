//! What each expert of a `MoeExperts` op computes between its projections: a gated unit
//! act(a) ⊙ (b + offset) of a = x·w1ₑ (+ b1ₑ) and b = x·w3ₑ (+ b3ₑ), with act(g) = g·σ(α·g),
//! both clamped where a limit is set. SwiGLU (Mixtral, DeepSeek, Qwen-MoE) is α = 1, no limit,
//! offset 0; gpt-oss's is α = 1.702, gate ≤ 7 and |up| ≤ 7, offset 1 (transformers'
//! `GptOssExperts`), with biases on every projection.

use serde::{Deserialize, Serialize};

/// The form of every expert of one op: its biases and its gated unit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertForm {
    /// Bias operands b1ₑ, b3ₑ (`[E, F]`) added to each expert's two input projections.
    #[serde(default, skip_serializing_if = "is_false")]
    pub bias: bool,
    /// The slope of the gate's sigmoid: 1 is SiLU.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub alpha: f64,
    /// The gate clamped to at most `limit`, the up projection to ±`limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// Added to the up projection before the product.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub up_offset: f64,
    /// The gate scales each expert's input, Σₑ unit(gₑx w1ₑ, gₑx w3ₑ) w2ₑ, rather than its
    /// output (transformers' `Llama4TextMoe`: `routed_in = hidden_states * router_scores`).
    /// Without biases only, so that an expert at gate 0 adds exactly 0 either way.
    #[serde(default, skip_serializing_if = "is_false")]
    pub scales_input: bool,
}

impl Default for ExpertForm {
    fn default() -> ExpertForm {
        ExpertForm::SWIGLU
    }
}

impl ExpertForm {
    /// silu(x w1) ⊙ (x w3), no biases: every MoE family before gpt-oss.
    pub const SWIGLU: ExpertForm = ExpertForm {
        bias: false,
        alpha: 1.0,
        limit: None,
        up_offset: 0.0,
        scales_input: false,
    };

    pub fn is_swiglu(&self) -> bool {
        *self == ExpertForm::SWIGLU
    }

    /// Operands of the op: x, gates, w1, w3, w2, and b1, b3 with biases.
    pub fn operands(&self) -> usize {
        5 + 2 * usize::from(self.bias)
    }

    /// The gate and up values after the clamp.
    fn clamped(&self, a: f64, b: f64) -> (f64, f64) {
        match self.limit {
            None => (a, b),
            Some(l) => (a.min(l), b.clamp(-l, l)),
        }
    }

    /// The unit's output for gate pre-activation `a` and up projection `b`.
    pub fn hidden(&self, a: f64, b: f64) -> f64 {
        let (g, u) = self.clamped(a, b);
        g * sigmoid(self.alpha * g) * (u + self.up_offset)
    }

    /// ∂hidden/∂a and ∂hidden/∂b. A clamped value passes no gradient (inside the limits,
    /// bounds included, it passes all of it: `torch.clamp`'s rule).
    pub fn partials(&self, a: f64, b: f64) -> (f64, f64) {
        let (g, u) = self.clamped(a, b);
        let s = sigmoid(self.alpha * g);
        let dact = s * (1.0 + self.alpha * g * (1.0 - s));
        let (gate_open, up_open) = match self.limit {
            None => (true, true),
            Some(l) => (a <= l, b.abs() <= l),
        };
        let da = if gate_open {
            dact * (u + self.up_offset)
        } else {
            0.0
        };
        let db = if up_open { g * s } else { 0.0 };
        (da, db)
    }

    /// The attributes a file omits where they are SwiGLU's, checked.
    pub fn check(&self) -> Result<(), String> {
        if !self.alpha.is_finite() || !self.up_offset.is_finite() {
            return Err(format!(
                "expert alpha {} and up_offset {} must be finite",
                self.alpha, self.up_offset
            ));
        }
        if self.scales_input && self.bias {
            return Err("experts whose gate scales their input take no biases".into());
        }
        match self.limit {
            Some(l) if !(l.is_finite() && l > 0.0) => {
                Err(format!("expert limit {l} must be a positive number"))
            }
            _ => Ok(()),
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPT_OSS: ExpertForm = ExpertForm {
        bias: true,
        alpha: 1.702,
        limit: Some(7.0),
        up_offset: 1.0,
        scales_input: false,
    };

    #[test]
    fn swiglu_is_silu_times_up() {
        let (a, b) = (0.7, -1.3);
        let silu = a / (1.0 + f64::exp(-a));
        assert!((ExpertForm::SWIGLU.hidden(a, b) - silu * b).abs() < 1e-15);
    }

    /// Central differences of `hidden` against `partials`, inside and beyond the limits.
    #[test]
    fn partials_are_the_derivatives() {
        let h = 1e-6;
        for form in [ExpertForm::SWIGLU, GPT_OSS] {
            for (a, b) in [
                (0.3, -0.8),
                (-2.0, 1.5),
                (9.0, 0.4),
                (1.0, -8.5),
                (8.0, 9.0),
            ] {
                let (da, db) = form.partials(a, b);
                let fa = (form.hidden(a + h, b) - form.hidden(a - h, b)) / (2.0 * h);
                let fb = (form.hidden(a, b + h) - form.hidden(a, b - h)) / (2.0 * h);
                assert!(
                    (da - fa).abs() < 1e-6,
                    "{form:?} da at {a},{b}: {da} vs {fa}"
                );
                assert!(
                    (db - fb).abs() < 1e-6,
                    "{form:?} db at {a},{b}: {db} vs {fb}"
                );
            }
        }
    }

    #[test]
    fn gpt_oss_clamps_the_gate_above_and_the_up_both_ways() {
        let at_limit = GPT_OSS.hidden(7.0, 7.0);
        assert_eq!(GPT_OSS.hidden(50.0, 50.0), at_limit);
        assert_eq!(GPT_OSS.hidden(3.0, -50.0), GPT_OSS.hidden(3.0, -7.0));
        // No lower clamp on the gate: a very negative gate shuts the unit.
        assert!(GPT_OSS.hidden(-50.0, 2.0).abs() < 1e-30);
    }
}
