//! `plait profile --device cuda`: plait's own CUDA runtime measured on GPU 0
//! (`runtime::profile::measure_gpu`), written as a cluster file whose plans predict `plait run`
//! on this GPU. What a single GPU cannot measure (its datasheet peaks, the links between GPUs
//! and nodes, its board power) comes from the preset of the same GPU where there is one.

use std::fmt::Write as _;

use anyhow::Context;
use planner::cost::compute::Kernels;
use planner::hardware::{
    Cluster, FlashAttentionRate, Gpu, KernelFractions, Link, PeakTflops, Scope,
};
use runtime::Backend as _;
use runtime::profile::{GpuProfile, GpuProfileOptions, measure_gpu, utc};

/// Measures GPU 0 and writes the cluster file `output` named `name`.
pub fn run(output: &std::path::Path, name: &str, quick: bool) -> anyhow::Result<()> {
    let open = || runtime::backend::CudaBackend::new(0);
    let f32 = open().map_err(|e| {
        anyhow::anyhow!(
            "`plait profile --device cuda` measures GPU 0, and CUDA cannot start here: {e}. \
             Build with `cargo build --release --features cuda` and run it on the GPU machine; \
             `plait profile` (the default `--device cpu`) measures this machine's CPU"
        )
    })?;
    let bf16 = open()?.with_gemm_precision(runtime::GemmPrecision::Bf16);
    let gpus = runtime::backend::CudaBackend::device_count()?;
    eprintln!("measuring {} (about half a minute) ...", f32.name());
    let p = measure_gpu(&f32, &bf16, f32.properties(), &GpuProfileOptions { quick })?;
    let (cluster, header) = profiled_cluster(&p, name, u32::try_from(gpus).unwrap_or(1))?;
    let text = format!("{header}{}", toml::to_string(&cluster)?);
    Cluster::from_toml(&text, &output.display().to_string())
        .context("the measured cluster does not load back (a bug in plait profile)")?;
    std::fs::write(output, &text).with_context(|| format!("cannot write {}", output.display()))?;
    print!("{}", header.replace("# ", "  "));
    println!(
        "wrote {}; use it with `plait compile MODEL --cluster {}`",
        output.display(),
        output.display()
    );
    Ok(())
}

/// The preset whose GPU this is: the preset GPU's model (its name up to the first `-`, `H200`
/// of `H200-SXM-141GB`) is a word of the device's product name (`NVIDIA H200`); among several
/// (A100 40 GB and 80 GB) the one whose memory is nearest the device's.
pub fn datasheet_preset(product: &str, memory_gib: Option<f64>) -> Option<Cluster> {
    let words: Vec<String> = product
        .split(|c: char| !c.is_ascii_alphanumeric())
        .map(str::to_ascii_uppercase)
        .collect();
    let distance = |c: &Cluster| memory_gib.map_or(0.0, |m| (c.gpu.memory_gib - m).abs());
    planner::hardware::presets()
        .ok()?
        .into_iter()
        .filter(|c| {
            let model = c
                .gpu
                .name
                .split('-')
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            !model.is_empty() && words.contains(&model)
        })
        .min_by(|a, b| distance(a).total_cmp(&distance(b)))
}

/// The cluster of a measured GPU with `gpus` of them in this node, and the comment block
/// that says what was measured and what was taken from which preset.
pub fn profiled_cluster(
    p: &GpuProfile,
    name: &str,
    gpus: u32,
) -> anyhow::Result<(Cluster, String)> {
    let product = p
        .properties
        .product
        .clone()
        .unwrap_or_else(|| p.device.clone());
    let memory_gib = p
        .properties
        .memory_bytes
        .map(|b| b as f64 / (1u64 << 30) as f64);
    let preset = datasheet_preset(&product, memory_gib);
    let gpu = profiled_gpu(p, &product, memory_gib, preset.as_ref())?;
    let (links, max_nodes) = match &preset {
        Some(c) => (c.links.clone(), c.max_nodes),
        None => (vec![pcie_link()], Some(1)),
    };
    let cluster = Cluster {
        name: name.to_string(),
        description: format!(
            "plait's CUDA runtime on {product}, measured by plait profile {}",
            utc(p.unix_time)
        ),
        gpus_per_node: gpus.max(1),
        max_nodes,
        gpu,
        links,
        // plait's CUDA runtime runs a collective on the compute stream, between ops.
        comm_overlaps_compute: false,
        pue: None,
        price_per_gpu_hour: None,
    };
    Ok((cluster, header(p, preset.as_ref())))
}

/// A node link for a GPU no preset knows: PCIe 4.0 x16, 31.5 GB/s per direction (PCI-SIG
/// base specification 4.0), at the 0.8 of it NCCL's rings reach over PCIe (assumed).
fn pcie_link() -> Link {
    Link {
        name: "pcie (assumed: no preset knows this GPU)".into(),
        scope: Scope::Node,
        gb_per_s: Some(31.5),
        nics_per_node: None,
        nic_gb_per_s: None,
        latency_us: 10.0,
        efficiency: 0.8,
        nvls_efficiency: None,
    }
}

