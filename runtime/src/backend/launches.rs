//! Kernel launches counted by kernel name, with the bytes of the device buffers each launch is
//! handed: what a step asks of a GPU's memory system, counted without one (the dry device,
//! `backend::dry`). The bytes are those of the buffers passed (every input read whole and every
//! output written whole), an upper bound on a launch's traffic that is exact for the streaming
//! kernels (`to_bf16`, `from_bf16`, element-wise ops) and for a GEMM's operands and result.

use std::collections::BTreeMap;

/// Launches of one kernel and the bytes of the buffers they were handed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCount {
    pub launches: u64,
    pub bytes: u64,
}

/// [`KernelCount`]s by kernel name (cuBLAS's products under `gemm (cuBLAS)`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchTally(BTreeMap<&'static str, KernelCount>);

impl LaunchTally {
    /// Counts one launch of `kernel` handed `bytes` of buffers.
    pub fn add(&mut self, kernel: &'static str, bytes: u64) {
        let c = self.0.entry(kernel).or_default();
        c.launches += 1;
        c.bytes += bytes;
    }

    /// What was counted after `earlier` (a tally this one grew from).
    pub fn since(&self, earlier: &LaunchTally) -> LaunchTally {
        let mut out = LaunchTally::default();
        for (&name, c) in &self.0 {
            let e = earlier.0.get(name).copied().unwrap_or_default();
            let d = KernelCount {
                launches: c.launches.saturating_sub(e.launches),
                bytes: c.bytes.saturating_sub(e.bytes),
            };
            if d.launches > 0 {
                out.0.insert(name, d);
            }
        }
        out
    }

    /// Every launch counted.
    pub fn launches(&self) -> u64 {
        self.0.values().map(|c| c.launches).sum()
    }

    /// Every byte counted.
    pub fn bytes(&self) -> u64 {
        self.0.values().map(|c| c.bytes).sum()
    }

    /// The count of `kernel` (zero if it never ran).
    pub fn get(&self, kernel: &str) -> KernelCount {
        self.0.get(kernel).copied().unwrap_or_default()
    }

    /// The kernels, most bytes first (then by name).
    pub fn by_bytes(&self) -> Vec<(&'static str, KernelCount)> {
        let mut v: Vec<_> = self.0.iter().map(|(&n, &c)| (n, c)).collect();
        v.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_tally_less_an_earlier_one_is_what_ran_in_between() {
        let mut t = LaunchTally::default();
        t.add("fill", 8);
        let earlier = t.clone();
        t.add("fill", 16);
        t.add("to_bf16", 100);
        t.add("to_bf16", 50);
        let d = t.since(&earlier);
        assert_eq!(
            d.get("fill"),
            KernelCount {
                launches: 1,
                bytes: 16
            }
        );
        assert_eq!(d.launches(), 3);
        assert_eq!(d.bytes(), 166);
        assert_eq!(d.by_bytes()[0].0, "to_bf16");
        assert_eq!(t.since(&t).launches(), 0);
    }
}
