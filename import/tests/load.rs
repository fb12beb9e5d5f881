//! `import::load_model` resolves every way of naming a model, and every graph it or the
//! builders return verifies.

use std::path::PathBuf;

use import::{Error, Source, load_model};

fn repo(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("plait-load-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn verifies(g: &ir::Graph) {
    if let Err(e) = ir::verify::verify(g) {
        panic!("{} does not verify:\n{e}", g.name);
    }
}

#[test]
fn every_zoo_model_builds_and_verifies() {
    for spec in import::zoo::zoo() {
        let g = import::build_forward(&spec, ir::DType::F32).expect("builds");
        verifies(&g);
        assert_eq!(g.param_count(), spec.param_count(), "{}", spec.name);
        assert_eq!(g.num_layers() as u64, spec.layers, "{}", spec.name);
    }
}

#[test]
fn zoo_name() {
    let m = load_model("GPT2", 4, None).expect("zoo name, any case");
    assert_eq!(
        m.source,
        Source::Zoo {
            name: "gpt2".into()
        }
    );
    assert_eq!((m.binding.batch, m.binding.seq), (4, 1024));
    assert!(m.weights.is_none());
    assert_eq!(m.graph.param_count(), 124_439_808);
    verifies(&m.graph);
}

#[test]
fn onnx_file_at_requested_shape_keeps_weights() {
    let path = repo("fixtures/onnx/llama_gqa_tiny/model.onnx");
    let m = load_model(&path, 2, Some(8)).expect("fixture loads");
    assert!(matches!(m.source, Source::Onnx { .. }));
    assert_eq!((m.binding.batch, m.binding.seq), (2, 8));
    assert_eq!(m.graph.param_count(), 162_240);
    assert_eq!(m.graph.num_layers(), 3);
    let weights = m.weights.expect("ONNX weights are kept");
    for (name, _) in m.graph.params() {
        assert!(weights.contains_key(&name), "weight of {name}");
    }
    verifies(&m.graph);
}

#[test]
fn onnx_default_seq_fits_the_position_table() {
    // GPT-2's learned positions have 64 rows: the default (128) is lowered to 64.
    let m = load_model(&repo("fixtures/onnx/gpt2_tiny/model.onnx"), 1, None).expect("loads");
    assert_eq!(m.binding.seq, 64);
    // Llama has rotary positions: no limit, so the default applies.
    let m = load_model(&repo("fixtures/onnx/llama_gqa_tiny/model.onnx"), 1, None).expect("loads");
    assert_eq!(m.binding.seq, import::DEFAULT_ONNX_SEQ);
}

#[test]
fn directory_with_model_onnx() {
    let m = load_model(&repo("fixtures/onnx/gpt2_tiny"), 2, Some(8)).expect("dir loads");
    assert_eq!(m.graph.param_count(), 120_576);
    assert_eq!(m.graph.name, "gpt2_tiny");
}

#[test]
fn config_file() {
    let dir = scratch("config");
    let p = dir.join("config.json");
    std::fs::write(&p, r#"{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 32}"#).expect("write");
    let m = load_model(&p.to_string_lossy(), 1, Some(16)).expect("config loads");
    assert_eq!(m.source, Source::Config { path: p.clone() });
    assert_eq!(m.binding.seq, 16);
    verifies(&m.graph);
    // The directory resolves to its config.json.
    let m = load_model(&dir.to_string_lossy(), 1, None).expect("dir loads");
    assert_eq!(m.binding.seq, 32);
}

#[test]
fn seq_longer_than_positions_is_refused() {
    let err = load_model("gpt2", 1, Some(2048)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SeqTooLong {
                seq: 2048,
                max: 1024,
                ..
            }
        ),
        "{err:?}"
    );
    let path = repo("fixtures/onnx/gpt2_tiny/model.onnx");
    let err = load_model(&path, 1, Some(100)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::SeqTooLong { max: 64, .. }), "{msg}");
    assert!(
        msg.contains("model.onnx") && msg.contains("at most 64"),
        "{msg}"
    );
}

#[test]
fn unknown_name_lists_the_zoo() {
    let err = load_model("gpt5-turbo", 1, None).unwrap_err();
    match &err {
        Error::UnknownModel { name, zoo } => {
            assert_eq!(name, "gpt5-turbo");
            assert!(zoo.iter().any(|z| z == "llama3-8b"));
        }
        other => panic!("expected UnknownModel, got {other:?}"),
    }
}

#[test]
fn errors_of_each_importer_are_wrapped() {
    let err = load_model("/nonexistent/plait/config.json", 1, None).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let err = load_model("/nonexistent/plait/model.onnx", 1, None).unwrap_err();
    assert!(matches!(err, Error::Onnx(_)), "{err:?}");
    let err = load_model(&scratch("empty").to_string_lossy(), 1, None).unwrap_err();
    assert!(matches!(err, Error::EmptyDir { .. }), "{err:?}");
    let err = load_model("gpt2", 0, None).unwrap_err();
    assert!(matches!(err, Error::BadBinding { .. }), "{err:?}");
}

/// A Hub cache as `huggingface-cli download` leaves it: the repository's folder, `refs/main`
/// naming a commit, that commit's snapshot, and an older snapshot beside it.
fn fake_hub_cache(test: &str, with_ref: bool) -> PathBuf {
    let cache = scratch(test);
    let repo = cache.join("models--HuggingFaceTB--SmolLM3-3B");
    let fixture = std::fs::read_to_string(repo_fixture("smollm3-3b")).expect("fixture");
    for (commit, text) in [
        (
            "0123abc",
            fixture.replace("\"num_hidden_layers\": 36", "\"num_hidden_layers\": 35"),
        ),
        ("4567def", fixture),
    ] {
        let snapshot = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snapshot).expect("snapshot");
        std::fs::write(snapshot.join("config.json"), text).expect("config");
    }
    if with_ref {
        std::fs::create_dir_all(repo.join("refs")).expect("refs");
        std::fs::write(repo.join("refs/main"), "4567def").expect("ref");
    }
    cache
}

fn repo_fixture(name: &str) -> String {
    repo(&format!("fixtures/hf/{name}/config.json"))
}

/// A Hub id reads the snapshot `refs/main` points at (not the older one beside it), named as
/// the repository; without refs, the newest snapshot; an id not in the cache is not found.
#[test]
fn hub_ids_read_the_cached_snapshot_of_main() {
    let cache = fake_hub_cache("hub-main", true);
    let config = import::hub::cached_config(&cache, "HuggingFaceTB/SmolLM3-3B").expect("cached");
    assert!(
        config.ends_with("snapshots/4567def/config.json"),
        "{config:?}"
    );
    let spec = import::hf::read_config(&config).expect("parses");
    assert_eq!((spec.name.as_str(), spec.layers), ("SmolLM3-3B", 36));
    assert!(import::hub::cached_config(&cache, "HuggingFaceTB/SmolLM2-1.7B").is_none());
    let unref = fake_hub_cache("hub-newest", false);
    let old = unref.join("models--HuggingFaceTB--SmolLM3-3B/snapshots/0123abc/config.json");
    let text = std::fs::read_to_string(&old).expect("old");
    // Written last, so newest.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&old, text).expect("touch");
    let config = import::hub::cached_config(&unref, "HuggingFaceTB/SmolLM3-3B").expect("cached");
    assert!(
        config.ends_with("snapshots/0123abc/config.json"),
        "{config:?}"
    );
}