fn profiled_gpu(
    p: &GpuProfile,
    product: &str,
    memory_gib: Option<f64>,
    preset: Option<&Cluster>,
) -> anyhow::Result<Gpu> {
    let memory_gib = memory_gib
        .or(preset.map(|c| c.gpu.memory_gib))
        .context("the device reported no memory size and no preset knows it")?;
    let sm_count = p
        .properties
        .sm_count
        .or(preset.map(|c| c.gpu.sm_count))
        .unwrap_or(1);
    // Without a datasheet the measured rates are the peaks, reached at efficiency 1.
    let peak_tflops = preset.map_or_else(
        || PeakTflops {
            fp32: Some(p.gemm_f32_tflops),
            bf16: Some(p.gemm_bf16_tflops),
            fp16: Some(p.gemm_bf16_tflops),
            ..PeakTflops::default()
        },
        |c| c.gpu.peak_tflops.clone(),
    );
    let bf16_peak = peak_tflops.bf16.unwrap_or(p.gemm_bf16_tflops);
    let of_peak = |tflops: f64| (tflops / bf16_peak).clamp(1e-4, 1.0);
    let k = &p.kernel_fractions;
    Ok(Gpu {
        name: product.to_string(),
        sm_count,
        launch_overhead_us: p.launch_us,
        memory_gib,
        hbm_gb_per_s: p.copy_gb_per_s,
        matmul_efficiency: of_peak(p.gemm_bf16_tflops),
        memory_efficiency: 1.0,
        peak_tflops,
        kernels: Some(Kernels::Eager),
        matmul_packs_operands: false,
        // The runtime's bf16 GEMMs read the words their operands' producers wrote (weights'
        // twins from the optimizer's copy, results made as words, stashed values' words): a
        // GPT-2 step on `plait run --device dry` converts the operands of 6 of 147 GEMMs (the
        // tied LM head's). So no conversion is priced per GEMM.
        matmul_casts_operands: false,
        f32_activations: true,
        kernel_fractions: Some(KernelFractions {
            pointwise: Some(k.pointwise),
            activation: Some(k.activation),
            norm: Some(k.norm),
            softmax: Some(k.softmax),
            dropout: Some(k.dropout),
        }),
        flash_attention: Some(FlashAttentionRate {
            forward: of_peak(p.attention_fwd_tflops),
            backward: of_peak(p.attention_bwd_tflops),
        }),
        board_power_w: preset.and_then(|c| c.gpu.board_power_w),
    })
}

/// What each figure of the file is.
fn header(p: &GpuProfile, preset: Option<&Cluster>) -> String {
    let mut s = String::new();
    let a = p.attention;
    let k = &p.kernel_fractions;
    let lines = [
        format!(
            "Measured by `plait profile --device cuda` on {} ({}).",
            p.device,
            utc(p.unix_time)
        ),
        "Every rate is plait's own CUDA runtime's, through the backend `plait run` uses:".into(),
        format!(
            "hbm_gb_per_s: device copy {:.0} GB/s (read + written), memory_efficiency 1.",
            p.copy_gb_per_s
        ),
        format!(
            "launch_overhead_us: {:.2} us per op on the device, small ops queued behind a long \
             product (the host's dispatch runs ahead of a busy device).",
            p.launch_us
        ),
        format!(
            "bf16 GEMM {n}^3: {:.0} TFLOP/s with the f32 operands' conversions removed (the \
             runtime's GEMMs read their operands' bf16 words as their producers wrote them: \
             matmul_casts_operands false); f32 GEMM {:.1} TFLOP/s.",
            p.gemm_bf16_tflops,
            p.gemm_f32_tflops,
            n = p.gemm_size
        ),
        format!(
            "kernel_fractions: forward + backward on [{}, {}] f32 activations over the copy: add \
             {:.2}, GELU {:.2}, LayerNorm {:.2}, softmax {:.2}, dropout {:.2}; f32_activations: \
             these kernels move f32 whatever the plan's precision.",
            p.kernel_rows, p.kernel_cols, k.pointwise, k.activation, k.norm, k.softmax, k.dropout
        ),
        format!(
            "flash_attention: causal attention B{} S{} {}x{}: forward {:.0}, backward {:.0} \
             TFLOP/s (FlashAttention's FLOPs), over the bf16 peak.",
            a.batch, a.seq, a.heads, a.head_dim, p.attention_fwd_tflops, p.attention_bwd_tflops
        ),
        match preset {
            Some(c) => format!(
                "Datasheet peaks, board power and links: preset {} (not measurable on one GPU).",
                c.name
            ),
            None => "No preset knows this GPU: the measured GEMM rates are its peaks \
                     (matmul_efficiency 1), and its node link is an assumed PCIe 4.0 x16."
                .into(),
        },
        "kernels = eager: one kernel per IR op; comm_overlaps_compute = false: collectives \
         run between ops."
            .into(),
    ];
    for l in lines {
        let _ = writeln!(s, "# {l}");
    }
    s
}

