//! Checkpoints (`plait-checkpoint/1`): each rank writes the parameter and optimizer pieces it
//! holds as one safetensors file; rank 0 then writes a JSON index of the global tensors and
//! points `latest` at the step. Every file is written to a temporary name and renamed, and
//! `latest` moves only after every rank's file is complete, so a crash leaves the previous
//! checkpoint intact.
//!
//! ```text
//! DIR/latest                          "step-00000010"
//! DIR/step-00000010/index.json        step, mesh, global tensors (name, shape), rank files
//! DIR/step-00000010/rank-00003.safetensors
//!     "<param>/weight", "<param>/m", "<param>/v": f32 pieces (the rank's flat range of its
//!     tensor-parallel shard); metadata "plait": where each piece sits in the global tensor
//! DIR/step-00000010/rank-00003.local.safetensors
//!     "residual/<buffer>/<phase>": the rank's own error-feedback residuals (top-k and int8
//!     runs only)
//! ```
//!
//! Loading reads every rank file and assembles full tensors, so a checkpoint resumes under
//! any layout (resharding). A compressed or local-SGD run resumes on the mesh that wrote it:
//! each rank reads its own residuals and its own data-parallel replica's pieces (under local
//! SGD the replicas differ between averages).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use kernels::Tensor32;
use program::ParamId;
use program::{ParamInfo, Slice};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::exec::{Field, Piece, ShardState, assemble};

pub const FORMAT: &str = "plait-checkpoint/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Index {
    format: String,
    model: String,
    step: u64,
    mesh: [u32; 3],
    /// Context-parallel degree (checkpoints written before it existed: 1); the mesh's dp
    /// counts dp × cp ranks.
    #[serde(default = "one")]
    cp: u32,
    params: Vec<ParamInfo>,
    files: Vec<String>,
}

fn one() -> u32 {
    1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PieceMeta {
    name: String,
    boxes: Vec<Vec<(u64, u64)>>,
    axis: usize,
    /// Zero rows after the boxes along `axis` (a padded vocabulary shard).
    #[serde(default, skip_serializing_if = "is_zero")]
    pad_rows: u64,
    weight: (usize, usize),
    m: (usize, usize),
    v: (usize, usize),
}

/// A loaded checkpoint: full tensors in the order of the requested parameter table.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub step: u64,
    /// The mesh (tp, pp, dp) and the number of ranks that wrote it.
    pub mesh: [u32; 3],
    /// Of the mesh's dp ranks, how many shared each sequence (context parallelism).
    pub cp: u32,
    pub ranks: usize,
    pub weights: BTreeMap<String, Tensor32>,
    pub m: Vec<Tensor32>,
    pub v: Vec<Tensor32>,
}

