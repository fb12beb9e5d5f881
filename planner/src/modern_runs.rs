//! The modern public set: H100 FP8 runs of Megatron-Core (NeMo 24.07, Megatron-Bridge 25.11) with
//! their full configuration, each predicted as published (`plait bench cost-model`).

use crate::cost::compute::{AttentionKernel, Kernels};
use crate::engine::Engine;
use crate::error::PlanError;
use crate::precision::Precision;
use crate::strategy::{Recompute, Schedule, Strategy};

pub const MODERN_CSV: &str = include_str!("../../data/modern_runs.csv");

/// One published run.
#[derive(Clone, Debug, PartialEq)]
pub struct ModernRow {
    pub source: String,
    pub model: String,
    /// `gpt` or `llama`.
    pub arch: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub ffn: u64,
    pub vocab: u64,
    pub seq: u64,
    pub gpus: u64,
    pub global_batch: u64,
    pub micro_batch: u64,
    pub tp: u32,
    pub pp: u32,
    pub cp: u32,
    pub virtual_stages: Option<u32>,
    /// Megatron-FSDP (ZeRO-3) rather than the distributed optimizer (ZeRO-1).
    pub fsdp: bool,
    /// `fp8` (delayed scaling) or `fp8 current scaling` (per-tensor current scaling).
    pub precision: Precision,
    pub iteration_s: f64,
}

/// Parses the CSV: 17 fields from the left, the free-text `dp_sharding`, 3 from the right.
pub fn modern_rows(csv: &str) -> Result<Vec<ModernRow>, PlanError> {
    let bad = |line: usize, m: String| PlanError::ClusterFile {
        file: "modern_runs.csv".into(),
        message: format!("line {line}: {m}"),
    };
    let mut out = Vec::new();
    for (i, line) in csv.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 21 {
            return Err(bad(i + 1, format!("{} fields, expected 21", f.len())));
        }
        let right = &f[f.len() - 3..];
        let sharding = f[17..f.len() - 3].join(",");
        let num = |k: usize| -> Result<u64, PlanError> {
            f[k].trim()
                .parse()
                .map_err(|_| bad(i + 1, format!("field {} `{}` is not a number", k + 1, f[k])))
        };
        let small = |k: usize| -> Result<u32, PlanError> {
            num(k).and_then(|v| u32::try_from(v).map_err(|_| bad(i + 1, format!("field {k}"))))
        };
        out.push(ModernRow {
            source: f[0].into(),
            model: f[1].into(),
            arch: f[2].into(),
            layers: num(3)?,
            hidden: num(4)?,
            heads: num(5)?,
            kv_heads: num(6)?,
            ffn: num(7)?,
            vocab: num(8)?,
            seq: num(9)?,
            gpus: num(10)?,
            global_batch: num(11)?,
            micro_batch: num(12)?,
            tp: small(13)?,
            pp: small(14)?,
            cp: small(15)?,
            virtual_stages: if f[16].trim().is_empty() {
                None
            } else {
                Some(small(16)?)
            },
            fsdp: sharding.contains("FSDP"),
            precision: match right[0].trim() {
                "fp8" => Precision::Fp8,
                "fp8 current scaling" => Precision::Fp8Tensorwise,
                other => return Err(bad(i + 1, format!("precision `{other}`"))),
            },
            iteration_s: right[2]
                .trim()
                .parse()
                .map_err(|_| bad(i + 1, format!("iteration_s `{}`", right[2])))?,
        });
    }
    Ok(out)
}

impl ModernRow {
    /// The run as published, on Megatron-Core: FP8 GEMMs, fused attention, sequence parallelism
    /// with tensor parallelism, no recomputation, the distributed optimizer or Megatron-FSDP.
    pub fn strategy(&self) -> Strategy {
        let dp = (self.gpus / u64::from(self.tp * self.pp * self.cp)) as u32;
        let zero = if self.fsdp { 3 } else { 1 };
        let (schedule, virtual_stages) = match self.virtual_stages {
            Some(v) => (Schedule::Interleaved, v),
            None => (Schedule::OneFOneB, 1),
        };
        Strategy {
            tp: self.tp,
            pp: self.pp,
            dp,
            micro_batch: self.micro_batch,
            global_batch: self.global_batch,
            seq: self.seq,
            zero,
            recompute: Recompute::None,
            schedule,
            virtual_stages,
            sequence_parallel: self.tp > 1,
            precision: self.precision,
            attention: AttentionKernel::Fused,
            kernels: Kernels::Fused,
            stage_layers: None,
            cp: self.cp,
            ep: 1,
            engine: Engine::Megatron,
            overlap: Engine::Megatron.overlap(zero),
            dp_comm: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_parses_with_its_configuration() {
        let rows = modern_rows(MODERN_CSV).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rows.len(), 12);
        for r in &rows {
            assert_eq!(r.strategy().gpus(), r.gpus, "{}", r.model);
        }
        assert_eq!(rows.iter().filter(|r| r.fsdp).count(), 1);
        assert_eq!(rows.iter().filter(|r| r.cp > 1).count(), 3);
    }
}
