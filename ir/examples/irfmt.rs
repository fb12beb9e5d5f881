//! Parses, verifies and reprints an `.ir` file: `cargo run -p ir --example irfmt -- FILE`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: irfmt FILE");
        return ExitCode::FAILURE;
    };
    let src = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let graph = match ir::text::parse(&src) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{path}:{e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", ir::text::print(&graph));
    if let Some(s) = ir::blocks::layer_summary(&graph) {
        println!("; repeated block: {s}");
    }
    match ir::verify::verify(&graph) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
