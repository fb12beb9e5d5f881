//! Hardware description: GPUs, nodes and the links between them, read from TOML.
//!
//! The schema is documented in `docs/hardware.md`; presets live in `presets/*.toml`, each figure
//! cited to a datasheet or a public measurement in the file's comments.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::precision::Precision;

/// Dense (non-sparse) peak throughput per element type, TFLOP/s. Absent = not supported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakTflops {
    pub fp32: Option<f64>,
    pub tf32: Option<f64>,
    pub bf16: Option<f64>,
    pub fp16: Option<f64>,
    pub fp8: Option<f64>,
}

/// One GPU model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub name: String,
    /// Streaming multiprocessors: the number of matmul tiles that run at once.
    pub sm_count: u32,
    /// Fixed cost of launching one kernel, µs.
    pub launch_overhead_us: f64,
    /// Device memory, GiB.
    pub memory_gib: f64,
    /// HBM bandwidth, GB/s (datasheet).
    pub hbm_gb_per_s: f64,
    /// Fraction of the dense peak that large, well-shaped matmuls sustain (measured MAMF).
    pub matmul_efficiency: f64,
    /// Fraction of the HBM bandwidth that streaming kernels sustain.
    pub memory_efficiency: f64,
    pub peak_tflops: PeakTflops,
    /// How the runtime on this hardware executes element-wise work (`eager` or `fused`);
    /// absent = fused, what GPU training stacks run (Megatron-LM's fused kernels). plait's CPU
    /// runtime is eager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<crate::cost::compute::Kernels>,
    /// The matmul library packs both operands into contiguous panels before multiplying, a
    /// memory-bound pass serialized with the arithmetic (CPU BLAS: Goto and van de Geijn,
    /// "Anatomy of High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008). GPU GEMMs
    /// stage tiles through shared memory inside the kernel instead: absent = false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub matmul_packs_operands: bool,
    /// The runtime's 16-bit GEMMs convert their f32 operands to bf16 copies first, a
    /// memory-bound pass apart from the arithmetic (plait's CUDA runtime: 4 bytes read and 2
    /// written per element; the forward converts x and w, the backward the output gradient
    /// once for both products and x and w again), and write a product whose rows are not whole
    /// 16-byte words at a padded pitch, copied out after. Absent = false (training stacks keep
    /// 16-bit activations and weights, nothing to convert).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub matmul_casts_operands: bool,
    /// The runtime's memory-bound kernels and collectives read and write activations in f32
    /// whatever the plan's precision (plait's CUDA runtime: its residual sums, gradients and
    /// loss move f32), so their time is priced at 4 bytes per element. Memory is not: the
    /// runtime holds declared-16-bit buffers in 16 bits between uses, and holding them so costs
    /// no conversion pass (results that only GEMMs, attention or a GELU's or a norm's gradient
    /// read are made as bf16 words and read as such; `plait run --device dry --op-times` counts
    /// no stash traffic in a GPT-2 step). Absent = false (the plan's precision, as training
    /// stacks run it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub f32_activations: bool,
    /// Sustained bandwidth of this runtime's memory-bound kernels relative to a plain copy, by
    /// op class, as measured on this hardware (`plait profile` writes them for the CPU);
    /// a class left out uses plait's H200 measurement (docs/cost-model.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_fractions: Option<KernelFractions>,
    /// Achieved throughput of the fused attention kernel the GPU's training stacks run
    /// (FlashAttention-2 on Ampere, FlashAttention-3 / cuDNN on Hopper), as fractions of the
    /// 16-bit dense peak. Present = the GPU runs fused attention by default; absent (V100, the
    /// CPU runtime) = attention materializes its scores unless `--attention fused` says
    /// otherwise, costed then at the GPU's matmul efficiency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attention: Option<FlashAttentionRate>,
    /// Board power at full load, watts (the datasheet's maximum TDP): the energy a plan uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_power_w: Option<f64>,
}

/// Achieved FlashAttention throughput over the 16-bit dense peak, forward and backward (the
/// backward's FLOPs counted as FlashAttention counts them: 2.5 × the forward's).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashAttentionRate {
    pub forward: f64,
    pub backward: f64,
}

