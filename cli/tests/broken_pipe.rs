//! `plait compile … | head`: a reader that closes its end early is not an error; plait ends
//! quietly (exit 0, no panic message) instead of panicking with exit 101.

use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_ends_plait_quietly() {
    for args in [
        &[
            "compile",
            "gpt2",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "64",
        ][..],
        &["models"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_plait"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("plait starts");
        // Close the read end before plait prints anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("plait ends");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