fn err(path: &Path, e: impl ToString) -> RuntimeError {
    RuntimeError::Checkpoint {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

fn rank_file(r: u32) -> String {
    format!("rank-{r:05}.safetensors")
}

/// Writes `bytes` to `path` through a temporary file and a rename.
fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(|e| err(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| err(path, e))
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Makes sure checkpoints can be written into `dir` (creating it), before any training: a
/// directory that cannot take them fails the run now, not after the first interval's work.
pub fn check_writable(dir: &Path, rank: u32) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create it: {e}")))?;
    let probe = dir.join(format!(".probe-rank{rank}"));
    std::fs::write(&probe, b"plait")
        .map_err(|e| err(dir, format!("cannot write checkpoints into it: {e}")))?;
    std::fs::remove_file(&probe).map_err(|e| err(&probe, e))
}

/// Writes this rank's pieces of step `step`.
pub fn save_rank(
    dir: &Path,
    step: u64,
    rank: u32,
    params: &[ParamInfo],
    states: &[ShardState],
) -> Result<(), RuntimeError> {
    let sd = step_dir(dir, step);
    std::fs::create_dir_all(&sd).map_err(|e| err(&sd, e))?;
    let mut metas = Vec::new();
    let mut blobs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for st in states {
        let name = params
            .get(st.param.index())
            .map_or_else(|| st.param.to_string(), |p| p.name.clone());
        metas.push(PieceMeta {
            name: name.clone(),
            boxes: st.slice.boxes.clone(),
            axis: st.axis,
            pad_rows: st.slice.pad.map_or(0, |p| p.rows),
            weight: st.weight.owned,
            m: st.m.owned,
            v: st.v.owned,
        });
        for (field, pc) in [("weight", &st.weight), ("m", &st.m), ("v", &st.v)] {
            blobs.push((
                format!("{name}/{field}"),
                vec![pc.data.len()],
                bytes_of(&pc.data),
            ));
        }
    }
    let path = sd.join(rank_file(rank));
    let mut views = Vec::new();
    for (n, shape, b) in &blobs {
        views.push((
            n.clone(),
            TensorView::new(Dtype::F32, shape.clone(), b).map_err(|e| err(&path, e))?,
        ));
    }
    let meta = HashMap::from([(
        "plait".to_string(),
        serde_json::to_string(&metas).map_err(|e| err(&path, e))?,
    )]);
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| err(&path, e))?;
    atomic_write(&path, &bytes)
}

/// Rank 0, after every rank's [`save_rank`]: the index and the `latest` pointer.
pub fn commit(
    dir: &Path,
    step: u64,
    model: &str,
    (mesh, cp): ([u32; 3], u32),
    params: &[ParamInfo],
    ranks: u32,
) -> Result<(), RuntimeError> {
    let sd = step_dir(dir, step);
    let index = Index {
        format: FORMAT.into(),
        model: model.into(),
        step,
        mesh,
        cp,
        params: params.to_vec(),
        files: (0..ranks).map(rank_file).collect(),
    };
    let p = sd.join("index.json");
    let text = serde_json::to_string_pretty(&index).map_err(|e| err(&p, e))?;
    atomic_write(&p, text.as_bytes())?;
    let name = sd
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    atomic_write(&dir.join("latest"), name.as_bytes())
}

fn floats(path: &Path, t: &TensorView<'_>) -> Result<Vec<f32>, RuntimeError> {
    if t.dtype() != Dtype::F32 {
        return Err(err(
            path,
            format!("a tensor of {:?}, expected F32", t.dtype()),
        ));
    }
    Ok(t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Writes rank `rank`'s own state of step `step` beside its pieces (before [`commit`]): what
/// no other layout could use, such as top-k's error-feedback residuals.
pub fn save_local(
    dir: &Path,
    step: u64,
    rank: u32,
    named: &[(String, Vec<f32>)],
) -> Result<(), RuntimeError> {
    let path = step_dir(dir, step).join(local_file(rank));
    let blobs: Vec<(&String, Vec<u8>, usize)> = named
        .iter()
        .map(|(n, v)| (n, bytes_of(v), v.len()))
        .collect();
    let mut views = Vec::new();
    for (n, b, len) in &blobs {
        views.push((
            (*n).clone(),
            TensorView::new(Dtype::F32, vec![*len], b).map_err(|e| err(&path, e))?,
        ));
    }
    let bytes = safetensors::serialize(views, None).map_err(|e| err(&path, e))?;
    atomic_write(&path, &bytes)
}

/// Rank `rank`'s own state in the latest checkpoint (none if it wrote none).
pub fn load_local(dir: &Path, rank: u32) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let sd = latest_dir(dir)?;
    let path = sd.join(local_file(rank));
    if !path.exists() {
        return Ok(vec![]);
    }
    let bytes = std::fs::read(&path).map_err(|e| err(&path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| err(&path, e))?;
    let mut out = Vec::new();
    for (name, t) in st.tensors() {
        out.push((name, floats(&path, &t)?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn local_file(r: u32) -> String {
    format!("rank-{r:05}.local.safetensors")
}

/// The directory `latest` points at.
fn latest_dir(dir: &Path) -> Result<PathBuf, RuntimeError> {
    let latest = dir.join("latest");
    let name = std::fs::read_to_string(&latest).map_err(|e| err(&latest, e))?;
    Ok(dir.join(name.trim()))
}

/// Loads the latest checkpoint in `dir` as full tensors for the parameter table `params`.
pub fn load_latest(dir: &Path, params: &[ParamInfo]) -> Result<Loaded, RuntimeError> {
    load_latest_of(dir, params, None)
}

/// [`load_latest`] from the files of `only` these ranks (one data-parallel replica, whose
/// state may differ from the others' under local SGD); all ranks' when `None`.
pub fn load_latest_of(
    dir: &Path,
    params: &[ParamInfo],
    only: Option<&[u32]>,
) -> Result<Loaded, RuntimeError> {
    let latest = dir.join("latest");
    let name = std::fs::read_to_string(&latest).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            err(
                dir,
                "no checkpoint here (no `latest` file): point --checkpoint-dir at the directory \
                 a run with --checkpoint-dir wrote, or start without --resume",
            )
        } else {
            err(&latest, e)
        }
    })?;
    let sd = dir.join(name.trim());
    let ip = sd.join("index.json");
    let text = std::fs::read_to_string(&ip).map_err(|e| err(&ip, e))?;
    let index: Index = serde_json::from_str(&text).map_err(|e| err(&ip, e))?;
    if index.format != FORMAT {
        return Err(err(
            &ip,
            format!("format `{}`, expected `{FORMAT}`", index.format),
        ));
    }
    let pos: HashMap<&str, usize> = index
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    let mut states = Vec::new();
    for (r, f) in index.files.iter().enumerate() {
        if only.is_some_and(|o| !o.contains(&(r as u32))) {
            continue;
        }
        let path = sd.join(f);
        let bytes = std::fs::read(&path).map_err(|e| err(&path, e))?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| err(&path, e))?;
        let metas: Vec<PieceMeta> = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("plait"))
            .ok_or_else(|| err(&path, "no `plait` metadata"))
            .and_then(|s| serde_json::from_str(s).map_err(|e| err(&path, e)))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| err(&path, e))?;
        for pm in metas {
            let i = *pos
                .get(pm.name.as_str())
                .ok_or_else(|| err(&path, format!("`{}` is not in the index", pm.name)))?;
            let get = |field: &str, owned| -> Result<Piece, RuntimeError> {
                let t = st
                    .tensor(&format!("{}/{field}", pm.name))
                    .map_err(|e| err(&path, e))?;
                Ok(Piece {
                    owned,
                    data: floats(&path, &t)?,
                })
            };
            states.push(ShardState {
                param: ParamId(i as u32),
                slice: Slice {
                    boxes: pm.boxes.clone(),
                    owned: (0, 0),
                    pad: (pm.pad_rows > 0).then_some(program::Pad {
                        axis: pm.axis,
                        rows: pm.pad_rows,
                    }),
                },
                axis: pm.axis,
                weight: get("weight", pm.weight)?,
                m: get("m", pm.m)?,
                v: get("v", pm.v)?,
            });
        }
    }
    let full = |f: Field| assemble(&index.params, &states, f);
    let (w, m, v) = (full(Field::Weight), full(Field::M), full(Field::V));
    let mut out = Loaded {
        step: index.step,
        mesh: index.mesh,
        cp: index.cp,
        ranks: index.files.len(),
        weights: BTreeMap::new(),
        m: Vec::new(),
        v: Vec::new(),
    };
    for p in params {
        let i = *pos.get(p.name.as_str()).ok_or_else(|| {
            err(
                &ip,
                format!("parameter `{}` is not in the checkpoint", p.name),
            )
        })?;
        let want: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
        if w[i].shape != want {
            return Err(err(
                &ip,
                format!(
                    "`{}` has shape {:?}, the programs {want:?}",
                    p.name, w[i].shape
                ),
            ));
        }
        out.weights.insert(p.name.clone(), w[i].clone());
        out.m.push(m[i].clone());
        out.v.push(v[i].clone());
    }
    Ok(out)
}