/// Measured bandwidth fractions per class of memory-bound kernel (see
/// [`crate::cost::compute::bandwidth_fraction`] for the classes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelFractions {
    /// Element-wise arithmetic (add, multiply, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pointwise: Option<f64>,
    /// Activations with transcendental functions (GELU, SiLU, tanh, exp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<f64>,
    /// Normalizations and row reductions (LayerNorm, RMSNorm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm: Option<f64>,
    /// Softmax and cross-entropy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softmax: Option<f64>,
    /// Dropout (random numbers and masks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout: Option<f64>,
}

/// Which GPUs a link connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// GPUs inside one node (NVLink / NVSwitch).
    Node,
    /// Nodes, through each node's NICs.
    Network,
}

/// One level of the topology.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub name: String,
    pub scope: Scope,
    /// Bandwidth per GPU per direction, GB/s (node scope).
    #[serde(default)]
    pub gb_per_s: Option<f64>,
    /// NICs per node and bandwidth per NIC per direction, GB/s (network scope).
    #[serde(default)]
    pub nics_per_node: Option<u32>,
    #[serde(default)]
    pub nic_gb_per_s: Option<f64>,
    /// Per-message latency (the α of the α-β model), µs.
    pub latency_us: f64,
    /// Fraction of the bandwidth that NCCL collectives sustain (measured bus bandwidth).
    pub efficiency: f64,
    /// Node links with NVLink SHARP (NVSwitch 3, H100/H200): the all-reduce's algorithm
    /// bandwidth over the link bandwidth (the switch reduces: each GPU sends and receives the
    /// buffer once). Absent = no NVLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvls_efficiency: Option<f64>,
}

/// Bounds of a cluster file's rates and sizes (GB/s, GiB, TFLOP/s), fractions (a profiled
/// GPU's efficiency may be a CPU's share of an H200's peak), delays (µs) and counts
/// ([`Cluster::validate`]).
const MIN_RATE: f64 = 1e-6;
const MAX_RATE: f64 = 1e7;
const MIN_FRACTION: f64 = 1e-9;
const MAX_DELAY_US: f64 = 1e6;
const MAX_COUNT: u32 = 1_000_000;

/// A cluster type: identical nodes of identical GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub gpus_per_node: u32,
    /// Largest number of nodes, if the cluster is finite.
    #[serde(default)]
    pub max_nodes: Option<u32>,
    pub gpu: Gpu,
    #[serde(rename = "link")]
    pub links: Vec<Link>,
    /// Whether collectives run alongside compute, as on GPUs, where NCCL has its own stream
    /// (the default): data-parallel gradient reductions then hide behind the remaining
    /// backward and ZeRO-3 gathers behind the previous layer. plait's CPU runtime runs a
    /// collective on the rank's one thread, between its computations, so a `cpu` cluster says
    /// false and pays them in full.
    #[serde(default = "overlap_default")]
    pub comm_overlaps_compute: bool,
    /// Power usage effectiveness of the data center (facility power over IT power); absent =
    /// [`DEFAULT_PUE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pue: Option<f64>,
    /// Price of one GPU-hour, in the user's currency (optional: the cost of a training run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_gpu_hour: Option<f64>,
}

/// PUE when the cluster file gives none: the 2020 average of US data centers, 1.59 (Patterson
/// et al. 2021, "Carbon Emissions and Large Neural Network Training", Table 1).
pub const DEFAULT_PUE: f64 = 1.59;

fn overlap_default() -> bool {
    true
}

const PRESETS: [(&str, &str); 9] = [
    ("dgx-a100-40gb", include_str!("presets/dgx-a100-40gb.toml")),
    ("dgx-a100-80gb", include_str!("presets/dgx-a100-80gb.toml")),
    ("dgx-h100", include_str!("presets/dgx-h100.toml")),
    ("dgx-h200", include_str!("presets/dgx-h200.toml")),
    ("dgx1-v100", include_str!("presets/dgx1-v100.toml")),
    (
        "aws-p3.16xlarge",
        include_str!("presets/aws-p3.16xlarge.toml"),
    ),
    (
        "aws-p4d.24xlarge",
        include_str!("presets/aws-p4d.24xlarge.toml"),
    ),
    (
        "aws-p5.48xlarge",
        include_str!("presets/aws-p5.48xlarge.toml"),
    ),
    ("cpu", include_str!("presets/cpu.toml")),
];

/// Names of the built-in presets.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

