//! Resolves a MODEL argument: a `.onnx` file, a `config.json`, or a zoo name.

use std::path::Path;

use anyhow::{Context, bail};
use import::{build_forward, hf, zoo};
use ir::{Binding, DType, Graph};

/// A model ready to inspect or plan.
pub struct LoadedModel {
    pub graph: Graph,
    pub binding: Binding,
}

/// Loads MODEL at the given batch and (optional) sequence length.
pub fn load(model: &str, batch: u64, seq: Option<u64>) -> anyhow::Result<LoadedModel> {
    let path = Path::new(model);
    let spec =
        if path.exists() || model.ends_with(".json") || model.ends_with(".onnx") {
            if model.ends_with(".onnx") {
                bail!("{model}: ONNX import is not available in this build yet");
            }
            hf::read_config(path)?
        } else {
            zoo::find(model).with_context(|| {
            format!(
                "`{model}` is neither a file nor a zoo model; give a config.json or .onnx path, \
                 or one of: {}",
                zoo::zoo().iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ")
            )
        })?
        };
    let seq = seq.unwrap_or(spec.default_seq);
    let graph =
        build_forward(&spec, DType::F32).with_context(|| format!("building {}", spec.name))?;
    Ok(LoadedModel {
        graph,
        binding: Binding { batch, seq },
    })
}
