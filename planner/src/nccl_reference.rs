//! The published NCCL bus bandwidths of `shared/data/nccl_busbw.md`, each with the group and
//! cluster it was measured on, for `plait bench collectives` and its test: plait's collective
//! model must reproduce what NCCL's maintainers and nccl-tests users report.

use crate::cost::comm::{Collective, Group, bus_bandwidth_gb_per_s};
use crate::error::PlanError;
use crate::hardware::Cluster;

/// One published figure and the setting it was measured in.
#[derive(Clone, Debug)]
pub struct BusbwRow {
    pub system: &'static str,
    pub collective: Collective,
    pub published_gb_per_s: f64,
    pub source: &'static str,
    preset: &'static str,
    /// NICs per node when the measured system had fewer than the preset.
    nics: Option<u32>,
    group: Group,
}

/// A large buffer, where bandwidth and not latency sets the time (nccl-tests' plateau; NVLS
/// reaches its peak only past 256 MB).
pub const BUFFER_BYTES: f64 = 4.0 * (1u64 << 30) as f64;

fn group(size: u64, nodes: u64, per_node: u64, sharing: u64) -> Group {
    Group {
        size,
        nodes,
        per_node,
        sharing,
    }
}

/// The rows with a number (the 2-node tree row of the file is qualitative).
pub fn rows() -> Vec<BusbwRow> {
    vec![
        BusbwRow {
            system: "DGX A100, 8x HDR, 4 nodes",
            collective: Collective::AllReduce,
            published_gb_per_s: 192.0,
            source: "NVIDIA/nccl#812",
            preset: "dgx-a100-80gb",
            nics: None,
            group: group(32, 4, 8, 1),
        },
        BusbwRow {
            system: "DGX A100, one 200 Gb/s NIC per group",
            collective: Collective::AllReduce,
            published_gb_per_s: 24.0,
            source: "NVIDIA/nccl#412",
            preset: "dgx-a100-80gb",
            nics: None,
            // Each node holds one member of each of 8 groups (dp across nodes at tp 8).
            group: group(4, 4, 1, 8),
        },
        BusbwRow {
            system: "8x A100 SXM, one node",
            collective: Collective::AllReduce,
            published_gb_per_s: 232.5,
            source: "NVIDIA/nccl-tests#175",
            preset: "dgx-a100-80gb",
            nics: None,
            group: group(8, 1, 8, 1),
        },
        BusbwRow {
            system: "8x A100 SXM (HPE), one node",
            collective: Collective::AllReduce,
            published_gb_per_s: 200.0,
            source: "NVIDIA/nccl-tests#149",
            preset: "dgx-a100-80gb",
            nics: None,
            group: group(8, 1, 8, 1),
        },
        BusbwRow {
            system: "2 nodes x 8 A100, 4x 200 Gb/s",
            collective: Collective::AllReduce,
            published_gb_per_s: 86.0,
            source: "NVIDIA/nccl#1048",
            preset: "dgx-a100-80gb",
            nics: Some(4),
            group: group(16, 2, 8, 1),
        },
        BusbwRow {
            system: "8x H100 SXM, one node, ring",
            collective: Collective::AllGather,
            published_gb_per_s: 370.0,
            source: "NVIDIA/nccl-tests#212",
            preset: "dgx-h100",
            nics: None,
            group: group(8, 1, 8, 1),
        },
        BusbwRow {
            system: "8x H100 SXM, one node, NVLS",
            collective: Collective::AllReduce,
            published_gb_per_s: 480.0,
            source: "NVIDIA/nccl-tests#212",
            preset: "dgx-h100",
            nics: None,
            group: group(8, 1, 8, 1),
        },
        BusbwRow {
            system: "8x H200 SXM, one node, NVLS",
            collective: Collective::AllReduce,
            published_gb_per_s: 475.0,
            source: "NVIDIA/nccl-tests#272",
            preset: "dgx-h200",
            nics: None,
            group: group(8, 1, 8, 1),
        },
    ]
}

impl BusbwRow {
    /// plait's bus bandwidth for this row, GB/s.
    pub fn predicted_gb_per_s(&self) -> Result<f64, PlanError> {
        let mut c = Cluster::load(self.preset)?;
        if let Some(n) = self.nics {
            for l in &mut c.links {
                if l.nics_per_node.is_some() {
                    l.nics_per_node = Some(n);
                }
            }
        }
        Ok(bus_bandwidth_gb_per_s(
            &c,
            &self.group,
            self.collective,
            BUFFER_BYTES,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_published_figure_within_15_percent() {
        for r in rows() {
            let p = r.predicted_gb_per_s().unwrap_or_else(|e| panic!("{e}"));
            let err = (p - r.published_gb_per_s) / r.published_gb_per_s;
            assert!(
                err.abs() <= 0.15,
                "{}: {p:.1} vs {} GB/s",
                r.system,
                r.published_gb_per_s
            );
        }
    }
}
