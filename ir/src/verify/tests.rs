//! Invariants the text form cannot express (broken ids, orders, tables); the rest are covered
//! by `tests/broken/*.ir`.

use crate::graph::{Graph, OpId, ValueId};
use crate::op::OpKind;
use crate::types::{DType, Shape, TensorType};
use crate::verify::{ErrorKind, Location, verify};

fn f32s(dims: &[u64]) -> TensorType {
    TensorType::new(DType::F32, Shape::fixed(dims))
}

/// x -> neg -> exp, output "y".
fn small() -> Graph {
    let mut g = Graph::new("small");
    let x = g.push_source(OpKind::Input { name: "x".into() }, f32s(&[4]), None);
    let n = g.push_op(OpKind::Neg, vec![x], None).unwrap()[0];
    let e = g.push_op(OpKind::Exp, vec![n], None).unwrap()[0];
    g.add_output("y", e);
    g
}

fn messages(g: &Graph) -> Vec<String> {
    match verify(g) {
        Ok(()) => vec![],
        Err(e) => e.errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_valid_graph_verifies() {
    assert_eq!(messages(&small()), Vec::<String>::new());
}

#[test]
fn order_errors() {
    let mut g = small();
    g.set_order(vec![OpId(0), OpId(1), OpId(1), OpId(7)]);
    assert_eq!(
        messages(&g),
        [
            "graph: position 3 of the execution order names op7, which does not exist",
            "op1: %1 = neg: appears 2 times in the execution order",
            "op2: %?2 = exp: not in the execution order",
        ]
    );
}

#[test]
fn operand_defined_by_an_unordered_op() {
    let mut g = small();
    g.set_order(vec![OpId(0), OpId(2)]);
    assert_eq!(
        messages(&g),
        [
            "op1: %?1 = neg: not in the execution order",
            "op2: %1 = exp: operand 0 (%?1) is defined by op1, which is not in the execution order",
        ]
    );
}

#[test]
fn dangling_ids() {
    let mut g = small();
    g.op_mut(OpId(1)).inputs = vec![ValueId(99)];
    g.outputs.push(("z".into(), ValueId(50)));
    let errors = verify(&g).unwrap_err().errors;
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(
        errors[0].kind,
        ErrorKind::UndefinedOperand {
            index: 0,
            value: ValueId(99)
        }
    );
    assert_eq!(errors[1].location, Location::Output { name: "z".into() });
    assert_eq!(
        errors[1].to_string(),
        "output \"z\": refers to value #50, which does not exist"
    );
}

#[test]
fn result_table_errors() {
    let mut g = small();
    // Swap the results of neg and exp: each value's def now names the other op.
    g.op_mut(OpId(1)).results = vec![ValueId(2)];
    g.op_mut(OpId(2)).results = vec![ValueId(1)];
    let m = messages(&g);
    assert!(
        m.contains(
            &"op1: %1 = neg: result 0 (%1) records its definition as result 0 of op2".into()
        ),
        "{m:#?}"
    );
    assert!(m.contains(
        &"value #1: records its definition as result 0 of op1, which does not list it".into()
    ));

    let mut g = small();
    g.op_mut(OpId(2)).results = vec![];
    let m = messages(&g);
    assert!(
        m.contains(&"op2: exp: has 0 result(s), exp defines 1".into()),
        "{m:#?}"
    );
    assert!(m.contains(
        &"value #2: records its definition as result 0 of op2, which does not list it".into()
    ));

    let mut g = small();
    g.op_mut(OpId(2)).results = vec![ValueId(2), ValueId(8)];
    let m = messages(&g);
    assert!(
        m.contains(&"op2: %2, %?8 = exp: result 1 is value #8, which does not exist".into()),
        "{m:#?}"
    );
}

#[test]
fn huge_layer_tags_do_not_panic() {
    let mut g = small();
    g.block_name = Some("blk".into());
    g.op_mut(OpId(1)).layer = Some(u32::MAX);
    assert_eq!(
        messages(&g),
        ["graph: layer 0 has no compute ops (layer tags must be dense, 0..4294967296)"]
    );
}

#[test]
fn errors_display_as_a_list() {
    let mut g = small();
    g.set_order(vec![]);
    let text = verify(&g).unwrap_err().to_string();
    assert!(
        text.starts_with("3 verifier error(s)\n  op0: %?0 = input: not in the execution order"),
        "{text}"
    );
}

/// Sizes near u64::MAX reach arithmetic in type inference; they must give errors, not panics.
#[test]
fn overflowing_sizes_are_errors() {
    let big = u64::MAX;
    for (src, message) in [
        (
            format!(
                "%0: f32[{big}] = input \"x\"\n%1: f32[1], %2: f32[1] = split{{axis=0, sizes=[{big},1]}} %0"
            ),
            "split sizes overflow",
        ),
        (
            format!(
                "%0: f32[{big},{big},{big}] = input \"x\"\n%1: f32[1] = reshape{{shape=[1]}} %0"
            ),
            "element counts differ",
        ),
        (
            format!("%0: f32[{big}] = input \"x\"\n%1: f32[1] = concat{{axis=0}} %0, %0"),
            "concat size overflows",
        ),
    ] {
        let g = crate::text::parse(&format!("graph \"g\"\n{src}\n")).unwrap();
        let text = verify(&g).unwrap_err().to_string();
        assert!(text.contains(message), "{text}");
    }
}

/// Three layers: layer 0 negates, layers 1 and 2 take `tanh` (a dense layer before two of
/// another structure, as DeepSeek-V3's), with `kind_starts` as given.
fn two_runs(kind_starts: Vec<u32>) -> Graph {
    let mut g = Graph::new("runs");
    g.block_name = Some("blk".into());
    g.kind_starts = kind_starts;
    let mut x = g.push_source(OpKind::Input { name: "x".into() }, f32s(&[4]), None);
    for (layer, kind) in [OpKind::Neg, OpKind::Tanh, OpKind::Tanh]
        .into_iter()
        .enumerate()
    {
        x = g.push_op(kind, vec![x], Some(layer as u32)).unwrap()[0];
    }
    g.add_output("y", x);
    g
}

#[test]
fn each_layer_matches_the_first_layer_of_its_run() {
    assert_eq!(messages(&two_runs(vec![1])), Vec::<String>::new());
    assert_eq!(
        messages(&two_runs(vec![])),
        [
            "op2: %2 = tanh: layer 1 differs from layer 0: op 0 is tanh, that layer has neg (%1 = neg)",
            "op3: %3 = tanh: layer 2 differs from layer 0: op 0 is tanh, that layer has neg (%1 = neg)"
        ]
    );
    // Layer 1 starts no run: it is compared with layer 0; layer 2 starts its own.
    assert_eq!(messages(&two_runs(vec![2])).len(), 1);
    for bad in [vec![0], vec![3], vec![2, 1]] {
        let m = messages(&two_runs(bad.clone()));
        assert!(
            m.len() == 1 && m[0].contains("kind_starts"),
            "{bad:?}: {m:#?}"
        );
    }
    let g = two_runs(vec![1]);
    let text = crate::text::print(&g);
    assert!(text.contains("block \"blk\" kind_starts 1\n"), "{text}");
    assert_eq!(crate::text::parse(&text).unwrap(), g);
}

/// Attention of two heads, with `window`.
fn attention(window: Option<u64>, causal: bool) -> OpKind {
    OpKind::Attention {
        heads: 2,
        kv_heads: 2,
        scale: 0.5,
        causal,
        softcap: None,
        sinks: false,
        window,
        chunk: None,
    }
}

/// Two layers of attention on q = k = v `[1, 4, 8]`, the first with `window`, the second
/// with none.
fn windowed_then_full(window: Option<u64>, causal: bool) -> Graph {
    let mut g = Graph::new("windows");
    g.block_name = Some("blk".into());
    let mut x = g.push_source(OpKind::Input { name: "x".into() }, f32s(&[1, 4, 8]), None);
    for (layer, window) in [window, None].into_iter().enumerate() {
        let kind = attention(window, causal);
        x = g.push_op(kind, vec![x, x, x], Some(layer as u32)).unwrap()[0];
    }
    g.add_output("y", x);
    g
}

/// A window is a per-layer attribute (Gemma 2's and gpt-oss's layers alternate): layers that
/// differ only in it are one structure; a window of no keys, or on non-causal attention, is
/// refused (the builder checks types as the verifier does).
#[test]
fn attention_windows_may_differ_between_layers() {
    assert_eq!(
        messages(&windowed_then_full(Some(2), true)),
        Vec::<String>::new()
    );
    let g = windowed_then_full(Some(2), true);
    assert_eq!(crate::text::parse(&crate::text::print(&g)).unwrap(), g);
    let mut g = Graph::new("bad");
    let x = g.push_source(OpKind::Input { name: "x".into() }, f32s(&[1, 4, 8]), None);
    for (window, causal, why) in [
        (Some(0), true, "at least one key"),
        (Some(2), false, "needs causal attention"),
    ] {
        let e = g
            .push_op(attention(window, causal), vec![x, x, x], None)
            .unwrap_err();
        assert!(e.reason.contains(why), "{e}");
    }
}
