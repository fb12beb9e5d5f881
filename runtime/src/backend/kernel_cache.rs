//! Compiled kernels kept for the next time (feature `cuda`): in the process, so that ranks that
//! are threads compile once, and on disk, so that the next `plait run` loads in milliseconds
//! what NVRTC takes many seconds to build (the tensor-core attention's templates dominate).
//! PyTorch's and Triton's kernel caches work the same way: a file named by a hash of everything
//! that decides the output (source, options, NVRTC's version, target), written atomically,
//! and a cache that cannot be read or written is only a slower start, never an error.
//!
//! Folder: `$PLAIT_KERNEL_CACHE`, else `$XDG_CACHE_HOME/plait/kernels`, else
//! `$HOME/.cache/plait/kernels`; `PLAIT_KERNEL_CACHE=off` keeps nothing on disk.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// What decides a compilation's output.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// The target (`sm_90`, `compute_80`).
    pub target: String,
    /// 64-bit FNV-1a of the source, the options and the compiler's version.
    pub hash: u64,
}

impl Key {
    pub fn new(target: &str, parts: &[&[u8]]) -> Key {
        Key {
            target: target.to_string(),
            hash: fnv1a(parts),
        }
    }

    fn file_name(&self) -> String {
        format!("{:016x}-{}.bin", self.hash, self.target)
    }
}

/// FNV-1a over the parts, each followed by a separator byte so that ("ab", "c") and ("a",
/// "bc") differ.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut h = OFFSET;
    for part in parts {
        for &b in part.iter().chain(std::iter::once(&0xffu8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

fn memo() -> &'static Mutex<HashMap<Key, Arc<Vec<u8>>>> {
    static MEMO: OnceLock<Mutex<HashMap<Key, Arc<Vec<u8>>>>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

/// The disk cache's folder, or `None` when it is off or no home is known.
pub fn folder() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    match env("PLAIT_KERNEL_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("plait").join("kernels")),
    }
}

/// The bytes for `key`: from the process's memo, the disk cache, or `build` (then kept in
/// both). The memo's lock is held while building, so threads asking at once build once.
pub fn get_or_build<E>(
    key: &Key,
    build: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<Arc<Vec<u8>>, E> {
    let mut memo = memo().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(bytes) = memo.get(key) {
        return Ok(Arc::clone(bytes));
    }
    let path = folder().map(|f| f.join(key.file_name()));
    let bytes = match path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        Some(bytes) if !bytes.is_empty() => bytes,
        _ => {
            let bytes = build()?;
            if let Some(p) = &path {
                store(p, &bytes);
            }
            bytes
        }
    };
    let bytes = Arc::new(bytes);
    memo.insert(key.clone(), Arc::clone(&bytes));
    Ok(bytes)
}

/// Writes `bytes` to `path` through a temporary file and a rename, so that a reader never
/// sees half a file; failures leave no cache entry and are otherwise ignored.
fn store(path: &std::path::Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_hash_separates_its_parts_and_follows_every_byte() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_ne!(fnv1a(&[b"source"]), fnv1a(&[b"sourcf"]));
        assert_eq!(fnv1a(&[b"x", b"y"]), fnv1a(&[b"x", b"y"]));
    }

    #[test]
    fn a_build_is_kept_in_the_process_and_on_disk() {
        let dir = std::env::temp_dir().join(format!("plait-kernel-cache-{}", std::process::id()));
        let key = Key::new("sm_test", &[b"a source", b"options"]);
        let path = dir.join(key.file_name());
        store(&path, b"compiled");
        assert_eq!(std::fs::read(&path).unwrap(), b"compiled");
        // The memo: a second request does not build.
        let memo_key = Key::new("sm_memo", &[dir.to_string_lossy().as_bytes()]);
        let first = get_or_build(&memo_key, || Ok::<_, ()>(b"once".to_vec())).unwrap();
        let second = get_or_build(&memo_key, || Err(())).unwrap();
        assert_eq!(
            (first.as_slice(), second.as_slice()),
            (&b"once"[..], &b"once"[..])
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
