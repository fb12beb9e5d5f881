//! MLIR export of the per-rank programs (cargo feature `mlir`).
//!
//! Each [`Template`](crate::program::Template) becomes one MLIR module, an SPMD program that
//! every rank of the template runs (ranks of a template differ only in their mesh coordinates,
//! which is exactly what the upstream `shard` dialect expresses):
//!
//! - `shard.grid @mesh(shape = PPxDPxTP)`: axis 0 is the pipeline stage, 1 the data-parallel
//!   replica, 2 the tensor-parallel rank, so the grid's row-major linear index is plait's rank
//!   (`tp + tp_size·(dp + dp_size·pp)`). A tied-embedding group with more than two stages (first
//!   and last stage only, not a whole axis) uses a second grid `@tied(shape = 2xDPxTP)` whose
//!   axis 0 holds the first and the last stage.
//! - `func.func @init() -> (...)` runs the template's `init` instructions and returns the
//!   persistent buffers; `func.func @step(...) -> (...)` is one training iteration: it takes
//!   the persistent buffers (every buffer the iteration uses before allocating it) and returns
//!   their new values in the same order, so `step` composes with itself.
//! - Buffers become SSA tensor values at their local shard shape and storage type (`u8` masks
//!   are `i8`). An in-place write gives the buffer a new value; `Alloc` is `tensor.empty`.
//! - Compute: `linalg.matmul`/`linalg.batch_matmul` for `MatMul` and `Linear` (bias added by a
//!   broadcasting `linalg.generic`), `linalg.generic` for elementwise ops (numpy broadcasting
//!   in the indexing maps, arithmetic in f32, converted to the output type), reductions,
//!   `linalg.transpose`, `linalg.softmax` (non-causal), `tensor` reshapes/slices/concat. Ops
//!   without a natural linalg form (attention, norms, rotary, embedding, cross-entropy,
//!   dropout, every backward `Grad`, AdamW) are `func.call`s to declared external kernels
//!   `@plait.<op>` (`@plait.grad.<op>` for backward) with the exact tensor types; the op's
//!   attributes ride along as a `plait.op` string. Kernels return their outputs, then their
//!   `saves`.
//! - Collectives are `shard.all_reduce` (sum), `shard.all_gather`, `shard.reduce_scatter`,
//!   `shard.all_to_all`, `shard.broadcast` over the slot's grid axis; a bucket's pairs become
//!   one op each, tagged `plait.bucket`. Flat collectives (`axis: None`) reshape to 1-D, pad
//!   to a multiple of the group size, and slice the padding off again. `Chunk` is
//!   `shard.all_slice` (no communication). Pipeline `Send`/`Recv` are `shard.send`/`shard.recv`
//!   on axis 0 with the peer stage as in-group index and the message tag as `plait.tag`.
//! - Token loading, parameter initialization and loss reporting are external calls
//!   (`@plait.load_tokens`, `@plait.init_param`, `@plait.loss`); schedule and recompute markers
//!   are comments.
//!
//! Every module is parsed and checked by MLIR's own verifier before [`export`] returns it; the
//! text written is the text verified. Without the feature, [`export`] and [`write`] return
//! [`MlirError::NotCompiled`].

use std::path::{Path, PathBuf};

use crate::ids::TemplateId;
use crate::program::ProgramSet;

#[cfg(feature = "mlir")]
mod text;
#[cfg(feature = "mlir")]
mod verify;

#[cfg(feature = "mlir")]
pub use text::emit_template;
#[cfg(feature = "mlir")]
pub use verify::Verifier;

/// The LLVM/MLIR major version the feature binds (through melior 0.27).
pub const MLIR_VERSION: u32 = 22;

#[derive(Debug, thiserror::Error)]
pub enum MlirError {
    #[error(
        "this build of plait lacks MLIR support: rebuild with `--features mlir` \
         (needs LLVM/MLIR {MLIR_VERSION}, see .ci/install-mlir.sh)"
    )]
    NotCompiled,
    #[error("template {template}: {message}")]
    Emit {
        template: TemplateId,
        message: String,
    },
    #[error("MLIR could not parse module `{name}`: {diagnostics}")]
    Parse { name: String, diagnostics: String },
    #[error("module `{name}` fails MLIR's verifier: {diagnostics}")]
    Verify { name: String, diagnostics: String },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One verified module: the program of one template.
#[derive(Clone, Debug, PartialEq)]
pub struct MlirModule {
    /// File stem, `template-N` (beside the program's `template-N.json`).
    pub name: String,
    pub template: TemplateId,
    /// The ranks that run it.
    pub ranks: Vec<u32>,
    pub text: String,
}

/// One module per template, each verified by MLIR.
#[cfg(feature = "mlir")]
pub fn export(set: &ProgramSet) -> Result<Vec<MlirModule>, MlirError> {
    let verifier = Verifier::new();
    set.templates
        .iter()
        .map(|t| {
            let module = emit_template(set, t)?;
            verifier.check(&module.name, &module.text)?;
            Ok(module)
        })
        .collect()
}

/// One module per template, each verified by MLIR.
#[cfg(not(feature = "mlir"))]
pub fn export(_set: &ProgramSet) -> Result<Vec<MlirModule>, MlirError> {
    Err(MlirError::NotCompiled)
}

/// Exports and writes `DIR/template-N.mlir`; returns the paths.
pub fn write(set: &ProgramSet, dir: &Path) -> Result<Vec<PathBuf>, MlirError> {
    write_modules(&export(set)?, dir)
}

/// Writes exported modules as `DIR/<name>.mlir`; returns the paths.
pub fn write_modules(modules: &[MlirModule], dir: &Path) -> Result<Vec<PathBuf>, MlirError> {
    std::fs::create_dir_all(dir).map_err(|source| MlirError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    modules
        .iter()
        .map(|m| {
            let path = dir.join(format!("{}.mlir", m.name));
            std::fs::write(&path, &m.text).map_err(|source| MlirError::Io {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        })
        .collect()
}

#[cfg(all(test, not(feature = "mlir")))]
mod tests {
    use super::*;

    #[test]
    fn without_the_feature_export_says_how_to_get_it() {
        let set = ProgramSet {
            format: crate::program::FORMAT.into(),
            model: "none".into(),
            mesh: crate::program::MeshInfo {
                tp: 1,
                dp: 1,
                pp: 1,
                virtual_stages: 1,
                micro_batches: 1,
                micro_batch: 1,
                seq: 1,
                schedule: "1f1b".into(),
                zero: 0,
                recompute: "none".into(),
                sequence_parallel: false,
                precision: "fp32".into(),
                ep: 1,
                cp: 1,
                attention: "materialized".into(),
            },
            params: vec![],
            groups: vec![],
            predicted: vec![],
            ranks: vec![],
            templates: vec![],
        };
        let err = export(&set)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--features mlir"), "{err}");
        let dir = std::env::temp_dir().join("plait-mlir-absent");
        assert!(matches!(write(&set, &dir), Err(MlirError::NotCompiled)));
        assert!(!dir.exists(), "nothing is written without MLIR support");
    }
}
