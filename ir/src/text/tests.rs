use crate::graph::Graph;
use crate::op::{AdamWConfig, OpKind};
use crate::text::{parse, print};
use crate::types::{DType, Dim, Shape, Sym, TensorType};

/// One of every op kind, with attribute values chosen to stress the float and list syntax.
fn every_kind() -> Vec<OpKind> {
    let s = Dim::Sym(Sym::Seq);
    vec![
        OpKind::Input { name: "ids".into() },
        OpKind::Param {
            name: "h.0.w".into(),
        },
        OpKind::Buffer {
            name: "mask".into(),
        },
        OpKind::State {
            name: "step".into(),
        },
        OpKind::Scalar { value: -0.0 },
        OpKind::Iota { len: s },
        OpKind::Embedding,
        OpKind::MatMul,
        OpKind::Linear { bias: true },
        OpKind::Add,
        OpKind::Sub,
        OpKind::Mul,
        OpKind::Div,
        OpKind::Neg,
        OpKind::Exp,
        OpKind::Sqrt,
        OpKind::Rsqrt,
        OpKind::Tanh,
        OpKind::Sigmoid,
        OpKind::Pow {
            exponent: 0.1 + 0.2,
        },
        OpKind::Scale { factor: 1e300 },
        OpKind::Gelu { tanh: false },
        OpKind::Silu,
        OpKind::Relu,
        OpKind::Clamp { limit: 8.0 },
        OpKind::ReduceMean,
        OpKind::ReduceSum,
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: true,
        },
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: false,
        },
        OpKind::RmsNorm { eps: 5e-324 },
        OpKind::Softmax { causal: true },
        OpKind::Attention {
            heads: 32,
            kv_heads: 8,
            scale: 0.08838834764831845,
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        },
        OpKind::Attention {
            heads: 40,
            kv_heads: 8,
            scale: 0.08838834764831845,
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: Some(8192),
        },
        OpKind::Attention {
            heads: 16,
            kv_heads: 8,
            scale: 0.0625,
            causal: true,
            softcap: Some(50.0),
            sinks: false,
            window: Some(4096),
            chunk: None,
        },
        OpKind::Attention {
            heads: 64,
            kv_heads: 8,
            scale: 0.125,
            causal: true,
            softcap: None,
            sinks: true,
            window: None,
            chunk: None,
        },
        OpKind::Rotary {
            heads: 32,
            theta: 500000.0,
            scaling: Default::default(),
        },
        OpKind::Rotary {
            heads: 32,
            theta: 500000.0,
            scaling: crate::RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max: 8192.0,
            },
        },
        OpKind::Rotary {
            heads: 1,
            theta: 10000.0,
            scaling: crate::RopeScaling::Yarn {
                factor: 40.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max: 4096.0,
                attention_factor: 1.1,
                truncate: true,
            },
        },
        OpKind::Rotary {
            heads: 4,
            theta: 10000.0,
            scaling: crate::RopeScaling::Linear { factor: 2.0 },
        },
        OpKind::Rotary {
            heads: 4,
            theta: 10000.0,
            scaling: crate::RopeScaling::Nope,
        },
        OpKind::Rotary {
            heads: 4,
            theta: 10000.0,
            scaling: crate::RopeScaling::Temperature {
                floor: 8192.0,
                scale: 0.1,
            },
        },
        OpKind::Reshape {
            shape: vec![Dim::Sym(Sym::Batch), s, Dim::Fixed(4), Dim::Fixed(16)],
        },
        OpKind::Expand { shape: vec![] },
        OpKind::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        OpKind::Split {
            axis: 2,
            sizes: vec![64, 32, 32],
        },
        OpKind::Concat { axis: 1 },
        OpKind::Slice {
            axis: 0,
            start: 3,
            end: u64::MAX,
        },
        OpKind::Dropout {
            p: f64::INFINITY,
            seed: 7,
        },
        OpKind::CrossEntropy,
        OpKind::TopKRouter {
            experts: 8,
            k: 2,
            routing: Default::default(),
            bias: false,
        },
        OpKind::TopKRouter {
            experts: 256,
            k: 8,
            routing: crate::Routing {
                sigmoid: true,
                normalize: false,
                groups: 8,
                groups_kept: 4,
                group_top: 2,
            },
            bias: false,
        },
        OpKind::TopKRouter {
            experts: 160,
            k: 6,
            routing: crate::Routing {
                sigmoid: false,
                normalize: false,
                groups: 8,
                groups_kept: 3,
                group_top: 1,
            },
            bias: false,
        },
        OpKind::MoeExperts {
            experts: 8,
            form: Default::default(),
        },
        OpKind::TopKRouter {
            experts: 32,
            k: 4,
            routing: Default::default(),
            bias: true,
        },
        OpKind::MoeExperts {
            experts: 32,
            form: crate::ExpertForm {
                bias: true,
                alpha: 1.702,
                limit: Some(7.0),
                up_offset: 1.0,
                scales_input: false,
            },
        },
        OpKind::MoeExperts {
            experts: 16,
            form: crate::ExpertForm {
                scales_input: true,
                ..crate::ExpertForm::SWIGLU
            },
        },
        OpKind::Grad {
            of: Box::new(OpKind::Grad {
                of: Box::new(OpKind::RmsNorm { eps: 1e-6 }),
                wrt: vec![0, 1],
            }),
            wrt: vec![],
        },
        OpKind::AdamW(AdamWConfig {
            lr: f64::NEG_INFINITY,
            ..AdamWConfig::default()
        }),
        OpKind::Scale { factor: f64::NAN },
    ]
}

