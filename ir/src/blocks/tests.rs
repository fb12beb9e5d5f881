use crate::blocks::{detect_repeated_layers, layer_summary};
use crate::graph::{Graph, OpId, ValueId};
use crate::op::OpKind;
use crate::text::print;
use crate::types::{DType, Dim, Shape, Sym, TensorType};
use crate::verify::verify;

const H: u64 = 16;

fn ty(dims: &[Dim]) -> TensorType {
    TensorType::new(DType::F32, Shape::of(dims))
}

fn act() -> TensorType {
    ty(&[Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq), Dim::Fixed(H)])
}

/// An imported-looking graph: no tags, every parameter declared up front in name order
/// (`h.10` before `h.2`), a rotary-like table and a scalar shared by all layers, and a final
/// norm of the same kind as each layer's first op.
fn imported(layers: usize) -> (Graph, ValueId, ValueId) {
    let mut g = Graph::new("imported");
    let vec_h = ty(&[Dim::Fixed(H)]);
    let mat = ty(&[Dim::Fixed(H), Dim::Fixed(H)]);
    let ids = g.push_source(
        OpKind::Input { name: "ids".into() },
        TensorType::new(
            DType::I64,
            Shape::of(&[Dim::Sym(Sym::Batch), Dim::Sym(Sym::Seq)]),
        ),
        None,
    );
    let table = g.push_source(
        OpKind::Param {
            name: "embed".into(),
        },
        ty(&[Dim::Fixed(100), Dim::Fixed(H)]),
        None,
    );
    let rope = g.push_source(
        OpKind::Buffer {
            name: "rope".into(),
        },
        vec_h.clone(),
        None,
    );
    let half = g
        .push_op(OpKind::Scalar { value: 0.5 }, vec![], None)
        .unwrap()[0];
    let mut names: Vec<String> = (0..layers)
        .flat_map(|k| [format!("h.{k}.norm"), format!("h.{k}.w")])
        .collect();
    names.sort();
    let mut params = std::collections::HashMap::new();
    for n in names {
        let t = if n.ends_with("norm") {
            vec_h.clone()
        } else {
            mat.clone()
        };
        params.insert(n.clone(), g.push_source(OpKind::Param { name: n }, t, None));
    }
    let mut x = g
        .push_op(OpKind::Embedding, vec![table, ids], None)
        .unwrap()[0];
    for k in 0..layers {
        let op = |g: &mut Graph, kind, inputs| g.push_op(kind, inputs, None).unwrap()[0];
        let h = op(
            &mut g,
            OpKind::RmsNorm { eps: 1e-6 },
            vec![x, params[&format!("h.{k}.norm")]],
        );
        let y = op(
            &mut g,
            OpKind::Linear { bias: false },
            vec![h, params[&format!("h.{k}.w")]],
        );
        let r = op(&mut g, OpKind::Mul, vec![y, rope]);
        let s = op(&mut g, OpKind::Silu, vec![r]);
        let s = op(&mut g, OpKind::Mul, vec![s, half]);
        x = op(&mut g, OpKind::Add, vec![x, s]);
    }
    let norm = g.push_source(
        OpKind::Param {
            name: "norm".into(),
        },
        vec_h,
        None,
    );
    let out = g
        .push_op(OpKind::RmsNorm { eps: 1e-6 }, vec![x, norm], None)
        .unwrap()[0];
    g.add_output("y", out);
    assert!(verify(&g).is_ok());
    (g, rope, half)
}

fn kinds(g: &Graph, ops: &[OpId]) -> Vec<String> {
    ops.iter()
        .filter(|&&o| !g.op(o).kind.is_source())
        .map(|&o| crate::text::KindText(&g.op(o).kind).to_string())
        .collect()
}

#[test]
fn three_layers_are_found_and_shared_sources_stay_untagged() {
    let (mut g, rope, half) = imported(3);
    assert_eq!(detect_repeated_layers(&mut g, "decoder_layer"), 3);
    assert_eq!(g.block_name.as_deref(), Some("decoder_layer"));
    verify(&g).unwrap_or_else(|e| panic!("{e}\n{}", print(&g)));

    let layer0 = kinds(&g, &g.layer_ops(0));
    assert_eq!(
        layer0,
        [
            "rmsnorm{eps=1e-6}",
            "linear{bias=false}",
            "mul",
            "silu",
            "mul",
            "add"
        ]
    );
    for k in 1..3 {
        assert_eq!(kinds(&g, &g.layer_ops(k)), layer0, "layer {k}");
    }
    // Each layer owns exactly its own two parameters.
    for k in 0..3u32 {
        let mut owned: Vec<String> = g
            .layer_ops(k)
            .into_iter()
            .filter_map(|o| match &g.op(o).kind {
                OpKind::Param { name } => Some(name.clone()),
                _ => None,
            })
            .collect();
        owned.sort();
        assert_eq!(owned, [format!("h.{k}.norm"), format!("h.{k}.w")]);
    }
    // Shared sources stay untagged, and so do the compute ops outside the layers.
    for v in [rope, half] {
        assert_eq!(g.op(g.def_op(v)).layer, None);
    }
    let untagged = kinds(
        &g,
        &g.order()
            .iter()
            .copied()
            .filter(|&o| g.op(o).layer.is_none())
            .collect::<Vec<_>>(),
    );
    assert_eq!(untagged, ["embedding", "rmsnorm{eps=1e-6}"]);

    let s = layer_summary(&g).unwrap();
    assert_eq!(s.to_string(), "decoder_layer x3, 6 ops, 272 params each");
}

