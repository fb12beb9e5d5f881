//! Initial parameter values: every full tensor is a pure function of (seed, parameter name),
//! or comes from given weights (an ONNX file's initializers, a checkpoint), so every rank
//! computes the same full tensor and copies out its own shard.
//!
//! Seeded rule (GPT-2's): a parameter of rank ≥ 2 is normal(0, 0.02); a rank-1 parameter
//! whose name ends in `weight` (a norm's gain) is ones; every other rank-1 or scalar
//! parameter (biases) is zeros. The normal samples come from `ir::testing::Rng` seeded with
//! `seed` mixed with the FNV-1a hash of the name, in row-major order.

use std::collections::BTreeMap;

use ir::testing::Rng;
use kernels::Tensor32;
use program::ParamInfo;

use crate::RuntimeError;

/// Where initial parameter values come from.
#[derive(Debug, Clone)]
pub enum Init {
    /// The seeded rule of the module doc.
    Seed(u64),
    /// Full tensors by parameter name.
    Weights(BTreeMap<String, Tensor32>),
}

/// Standard deviation of the seeded normal initialization.
pub const INIT_STD: f64 = 0.02;

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Init {
    /// The full tensor of `p`.
    pub fn full(&self, p: &ParamInfo) -> Result<Tensor32, RuntimeError> {
        let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
        let n: usize = shape.iter().product();
        match self {
            Init::Seed(seed) => {
                let data = if shape.len() >= 2 {
                    let mut rng = Rng::new(seed ^ fnv(&p.name));
                    (0..n).map(|_| (rng.normal() * INIT_STD) as f32).collect()
                } else if p.name.ends_with("weight") {
                    vec![1.0; n]
                } else {
                    vec![0.0; n]
                };
                Ok(Tensor32 { shape, data })
            }
            Init::Weights(w) => {
                let t = w.get(&p.name).ok_or_else(|| RuntimeError::Init {
                    name: p.name.clone(),
                    message: "no value given".into(),
                })?;
                if t.data.len() != n {
                    return Err(RuntimeError::Init {
                        name: p.name.clone(),
                        message: format!("shape {:?}, the program expects {shape:?}", t.shape),
                    });
                }
                Ok(Tensor32 {
                    shape,
                    data: t.data.clone(),
                })
            }
        }
    }
}

/// Converts an ONNX import's weights (f64 interpreter tensors) for [`Init::Weights`].
pub fn from_ir_weights(w: &ir::Weights) -> BTreeMap<String, Tensor32> {
    w.iter()
        .map(|(k, t)| (k.clone(), Tensor32::from_ir(t)))
        .collect()
}
