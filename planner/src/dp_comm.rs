//! How data-parallel replicas exchange their gradients, as the planner prices it: compressed
//! (`--grad-compression`) or replaced by periodic parameter averaging (`--dp-sync local-sgd:H`).
//!
//! Both trade convergence for bandwidth, so the search never picks them by itself: they are
//! the user's choice, priced as the runtime runs them (`runtime::exec::dp_comm`):
//! - a compressed all-reduce: each rank's gradient is compressed and reduce-scattered (an
//!   all-to-all of the compressed pieces), the summed piece compressed again and all-gathered,
//!   so the ring moves 2(n − 1)/n of the compressed size; every element is encoded twice and
//!   decoded twice, each a streaming pass over the gradient (top-k also selects: a pass that
//!   reads the magnitudes);
//! - local SGD: no gradient exchange; every H steps the replicas average their parameters (an
//!   all-reduce of the weights) after the optimizer step, with nothing to hide it behind.
//!
//! The runtime runs both at ZeRO-0 (a compressed exchange is an all-reduce; local SGD keeps
//! whole optimizer states per replica), so the planner prices them only there.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Bytes of one int8 scale (f32) and the elements it covers (the runtime's `INT8_BUCKET`).
const INT8_SCALE_BYTES: f64 = 4.0;
const INT8_BUCKET: f64 = 256.0;
/// Bytes of one top-k index (u32).
const TOPK_INDEX_BYTES: f64 = 4.0;

/// The form data-parallel gradients cross the network in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GradCompression {
    #[default]
    None,
    Bf16,
    Int8,
    /// The fraction of entries with the largest magnitudes, as index and value.
    TopK(f64),
}

/// When replicas exchange.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DpSync {
    #[default]
    Sync,
    /// Parameters averaged every `every` steps, no gradient exchange in between.
    LocalSgd { every: u32 },
}

/// The data-parallel exchange of a plan (default: synchronous and uncompressed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DpComm {
    #[serde(default)]
    pub grad_compression: GradCompression,
    #[serde(default)]
    pub dp_sync: DpSync,
}

impl DpComm {
    /// Whether this is the plain exchange.
    pub fn is_plain(&self) -> bool {
        *self == DpComm::default()
    }

    /// The flags that give this exchange, leaving out the plain parts (`--dp-sync
    /// local-sgd:8`, `--grad-compression int8`), for messages.
    pub fn flags(&self) -> String {
        let mut out = Vec::new();
        if self.grad_compression != GradCompression::None {
            out.push(format!("--grad-compression {}", self.grad_compression));
        }
        if self.dp_sync != DpSync::Sync {
            out.push(format!("--dp-sync {}", self.dp_sync));
        }
        if out.is_empty() {
            out.push("--dp-sync sync".into());
        }
        out.join(" ")
    }

    /// Why the two halves do not go together: local SGD exchanges no gradients, so there is
    /// nothing to compress (its parameter average would be priced and run uncompressed).
    pub fn conflict(&self) -> Option<String> {
        (self.grad_compression != GradCompression::None && self.dp_sync != DpSync::Sync).then(|| {
            format!(
                "{}: local SGD exchanges no gradients to compress (it averages parameters every \
                 few steps); drop --grad-compression or --dp-sync",
                self.flags()
            )
        })
    }

    /// One exchange named as `--grad-compression` or `--dp-sync` name it (`bf16`, `int8`,
    /// `topk:0.01`, `local-sgd:8`; `none` and `sync` are the plain exchange), for
    /// `compile --search-dp-comm`.
    pub fn parse_mode(s: &str) -> Result<DpComm, String> {
        if let Ok(c) = s.parse::<GradCompression>() {
            return Ok(DpComm {
                grad_compression: c,
                ..DpComm::default()
            });
        }
        // A mode that names its kind (`topk:`, `local-sgd:`) gets that kind's own message.
        if s.starts_with("topk:") {
            return s.parse::<GradCompression>().map(|c| DpComm {
                grad_compression: c,
                ..DpComm::default()
            });
        }
        if s.starts_with("local-sgd:") {
            return s.parse::<DpSync>().map(|d| DpComm {
                dp_sync: d,
                ..DpComm::default()
            });
        }
        s.parse::<DpSync>()
            .map(|d| DpComm {
                dp_sync: d,
                ..DpComm::default()
            })
            .map_err(|_| {
                format!(
                    "unknown data-parallel exchange `{s}`; expected bf16, int8, topk:FRACTION or \
                     local-sgd:H"
                )
            })
    }