#[test]
fn twelve_layers_are_not_read_as_six_pairs() {
    let (mut g, _, _) = imported(12);
    assert_eq!(detect_repeated_layers(&mut g, "blk"), 12);
    verify(&g).unwrap();
    assert_eq!(g.num_layers(), 12);
}

#[test]
fn no_repetition_leaves_the_graph_untagged() {
    let (mut g, _, _) = imported(1);
    let before = g.clone();
    assert_eq!(detect_repeated_layers(&mut g, "blk"), 1);
    assert_eq!(g, before);

    let mut empty = Graph::new("empty");
    empty.push_source(OpKind::Input { name: "x".into() }, act(), None);
    assert_eq!(detect_repeated_layers(&mut empty, "blk"), 0);
}

#[test]
fn existing_tags_are_replaced() {
    let (mut g, _, _) = imported(2);
    let first = g.op_ids().next().unwrap();
    g.op_mut(first).layer = Some(7);
    g.block_name = Some("old".into());
    assert_eq!(detect_repeated_layers(&mut g, "new"), 2);
    assert_eq!(g.op(first).layer, None);
    assert_eq!(g.block_name.as_deref(), Some("new"));
    verify(&g).unwrap();
}

#[test]
fn ill_formed_graphs_are_left_alone() {
    let (mut g, _, _) = imported(2);
    g.set_order(vec![]);
    assert_eq!(detect_repeated_layers(&mut g, "blk"), 0);
    assert!(g.block_name.is_none());
}

#[test]
fn summary_needs_a_tagged_block() {
    let (g, _, _) = imported(2);
    assert!(layer_summary(&g).is_none());
}

/// Each layer's dropout has its own seed (its own mask), like its own parameter names: the
/// layers are still identical, in the forward graph and in the training graph's `grad` ops.
#[test]
fn dropout_seeds_are_per_layer() {
    use crate::testing::{TinyConfig, tiny_gpt2};
    let cfg = TinyConfig {
        dropout: 0.1,
        ..TinyConfig::gpt2()
    };
    let g = tiny_gpt2(&cfg).unwrap();
    verify(&g).unwrap();
    let train = crate::autodiff::training_graph(&g, crate::AdamWConfig::default()).unwrap();
    verify(&train).unwrap();
    let mut untagged = g.clone();
    let layers = detect_repeated_layers(&mut untagged, "decoder_layer");
    assert_eq!(layers, cfg.layers as usize);
    verify(&untagged).unwrap();

    // A different rate is a different op.
    let mut changed = g.clone();
    let mut dropouts = changed
        .order()
        .iter()
        .copied()
        .filter(|&o| changed.op(o).layer == Some(1))
        .filter(|&o| matches!(changed.op(o).kind, OpKind::Dropout { .. }))
        .collect::<Vec<OpId>>()
        .into_iter();
    let first = dropouts.next().unwrap();
    changed.op_mut(first).kind = OpKind::Dropout { p: 0.2, seed: 9 };
    let err = verify(&changed).unwrap_err().to_string();
    assert!(err.contains("differs from layer 0"), "{err}");
}

/// Layers alternating two structures (negate, tanh, negate, tanh): each run is found alike to
/// the first earlier run of its structure, and the structure, not the position, decides.
#[test]
fn alternating_runs_are_alike_to_the_first_of_their_structure() {
    let mut g = Graph::new("alternating");
    g.block_name = Some("blk".into());
    g.kind_starts = vec![1, 2, 3];
    let mut x = g.push_source(OpKind::Input { name: "x".into() }, act(), None);
    for (layer, kind) in [OpKind::Neg, OpKind::Tanh, OpKind::Neg, OpKind::Tanh]
        .into_iter()
        .enumerate()
    {
        x = g.push_op(kind, vec![x], Some(layer as u32)).unwrap()[0];
    }
    g.add_output("y", x);
    assert_eq!(
        crate::blocks::earlier_alike(&g, &[0, 1, 2, 3]),
        [None, None, Some(0), Some(1)]
    );
    assert_eq!(crate::blocks::earlier_alike(&g, &[1, 3]), [None, Some(0)]);
}
