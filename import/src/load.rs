//! One entry point for every way of naming a model: [`load_model`] resolves a MODEL argument
//! (an ONNX file, a Hugging Face `config.json`, a directory holding either, or a zoo name) into a
//! forward graph bound to a batch and sequence length.
//!
//! Resolution, in order:
//! 1. a name ending in `.onnx` → [`crate::onnx::import_onnx`] at the requested batch and seq;
//! 2. an existing directory → its `model.onnx`, else its `config.json`;
//! 3. an existing file, or a name ending in `.json` → [`crate::hf::read_config`], then
//!    [`crate::build_forward`] (f32);
//! 4. a Hugging Face Hub id (`org/name`) → its `config.json` in the local Hub cache
//!    ([`crate::hub`]; plait does not download);
//! 5. otherwise a zoo name ([`crate::zoo::find`], case-insensitive).
//!
//! The sequence length, when not given: a config's or zoo entry's `default_seq` (its context
//! length, at most 8192: `spec::default_seq`); for ONNX, the length the file fixes for its token-id input, else
//! [`DEFAULT_ONNX_SEQ`], lowered to the number of rows of a learned position embedding when the
//! model has a smaller one (found by a two-token import first, so giving `seq` saves an import).
//! A sequence longer than a learned position embedding is an error ([`Error::SeqTooLong`]), for
//! configs and ONNX alike.

use std::path::{Path, PathBuf};

use ir::{Binding, BuildError, DType, Graph, OpKind, ValueId, Weights};

use crate::hf::{self, ConfigError};
use crate::{ImportError, build_forward, hub, onnx, zoo};

/// Sequence length of an ONNX import when neither the caller nor the file fixes one.
pub const DEFAULT_ONNX_SEQ: u64 = 128;

/// Where a loaded model came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An ONNX file, imported at the binding's batch and seq.
    Onnx { path: PathBuf, opset: i64 },
    /// A Hugging Face `config.json`.
    Config { path: PathBuf },
    /// A built-in zoo entry.
    Zoo { name: String },
}

/// A model ready to inspect, plan or train.
#[derive(Clone, Debug)]
pub struct LoadedModel {
    /// The forward graph: input `input_ids`, output `logits`, and, with input `targets`, the
    /// next-token `loss` (configs and the zoo always; ONNX imports whose logits are
    /// `[batch, seq, vocab]`, see `onnx::import_model`). Verified; layers tagged when the
    /// model repeats a block.
    pub graph: Graph,
    /// Batch (sequences) and sequence length. ONNX graphs have these folded into their shapes;
    /// config and zoo graphs keep them symbolic (`B`, `S`) and are evaluated at this binding.
    pub binding: Binding,
    /// The weights an ONNX file carries (every `param` and `buffer` of the graph, by name);
    /// `None` for configs and the zoo, which describe shapes only.
    pub weights: Option<Weights>,
    pub source: Source,
    /// What the file asks for that plait models more simply ([`hf::approximations`]).
    pub notes: Vec<String>,
}

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `config.json` that cannot be read or interpreted (boxed: the errors are large).
    #[error(transparent)]
    Config(Box<ConfigError>),
    /// An ONNX file that cannot be read or imported.
    #[error(transparent)]
    Onnx(Box<ImportError>),
    /// Neither a file nor a zoo entry.
    #[error(
        "`{name}` is neither a file nor a zoo model; give a config.json or .onnx path, or one of: {}",
        zoo.join(", ")
    )]
    UnknownModel { name: String, zoo: Vec<String> },
    /// A Hub id whose `config.json` is not in the local cache.
    #[error(
        "`{id}` reads as a Hugging Face Hub id, but no config.json of it is in the Hub cache \
         ({}); plait does not download: fetch it with `huggingface-cli download {id} \
         config.json` (which fills that cache) or give the config.json's path",
        match cache {
            Some(dir) => hub::repo_dir(dir, id).display().to_string(),
            None => "no cache directory: set HF_HUB_CACHE or HF_HOME".to_string(),
        }
    )]
    HubNotCached { id: String, cache: Option<PathBuf> },
    /// A directory without a `model.onnx` or `config.json`.
    #[error(
        "{}: the directory holds neither model.onnx nor config.json; give the model file's path",
        dir.display()
    )]
    EmptyDir { dir: PathBuf },
    #[error("{model}: batch and seq must be at least 1 (got batch {batch}, seq {seq})")]
    BadBinding { model: String, batch: u64, seq: u64 },
    /// The sequence is longer than the model's learned position embedding.
    #[error(
        "{model}: sequence length {seq} exceeds the {max} positions of the learned position embedding '{table}'; use a sequence length of at most {max}"
    )]
    SeqTooLong {
        model: String,
        seq: u64,
        max: u64,
        table: String,
    },
    /// A tensor or the parameters together beyond what plait plans for
    /// ([`crate::sizes::MAX_ELEMENTS`]).
    #[error(
        "{model}: {oversize}, beyond the 2^50 plait plans for (a thousand times the largest \
         models trained); check the model's sizes (hidden, intermediate and vocabulary sizes, \
         expert count)"
    )]
    TooLarge {
        model: String,
        oversize: crate::sizes::Oversize,
    },
    /// The builder could not lower a (validated) spec: a bug or an unsupported combination.
    #[error("{model}: building the forward graph failed: {source}")]
    Build {
        model: String,
        #[source]
        source: BuildError,
    },
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(Box::new(e))
    }
}