/// A graph holding every kind once (types are nonsense: the parser does not check them).
fn graph_of_every_kind() -> Graph {
    let mut g = Graph::new("every \"kind\"\n\t\u{1}é");
    g.block_name = Some("blk".into());
    let x = g.push_source(
        OpKind::Input { name: "x".into() },
        TensorType::new(DType::Fp8, Shape::scalar()),
        None,
    );
    for (i, kind) in every_kind().into_iter().enumerate() {
        let n = kind.result_count();
        let inputs = if kind.is_source() { vec![] } else { vec![x, x] };
        let ty = TensorType::new(DType::ALL[i % 6], Shape::fixed(&[i as u64, 2]));
        g.push_op_typed(kind, inputs, vec![ty; n], Some(i as u32 % 3));
    }
    g.add_output("x out", x);
    g
}

#[test]
fn every_kind_round_trips() {
    let g = graph_of_every_kind();
    let text = print(&g);
    let back = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print(&back), text);
    for line in [
        "scalar{value=-0.0}",
        "pow{exponent=0.30000000000000004}",
        "scale{factor=1e300}",
        "rmsnorm{eps=5e-324}",
        "dropout{p=inf, seed=7}",
        "adamw{lr=-inf, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01}",
        "scale{factor=NaN}",
        "slice{axis=0, start=3, end=18446744073709551615}",
        "grad{of=grad{of=rmsnorm{eps=1e-6}, wrt=[0,1]}, wrt=[]}",
        "expand{shape=[]}",
        "_ = grad",
        "graph \"every \\\"kind\\\"\\n\\t\\u{1}é\"",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    // NaN defeats PartialEq, so compare everything else structurally.
    let mut a = g.clone();
    let mut b = back;
    for o in a.op_ids().collect::<Vec<_>>() {
        if matches!(a.op(o).kind, OpKind::Scale { factor } if factor.is_nan()) {
            a.op_mut(o).kind = OpKind::Silu;
            b.op_mut(o).kind = OpKind::Silu;
        }
    }
    assert_eq!(a, b);
}

#[test]
fn names_and_comments_are_flexible() {
    let src = "# leading comment\n\n  graph \"g\"  ; trailing\n\
               %in.x: f32[B,S] = input \"x\" # hash comment\n\
               %y_1: f32[B,S] = neg %in.x @4\n\
               output \"y\" = %y_1\n";
    let g = parse(src).unwrap();
    assert_eq!(
        print(&g),
        "graph \"g\"\n\n%0: f32[B,S] = input \"x\"\n%1: f32[B,S] = neg %0 @4\n\noutput \"y\" = %1\n"
    );
}

#[test]
fn attributes_may_come_in_any_order() {
    let src = "graph \"g\"\n%0: f32[4] = input \"x\"\n\
               %1: f32[4] = slice{end=3, axis=0, start=1} %0\n";
    let g = parse(src).unwrap();
    assert!(print(&g).contains("slice{axis=0, start=1, end=3} %0"));
}

#[test]
fn forward_references_parse() {
    // The verifier, not the parser, rejects a use before definition.
    let src = "graph \"g\"\n%a: f32[4] = neg %b\n%b: f32[4] = input \"x\"\n";
    let g = parse(src).unwrap();
    assert!(crate::verify::verify(&g).is_err());
    assert_eq!(print(&parse(&print(&g)).unwrap()), print(&g));
}

