//! Hugging Face Hub ids (`org/name`), read from the local cache that `huggingface-cli download`,
//! transformers and vLLM fill: a model someone has downloaded is named as they name it, and
//! plait never reaches the network.
//!
//! The cache's layout is huggingface_hub's (`file_download.py`): the repository's folder
//! `models--{org}--{name}`, the commit a branch points at in `refs/{branch}`, and that commit's
//! files in `snapshots/{commit}/`.

use std::path::{Path, PathBuf};

/// Whether `model` reads as a Hub model id: `org/name`, each part of ASCII letters, digits,
/// `-`, `_` and `.` (the Hub's rule), neither part `.` or `..`.
pub fn is_hub_id(model: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match model.split_once('/') {
        Some((org, name)) => part(org) && part(name),
        None => false,
    }
}

/// The Hub cache as huggingface_hub finds it: `HF_HUB_CACHE` (or the older
/// `HUGGINGFACE_HUB_CACHE`), else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else
/// `~/.cache/huggingface/hub`; none without a home directory.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return Some(PathBuf::from(dir));
    }
    if let Some(home) = var("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("huggingface").join("hub"))
}

/// The folder of `id`'s repository in `cache`.
pub fn repo_dir(cache: &Path, id: &str) -> PathBuf {
    cache.join(format!("models--{}", id.replace('/', "--")))
}

/// The `config.json` of `id` in `cache`: the snapshot `refs/main` points at, else (a cache
/// filled at another revision) the most recently written snapshot that holds one.
pub fn cached_config(cache: &Path, id: &str) -> Option<PathBuf> {
    let repo = repo_dir(cache, id);
    let snapshots = repo.join("snapshots");
    let main = std::fs::read_to_string(repo.join("refs").join("main"))
        .ok()
        .map(|commit| snapshots.join(commit.trim()).join("config.json"))
        .filter(|c| c.is_file());
    main.or_else(|| newest_snapshot_config(&snapshots))
}

fn newest_snapshot_config(snapshots: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(snapshots).ok()?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path().join("config.json"))
        .filter(|c| c.is_file())
        .max_by_key(|c| std::fs::metadata(c).and_then(|m| m.modified()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_org_slash_name() {
        for id in [
            "meta-llama/Llama-3.1-8B",
            "HuggingFaceTB/SmolLM3-3B",
            "a/b.c_d",
        ] {
            assert!(is_hub_id(id), "{id}");
        }
        for not in [
            "gpt2",
            "a/b/c",
            "/abs",
            "org/",
            "../x",
            "./config.json",
            "org/na me",
        ] {
            assert!(!is_hub_id(not), "{not}");
        }
    }
}