#[cfg(test)]
mod tests {
    use runtime::backend::DeviceProperties;

    use super::*;

    fn measured(product: &str) -> GpuProfile {
        let cpu = runtime::CpuBackend::new();
        let props = DeviceProperties {
            product: Some(product.into()),
            sm_count: Some(132),
            memory_bytes: Some(150_000_000_000),
        };
        measure_gpu(&cpu, &cpu, props, &GpuProfileOptions { quick: true }).expect("measures")
    }

    #[test]
    fn a_known_gpu_takes_its_datasheet_from_its_preset() {
        let p = measured("NVIDIA H200");
        let (c, header) = profiled_cluster(&p, "mine", 1).expect("cluster");
        let text = format!("{header}{}", toml::to_string(&c).expect("toml"));
        let back = Cluster::from_toml(&text, "profiled").expect("loads back");
        assert_eq!(back, c);
        let h200 = Cluster::load("dgx-h200").expect("preset");
        assert_eq!(c.gpu.peak_tflops, h200.gpu.peak_tflops);
        assert_eq!(c.links, h200.links);
        assert!(c.gpu.f32_activations && !c.gpu.matmul_casts_operands);
        assert!(!c.gpu.matmul_packs_operands);
        assert_eq!(c.gpu.kernels, Some(Kernels::Eager));
        // A CPU's GEMM is far below an H200's peak: the efficiency says so, it is not clamped
        // to a datasheet figure.
        assert!(c.gpu.matmul_efficiency < 0.1, "{}", c.gpu.matmul_efficiency);
        assert!(header.contains("preset dgx-h200"), "{header}");
    }

    #[test]
    fn an_unknown_gpu_uses_its_measured_rates_as_peaks() {
        let p = measured("Imaginary X1");
        let (c, header) = profiled_cluster(&p, "mine", 2).expect("cluster");
        assert_eq!(c.gpu.peak_tflops.bf16, Some(p.gemm_bf16_tflops));
        assert_eq!(c.gpu.matmul_efficiency, 1.0);
        assert_eq!(c.links[0].scope, Scope::Node);
        assert!(header.contains("No preset knows this GPU"), "{header}");
        let text = format!("{header}{}", toml::to_string(&c).expect("toml"));
        Cluster::from_toml(&text, "profiled").expect("loads back");
    }

    /// The file `plait compile` reads: GPT-2's bf16 plan for one of these GPUs compiles on it,
    /// priced as this runtime runs (eager kernels), slower than on the H200 preset when the
    /// "GPU" measured is a CPU.
    #[test]
    fn gpt2_compiles_on_the_profiled_file() {
        use clap::Parser;
        #[derive(Parser)]
        #[command(no_binary_name = true)]
        struct Line {
            model: String,
            #[command(flatten)]
            cluster: crate::strategy_args::ClusterArgs,
            #[command(flatten)]
            pins: crate::strategy_args::StrategyArgs,
        }
        let (c, header) = profiled_cluster(&measured("NVIDIA H200"), "mine", 1).expect("cluster");
        let path = std::env::temp_dir().join(format!("plait-gpu-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            format!("{header}{}", toml::to_string(&c).expect("toml")),
        )
        .expect("written");
        let plan = |cluster: &str| {
            let args = format!(
                "gpt2 --cluster {cluster} --gpus 1 --global-batch 8 --seq 1024 --micro-batch 8 \
                 --precision bf16"
            );
            let l = Line::try_parse_from(args.split_whitespace()).expect("arguments");
            crate::compile::compile(&l.model, &l.cluster, &l.pins, 0, None)
                .expect("compiles")
                .plan
        };
        let profiled = plan(path.to_str().expect("utf-8 path"));
        let _ = std::fs::remove_file(&path);
        let preset = plan("dgx-h200");
        assert_eq!(profiled.strategy.kernels, Kernels::Eager);
        assert!(
            profiled.predicted.iteration_time_s > preset.predicted.iteration_time_s,
            "{} vs {}",
            profiled.predicted.iteration_time_s,
            preset.predicted.iteration_time_s
        );
    }

    #[test]
    fn presets_match_by_model_and_memory() {
        let name = |p: &str, m| datasheet_preset(p, m).map(|c| c.gpu.name);
        assert_eq!(
            name("NVIDIA A100-SXM4-40GB", Some(39.4)).as_deref(),
            Some("A100-SXM4-40GB")
        );
        assert!(name("NVIDIA A100-SXM4-80GB", Some(79.2)).is_some_and(|n| n.contains("80")));
        assert_eq!(name("NVIDIA GeForce RTX 4090", Some(24.0)), None);
    }
}
