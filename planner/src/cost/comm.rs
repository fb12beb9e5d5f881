//! Collective communication as NCCL runs it, under the α–β model per topology level.
//!
//! A group of `n` ranks spans `nodes` nodes with `per_node` members in each. Ring algorithms
//! (Patarasuk & Yuan 2009; NCCL): all-reduce moves 2(n−1)/n·S bytes per rank in 2(n−1) steps,
//! reduce-scatter and all-gather (n−1)/n·S in n−1 steps; all-reduce may also use a tree
//! (2·S per rank, 2·log₂ n latency steps, NCCL's double binary tree), whichever is cheaper.
//!
//! Inside a node the rings run over NVLink at the link's measured NCCL efficiency; an
//! all-reduce on an NVSwitch with NVLink SHARP (NVLS) instead sends and receives the buffer once
//! per GPU while the switch reduces. Across nodes NCCL runs one ring per channel, channels
//! spread over the node's NICs: a ring crosses each node boundary once per channel, so a group's
//! inter-node traffic uses all of the node's NICs, shared only among the groups of that node
//! that communicate at the same time (`sharing`) — not 1/per_node of them per member. When
//! every node holds one member (data parallelism across nodes at tp = GPUs per node) each of
//! the node's groups has one NIC's share.

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
    /// NVLink SHARP all-reduce algorithm bandwidth inside a node, if the switch has it.
    nvls_bw: Option<f64>,
    inter_bw: f64,
    inter_lat: f64,
}

fn levels(c: &Cluster, g: &Group) -> Levels {
    let (intra_bw, intra_lat) = c
        .node_link()
        .map(|l| {
            (
                l.gb_per_s.unwrap_or(0.0) * 1e9 * l.efficiency,
                l.latency_us * 1e-6,
            )
        })
        .unwrap_or((f64::INFINITY, 0.0));
    let (inter_bw, inter_lat) = c
        .network_link()
        .map(|l| {
            let node_bw =
                f64::from(l.nics_per_node.unwrap_or(1)) * l.nic_gb_per_s.unwrap_or(0.0) * 1e9;
            // The groups of a node that cross the network at once split the node's NICs; one
            // group's channels use them all.
            let users = g.sharing.clamp(1, u64::from(c.gpus_per_node)) as f64;
            (node_bw * l.efficiency / users, l.latency_us * 1e-6)
        })
        .unwrap_or((intra_bw, intra_lat));
    let nvls_bw = c.node_link().and_then(|l| {
        l.nvls_efficiency
            .map(|e| l.gb_per_s.unwrap_or(0.0) * 1e9 * e)
    });
    Levels {
        intra_bw,
        intra_lat,
        nvls_bw,
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
        let ring = single_level(kind, nf, bytes, lv.intra_bw, lv.intra_lat);
        return match (kind, lv.nvls_bw) {
            // The switch reduces: each GPU sends its buffer once and receives the sum once.
            (Collective::AllReduce, Some(bw)) if n > 2 => ring.min(bytes / bw + 2.0 * lv.intra_lat),
            _ => ring,
        };
    }
    // Each channel's ring crosses the node boundary once: the bytes a ring moves per rank cross
    // every node's NICs, shared among the node's concurrent groups, and its NVLink hops.
    let bw = lv.inter_bw.min(lv.intra_bw);
    single_level(kind, nf, bytes, bw, lv.inter_lat)
}

/// The bus bandwidth nccl-tests would report for `kind` over `bytes` in group `g` (GB/s):
/// algorithm bandwidth × 2(n−1)/n for all-reduce, × (n−1)/n for the others.
pub fn bus_bandwidth_gb_per_s(c: &Cluster, g: &Group, kind: Collective, bytes: f64) -> f64 {
    let n = g.size as f64;
    let t = collective_time(c, g, kind, bytes);
    let factor = match kind {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        _ => (n - 1.0) / n,
    };
    bytes / t * factor / 1e9
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
    /// The ranks that reduce gradients together (data × context parallel).
    pub dp: Group,
    /// The context-parallel ring.
    #[serde(skip_serializing_if = "is_single")]
    pub cp: Group,
    /// The expert-parallel group: `ep` consecutive data-parallel ranks (Megatron-Core's order)
    /// that split each layer's experts and dispatch tokens among them.
    #[serde(default = "Group::single", skip_serializing_if = "is_single")]
    pub ep: Group,
    /// The ranks holding the same experts, which reduce the experts' gradients.
    #[serde(default = "Group::single", skip_serializing_if = "is_single")]
    pub edp: Group,
    /// Whether consecutive pipeline stages sit on different nodes.
    pub pp_cross_node: bool,
    /// GPUs of a node sending pipeline traffic at once.
    pub pp_sharing: u64,
}

fn is_single(g: &Group) -> bool {
    g.size <= 1
}

pub fn mesh(c: &Cluster, tp: u64, dp: u64, pp: u64) -> Mesh {
    mesh_cp(c, tp, 1, dp, pp)
}

/// The groups of a (tp, cp, dp, pp) mesh in Megatron-Core's order (tp fastest, then cp, dp,
/// pp): gradients reduce over the dp × cp ranks that hold the same weights.
pub fn mesh_cp(c: &Cluster, tp: u64, cp: u64, dp: u64, pp: u64) -> Mesh {
    mesh_ep(c, tp, cp, dp, pp, 1)
}

/// [`mesh_cp`] with `ep` of the data-parallel ranks splitting the experts (consecutive ranks,
/// as Megatron-Core lays out its expert-parallel groups; `ep` divides dp, cp is 1).
pub fn mesh_ep(c: &Cluster, tp: u64, cp: u64, dp: u64, pp: u64, ep: u64) -> Mesh {
    let gpn = u64::from(c.gpus_per_node);
    let span = |stride: u64, size: u64| -> Group {
        if size <= 1 {
            return Group::single();
        }
        // Members are `stride` apart; how many fall in one node, and how many nodes they cover.
        let per_node = if stride >= gpn {
            1
        } else {
            (gpn / stride).min(size).max(1)
        };
        let nodes = size.div_ceil(per_node);
        // Other groups of the same kind in a node: the node's GPUs divided among the groups.
        let sharing = if nodes > 1 {
            (gpn / per_node).max(1)
        } else {
            1
        };
        Group {
            size,
            nodes,
            per_node,
            sharing,
        }
    };
    let tpg = span(1, tp);
    let dpg = span(tp, dp * cp);
    let cpg = span(tp, cp);
    let stage = tp * dp * cp;
    let ep = ep.max(1);
    Mesh {
        tp: tpg,
        dp: dpg,
        cp: cpg,
        ep: span(tp, ep),
        edp: span(tp * ep, dp * cp / ep),
        pp_cross_node: pp > 1 && stage >= gpn,
        pp_sharing: if stage >= gpn { gpn } else { stage.max(1) },
    }
}