    /// The exchange as its flags' values read (`synchronous`, `int8`, `local-sgd:8`).
    pub fn name(&self) -> String {
        match (self.grad_compression, self.dp_sync) {
            (GradCompression::None, DpSync::Sync) => "synchronous".into(),
            (c, DpSync::Sync) => c.to_string(),
            (GradCompression::None, d) => d.to_string(),
            (c, d) => format!("{c} + {d}"),
        }
    }

    /// Bytes on the wire per gradient element of `grad_bytes` bytes.
    pub fn wire_bytes(&self, grad_bytes: f64) -> f64 {
        match self.grad_compression {
            GradCompression::None => grad_bytes,
            GradCompression::Bf16 => grad_bytes.min(2.0),
            GradCompression::Int8 => 1.0 + INT8_SCALE_BYTES / INT8_BUCKET,
            GradCompression::TopK(f) => f * (TOPK_INDEX_BYTES + grad_bytes),
        }
    }

    /// Streaming passes over the gradient, each reading or writing `grad_bytes` per element,
    /// that compression adds to one exchange: two encodes and two decodes (see the module
    /// doc); error feedback (int8's, top-k's) passes over its residual once more per encode
    /// (top-k's selection reads the magnitudes there).
    pub fn kernel_passes(&self) -> f64 {
        match self.grad_compression {
            GradCompression::None => 0.0,
            GradCompression::Bf16 => 4.0,
            GradCompression::Int8 | GradCompression::TopK(_) => 6.0,
        }
    }
}

impl FromStr for GradCompression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(GradCompression::None),
            "bf16" => Ok(GradCompression::Bf16),
            "int8" => Ok(GradCompression::Int8),
            _ => match s.strip_prefix("topk:").map(str::parse::<f64>) {
                Some(Ok(f)) if f > 0.0 && f <= 1.0 => Ok(GradCompression::TopK(f)),
                Some(_) => Err(format!(
                    "`{s}`: the top-k fraction must be a number in (0, 1], e.g. topk:0.01"
                )),
                None => Err(format!(
                    "unknown gradient compression `{s}`; expected none, bf16, int8 or topk:FRACTION"
                )),
            },
        }
    }
}

impl fmt::Display for GradCompression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GradCompression::None => f.write_str("none"),
            GradCompression::Bf16 => f.write_str("bf16"),
            GradCompression::Int8 => f.write_str("int8"),
            GradCompression::TopK(k) => write!(f, "topk:{k}"),
        }
    }
}

impl FromStr for DpSync {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "sync" {
            return Ok(DpSync::Sync);
        }
        match s.strip_prefix("local-sgd:").map(str::parse::<u32>) {
            Some(Ok(h)) if h >= 1 => Ok(DpSync::LocalSgd { every: h }),
            Some(_) => Err(format!(
                "`{s}`: local SGD needs a whole number of steps from 1 to {}, e.g. local-sgd:8",
                u32::MAX
            )),
            None => Err(format!(
                "unknown data-parallel sync `{s}`; expected sync or local-sgd:H"
            )),
        }
    }
}

impl fmt::Display for DpSync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DpSync::Sync => f.write_str("sync"),
            DpSync::LocalSgd { every } => write!(f, "local-sgd:{every}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_follow_the_encodings() {
        let c = |g: GradCompression| DpComm {
            grad_compression: g,
            dp_sync: DpSync::Sync,
        };
        // f32 gradients (the CPU runtime): bf16 halves them, int8 quarters them plus a scale
        // per 256, top-k 1 % keeps an index and a value per kept entry.
        assert_eq!(c(GradCompression::Bf16).wire_bytes(4.0), 2.0);
        assert_eq!(c(GradCompression::Int8).wire_bytes(4.0), 1.0 + 4.0 / 256.0);
        assert!((c(GradCompression::TopK(0.01)).wire_bytes(4.0) - 0.08).abs() < 1e-12);
        // bf16 gradients are already 16-bit.
        assert_eq!(c(GradCompression::Bf16).wire_bytes(2.0), 2.0);
    }

    #[test]
    fn names_round_trip_and_bad_ones_say_why() {
        for s in ["none", "bf16", "int8", "topk:0.01"] {
            assert_eq!(s.parse::<GradCompression>().unwrap().to_string(), s);
        }
        for s in ["sync", "local-sgd:8"] {
            assert_eq!(s.parse::<DpSync>().unwrap().to_string(), s);
        }
        assert!(
            "topk:2"
                .parse::<GradCompression>()
                .unwrap_err()
                .contains("(0, 1]")
        );
        assert!(
            "local-sgd:0"
                .parse::<DpSync>()
                .unwrap_err()
                .contains("from 1 to")
        );
    }
}
