//! The help says what plait does today and what each knob means for the command at hand.

mod common;

use common::plait;

/// `--help` says which knobs `compile` searches, instead of a default it does not use, and the
/// top-level help says what plait does today.
#[test]
fn help_says_what_is_searched() {
    let (code, out, _) = plait(&["compile", "--help"]);
    assert_eq!(code, 0);
    for stale in ["[default: 0]", "[default: none]", "[default: off]"] {
        assert!(!out.contains(stale), "{stale} in:\n{out}");
    }
    assert!(out.contains("searched unless given"), "{out}");
    let (_, top, _) = plait(&["--help"]);
    assert!(!top.contains("in later stages"), "{top}");
    let (_, show, _) = plait(&["show", "--help"]);
    assert!(
        show.contains("The global rank whose program to print"),
        "{show}"
    );
}

/// A plan for CPU ranks prints its rate in GFLOP/s, not as 0.0 TFLOP/s.
#[test]
fn cpu_rates_print_at_a_readable_scale() {
    let (code, out, err) = plait(&[
        "estimate",
        "gpt2",
        "--cluster",
        "cpu",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "--seq",
        "64",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "2",
        "--micro-batch",
        "2",
        "--precision",
        "fp32",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("model GFLOP/s per GPU"), "{out}");
    assert!(!out.contains("0.0 model TFLOP/s"), "{out}");
}