/// Every preset, parsed.
pub fn presets() -> Result<Vec<Cluster>, PlanError> {
    PRESETS
        .iter()
        .map(|(n, src)| Cluster::from_toml(src, &format!("preset {n}")))
        .collect()
}

impl Cluster {
    /// The name the `cpu` preset and `plait profile`'s cluster files give their device: plait's
    /// own CPU runtime, one rank per hardware thread.
    pub const CPU_THREAD: &'static str = "cpu-thread";

    /// Whether the cluster describes plait's CPU runtime (ranks as threads of this machine)
    /// rather than GPUs.
    pub fn runs_on_cpu_threads(&self) -> bool {
        self.gpu.name == Self::CPU_THREAD
    }
}

impl Cluster {
    /// Bytes per activation element that memory-bound kernels and collectives move for a
    /// plan of `precision` on this cluster's runtime (see [`Gpu::f32_activations`]).
    pub fn activation_traffic_bytes(&self, precision: Precision) -> f64 {
        if self.gpu.f32_activations {
            4.0
        } else {
            precision.activation_bytes()
        }
    }
}

impl Cluster {
    /// A preset by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Cluster, PlanError> {
        if let Some((n, src)) = PRESETS.iter().find(|(n, _)| *n == name_or_path) {
            return Cluster::from_toml(src, &format!("preset {n}"));
        }
        let path = Path::new(name_or_path);
        if !path.exists() && !name_or_path.ends_with(".toml") {
            return Err(PlanError::UnknownCluster {
                name: name_or_path.into(),
                presets: preset_names().join(", "),
            });
        }
        let src = std::fs::read_to_string(path).map_err(|e| PlanError::Io {
            file: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Cluster::from_toml(&src, &path.display().to_string())
    }

    /// Parses and validates a cluster description; `origin` names it in messages.
    pub fn from_toml(src: &str, origin: &str) -> Result<Cluster, PlanError> {
        let c: Cluster = toml::from_str(src).map_err(|e| {
            // toml's own text draws a caret diagram over several lines; one line reads better.
            let at = e.span().map_or(String::new(), |sp| {
                let before = src.get(..sp.start).unwrap_or("");
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!("line {line}, column {col}: ")
            });
            PlanError::ClusterFile {
                file: origin.into(),
                message: format!("{at}{}", e.message().trim()),
            }
        })?;
        c.validate(origin)?;
        Ok(c)
    }

    /// Whether `gpus` ranks can be placed on this cluster as plait prices them: within its
    /// `max_nodes`, and on whole nodes (or within one), since a launcher starts as many ranks
    /// on each node (torchrun's `--nproc-per-node`) and the links priced are the node's and
    /// the network's.
    pub fn check_gpus(&self, gpus: u64) -> Result<(), PlanError> {
        let per_node = u64::from(self.gpus_per_node.max(1));
        let nodes = gpus.div_ceil(per_node);
        if let Some(max) = self.max_nodes
            && nodes > u64::from(max)
        {
            return Err(PlanError::invalid(format!(
                "--gpus {gpus} needs {nodes} nodes of {per_node}, and {} has at most {max} \
                 (its `max_nodes`): use at most {} GPUs, or a cluster file with more nodes",
                self.name,
                u64::from(max) * per_node
            )));
        }
        if gpus > per_node && self.network_link().is_none() {
            return Err(PlanError::invalid(format!(
                "--gpus {gpus} spans {nodes} nodes of {per_node}, and {} describes no link \
                 between nodes (a [[link]] with scope = \"network\"): add one, or use at most \
                 {per_node} GPUs",
                self.name
            )));
        }
        if gpus > per_node && !gpus.is_multiple_of(per_node) {
            return Err(PlanError::invalid(format!(
                "--gpus {gpus} is {} whole node(s) of {per_node} GPUs and {} of another: plait \
                 places ranks on whole nodes, as a launcher starts the same number on each; use \
                 a multiple of {per_node}, or at most {per_node}",
                gpus / per_node,
                gpus % per_node
            )));
        }
        Ok(())
    }

    /// Checks every field's range, naming `origin` (the cluster file, or a plan carrying it).
    pub(crate) fn validate(&self, origin: &str) -> Result<(), PlanError> {
        let bad = |field: &str, why: &str| {
            Err(PlanError::ClusterFile {
                file: origin.into(),
                message: format!("`{field}` {why}"),
            })
        };
        // Rates, sizes and fractions within bounds far beyond any machine (a millionth of a
        // unit to ten million of them: GB/s, GiB, TFLOP/s), so that no product or quotient of
        // them leaves f64's range; a value outside is a typo, not a machine.
        let positive = |x: f64| x.is_finite() && (MIN_RATE..=MAX_RATE).contains(&x);
        let fraction = |x: f64| x.is_finite() && (MIN_FRACTION..=1.0).contains(&x);
        let delay = |x: f64| x.is_finite() && (0.0..=MAX_DELAY_US).contains(&x);
        if self.gpus_per_node == 0 || self.gpus_per_node > MAX_COUNT {
            return bad("gpus_per_node", "must be between 1 and 1000000");
        }
        if self.max_nodes == Some(0) {
            return bad("max_nodes", "must be at least 1 (or left out: no limit)");
        }
        if self.gpu.sm_count == 0 || self.gpu.sm_count > MAX_COUNT {
            return bad("gpu.sm_count", "must be between 1 and 1000000");
        }
        if !delay(self.gpu.launch_overhead_us) {
            return bad(
                "gpu.launch_overhead_us",
                "must be between 0 and 1000000 (microseconds)",
            );
        }
        if !positive(self.gpu.memory_gib) {
            return bad(
                "gpu.memory_gib",
                "must be between 0.000001 and 10000000 (GiB)",
            );
        }
        if !positive(self.gpu.hbm_gb_per_s) {
            return bad(
                "gpu.hbm_gb_per_s",
                "must be between 0.000001 and 10000000 (GB/s)",
            );
        }
        if !fraction(self.gpu.matmul_efficiency) {
            return bad("gpu.matmul_efficiency", "must be in (0, 1]");
        }
        if let Some(k) = &self.gpu.kernel_fractions {
            for (field, v) in [
                ("pointwise", k.pointwise),
                ("activation", k.activation),
                ("norm", k.norm),
                ("softmax", k.softmax),
                ("dropout", k.dropout),
            ] {
                if v.is_some_and(|v| !positive(v)) {
                    return bad(
                        &format!("gpu.kernel_fractions.{field}"),
                        "must be between 0.000001 and 10000000 (a kernel's bandwidth over a plain copy's)",
                    );
                }
            }
        }
        if let Some(fa) = &self.gpu.flash_attention {
            for (field, v) in [("forward", fa.forward), ("backward", fa.backward)] {
                if !fraction(v) {
                    return bad(&format!("gpu.flash_attention.{field}"), "must be in (0, 1]");
                }
            }
        }
        if self.gpu.board_power_w.is_some_and(|w| !positive(w)) {
            return bad(
                "gpu.board_power_w",
                "must be between 0.000001 and 10000000 (watts)",
            );
        }
        if self
            .pue
            .is_some_and(|p| !(p.is_finite() && (1.0..=10.0).contains(&p)))
        {
            return bad(
                "pue",
                "must be between 1 and 10 (facility power over IT power)",
            );
        }
        if self
            .price_per_gpu_hour
            .is_some_and(|p| !(p.is_finite() && (0.0..=MAX_RATE).contains(&p)))
        {
            return bad("price_per_gpu_hour", "must be between 0 and 10000000");
        }
        if !fraction(self.gpu.memory_efficiency) {
            return bad("gpu.memory_efficiency", "must be in (0, 1]");
        }
        let p = &self.gpu.peak_tflops;
        for (f, v) in [
            ("fp32", p.fp32),
            ("tf32", p.tf32),
            ("bf16", p.bf16),
            ("fp16", p.fp16),
            ("fp8", p.fp8),
        ] {
            if v.is_some_and(|x| !positive(x)) {
                return bad(
                    &format!("gpu.peak_tflops.{f}"),
                    "must be between 0.000001 and 10000000 (omit it if unsupported)",
                );
            }
        }
        if p.fp32.is_none() {
            return bad("gpu.peak_tflops.fp32", "is required");
        }
        if !self.links.iter().any(|l| l.scope == Scope::Node) && self.gpus_per_node > 1 {
            return bad(
                "link",
                "needs a `scope = \"node\"` entry for GPUs inside a node",
            );
        }
        for (i, l) in self.links.iter().enumerate() {
            // The cost model prices one link of each scope: a second would be ignored.
            if self.links[..i]
                .iter()
                .any(|earlier| earlier.scope == l.scope)
            {
                return bad(
                    &format!("link[{i}].scope"),
                    "repeats an earlier link's scope: give one link per scope (node, network)",
                );
            }
            // A field of the other scope's kind is a mistake plait would ignore.
            let foreign = match l.scope {
                Scope::Node => {
                    (l.nics_per_node.is_some() || l.nic_gb_per_s.is_some()).then_some("nic fields")
                }
                Scope::Network => l.gb_per_s.is_some().then_some("gb_per_s"),
            };
            if let Some(field) = foreign {
                return bad(
                    &format!("link[{i}]"),
                    &format!(
                        "has {field}, which a link of its scope does not use (node links take \
                         gb_per_s, network links nics_per_node and nic_gb_per_s)"
                    ),
                );
            }
            if !fraction(l.efficiency) {
                return bad(&format!("link[{i}].efficiency"), "must be in (0, 1]");
            }
            if l.nvls_efficiency.is_some_and(|x| !fraction(x)) {
                return bad(&format!("link[{i}].nvls_efficiency"), "must be in (0, 1]");
            }
            if !delay(l.latency_us) {
                return bad(
                    &format!("link[{i}].latency_us"),
                    "must be between 0 and 1000000 (microseconds)",
                );
            }
            match l.scope {
                Scope::Node if !l.gb_per_s.is_some_and(positive) => {
                    return bad(
                        &format!("link[{i}].gb_per_s"),
                        "is required (0.000001 to 10000000 GB/s) for a node link",
                    );
                }
                Scope::Network
                    if !(l.nics_per_node.is_some_and(|n| n > 0 && n <= MAX_COUNT)
                        && l.nic_gb_per_s.is_some_and(positive)) =>
                {
                    return bad(
                        &format!("link[{i}]"),
                        "needs nics_per_node (1 to 1000000) and nic_gb_per_s (0.000001 to 10000000) for a network link",
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The kernels the cluster's runtime uses unless a strategy says otherwise.
    pub fn default_kernels(&self) -> crate::cost::compute::Kernels {
        self.gpu
            .kernels
            .unwrap_or(crate::cost::compute::Kernels::Fused)
    }

    /// The attention kernel the cluster's training stacks run unless a strategy says
    /// otherwise: fused (FlashAttention) where the GPU has a measured FlashAttention rate,
    /// materialized elsewhere (V100, plait's CPU kernels).
    pub fn default_attention(&self) -> crate::cost::compute::AttentionKernel {
        use crate::cost::compute::AttentionKernel;
        if self.gpu.flash_attention.is_some() {
            AttentionKernel::Fused
        } else {
            AttentionKernel::Materialized
        }
    }

    /// The data center's power usage effectiveness ([`DEFAULT_PUE`] unless the file says).
    pub fn pue(&self) -> f64 {
        self.pue.unwrap_or(DEFAULT_PUE)
    }

    /// The element-wise kernels `engine` runs on this cluster: the cluster's own where its
    /// runtime says eager (plait's CPU runtime), else the engine's.
    pub fn engine_kernels(&self, engine: crate::engine::Engine) -> crate::cost::compute::Kernels {
        match self.gpu.kernels {
            Some(k) => k,
            None => engine.kernels(),
        }
    }

    pub fn memory_bytes(&self) -> f64 {
        self.gpu.memory_gib * (1u64 << 30) as f64
    }

    /// Dense peak FLOP/s for a precision, if the GPU supports it.
    pub fn peak_flops(&self, p: Precision) -> Option<f64> {
        let t = &self.gpu.peak_tflops;
        let tflops = match p {
            Precision::Fp32 => t.fp32,
            Precision::Bf16 => t.bf16,
            Precision::Fp16 => t.fp16,
            Precision::Fp8 | Precision::Fp8Tensorwise => t.fp8,
        };
        tflops.map(|x| x * 1e12)
    }

    /// Sustained HBM bandwidth, bytes/s.
    pub fn hbm_bytes_per_s(&self) -> f64 {
        self.gpu.hbm_gb_per_s * 1e9 * self.gpu.memory_efficiency
    }

    pub fn node_link(&self) -> Option<&Link> {
        self.links.iter().find(|l| l.scope == Scope::Node)
    }

    pub fn network_link(&self) -> Option<&Link> {
        self.links.iter().find(|l| l.scope == Scope::Network)
    }
}
