//! Every `.ir` file under `tests/broken/` is rejected with the messages its header expects.
//!
//! Header lines (at the top of the file, before `graph`):
//! - `; expect: FRAGMENT` — the file parses, and the verifier reports an error whose text
//!   contains FRAGMENT. The verifier must report exactly as many errors as there are
//!   `expect` lines, each matching a different line.
//! - `; expect-parse: LINE:COLUMN: FRAGMENT` — parsing fails at that position with a message
//!   containing FRAGMENT.

use std::fs;
use std::path::{Path, PathBuf};

use ir::text::parse;
use ir::verify::verify;

fn broken_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broken");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("the test directory is readable")
        .map(|e| e.expect("the test directory is readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ir"))
        .collect();
    files.sort();
    files
}

fn header(src: &str, key: &str) -> Vec<String> {
    src.lines()
        .take_while(|l| l.starts_with(';'))
        .filter_map(|l| l.strip_prefix(key))
        .map(|l| l.trim().to_string())
        .collect()
}

fn check(path: &Path) -> Result<(), String> {
    let src = fs::read_to_string(path).map_err(|e| e.to_string())?;
    let expect_parse = header(&src, "; expect-parse:");
    let expect = header(&src, "; expect:");
    match (parse(&src), expect_parse.as_slice()) {
        (Ok(_), [want, ..]) => Err(format!("parsed, but expected a parse error {want}")),
        (Err(e), [want]) => {
            let (pos, fragment) = want
                .split_once(": ")
                .ok_or("expect-parse must be LINE:COLUMN: FRAGMENT")?;
            let got_pos = format!("{}:{}", e.line, e.column);
            if got_pos != pos || !e.message.contains(fragment) {
                return Err(format!("expected parse error `{want}`, got `{e}`"));
            }
            Ok(())
        }
        (Err(e), _) => Err(format!("unexpected parse error `{e}`")),
        (Ok(graph), []) => {
            if expect.is_empty() {
                return Err("no `; expect:` header".into());
            }
            let errors: Vec<String> = match verify(&graph) {
                Ok(()) => vec![],
                Err(e) => e.errors.iter().map(ToString::to_string).collect(),
            };
            let mut unmatched = errors.clone();
            for want in &expect {
                match unmatched.iter().position(|e| e.contains(want.as_str())) {
                    Some(i) => {
                        unmatched.remove(i);
                    }
                    None => return Err(format!("no error contains `{want}`; got:\n{errors:#?}")),
                }
            }
            if !unmatched.is_empty() {
                return Err(format!("unexpected extra errors:\n{unmatched:#?}"));
            }
            Ok(())
        }
    }
}

#[test]
fn broken_files_report_expected_errors() {
    let files = broken_files();
    assert!(
        files.len() >= 10,
        "expected the broken files, found {files:?}"
    );
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| check(f).err().map(|e| format!("{}: {e}", f.display())))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