#[test]
fn parse_errors_have_positions() {
    let cases: &[(&str, usize, usize, &str)] = &[
        ("", 1, 1, "expected `graph \"name\"`, found end of input"),
        (
            "graph g",
            1,
            7,
            "expected the graph name as a quoted string",
        ),
        (
            "graph \"g\"\nblock \"a\"\nblock \"b\"",
            3,
            1,
            "the block name is given twice",
        ),
        (
            "graph \"g\"\n%0: f32[4] = input \"x\" @",
            2,
            25,
            "expected a layer number",
        ),
        (
            "graph \"g\"\n%0: f32[4] = input \"x\" @99999999999",
            2,
            25,
            "too large",
        ),
        (
            "graph \"g\"\n%: f32[4] = input \"x\"",
            2,
            1,
            "expected a value name after `%`",
        ),
        (
            "graph \"g\"\n%0: f32[4] = input \"\\q\"",
            2,
            21,
            "unknown escape `\\q`",
        ),
        (
            "graph \"g\"\n%0: f32[4] = input \"\\u{d800}\"",
            2,
            21,
            "invalid character code",
        ),
        (
            "graph \"g\"\n%0: f32[4] = input \"x\" $",
            2,
            24,
            "unexpected character '$'",
        ),
        (
            "graph \"g\"\n%0: f32[4] = silu \"x\"",
            2,
            19,
            "expected end of line",
        ),
        (
            "graph \"g\"\n%0: f32[4] = linear{bias=1}",
            2,
            26,
            "expected true or false",
        ),
        (
            "graph \"g\"\n%0: f32[4] = split{axis=-1, sizes=[]}",
            2,
            25,
            "expected an integer",
        ),
        (
            "graph \"g\"\n%0: f32[4] = linear{bias=true, bias=true}",
            2,
            32,
            "given twice",
        ),
        (
            "graph \"g\"\n%0: f32[4] = concat{axis=1,}",
            2,
            28,
            "expected an attribute name",
        ),
        (
            "graph \"g\"\n%0: f32[4] = grad{of=\"x\", wrt=[]}",
            2,
            22,
            "expected an op name",
        ),
        (
            "graph \"g\"\n%0: f32[4] = neg{} \"x\"",
            2,
            20,
            "expected end of line",
        ),
        (
            "graph \"g\"\n%0: f32[4] = neg \"x\"",
            2,
            18,
            "expected end of line",
        ),
        (
            "graph \"g\"\n%0: f32[4] = embedding \"t\"",
            2,
            24,
            "expected end of line",
        ),
        ("graph \"g\"\noutput \"y\" %0", 2, 12, "expected `=`"),
        (
            "graph \"g\"\nfoo",
            2,
            1,
            "expected `block`, `output`, or an op line",
        ),
    ];
    for &(src, line, column, fragment) in cases {
        match parse(src) {
            Ok(_) => panic!("{src:?} parsed"),
            Err(e) => assert!(
                e.line == line && e.column == column && e.message.contains(fragment),
                "{src:?}: expected {line}:{column}: {fragment}, got {e}"
            ),
        }
    }
}

#[test]
fn deep_grad_nesting_is_an_error_not_a_crash() {
    let mut kind = "silu".to_string();
    for _ in 0..10_000 {
        kind = format!("grad{{of={kind}, wrt=[]}}");
    }
    let src = format!("graph \"g\"\n_ = {kind}\n");
    let e = parse(&src).unwrap_err();
    assert!(e.message.contains("nested too deeply"), "{e}");
}

#[test]
fn hostile_bytes_never_panic() {
    // Every prefix of a valid file, and some junk, must give Ok or Err, never a panic; so must
    // verifying and detecting blocks in whatever parses.
    let text = print(&graph_of_every_kind());
    for (i, _) in text.char_indices() {
        if let Ok(g) = parse(&text[..i]) {
            let _ = crate::verify::verify(&g);
            let _ = crate::blocks::detect_repeated_layers(&mut g.clone(), "blk");
        }
    }
    for junk in [
        "\u{0}",
        "%%%",
        "graph \"",
        "graph \"g\"\n%0: f32[",
        "graph \"g\"\n_ = grad{of=",
    ] {
        let _ = parse(junk);
    }
}

#[test]
fn printing_a_broken_graph_does_not_panic() {
    let mut g = Graph::new("broken");
    let t = TensorType::new(DType::F32, Shape::fixed(&[2]));
    g.push_op_typed(OpKind::Neg, vec![crate::ValueId(42)], vec![t], None);
    let mut order = g.order().to_vec();
    order.push(crate::OpId(9));
    g.set_order(order);
    g.add_output("dangling", crate::ValueId(7));
    let text = print(&g);
    assert!(text.contains("%0: f32[2] = neg %?42"), "{text}");
    assert!(text.contains("; op9 is in the execution order but not in the graph"));
    assert!(text.contains("output \"dangling\" = %?7"));
    assert!(parse(&text).is_err());
}
