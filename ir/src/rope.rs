//! The rotary embedding's frequencies: Llama's θ^(−2c/d) per channel pair, and the scalings
//! published models extend their context with, as transformers' `modeling_rope_utils` computes
//! them (`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
//! `_compute_yarn_parameters`).
//!
//! Each scaling changes the inverse frequencies; YaRN also multiplies cos and sin by an
//! attention factor (so q·k by its square).

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

/// How a config rescales the rotary frequencies (`rope_scaling`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Plain θ^(−2c/d).
    #[default]
    None,
    /// Every frequency divided by `factor` (position interpolation).
    Linear { factor: f64 },
    /// Llama 3.1: wavelengths longer than `original_max / low_freq_factor` divided by
    /// `factor`, shorter than `original_max / high_freq_factor` kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max: f64,
    },
    /// YaRN: interpolation (÷ `factor`) below a ramp between the dimensions that turn
    /// `beta_slow` and `beta_fast` times over `original_max` positions, extrapolation above;
    /// cos and sin times `attention_factor`. The ramp's ends are whole dimensions where
    /// `truncate` (transformers' default), exact where not (gpt-oss's `truncate: false`).
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        original_max: f64,
        attention_factor: f64,
        #[serde(default = "truncated", skip_serializing_if = "is_truncated")]
        truncate: bool,
    },
    /// No positional rotation (a NoPE layer: SmolLM3's `no_rope_layers`, Cohere2's global
    /// layers): every frequency zero, so cos = 1 and sin = 0 and the rotary is the identity,
    /// exactly. Such a layer keeps its rotary op so that it stays structurally identical to
    /// its rotated neighbours (the verifier's invariant 8d), as a window does.
    Nope,
    /// No rotation, and the queries of position p scaled by Llama 4's attention temperature
    /// 1 + `scale`·ln(⌊(p + 1)/`floor`⌋ + 1) (`attn_temperature_tuning` with `floor_scale` and
    /// `attn_scale`, on its NoPE layers' queries only): cos is that factor and sin 0, so the
    /// position-wise scaling runs, and differentiates, as a rotary does.
    Temperature { floor: f64, scale: f64 },
}

impl RopeScaling {
    pub fn is_none(&self) -> bool {
        matches!(self, RopeScaling::None)
    }

    /// Whether the rotary turns nothing ([`RopeScaling::Nope`], [`RopeScaling::Temperature`]).
    pub fn is_nope(&self) -> bool {
        matches!(self, RopeScaling::Nope | RopeScaling::Temperature { .. })
    }

    /// The inverse frequency of each of the `d / 2` channel pairs of a head of size `d`.
    pub fn inv_freq(&self, theta: f64, d: usize) -> Vec<f64> {
        let plain = (0..d / 2).map(|c| 1.0 / theta.powf((2 * c) as f64 / d as f64));
        match *self {
            RopeScaling::None => plain.collect(),
            RopeScaling::Nope | RopeScaling::Temperature { .. } => vec![0.0; d / 2],
            RopeScaling::Linear { factor } => plain.map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max,
            } => plain
                .map(|f| llama3(f, factor, low_freq_factor, high_freq_factor, original_max))
                .collect(),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max,
                truncate,
                ..
            } => {
                let (low, high) =
                    yarn_range((beta_fast, beta_slow), d, theta, original_max, truncate);
                plain
                    .enumerate()
                    .map(|(c, f)| {
                        // transformers: extrapolation weight 1 − clamp((c − low)/(high − low)).
                        let span = if high == low { 0.001 } else { high - low };
                        let ramp = ((c as f64 - low) / span).clamp(0.0, 1.0);
                        let extrapolate = 1.0 - ramp;
                        f / factor * (1.0 - extrapolate) + f * extrapolate
                    })
                    .collect()
            }
        }
    }

    /// What cos and sin are multiplied by at every position (YaRN's attention factor; 1
    /// otherwise).
    pub fn attention_factor(&self) -> f64 {
        match *self {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// What cos and sin are multiplied by at position `pos`: the attention factor, times the
    /// temperature of [`RopeScaling::Temperature`].
    pub fn magnitude(&self, pos: f64) -> f64 {
        let (floor, scale) = self.temperature();
        let temperature = if floor > 0.0 {
            1.0 + scale * ((pos + 1.0) / floor).floor().ln_1p()
        } else {
            1.0
        };
        self.attention_factor() * temperature
    }

    /// (floor, scale) of [`RopeScaling::Temperature`]; (0, 0) for the others.
    pub fn temperature(&self) -> (f64, f64) {
        match *self {
            RopeScaling::Temperature { floor, scale } => (floor, scale),
            _ => (0.0, 0.0),
        }
    }

    /// A sentence when the scaling's numbers cannot describe a rotary embedding.
    pub fn check(&self) -> Result<(), String> {
        let positive = |name: &str, x: f64| {
            if x.is_finite() && x > 0.0 {
                Ok(())
            } else {
                Err(format!("rope scaling {name} {x} must be a positive number"))
            }
        };
        match *self {
            RopeScaling::None | RopeScaling::Nope => Ok(()),
            RopeScaling::Temperature { floor, scale } => {
                positive("floor_scale", floor)?;
                if scale.is_finite() {
                    Ok(())
                } else {
                    Err(format!(
                        "attention temperature attn_scale {scale} must be finite"
                    ))
                }
            }
            RopeScaling::Linear { factor } => positive("factor", factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max,
            } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                positive("original_max_position_embeddings", original_max)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(format!(
                        "rope scaling high_freq_factor {high_freq_factor} must exceed \
                         low_freq_factor {low_freq_factor}"
                    ));
                }
                Ok(())
            }
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max,
                attention_factor,
                ..
            } => {
                positive("factor", factor)?;
                positive("beta_fast", beta_fast)?;
                positive("beta_slow", beta_slow)?;
                positive("original_max_position_embeddings", original_max)?;
                positive("attention_factor", attention_factor)?;
                // The ramp runs from the dimension of beta_fast rotations to that of
                // beta_slow's; the other way round it inverts (transformers warns, and
                // interpolates the fast dimensions instead of the slow). Equal is a step, not
                // a ramp (Kimi-K2's 1 and 1).
                if beta_fast < beta_slow {
                    return Err(format!(
                        "rope scaling beta_fast {beta_fast} must be at least beta_slow \
                         {beta_slow} (YaRN's defaults: 32 and 1)"
                    ));
                }
                Ok(())
            }
        }
    }
}