impl From<ImportError> for Error {
    fn from(e: ImportError) -> Error {
        Error::Onnx(Box::new(e))
    }
}

/// Loads MODEL (see the module doc for how it is resolved) at `batch` sequences of `seq` tokens
/// (`None`: the model's default, see the module doc).
pub fn load_model(model: &str, batch: u64, seq: Option<u64>) -> Result<LoadedModel, Error> {
    load_model_at(model, Some(batch), seq)
}

/// [`load_model`] with the batch too left to the model when `None`: the batch an ONNX file
/// fixes for its token ids, else 1.
pub fn load_model_at(
    model: &str,
    batch: Option<u64>,
    seq: Option<u64>,
) -> Result<LoadedModel, Error> {
    if batch == Some(0) || seq == Some(0) {
        return Err(Error::BadBinding {
            model: model.to_string(),
            batch: batch.unwrap_or(1),
            seq: seq.unwrap_or(1),
        });
    }
    let path = Path::new(model);
    if has_extension(path, "onnx") {
        return load_onnx(path, batch, seq);
    }
    let one = batch.unwrap_or(1);
    if path.is_dir() {
        let onnx_file = path.join("model.onnx");
        if onnx_file.is_file() {
            return load_onnx(&onnx_file, batch, seq);
        }
        let config = path.join("config.json");
        if config.is_file() {
            return load_config(&config, one, seq);
        }
        return Err(Error::EmptyDir {
            dir: path.to_path_buf(),
        });
    }
    if path.exists() || has_extension(path, "json") {
        return load_config(path, one, seq);
    }
    if hub::is_hub_id(model) {
        let cache = hub::cache_dir();
        return match cache.as_deref().and_then(|c| hub::cached_config(c, model)) {
            Some(config) => load_config(&config, one, seq),
            None => Err(Error::HubNotCached {
                id: model.to_string(),
                cache,
            }),
        };
    }
    let Some(spec) = zoo::find(model) else {
        return Err(Error::UnknownModel {
            name: model.to_string(),
            zoo: zoo::zoo().into_iter().map(|m| m.name).collect(),
        });
    };
    let name = spec.name.clone();
    from_spec(&spec, one, seq, Source::Zoo { name })
}

fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case(ext))
}

fn load_config(path: &Path, batch: u64, seq: Option<u64>) -> Result<LoadedModel, Error> {
    let spec = hf::read_config(path)?;
    let source = Source::Config {
        path: path.to_path_buf(),
    };
    let mut m = from_spec(&spec, batch, seq, source)?;
    m.notes = std::fs::read_to_string(path)
        .map(|t| hf::approximations(&t))
        .unwrap_or_default();
    Ok(m)
}

fn from_spec(
    spec: &crate::ModelSpec,
    batch: u64,
    seq: Option<u64>,
    source: Source,
) -> Result<LoadedModel, Error> {
    let graph = build_forward(spec, DType::F32).map_err(|source| Error::Build {
        model: spec.name.clone(),
        source,
    })?;
    let seq = seq.unwrap_or(spec.default_seq).max(1);
    let model = match &source {
        Source::Config { path } | Source::Onnx { path, .. } => path.display().to_string(),
        Source::Zoo { name } => name.clone(),
    };
    if let Some(oversize) = crate::sizes::oversize(&graph) {
        return Err(Error::TooLarge { model, oversize });
    }
    if let Some(limit) = position_limit(&graph).filter(|l| l.max < seq) {
        return Err(Error::SeqTooLong {
            model,
            seq,
            max: limit.max,
            table: limit.table,
        });
    }
    Ok(LoadedModel {
        graph,
        binding: Binding { batch, seq },
        weights: None,
        source,
        notes: Vec::new(),
    })
}

