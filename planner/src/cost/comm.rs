//! Collective communication under the α–β model, per topology level.
//!
//! A group of `n` ranks spans `nodes` nodes with `per_node` members in each. Its cost comes from
//! the levels it crosses: inside a node the NVLink/NVSwitch bandwidth per GPU; across nodes the
//! node's NICs, shared by every GPU of the node that communicates at the same time (`sharing`).
//! Ring algorithms (Patarasuk & Yuan 2009; NCCL): all-reduce moves 2(n−1)/n·S bytes per rank in
//! 2(n−1) steps, reduce-scatter and all-gather (n−1)/n·S in n−1 steps. Hierarchical all-reduce
//! (reduce-scatter in the node, all-reduce across nodes on S/per_node, all-gather in the node) is
//! used for groups that span nodes with several members per node; the cheaper of ring and tree
//! (log₂ n latency steps, 2·S per rank, NCCL's double binary tree) is taken for single-level groups.

use serde::Serialize;

use crate::hardware::Cluster;

/// Where a communication group's members sit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Group {
    pub size: u64,
    /// Nodes the group spans.
    pub nodes: u64,
    /// Members per node.
    pub per_node: u64,
    /// GPUs of one node that use the network at the same time (each in its own group).
    pub sharing: u64,
}

impl Group {
    pub fn single() -> Group {
        Group {
            size: 1,
            nodes: 1,
            per_node: 1,
            sharing: 1,
        }
    }
}

/// Bandwidths (bytes/s, per GPU per direction, after efficiency) and latencies (s) of a group's levels.
#[derive(Clone, Copy, Debug)]
struct Levels {
    intra_bw: f64,
    intra_lat: f64,
    inter_bw: f64,
    inter_lat: f64,
}

fn levels(c: &Cluster, g: &Group) -> Levels {
    let (intra_bw, intra_lat) = c
        .node_link()
        .map(|l| (l.gb_per_s.unwrap_or(0.0) * 1e9 * l.efficiency, l.latency_us * 1e-6))
        .unwrap_or((f64::INFINITY, 0.0));
    let (inter_bw, inter_lat) = c
        .network_link()
        .map(|l| {
            let node_bw = f64::from(l.nics_per_node.unwrap_or(1)) * l.nic_gb_per_s.unwrap_or(0.0) * 1e9;
            // GPUs of a node that talk across the network at once split the node's NICs.
            let users = (g.per_node * g.sharing).clamp(1, u64::from(c.gpus_per_node)) as f64;
            (node_bw * l.efficiency / users * g.per_node as f64, l.latency_us * 1e-6)
        })
        .unwrap_or((intra_bw, intra_lat));
    Levels {
        intra_bw,
        intra_lat,
        inter_bw,
        inter_lat,
    }
}

/// Collective kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

/// Seconds for one collective over `bytes` (the full buffer size per rank) in group `g`.
pub fn collective_time(c: &Cluster, g: &Group, kind: Collective, bytes: f64) -> f64 {
    let n = g.size;
    if n <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let lv = levels(c, g);
    let nf = n as f64;
    if g.nodes <= 1 {
        return single_level(kind, nf, bytes, lv.intra_bw, lv.intra_lat);
    }
    if g.per_node <= 1 {
        // One member per node: the group's bandwidth is the member's share of its node's NICs.
        let bw = lv.inter_bw.min(lv.intra_bw);
        return single_level(kind, nf, bytes, bw, lv.inter_lat);
    }
    // Hierarchical: intra-node phase, inter-node phase on 1/per_node of the data, intra-node phase.
    let pn = g.per_node as f64;
    let nodes = g.nodes as f64;
    // Each GPU carries its 1/per_node slice across the network; the node's NICs are shared by the
    // per_node·sharing GPUs that communicate (already folded into inter_bw, which is the node's
    // bandwidth for this group's per_node members together).
    let inter_bw_per_gpu = lv.inter_bw / pn;
    match kind {
        Collective::AllReduce => {
            single_level(Collective::ReduceScatter, pn, bytes, lv.intra_bw, lv.intra_lat)
                + single_level(Collective::AllReduce, nodes, bytes / pn, inter_bw_per_gpu, lv.inter_lat)
                + single_level(Collective::AllGather, pn, bytes, lv.intra_bw, lv.intra_lat)
        }
        Collective::AllGather | Collective::ReduceScatter => {
            single_level(kind, pn, bytes / nodes, lv.intra_bw, lv.intra_lat)
                + single_level(kind, nodes, bytes / pn, inter_bw_per_gpu, lv.inter_lat)
        }
        Collective::AllToAll => {
            // (n−1)/n of the data leaves each GPU; the part for other nodes crosses the network.
            let remote = (nf - pn) / nf * bytes;
            let local = (pn - 1.0) / nf * bytes;
            remote / inter_bw_per_gpu + local / lv.intra_bw + (nf - 1.0) * lv.inter_lat
        }
    }
}

fn single_level(kind: Collective, n: f64, bytes: f64, bw: f64, lat: f64) -> f64 {
    if n <= 1.0 {
        return 0.0;
    }
    let frac = (n - 1.0) / n;
    match kind {
        Collective::AllReduce => {
            let ring = 2.0 * frac * bytes / bw + 2.0 * (n - 1.0) * lat;
            let tree = 2.0 * bytes / bw + 2.0 * n.log2().ceil() * lat;
            ring.min(tree)
        }
        Collective::AllGather | Collective::ReduceScatter => frac * bytes / bw + (n - 1.0) * lat,
        Collective::AllToAll => frac * bytes / bw + (n - 1.0) * lat,
    }
}

/// Seconds to send `bytes` point to point, inside a node or across nodes.
pub fn p2p_time(c: &Cluster, bytes: f64, cross_node: bool, sharing: u64) -> f64 {
    let g = Group {
        size: 2,
        nodes: if cross_node { 2 } else { 1 },
        per_node: 1,
        sharing,
    };
    let lv = levels(c, &g);
    if cross_node {
        bytes / lv.inter_bw.min(lv.intra_bw) + lv.inter_lat
    } else {
        bytes / lv.intra_bw + lv.intra_lat
    }
}

/// The communication groups of a (tp, dp, pp) mesh laid out tp-fastest, then dp, then pp
/// (Megatron's order: tensor parallelism inside a node).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Mesh {
    pub tp: Group,
    pub dp: Group,
    /// Whether consecutive pipeline stages sit on different nodes.
    pub pp_cross_node: bool,
    /// GPUs of a node sending pipeline traffic at once.
    pub pp_sharing: u64,
}

pub fn mesh(c: &Cluster, tp: u64, dp: u64, pp: u64) -> Mesh {
    let gpn = u64::from(c.gpus_per_node);
    let span = |stride: u64, size: u64| -> Group {
        if size <= 1 {
            return Group::single();
        }
        // Members are `stride` apart; how many fall in one node, and how many nodes they cover.
        let per_node = if stride >= gpn { 1 } else { (gpn / stride).min(size).max(1) };
        let nodes = size.div_ceil(per_node);
        // Other groups of the same kind in a node: the node's GPUs divided among the groups.
        let sharing = if nodes > 1 { (gpn / per_node).max(1) } else { 1 };
        Group {
            size,
            nodes,
            per_node,
            sharing,
        }
    };
    let tpg = span(1, tp);
    let dpg = span(tp, dp);
    let stage = tp * dp;
    Mesh {
        tp: tpg,
        dp: dpg,
        pp_cross_node: pp > 1 && stage >= gpn,
        pp_sharing: if stage >= gpn { gpn } else { stage.max(1) },
    }
}