/// One frequency under Llama 3.1's scaling (`_compute_llama3_parameters`).
fn llama3(f: f64, factor: f64, low: f64, high: f64, original_max: f64) -> f64 {
    let wavelen = 2.0 * PI / f;
    if wavelen > original_max / low {
        f / factor
    } else if wavelen < original_max / high {
        f
    } else {
        let smooth = (original_max / wavelen - low) / (high - low);
        (1.0 - smooth) * f / factor + smooth * f
    }
}

/// YaRN's ramp over channel pairs: from the pair that turns `beta_fast` times over the
/// original context to the one that turns `beta_slow` times, clamped to the head as
/// transformers' `find_correction_range` does, floored and ceiled where it truncates.
fn yarn_range(
    (beta_fast, beta_slow): (f64, f64),
    d: usize,
    theta: f64,
    original_max: f64,
    truncate: bool,
) -> (f64, f64) {
    let dim = d as f64;
    let correction =
        |turns: f64| dim * (original_max / (turns * 2.0 * PI)).ln() / (2.0 * theta.ln());
    let (low, high) = (correction(beta_fast), correction(beta_slow));
    let (low, high) = if truncate {
        (low.floor(), high.ceil())
    } else {
        (low, high)
    };
    (low.max(0.0), high.min(dim - 1.0))
}

fn truncated() -> bool {
    true
}

fn is_truncated(t: &bool) -> bool {
    *t
}

/// YaRN's default attention factor (`get_mscale`): 0.1·m·ln(factor) + 1 above factor 1.
pub fn yarn_mscale(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-3.1-8B's rope_scaling on its 128-wide heads, θ 500000.
    const LLAMA31: RopeScaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max: 8192.0,
    };

    #[test]
    fn llama3_keeps_fast_pairs_divides_slow_ones_and_blends_between() {
        let plain = RopeScaling::None.inv_freq(500_000.0, 128);
        let scaled = LLAMA31.inv_freq(500_000.0, 128);
        // Pair 0 turns once per 2π positions: far shorter than 8192/4, kept.
        assert_eq!(scaled[0], plain[0]);
        // The last pair's wavelength (~2.6M positions) exceeds 8192: divided by 8.
        assert!((scaled[63] - plain[63] / 8.0).abs() < 1e-18);
        // Wavelengths between 2048 and 8192 positions blend, strictly between the two.
        let mid = (0..64)
            .find(|&c| (2048.0..=8192.0).contains(&(2.0 * PI / plain[c])))
            .expect("a pair in the blend band");
        assert!(scaled[mid] < plain[mid] && scaled[mid] > plain[mid] / 8.0);
        // Monotone: frequencies still fall along the head.
        assert!(scaled.windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn yarn_interpolates_slow_pairs_extrapolates_fast_ones() {
        // DeepSeek-V3: factor 40 over 4096 positions, β 32 and 1, 64-wide rotary heads.
        let yarn = RopeScaling::Yarn {
            factor: 40.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max: 4096.0,
            attention_factor: 1.0,
            truncate: true,
        };
        let plain = RopeScaling::None.inv_freq(10_000.0, 64);
        let scaled = yarn.inv_freq(10_000.0, 64);
        let (low, high) = yarn_range((32.0, 1.0), 64, 10_000.0, 4096.0, true);
        // find_correction_dim(32) = 64·ln(4096/(64π))/(2 ln 10⁴) = 10.47 → 10; (1) → 22.51 → 23.
        assert_eq!((low, high), (10.0, 23.0));
        // Untruncated (gpt-oss's `truncate: false`), the ends are where they fall.
        let (low, high) = yarn_range((32.0, 1.0), 64, 10_000.0, 4096.0, false);
        assert!(
            (low - 10.47).abs() < 0.01 && (high - 22.51).abs() < 0.01,
            "{low} {high}"
        );
        assert_eq!(scaled[0], plain[0]);
        assert_eq!(scaled[10], plain[10]);
        assert!((scaled[31] - plain[31] / 40.0).abs() < 1e-18);
        assert!(scaled[16] < plain[16] && scaled[16] > plain[16] / 40.0);
    }

    #[test]
    fn linear_divides_every_frequency() {
        let plain = RopeScaling::None.inv_freq(10_000.0, 8);
        let scaled = RopeScaling::Linear { factor: 4.0 }.inv_freq(10_000.0, 8);
        for (s, p) in scaled.iter().zip(&plain) {
            assert_eq!(*s, p / 4.0);
        }
    }

    #[test]
    fn check_names_the_bad_number() {
        let bad = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 4.0,
            high_freq_factor: 1.0,
            original_max: 8192.0,
        };
        assert!(bad.check().unwrap_err().contains("high_freq_factor"));
        assert!(RopeScaling::Linear { factor: 0.0 }.check().is_err());
        assert!(LLAMA31.check().is_ok());
        assert!((yarn_mscale(4.0, 1.0) - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
    }
}