fn load_onnx(path: &Path, batch: Option<u64>, seq: Option<u64>) -> Result<LoadedModel, Error> {
    let proto = onnx::read_model(path)?;
    let (declared_batch, declared_seq) = onnx::declared_input_dims(&proto);
    let batch = batch.or(declared_batch).unwrap_or(1);
    let at = match seq.or(declared_seq) {
        Some(at) => at,
        None => {
            // Neither the caller nor the file fixes seq. A learned position table limits it, and
            // a longer seq fails to fold, so look for one in a two-token import first (one
            // token's position ids fold to a plain constant rather than `iota`).
            position_probe(path, &proto, batch)?
                .map_or(DEFAULT_ONNX_SEQ, |l| l.max.min(DEFAULT_ONNX_SEQ))
        }
    };
    let imported = match onnx::import_model(path, &proto, batch, at) {
        Ok(imported) => imported,
        Err(e) => {
            // Say so when the error is a seq longer than the position table.
            return match position_probe(path, &proto, batch) {
                Ok(Some(limit)) if limit.max < at => Err(too_long(path, at, limit)),
                _ => Err(e.into()),
            };
        }
    };
    if let Some(limit) = position_limit(&imported.graph).filter(|l| l.max < at) {
        return Err(too_long(path, at, limit));
    }
    if let Some(oversize) = crate::sizes::oversize(&imported.graph) {
        return Err(Error::TooLarge {
            model: path.display().to_string(),
            oversize,
        });
    }
    Ok(LoadedModel {
        graph: imported.graph,
        binding: Binding { batch, seq: at },
        weights: Some(imported.weights),
        source: Source::Onnx {
            path: path.to_path_buf(),
            opset: imported.opset,
        },
        notes: Vec::new(),
    })
}

/// The learned position table of a two-token import (one token's position ids fold to a plain
/// constant rather than `iota`).
fn position_probe(
    path: &Path,
    proto: &onnx::proto::ModelProto,
    batch: u64,
) -> Result<Option<PositionLimit>, ImportError> {
    let probe = onnx::import_model(path, proto, batch, 2)?;
    Ok(position_limit(&probe.graph))
}

fn too_long(path: &Path, seq: u64, limit: PositionLimit) -> Error {
    Error::SeqTooLong {
        model: path.display().to_string(),
        seq,
        max: limit.max,
        table: limit.table,
    }
}

/// The smallest learned position embedding: a table looked up by positions `0..n`.
struct PositionLimit {
    max: u64,
    table: String,
}

/// Finds `embedding(table, iota)` lookups (through reshapes and broadcasts of the positions) and
/// returns the one with the fewest rows.
fn position_limit(graph: &Graph) -> Option<PositionLimit> {
    let mut best: Option<PositionLimit> = None;
    for &o in graph.order() {
        let op = graph.op(o);
        let (OpKind::Embedding, [table, ids]) = (&op.kind, op.inputs.as_slice()) else {
            continue;
        };
        if !is_positions(graph, *ids) {
            continue;
        }
        let Some(rows) = graph
            .ty(*table)
            .shape
            .dims()
            .first()
            .and_then(|d| d.fixed())
        else {
            continue;
        };
        let name = match &graph.op(graph.def_op(*table)).kind {
            OpKind::Param { name } | OpKind::Buffer { name } => name.clone(),
            other => other.mnemonic().to_string(),
        };
        if best.as_ref().is_none_or(|b| rows < b.max) {
            best = Some(PositionLimit {
                max: rows,
                table: name,
            });
        }
    }
    best
}

/// Whether `v` is `iota`, possibly reshaped or broadcast.
fn is_positions(graph: &Graph, mut v: ValueId) -> bool {
    for _ in 0..8 {
        let op = graph.op(graph.def_op(v));
        match (&op.kind, op.inputs.as_slice()) {
            (OpKind::Iota { .. }, _) => return true,
            (OpKind::Reshape { .. } | OpKind::Expand { .. }, [x]) => v = *x,
            _ => return false,
        }
    }
    false
}
