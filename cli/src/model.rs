//! Resolves a MODEL argument: a thin wrapper over [`import::load_model`] (an `.onnx` file, a
//! `config.json`, a directory holding either, or a zoo name).

pub use import::LoadedModel;

/// Loads MODEL at the given batch and (optional) sequence length.
pub fn load(model: &str, batch: u64, seq: Option<u64>) -> anyhow::Result<LoadedModel> {
    Ok(import::load_model(model, batch, seq)?)
}
