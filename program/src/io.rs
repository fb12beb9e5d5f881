//! The program directory: `index.json` (mesh, groups, parameters, ranks, predictions) and one
//! `template-K.json` per template.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ProgramError;
use crate::{FORMAT, Group, MeshInfo, ParamInfo, Predicted, ProgramSet, RankInfo, Template};

#[derive(Serialize, Deserialize)]
struct Index {
    format: String,
    model: String,
    mesh: MeshInfo,
    params: Vec<ParamInfo>,
    groups: Vec<Group>,
    predicted: Vec<Predicted>,
    ranks: Vec<RankInfo>,
    templates: Vec<String>,
}

fn io(path: &Path, e: impl ToString) -> ProgramError {
    ProgramError::Io {
        path: path.into(),
        message: e.to_string(),
    }
}

/// Writes the set into `dir` (created if needed): a new or empty directory, or one that holds
/// a program written before (replaced). Nothing is written into a file's place or among other
/// files (a user's `index.json` would be overwritten).
pub fn write(set: &ProgramSet, dir: &Path) -> Result<(), ProgramError> {
    check_destination(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let names: Vec<String> = set
        .templates
        .iter()
        .map(|t| format!("template-{}.json", t.id.0))
        .collect();
    let jobs: Vec<(&Template, &String)> = set.templates.iter().zip(&names).collect();
    for written in on_every_core(&jobs, |(t, name)| {
        let p = dir.join(name);
        let text = serde_json::to_string(t).map_err(|e| io(&p, e))?;
        std::fs::write(&p, text).map_err(|e| io(&p, e))
    }) {
        written?;
    }
    let index = Index {
        format: set.format.clone(),
        model: set.model.clone(),
        mesh: set.mesh.clone(),
        params: set.params.clone(),
        groups: set.groups.clone(),
        predicted: set.predicted.clone(),
        ranks: set.ranks.clone(),
        templates: names,
    };
    let p = dir.join("index.json");
    let text = serde_json::to_string_pretty(&index).map_err(|e| io(&p, e))?;
    std::fs::write(&p, text + "\n").map_err(|e| io(&p, e))
}

/// Refuses a destination that is a file, or a directory of other files: one holding anything
/// but a program's own files (`index.json`, `template-K.json`, `template-K.mlir`: a program
/// written before, or one whose writing was cut short) and hidden files (`.keep`), or an
/// `index.json` that is not a program's.
fn check_destination(dir: &Path) -> Result<(), ProgramError> {
    let Ok(meta) = std::fs::metadata(dir) else {
        return check_creatable(dir);
    };
    if !meta.is_dir() {
        return Err(ProgramError::NotADirectory { path: dir.into() });
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let others = names.iter().filter(|n| !a_programs_own(n)).count();
    let foreign_index = names.iter().any(|n| n == "index.json") && !holds_a_program(dir);
    if others == 0 && !foreign_index {
        return Ok(());
    }
    Err(ProgramError::ForeignDirectory {
        path: dir.into(),
        others,
        foreign_index,
    })
}

/// A destination that does not exist yet: refused where creating it would fail on a link to
/// nothing or on a file in place of a parent directory (`notes.txt/programs`, or `notes.txt/`).
fn check_creatable(dir: &Path) -> Result<(), ProgramError> {
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(ProgramError::DanglingLink { path: dir.into() });
    }
    let text = dir.to_string_lossy();
    let trimmed = Path::new(text.trim_end_matches(std::path::MAIN_SEPARATOR));
    for a in trimmed.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        if let Ok(meta) = std::fs::metadata(a) {
            if !meta.is_dir() {
                return Err(ProgramError::NotADirectory { path: a.into() });
            }
            break;
        }
    }
    Ok(())
}

/// Whether a directory entry named `name` is a program's own file, or hidden.
fn a_programs_own(name: &str) -> bool {
    let template = name
        .strip_prefix("template-")
        .and_then(|r| r.strip_suffix(".json").or_else(|| r.strip_suffix(".mlir")))
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
    name == "index.json" || name.starts_with('.') || template
}

/// Whether `dir/index.json` is a program index (its `format` is plait's, of any version).
fn holds_a_program(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("index.json")) else {
        return false;
    };
    let family = FORMAT.split('/').next().unwrap_or(FORMAT);
    serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| {
        v["format"]
            .as_str()
            .is_some_and(|f| f.split('/').next() == Some(family))
    })
}

/// Reads a set written by [`write`].
pub fn read(dir: &Path) -> Result<ProgramSet, ProgramError> {
    let p = dir.join("index.json");
    let text = std::fs::read_to_string(&p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            io(
                dir,
                "not a program directory (no index.json); write one with `plait codegen PLAN -o DIR`",
            )
        } else {
            io(&p, e)
        }
    })?;
    let index: Index = serde_json::from_str(&text).map_err(|e| ProgramError::Format {
        path: p.clone(),
        message: e.to_string(),
    })?;
    if index.format != FORMAT {
        return Err(ProgramError::Format {
            path: p,
            message: format!("format `{}`; this plait reads `{FORMAT}`", index.format),
        });
    }
    if let Some(name) = index
        .templates
        .iter()
        .find(|name| name.contains('/') || name.contains(".."))
    {
        return Err(ProgramError::Format {
            path: p.clone(),
            message: format!("template name `{name}`"),
        });
    }
    let templates = on_every_core(&index.templates, |name| {
        let tp = dir.join(name);
        let text = std::fs::read_to_string(&tp).map_err(|e| io(&tp, e))?;
        serde_json::from_str::<Template>(&text).map_err(|e| ProgramError::Format {
            path: tp.clone(),
            message: e.to_string(),
        })
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    Ok(ProgramSet {
        format: index.format,
        model: index.model,
        mesh: index.mesh,
        params: index.params,
        groups: index.groups,
        predicted: index.predicted,
        ranks: index.ranks,
        templates,
    })
}

/// `f` of each item, in order, computed on as many threads as the machine has cores: a
/// pipeline plan's templates are read and written independently, and parsing their JSON is
/// most of what `plait verify` and `plait run DIR` spend before their first step.
fn on_every_core<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(k) else { break };
                        mine.push((k, f(item)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    done.sort_by_key(|(k, _)| *k);
    done.into_iter().map(|(_, r)| r).collect()
}
