//! Every `.ir` file under `tests/filetests/` parses, verifies, and round-trips:
//! print → parse → print is byte-identical and gives back an equal graph. A file whose first
//! line is `; canonical...` must also be exactly what the printer writes (comments aside).
//! Files with a repeated block must have their hand-written layer tags recovered by
//! `detect_repeated_layers` once the tags are stripped.

use std::fs;
use std::path::{Path, PathBuf};

use ir::blocks::{detect_repeated_layers, layer_summary};
use ir::text::{parse, print};
use ir::verify::verify;

fn ir_files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(dir);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("the test directory is readable")
        .map(|e| e.expect("the test directory is readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ir"))
        .collect();
    files.sort();
    files
}

fn check(path: &Path) -> Result<(), String> {
    let src = fs::read_to_string(path).map_err(|e| e.to_string())?;
    let graph = parse(&src).map_err(|e| format!("parse: {e}"))?;
    verify(&graph).map_err(|e| format!("verify: {e}"))?;
    let printed = print(&graph);
    let reparsed = parse(&printed).map_err(|e| format!("reparse: {e}\n{printed}"))?;
    verify(&reparsed).map_err(|e| format!("verify after reparse: {e}"))?;
    if print(&reparsed) != printed {
        return Err(format!(
            "print is not a fixed point:\n{printed}\n---\n{}",
            print(&reparsed)
        ));
    }
    if reparsed != graph {
        return Err("reparsed graph differs from the parsed one".into());
    }
    if src.starts_with("; canonical") {
        let stripped: String = src
            .lines()
            .filter(|l| !l.starts_with(';'))
            .map(|l| format!("{l}\n"))
            .collect();
        if stripped != printed {
            return Err(format!("not canonical; the printer writes:\n{printed}"));
        }
    }
    Ok(())
}

#[test]
fn filetests_parse_verify_and_round_trip() {
    let files = ir_files("filetests");
    assert!(files.len() >= 5, "expected the filetests, found {files:?}");
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| check(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Detection on the untagged graph recovers exactly the tags written by hand.
#[test]
fn detection_recovers_hand_written_layers() {
    for (file, layers) in [("gpt2_block.ir", 2), ("llama_block.ir", 2)] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/filetests")
            .join(file);
        let tagged = parse(&fs::read_to_string(path).unwrap()).unwrap();
        let mut untagged = tagged.clone();
        for o in untagged.op_ids().collect::<Vec<_>>() {
            untagged.op_mut(o).layer = None;
        }
        untagged.block_name = None;
        let found = detect_repeated_layers(&mut untagged, "decoder_layer");
        assert_eq!(found, layers, "{file}");
        assert_eq!(print(&untagged), print(&tagged), "{file}");
        verify(&untagged).unwrap();
    }
}

#[test]
fn summary_of_gpt2_block() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests/gpt2_block.ir");
    let g = parse(&fs::read_to_string(path).unwrap()).unwrap();
    let s = layer_summary(&g).unwrap();
    // 64*2 (ln_1) + 64*192+192 + 64*64+64 + 64*2 (ln_2) + 64*256+256 + 256*64+64
    let params = 128 + 12_480 + 4_160 + 128 + 16_640 + 16_448;
    assert_eq!(s.layers.len(), 2);
    assert_eq!(
        s.uniform().map(|l| (l.ops, l.params, l.param_tensors)),
        Some((11, params, 12))
    );
    assert_eq!(s.to_string(), "decoder_layer x2, 11 ops, 50.0K params each");
}
