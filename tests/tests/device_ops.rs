//! `DeviceBackend` on the `simt` emulator: every op the device lowers runs as the kernels of
//! `kernels/cuda` (compiled for the host), forward and backward, and must equal the CPU kernels
//! (`kernels::forward` / `kernels::backward`) without any host fallback. This is the CUDA
//! backend's lowering and kernel source tested on a machine without a GPU; the GEMMs, which
//! cuBLAS runs on a GPU, are a plain f64 loop here.
#![allow(clippy::unwrap_used)]

use ir::routing::Routing;
use ir::{AdamWConfig, Binding, Dim, OpKind, RopeScaling};
use kernels::Tensor32;
use runtime::backend::conformance::{self, Case, ids, positive, tensor};
use runtime::backend::vocab::VocabShard;
use runtime::backend::{DropoutMask, Stashed};
use runtime::{Backend, DeviceBackend, GemmPrecision};
use tests::emulator::{Emulator, emulator, emulator_bf16};

fn assert_close(got: &Tensor32, want: &Tensor32, tol: f32, what: &str) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

const BINDING: Binding = Binding { batch: 1, seq: 1 };

/// `kind` forward, backward and as `Grad` on the emulator against the CPU kernels, with no
/// host fallback (`runtime::backend::conformance`).
fn check(b: &DeviceBackend<Emulator>, kind: OpKind, inputs: &[Tensor32], tol: f32) {
    let case = Case {
        name: kind.mnemonic().into(),
        kind,
        inputs: inputs.to_vec(),
        tol,
    };
    if let Err(e) = conformance::check(b, &case) {
        panic!("{e}");
    }
}

/// The suite `plait bench kernels` runs on a GPU passes here first, so that a failure there
/// is the GPU's (its compiler, cuBLAS), not the lowering's.
#[test]
fn the_conformance_cases_pass_on_the_emulated_device() {
    let b = emulator(64);
    let cases = conformance::cases();
    assert!(cases.len() >= 25, "every op family: {}", cases.len());
    for case in &cases {
        match conformance::check(&b, case) {
            Ok(p) => println!(
                "{} {}: max error {:.1e}",
                case.name,
                case.kind.mnemonic(),
                p.max_error
            ),
            Err(e) => panic!("{e}"),
        }
    }
}

/// `to_bf16` of `mats` `[rows, cols]` matrices of `x` at `stride`, rows padded to `pitch`,
/// against the host's rounding, on `grid` blocks.
fn check_to_bf16(
    x: &Vec<f32>,
    (mats, rows, cols, stride, pitch): (usize, usize, usize, usize, usize),
    grid: u32,
) {
    use kernels::device::KernelArg;
    use runtime::Device;
    let dev = Emulator::new(32, false);
    let mut y = vec![f32::NAN; mats * rows * pitch / 2];
    let i = |n: usize| KernelArg::I64(i64::try_from(n).unwrap());
    let mut args = [
        KernelArg::Out(&mut y),
        KernelArg::In(x),
        i(mats),
        i(rows),
        i(cols),
        i(stride),
        i(pitch),
    ];
    dev.launch("to_bf16", grid, 32, &mut args).unwrap();
    for h in 0..mats * rows * pitch {
        let word = y[h / 2].to_bits();
        let half = if h % 2 == 0 {
            word & 0xffff
        } else {
            word >> 16
        };
        let (m, r, c) = (h / (rows * pitch), h / pitch % rows, h % pitch);
        let want = if c < cols {
            kernels::device::round_bf16(x[m * stride + r * cols + c]).to_bits() >> 16
        } else {
            0
        };
        assert_eq!(half, want, "matrix {m} row {r} column {c}");
    }
}

#[test]
fn to_bf16_rounds_as_the_host_and_pads_each_row_to_the_pitch() {
    // Two [3, 5] matrices, 15 apart, rows padded to 8: ties, a carry into the exponent and
    // negatives among the values.
    let x: Vec<f32> = [
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        -2.5,
        1.9999999,
        3.0e-3,
    ]
    .into_iter()
    .chain(tensor(&[25], 3).data)
    .collect();
    check_to_bf16(&x, (2, 3, 5, 15, 8), 2);
    // Rows of 4101 (odd: every other row starts off an 8-byte boundary, so both the paired
    // and the single loads run) over two segments of the kernel's loop, matrices 7 elements
    // apart beyond their size, on the launcher's grid and on a grid of 3 blocks.
    let (mats, rows, cols) = (2usize, 3usize, 4101usize);
    let stride = rows * cols + 7;
    let x = tensor(&[stride * mats], 5).data;
    let pitch = cols.next_multiple_of(8);
    let grid = kernels::device::to_bf16_grid(mats, rows, pitch);
    assert_eq!(grid, 12, "two segments per row");
    for g in [grid, 3] {
        check_to_bf16(&x, (mats, rows, cols, stride, pitch), g);
    }
}

#[test]
fn a_stashed_buffer_comes_back_rounded_to_bf16() {
    use runtime::Backend;
    let b = emulator(32);
    // Odd element counts: the last word holds one bf16 and a zero half. The larger spans
    // many blocks of the grid-stride kernels (four words in flight per thread).
    for shape in [[3, 7, 5], [7, 11, 131]] {
        let x = tensor(&shape, 11);
        let buf = b.upload(&x).unwrap();
        let runtime::backend::Stashed::Words(words) = b.stash_bf16(buf).unwrap() else {
            panic!("a device backend stashes");
        };
        assert_eq!(b.shape(&words), [x.data.len().div_ceil(2)]);
        let back = b
            .download(&b.unstash_bf16(words, &x.shape).unwrap())
            .unwrap();
        assert_eq!(back.shape, x.shape);
        for (i, (got, want)) in back.data.iter().zip(&x.data).enumerate() {
            assert_eq!(*got, kernels::device::round_bf16(*want), "element {i}");
        }
    }
}

/// `t` rounded to bf16, as a bf16 GEMM reads it.
fn bf16(t: &Tensor32) -> Tensor32 {
    let data = t
        .data
        .iter()
        .map(|&v| kernels::device::round_bf16(v))
        .collect();
    Tensor32::new(t.shape.clone(), data).unwrap()
}

/// `t` uploaded, stashed and brought back as its bf16 words only: its f32 values are never
/// written (NaN on the emulator), so a kernel that read them would show it.
fn words_only(b: &DeviceBackend<Emulator>, t: &Tensor32) -> runtime::DeviceBuffer<Vec<f32>> {
    let runtime::backend::Stashed::Words(w) = b.stash_bf16(b.upload(t).unwrap()).unwrap() else {
        panic!("a device backend stashes");
    };
    b.unstash_bf16_words(w, &t.shape).unwrap()
}

/// `x` stashed, as the bit patterns of the bf16 words the stash keeps.
fn stashed_bits(b: &DeviceBackend<Emulator>, x: runtime::DeviceBuffer<Vec<f32>>) -> Vec<Vec<u32>> {
    match b.stash_bf16(x).unwrap() {
        runtime::backend::Stashed::Words(w) => bits(b, &[w]),
        runtime::backend::Stashed::Kept(_) => panic!("a device backend stashes"),
    }
}

/// `x`'s values, read back, as bit patterns (the buffer kept).
fn host_bits(b: &DeviceBackend<Emulator>, x: &runtime::DeviceBuffer<Vec<f32>>) -> Vec<u32> {
    b.download(x)
        .unwrap()
        .data
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// How many elements of `x` and `y` differ in their bits (every element, where their shapes do).
fn differing(x: &[Vec<u32>], y: &[Vec<u32>]) -> usize {
    let flat = |v: &[Vec<u32>]| v.concat();
    let (x, y) = (flat(x), flat(y));
    if x.len() != y.len() {
        return x.len().max(y.len());
    }
    x.iter().zip(&y).filter(|(a, b)| a != b).count()
}

/// Each buffer's values as bit patterns, to compare two runs bit for bit.
fn bits(b: &DeviceBackend<Emulator>, bufs: &[runtime::DeviceBuffer<Vec<f32>>]) -> Vec<Vec<u32>> {
    bufs.iter().map(|x| host_bits(b, x)).collect()
}

/// A linear's forward makes bf16 copies of its input and weight (their twins). The stash
/// keeps the input's copy as its words, the backward reads both copies, and a weight written
/// in place (AdamW) drops its copy: the next product reads the new values.
#[test]
fn a_bf16_gemm_operand_copy_serves_the_stash_and_the_backward_until_written() {
    use runtime::backend::Stashed;
    let b = emulator_bf16(32);
    let linear = OpKind::Linear { bias: false };
    let (x, w, dy) = (
        tensor(&[4, 6, 16], 41),
        tensor(&[16, 24], 42),
        tensor(&[4, 6, 24], 43),
    );
    let (xb, mut wb) = (b.upload(&x).unwrap(), b.upload(&w).unwrap());
    let y = b.forward(&linear, &[&xb, &wb], BINDING).unwrap();
    assert_close(
        &b.download(&y[0]).unwrap(),
        &kernels::forward(&linear, &[&bf16(&x), &bf16(&w)], BINDING).unwrap()[0],
        1e-5,
        "forward on the copies",
    );
    let Stashed::Words(words) = b.stash_bf16(xb).unwrap() else {
        panic!("a device backend stashes");
    };
    let fresh = b.upload(&x).unwrap();
    let Stashed::Words(want) = b.stash_bf16(fresh).unwrap() else {
        panic!("a device backend stashes");
    };
    assert_eq!(
        b.download(&words)
            .unwrap()
            .data
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        b.download(&want)
            .unwrap()
            .data
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        "the stash kept the GEMM's copy, bit for bit"
    );
    let xb = b.unstash_bf16(words, &x.shape).unwrap();
    let dyb = b.upload(&dy).unwrap();
    let grad = OpKind::Grad {
        of: Box::new(linear.clone()),
        wrt: vec![0, 1],
    };
    let got = b.forward(&grad, &[&xb, &wb, &dyb], BINDING).unwrap();
    let host = kernels::backward(&linear, &[&bf16(&x), &bf16(&w)], &[&bf16(&dy)]).unwrap();
    for (i, (g, h)) in got.iter().zip(&host).enumerate() {
        let h = h.as_ref().expect("a gradient");
        assert_close(&b.download(g).unwrap(), h, 1e-4, &format!("gradient {i}"));
    }
    // AdamW writes the weight in place: the next product must read the new values.
    let zeros = Tensor32::new(w.shape.clone(), vec![0.0; w.data.len()]).unwrap();
    let (mut m, mut v) = (b.upload(&zeros).unwrap(), b.upload(&zeros).unwrap());
    let g = b.upload(&tensor(&w.shape, 44)).unwrap();
    let cfg = AdamWConfig {
        lr: 0.5,
        ..AdamWConfig::default()
    };
    b.adamw(&cfg, &mut wb, &g, &mut m, &mut v, 1).unwrap();
    let stepped = b.download(&wb).unwrap();
    let xb = b.upload(&x).unwrap();
    let y = b.forward(&linear, &[&xb, &wb], BINDING).unwrap();
    let want = kernels::forward(&linear, &[&bf16(&x), &bf16(&stepped)], BINDING).unwrap();
    assert_close(
        &b.download(&y[0]).unwrap(),
        &want[0],
        1e-5,
        "after the update",
    );
}

/// A unary function's gradient reads a stashed input's bf16 words as they are: brought back
/// without its f32 expansion (the emulator leaves those NaN), the gradient equals the host's on
/// the rounded input, for an odd element count (a last word half used) and a large one; so does
/// one from an output gradient held as words alone (a GEMM wrote them), bit for bit the one
/// from the same values in f32. An embedding's gradient reads no values of its table at all.
#[test]
fn a_unary_gradient_reads_a_stashed_inputs_words() {
    let b = emulator(32);
    let gelu = OpKind::Gelu { tanh: false };
    let grad = OpKind::Grad {
        of: Box::new(gelu.clone()),
        wrt: vec![0],
    };
    for shape in [vec![3, 7, 5], vec![4, 9, 131]] {
        let (x, dy) = (tensor(&shape, 46), tensor(&shape, 47));
        let shapes = [shape.as_slice(), shape.as_slice()];
        assert!(b.reads_stashed_words(&grad, &shapes, 0));
        assert!(
            b.reads_stashed_words(&grad, &shapes, 1),
            "the output gradient"
        );
        assert!(
            b.reads_stashed_words(&gelu, &shapes[..1], 0),
            "the forward too (unary_forward_bf16x)"
        );
        let xb = words_only(&b, &x);
        let dyb = b.upload(&dy).unwrap();
        let got = b.forward(&grad, &[&xb, &dyb], BINDING).unwrap();
        let want = kernels::backward(&gelu, &[&bf16(&x)], &[&dy]).unwrap();
        let want = want[0].as_ref().expect("a gradient");
        assert_close(&b.download(&got[0]).unwrap(), want, 1e-6, "gelu gradient");
        // dy held as words alone: expanded for the f32 kernel, read as words by the words one.
        let dy_words = words_only(&b, &dy);
        let dy_rounded = b.upload(&bf16(&dy)).unwrap();
        for x in [&xb, &b.upload(&x).unwrap()] {
            let run = |dy: &runtime::DeviceBuffer<Vec<f32>>| {
                let plain = b.forward(&grad, &[x, dy], BINDING).unwrap();
                let made = b.forward_words(&grad, &[x, dy]).unwrap().expect("words");
                (
                    bits(&b, &plain),
                    stashed_bits(&b, made.into_iter().next().unwrap()),
                )
            };
            assert_eq!(
                run(&dy_words),
                run(&dy_rounded),
                "gelu gradient from dy's words"
            );
        }
    }
    // An embedding table's gradient reads only the table's shape: a stashed (tied) table
    // comes back for it without its f32 values.
    let (table, tokens, dy) = (
        tensor(&[20, 12], 48),
        ids(&[4, 6], 20, 49),
        tensor(&[4, 6, 12], 50),
    );
    let grad = OpKind::Grad {
        of: Box::new(OpKind::Embedding),
        wrt: vec![0],
    };
    let shapes = [&table.shape[..], &tokens.shape[..], &dy.shape[..]];
    assert!(b.reads_stashed_words(&grad, &shapes, 0));
    assert!(!b.reads_stashed_words(&grad, &shapes[..2], 0), "malformed");
    let tb = words_only(&b, &table);
    let (ib, gb) = (b.upload(&tokens).unwrap(), b.upload(&dy).unwrap());
    let got = b.forward(&grad, &[&tb, &ib, &gb], BINDING).unwrap();
    let want = kernels::backward(&OpKind::Embedding, &[&table, &tokens], &[&dy]).unwrap();
    let want = want[0].as_ref().expect("a gradient");
    assert_close(
        &b.download(&got[0]).unwrap(),
        want,
        1e-6,
        "embedding gradient",
    );
}

/// A causal attention of `heads` query and `kv` key/value heads (scale 0.3), and its gradient
/// with respect to q, k and v.
fn causal_attention(heads: u64, kv: u64) -> (OpKind, OpKind) {
    let attention = OpKind::Attention {
        heads,
        kv_heads: kv,
        scale: 0.3,
        causal: true,
        softcap: None,
        sinks: false,
        window: None,
        chunk: None,
    };
    let grad = OpKind::Grad {
        of: Box::new(attention.clone()),
        wrt: vec![0, 1, 2],
    };
    (attention, grad)
}

/// On the tensor cores, attention reads q, k and v from a stash's bf16 words as they are:
/// brought back without their f32 expansion (NaN on the emulator), the backward equals, bit for
/// bit, the one that converts the same values from f32.
#[test]
fn tensor_core_attention_reads_stashed_operands_as_their_words() {
    let b = tests::emulator::emulator_mma(64);
    let (attention, grad) = causal_attention(2, 2);
    let shape = [1usize, 24, 64];
    let qkv: Vec<Tensor32> = (0..3).map(|i| tensor(&shape, 51 + i)).collect();
    let dy = b.upload(&tensor(&shape, 54)).unwrap();
    let shapes = [&shape[..]; 4];
    for operand in 0..3 {
        assert!(b.reads_stashed_words(&grad, &shapes, operand), "{operand}");
        assert!(b.reads_stashed_words(&attention, &shapes[..3], operand));
    }
    assert!(
        b.reads_stashed_words(&grad, &shapes, 3),
        "the output gradient"
    );
    assert!(
        !emulator(64).reads_stashed_words(&grad, &shapes, 0),
        "no tensor cores: the f32 kernels read q"
    );
    let stashed: Vec<_> = qkv.iter().map(|t| words_only(&b, t)).collect();
    let from_f32: Vec<_> = qkv.iter().map(|t| b.upload(&bf16(t)).unwrap()).collect();
    let run = |x: &[runtime::DeviceBuffer<Vec<f32>>]| {
        let got = b
            .forward(&grad, &[&x[0], &x[1], &x[2], &dy], BINDING)
            .unwrap();
        bits(&b, &got)
    };
    assert_eq!(run(&stashed), run(&from_f32));
    // dO held as words alone (a GEMM wrote them): the recomputed row statistics expand it, the
    // kernels read its words; bit for bit the gradients from the same values in f32.
    let dy_host = b.download(&dy).unwrap();
    let run_dy = |dy: &runtime::DeviceBuffer<Vec<f32>>| {
        let got = b
            .forward(
                &grad,
                &[&from_f32[0], &from_f32[1], &from_f32[2], dy],
                BINDING,
            )
            .unwrap();
        bits(&b, &got)
    };
    assert_eq!(
        run_dy(&words_only(&b, &dy_host)),
        run_dy(&b.upload(&bf16(&dy_host)).unwrap()),
        "dO from its words"
    );
}

/// `t` with each value rounded to bf16.
fn bf16_exact(mut t: Tensor32) -> Tensor32 {
    t.data
        .iter_mut()
        .for_each(|v| *v = kernels::device::round_bf16(*v));
    t
}

/// Results made as bf16 words only (`Backend::forward_words`): a LayerNorm's and an RMSNorm's
/// output (one warp per row at 48 wide, a block per row at 1030), a GELU's and its input
/// gradient (odd length: the last word half empty), a last-axis split's parts, a last-axis
/// concatenation and a biased linear's output (bf16 GEMMs: rows of whole 16-byte words by the
/// GEMM adding its product onto the bias's words, `bias_rows_words`; others by
/// `add_bias_to_words` after an f32 product) are, bit for bit, the words the stash keeps of
/// the f32 forward's results (the second linear's bias bf16-exact: the words path rounds the
/// bias to bf16 first, as autocast's bf16 linear does, where the f32 forward adds it whole), and read back they are those
/// results rounded to bf16; only kernels that write words ran. Odd rows and splits along
/// another axis are not made so.
#[test]
fn results_made_as_words_are_the_f32_results_rounded() {
    let b = emulator(64).with_gemm_precision(GemmPrecision::Bf16);
    let gelu = OpKind::Gelu { tanh: true };
    let ln = OpKind::LayerNorm {
        eps: 1e-5,
        bias: true,
    };
    let rms = OpKind::RmsNorm { eps: 1e-6 };
    let split = |axis| OpKind::Split {
        axis,
        sizes: vec![4, 6, 2],
    };
    let gelu_grad = OpKind::Grad {
        of: Box::new(gelu.clone()),
        wrt: vec![0],
    };
    let mut cases: Vec<(OpKind, Vec<Tensor32>)> = vec![
        (gelu.clone(), vec![tensor(&[3, 5, 7], 90)]),
        (split(2), vec![tensor(&[2, 3, 12], 91)]),
        (
            gelu_grad.clone(),
            vec![tensor(&[3, 5, 7], 88), tensor(&[3, 5, 7], 89)],
        ),
        (
            OpKind::Concat { axis: 2 },
            [4, 6, 2].iter().map(|&w| tensor(&[2, 3, w], 87)).collect(),
        ),
        (
            OpKind::Linear { bias: true },
            vec![
                tensor(&[2, 3, 16], 84),
                tensor(&[16, 10], 83),
                tensor(&[10], 82),
            ],
        ),
        (
            OpKind::Linear { bias: true },
            vec![
                tensor(&[2, 3, 16], 81),
                tensor(&[16, 24], 80),
                bf16_exact(tensor(&[24], 79)),
            ],
        ),
    ];
    for h in [48usize, 1030] {
        let x = tensor(&[3, 4, h], 92);
        cases.push((
            ln.clone(),
            vec![x.clone(), tensor(&[h], 93), tensor(&[h], 94)],
        ));
        cases.push((rms.clone(), vec![x, tensor(&[h], 95)]));
    }
    let words_of = |x: runtime::DeviceBuffer<Vec<f32>>| {
        let Stashed::Words(w) = b.stash_bf16(x).unwrap() else {
            panic!("a device backend stashes");
        };
        w
    };
    for (kind, inputs) in &cases {
        let bufs: Vec<_> = inputs.iter().map(|t| b.upload(t).unwrap()).collect();
        let xs: Vec<_> = bufs.iter().collect();
        let before = b.launch_tally().expect("counted");
        let made = b
            .forward_words(kind, &xs)
            .unwrap()
            .unwrap_or_else(|| panic!("{kind:?} made as words"));
        // Only kernels that write words ran (a linear's GEMM also converts its operands,
        // multiplies them and copies a padded product out).
        let launched = b.launch_tally().expect("counted").since(&before);
        let linear = matches!(kind, OpKind::Linear { .. });
        let gemm = |name: &str| {
            [
                "to_bf16",
                "unpad_rows",
                runtime::backend::device::bf16_gemm::CUBLAS,
                runtime::backend::device::bf16_gemm::CUBLAS_WORDS,
            ]
            .contains(&name)
        };
        // Rows of whole 16-byte words: the GEMM adds onto the bias's words, no f32 product.
        if linear && inputs[1].shape[1] % 8 == 0 {
            assert_eq!(launched.get("bias_rows_words").launches, 1);
            assert_eq!(launched.get("add_bias_to_words").launches, 0);
        }
        for (name, _) in launched.by_bytes() {
            assert!(
                name.contains("words") || (linear && gemm(name)),
                "{kind:?}: {name} ran"
            );
        }
        let plain = b.forward(kind, &xs, BINDING).unwrap();
        assert_eq!(made.len(), plain.len());
        for (mut m, p) in made.into_iter().zip(plain) {
            assert_eq!(b.shape(&m), b.shape(&p), "{kind:?}");
            let want = bf16(&b.download(&p).unwrap());
            assert_eq!(
                b.download(&m).unwrap(),
                want,
                "{kind:?}: read from its words"
            );
            b.expand_stashed(&mut m).unwrap();
            // The stash keeps the words made (the expansion keeps them as the twin).
            let (mw, pw) = (words_of(m), words_of(p));
            assert_eq!(bits(&b, &[mw]), bits(&b, &[pw]), "{kind:?}: the words");
        }
    }
    // A GELU and its gradient from its input's words (`unary_forward_bf16x`,
    // `unary_forward_words_bf16x`, `unary_backward_words_bf16x`), and a last-axis split's
    // parts (`split_cols_words_bf16x`, and expanded where they are wanted in f32), are the
    // ones from the same values in f32.
    let (x, g) = (
        tensor(&[3, 5, 7], 86),
        b.upload(&tensor(&[3, 5, 7], 85)).unwrap(),
    );
    let twin =
        |v: Vec<runtime::DeviceBuffer<Vec<f32>>>| v.into_iter().map(words_of).collect::<Vec<_>>();
    let qkv = split(2);
    let concat = OpKind::Concat { axis: 2 };
    let (dk, dv) = (
        b.upload(&tensor(&[2, 3, 6], 80)).unwrap(),
        b.upload(&tensor(&[2, 3, 2], 79)).unwrap(),
    );
    for (kind, x, rest) in [
        (&gelu_grad, x.clone(), vec![&g]),
        (&gelu, x, vec![]),
        (&qkv, tensor(&[2, 3, 12], 81), vec![]),
        (&concat, tensor(&[2, 3, 4], 78), vec![&dk, &dv]),
    ] {
        let mut shapes = vec![&x.shape[..]];
        shapes.extend(rest.iter().map(|r| b.shape(r)));
        assert!(
            b.reads_stashed_words(kind, &shapes, 0),
            "{kind:?} reads x's words"
        );
        let run = |x: &runtime::DeviceBuffer<Vec<f32>>| {
            let mut xs = vec![x];
            xs.extend(&rest);
            let made = b.forward_words(kind, &xs).unwrap().expect("made as words");
            let plain = b.forward(kind, &xs, BINDING).unwrap();
            (bits(&b, &twin(made)), bits(&b, &plain))
        };
        let from_words = run(&words_only(&b, &x));
        assert_eq!(from_words, run(&b.upload(&bf16(&x)).unwrap()), "{kind:?}");
    }
    let odd = [tensor(&[2, 3, 7], 96), tensor(&[7], 97), tensor(&[7], 98)];
    let odd: Vec<_> = odd.iter().map(|t| b.upload(t).unwrap()).collect();
    assert!(
        b.forward_words(&ln, &odd.iter().collect::<Vec<_>>())
            .unwrap()
            .is_none()
    );
    let x = b.upload(&tensor(&[12, 3], 99)).unwrap();
    assert!(b.forward_words(&split(0), &[&x]).unwrap().is_none());
}

/// A bf16 linear's gradient reads an output gradient made as words (or back from the stash)
/// as its twin, in both products and the bias's column sums (`column_sum_chunks_bf16x`): bit
/// for bit the gradients of the same values given as f32.
#[test]
fn a_linears_gradient_reads_its_output_gradients_words() {
    let b = emulator_bf16(32);
    let linear = OpKind::Linear { bias: true };
    let grad = OpKind::Grad {
        of: Box::new(linear.clone()),
        wrt: vec![0, 1, 2],
    };
    let (x, w, bias) = (
        tensor(&[2, 8, 16], 81),
        tensor(&[16, 24], 82),
        tensor(&[24], 83),
    );
    let g = tensor(&[2, 8, 24], 84);
    let shapes = [&x.shape[..], &w.shape[..], &bias.shape[..], &g.shape[..]];
    assert!(
        b.reads_stashed_words(&grad, &shapes, 3),
        "the output gradient"
    );
    let odd = [&x.shape[..], &[16, 20][..], &[20][..], &[2, 8, 20][..]];
    assert!(
        !b.reads_stashed_words(&grad, &odd, 3),
        "rows of 20: not whole 16-byte words"
    );
    let up = |t: &Tensor32| b.upload(t).unwrap();
    let (xb, wb, bb) = (up(&x), up(&w), up(&bias));
    let run = |g: &runtime::DeviceBuffer<Vec<f32>>| {
        bits(&b, &b.forward(&grad, &[&xb, &wb, &bb, g], BINDING).unwrap())
    };
    assert_eq!(run(&words_only(&b, &g)), run(&up(&bf16(&g))));
}

/// A residual add after a biased linear run without its bias (`Backend::forward_biased`,
/// `binary_forward_biased`): bit for bit the sum of the biased linear's output, with or
/// without the sum's twin, and whichever operand the product is; odd widths are not taken.
#[test]
fn a_sum_adds_the_bias_its_linear_left_out() {
    let b = emulator_bf16(32);
    let up = |t: &Tensor32| b.upload(t).unwrap();
    let (x, w, bias, resid) = (
        up(&tensor(&[2, 8, 16], 61)),
        up(&tensor(&[16, 24], 62)),
        up(&tensor(&[24], 63)),
        up(&tensor(&[2, 8, 24], 64)),
    );
    let biased = b
        .forward(&OpKind::Linear { bias: true }, &[&x, &w, &bias], BINDING)
        .unwrap();
    let product = b
        .forward(&OpKind::Linear { bias: false }, &[&x, &w], BINDING)
        .unwrap();
    for side in [0usize, 1] {
        let mut plain_in = vec![&resid, &biased[0]];
        let mut fused_in = vec![&resid, &product[0]];
        if side == 0 {
            plain_in.reverse();
            fused_in.reverse();
        }
        let plain = b.forward(&OpKind::Add, &plain_in, BINDING).unwrap();
        for twin in [false, true] {
            let fused = b
                .forward_biased(&OpKind::Add, &fused_in, (side, &bias), twin)
                .unwrap()
                .expect("laid out as the output");
            assert_eq!(
                host_bits(&b, &fused),
                host_bits(&b, &plain[0]),
                "side {side} twin {twin}"
            );
            if twin {
                let f32_sum = b.upload(&b.download(&plain[0]).unwrap()).unwrap();
                assert_eq!(
                    stashed_bits(&b, fused),
                    stashed_bits(&b, f32_sum),
                    "the twin"
                );
            }
        }
    }
    let odd = up(&tensor(&[2, 8, 5], 65));
    let odd_bias = up(&tensor(&[5], 66));
    assert!(
        b.forward_biased(&OpKind::Add, &[&odd, &odd], (1, &odd_bias), false)
            .unwrap()
            .is_none()
    );
}

/// A linear's input gradient made as bf16 words by its GEMM (`Gemm::c_words`,
/// `Backend::forward_some_words`) beside its weight's and bias's in f32: bit for bit the words
/// the stash keeps of the f32 input gradient, the others the same bits, and no conversion runs
/// for it. A width cuBLAS cannot write so (20, not whole 16-byte rows) stays f32.
#[test]
fn a_linears_input_gradient_is_made_as_words_by_its_gemm() {
    let b = emulator_bf16(32);
    let up = |t: &Tensor32| b.upload(t).unwrap();
    for (k, words) in [(16usize, true), (20, false)] {
        let linear = OpKind::Linear { bias: true };
        let grad = OpKind::Grad {
            of: Box::new(linear),
            wrt: vec![0, 1, 2],
        };
        let (x, w, bias) = (
            up(&tensor(&[2, 8, k], 71)),
            up(&tensor(&[k, 24], 72)),
            up(&tensor(&[24], 73)),
        );
        let g = up(&tensor(&[2, 8, 24], 74));
        let xs = [&x, &w, &bias, &g];
        let before = b.launch_tally().expect("counted");
        let made = b
            .forward_some_words(&grad, &xs, &[true, false, false])
            .unwrap()
            .expect("made on the device");
        let t = b.launch_tally().expect("counted").since(&before);
        let plain = b.forward(&grad, &xs, BINDING).unwrap();
        let flags: Vec<bool> = made.iter().map(|(_, w)| *w).collect();
        assert_eq!(flags, [words, false, false], "width {k}");
        let mut made = made.into_iter().map(|(d, _)| d);
        let (dx, rest): (_, Vec<_>) = (made.next().unwrap(), made.collect());
        let mut plain = plain.into_iter();
        let plain_dx = plain.next().unwrap();
        assert_eq!(bits(&b, &rest), bits(&b, &plain.collect::<Vec<_>>()));
        if words {
            // The product's operands are converted as before (x, w, g); nothing converts dx.
            assert_eq!(t.get("to_bf16").launches, 3, "{t:?}");
        }
        assert_eq!(
            stashed_bits(&b, dx),
            stashed_bits(&b, plain_dx),
            "width {k}: dx's words"
        );
    }
}

/// A norm's gradient reads a stashed input's bf16 words as they are (the `_bf16x` kernels), and
/// an output gradient's held as words alone (`_bf16g`, `_bf16xg`): on the one-warp-per-row
/// kernels (48 wide) and the block kernels (1030 wide), LayerNorm and RMSNorm equal, bit for
/// bit, the gradients of the same values read as f32.
#[test]
fn norm_gradients_read_a_stashed_inputs_words() {
    let b = emulator(64);
    for h in [48usize, 1030] {
        let shape = [3usize, 5, h];
        let x = tensor(&shape, 55);
        let params = [tensor(&[h], 56), tensor(&[h], 57)];
        let dy = b.upload(&tensor(&shape, 58)).unwrap();
        let stashed = words_only(&b, &x);
        let from_f32 = b.upload(&bf16(&x)).unwrap();
        let pb: Vec<_> = params.iter().map(|p| b.upload(p).unwrap()).collect();
        for (of, n) in [
            (
                OpKind::LayerNorm {
                    eps: 1e-5,
                    bias: true,
                },
                2,
            ),
            (OpKind::RmsNorm { eps: 1e-6 }, 1),
        ] {
            let grad = OpKind::Grad {
                of: Box::new(of),
                wrt: (0..=n).collect(),
            };
            let mut shapes = vec![&shape[..]];
            shapes.extend(params[..n].iter().map(|p| &p.shape[..]));
            shapes.push(&shape[..]);
            assert!(b.reads_stashed_words(&grad, &shapes, 0));
            assert!(!b.reads_stashed_words(&grad, &shapes, 1), "γ");
            assert!(b.reads_stashed_words(&grad, &shapes, n + 1), "dy");
            let run = |x: &runtime::DeviceBuffer<Vec<f32>>,
                       dy: &runtime::DeviceBuffer<Vec<f32>>| {
                let mut inputs = vec![x];
                inputs.extend(pb[..n].iter());
                inputs.push(dy);
                let got = b.forward(&grad, &inputs, BINDING).unwrap();
                bits(&b, &got)
            };
            assert_eq!(run(&stashed, &dy), run(&from_f32, &dy), "width {h}");
            // dy held as words alone (its GEMM wrote them: `_bf16g`, `_bf16xg`).
            let dy_host = b.download(&dy).unwrap();
            let (dy_words, dy_rounded) =
                (words_only(&b, &dy_host), b.upload(&bf16(&dy_host)).unwrap());
            for x in [&stashed, &from_f32] {
                assert_eq!(
                    run(x, &dy_words),
                    run(x, &dy_rounded),
                    "width {h}: dy's words"
                );
            }
        }
    }
}

/// `column_sum` splits each block's rows among lanes of threads and adds the lanes' sums in
/// order: every column of a width that is not a whole number of blocks, on blocks of one to
/// many lanes, on a grid smaller than the column groups (grid-stride).
#[test]
fn column_sums_split_rows_among_lanes_and_stride_over_column_groups() {
    use kernels::device::KernelArg;
    use runtime::Device;
    let (rows, cols) = (300usize, 70usize);
    let x = tensor(&[rows, cols], 45).data;
    let want: Vec<f32> = (0..cols)
        .map(|c| (0..rows).map(|r| f64::from(x[r * cols + c])).sum::<f64>() as f32)
        .collect();
    for (block, grid) in [(16, 5), (32, 1), (64, 2), (256, 3)] {
        let dev = Emulator::new(block, false);
        let mut out = vec![f32::NAN; cols];
        let i = |v: usize| KernelArg::I64(i64::try_from(v).unwrap());
        dev.launch(
            "column_sum",
            grid,
            block,
            &mut [
                KernelArg::Out(&mut out),
                KernelArg::In(&x),
                i(rows),
                i(cols),
            ],
        )
        .unwrap();
        for c in 0..cols {
            let tol = 1e-6 * want[c].abs().max(1.0);
            assert!(
                (out[c] - want[c]).abs() <= tol,
                "block {block}, column {c}: {} vs {}",
                out[c],
                want[c]
            );
        }
    }
}

#[test]
fn unpad_rows_copies_each_row_out_of_its_pitch() {
    use kernels::device::KernelArg;
    use runtime::Device;
    let dev = Emulator::new(64, false);
    // 5 rows of 37 columns at a pitch of 40 (a GEMM output whose rows cuBLAS wrote aligned),
    // into rows 2 .. 7 of a 9-row output (one chunk of a large product).
    let (rows, cols, pitch, row0) = (5usize, 37usize, 40usize, 2usize);
    let x = tensor(&[rows, pitch], 3).data;
    let mut y = vec![f32::NAN; 9 * cols];
    let i = |v: usize| KernelArg::I64(i64::try_from(v).unwrap());
    dev.launch(
        "unpad_rows",
        3,
        64,
        &mut [
            KernelArg::Out(&mut y),
            KernelArg::In(&x),
            i(rows),
            i(cols),
            i(pitch),
            i(row0),
        ],
    )
    .unwrap();
    for r in 0..rows {
        let out = (row0 + r) * cols;
        assert_eq!(
            y[out..out + cols],
            x[r * pitch..r * pitch + cols],
            "row {r}"
        );
    }
    assert!(
        y[..row0 * cols].iter().all(|v| v.is_nan()),
        "rows before row0 untouched"
    );
}

/// The tensor-core attention reads q, k and v as their bf16 words where they lie: operands
/// made as words (or back from the stash) cost the forward no launch but its own, and f32
/// operands one conversion each, kept as their twins, which a stash after takes as they are
/// (no second conversion). The rows past the sequence read as zeros: 70 rows end inside the
/// second 64-row block, and the output equals the f32 operands' bit for bit.
#[test]
fn tensor_core_attention_reads_its_operands_words_in_place() {
    let b = tests::emulator::emulator_mma(64);
    let (attention, _) = causal_attention(3, 3);
    let shape = [2usize, 70, 3 * 32];
    let host: Vec<Tensor32> = (0..3).map(|i| tensor(&shape, 71 + i)).collect();
    let launched = |f: &mut dyn FnMut()| {
        let before = b.launch_tally().expect("counted");
        f();
        b.launch_tally().expect("counted").since(&before)
    };
    let words: Vec<_> = host.iter().map(|t| words_only(&b, t)).collect();
    let mut from_words = Vec::new();
    let t = launched(&mut || {
        from_words = b
            .forward(&attention, &[&words[0], &words[1], &words[2]], BINDING)
            .unwrap();
    });
    assert_eq!(t.launches(), 1, "the forward alone: {t:?}");
    let mut f32s: Vec<_> = host.iter().map(|t| b.upload(&bf16(t)).unwrap()).collect();
    let mut from_f32 = Vec::new();
    let t = launched(&mut || {
        from_f32 = b
            .forward(&attention, &[&f32s[0], &f32s[1], &f32s[2]], BINDING)
            .unwrap();
    });
    assert_eq!(
        (t.get("to_bf16").launches, t.launches()),
        (3, 4),
        "one conversion an operand: {t:?}"
    );
    assert_eq!(bits(&b, &from_words), bits(&b, &from_f32));
    let t = launched(&mut || {
        for x in f32s.drain(..) {
            assert!(matches!(
                b.stash_bf16(x).unwrap(),
                runtime::backend::Stashed::Words(_)
            ));
        }
    });
    assert_eq!(t.launches(), 0, "the stash keeps the twins: {t:?}");
}

/// A binary op made with its bf16 twin (`binary_forward_twin`) gives the plain forward's f32
/// values bit for bit, and a twin that is, bit for bit, the words the stash makes of them (odd
/// length: the last word's upper half zero), which the stash then keeps with no launch. f32
/// GEMMs and broadcast operands are not made so.
#[test]
fn a_binary_result_made_with_its_twin_is_the_stash_of_its_values() {
    let b = emulator(64).with_gemm_precision(GemmPrecision::Bf16);
    for (kind, shape) in [(OpKind::Add, [3usize, 5, 7]), (OpKind::Mul, [2, 4, 16])] {
        let x = b.upload(&tensor(&shape, 21)).unwrap();
        let z = b.upload(&tensor(&shape, 22)).unwrap();
        let plain = b.forward(&kind, &[&x, &z], BINDING).unwrap();
        let made = b
            .forward_with_twin(&kind, &[&x, &z])
            .unwrap()
            .expect("made with its twin");
        let stash = |x| stashed_bits(&b, x);
        let copy = b.upload(&b.download(&made).unwrap()).unwrap();
        assert_eq!(
            bits(&b, &[copy]),
            bits(&b, &plain),
            "{kind:?}: the f32 values"
        );
        let before = b.launch_tally().expect("counted");
        let twin = stash(made);
        let t = b.launch_tally().expect("counted").since(&before);
        assert_eq!(t.launches(), 0, "the stash keeps the twin: {t:?}");
        let [p] = <[_; 1]>::try_from(plain).unwrap();
        assert_eq!(twin, stash(p), "{kind:?}: the twin is the stash's words");
    }
    let x = b.upload(&tensor(&[4, 8], 23)).unwrap();
    let row = b.upload(&tensor(&[8], 24)).unwrap();
    assert!(
        b.forward_with_twin(&OpKind::Add, &[&x, &row])
            .unwrap()
            .is_none()
    );
    let f32_gemms = emulator(64);
    let y = f32_gemms.upload(&tensor(&[4, 8], 25)).unwrap();
    assert!(
        f32_gemms
            .forward_with_twin(&OpKind::Add, &[&y, &y])
            .unwrap()
            .is_none()
    );
}

/// An LM head's logits held at its GEMM's padded pitch (`Backend::forward_pitched`: a vocabulary
/// of odd width, bf16 GEMMs) are the dense product's values; the cross-entropy and its
/// gradient read them where they lie and equal the dense run bit for bit; read back, stashed or
/// made dense they are the dense values; any other op refuses them. A product whose rows are
/// whole 16-byte words, or an f32 plan's, is not held so.
#[test]
fn logits_held_at_the_gemms_pitch_read_as_the_dense_ones() {
    let b = emulator(64).with_gemm_precision(GemmPrecision::Bf16);
    let head = OpKind::Linear { bias: false };
    let (rows, hidden, vocab) = (12usize, 16usize, 37usize);
    let x = b.upload(&tensor(&[2, rows / 2, hidden], 31)).unwrap();
    let w = b.upload(&tensor(&[hidden, vocab], 32)).unwrap();
    let targets: Vec<f32> = (0..rows).map(|i| ((i * 7) % vocab) as f32).collect();
    let targets = b
        .upload(&Tensor32::new(vec![2, rows / 2], targets).unwrap())
        .unwrap();
    let dense = b.forward(&head, &[&x, &w], BINDING).unwrap().remove(0);
    let pitched = b
        .forward_pitched(&head, &[&x, &w])
        .unwrap()
        .expect("held at the pitch");
    let dl = |t: &runtime::DeviceBuffer<Vec<f32>>| host_bits(&b, t);
    assert_eq!(dl(&pitched), dl(&dense), "the product's values");
    let ce = OpKind::CrossEntropy;
    let loss = |l: &runtime::DeviceBuffer<Vec<f32>>| {
        let out = b.forward(&ce, &[l, &targets], BINDING).unwrap();
        bits(&b, &out)
    };
    assert_eq!(loss(&pitched), loss(&dense), "the loss");
    let one = b
        .upload(&Tensor32::new(vec![], vec![1.0]).unwrap())
        .unwrap();
    let grad = |l: &runtime::DeviceBuffer<Vec<f32>>| {
        let g = b.backward(&ce, &[l, &targets], &[&one]).unwrap();
        dl(g[0].as_ref().expect("the logits' gradient"))
    };
    assert_eq!(grad(&pitched), grad(&dense), "the logits' gradient");
    let err = b
        .forward(&OpKind::Gelu { tanh: true }, &[&pitched], BINDING)
        .unwrap_err();
    assert!(err.to_string().contains("pitch"), "{err}");
    let stash = |x| stashed_bits(&b, x);
    let mut made_dense = b
        .forward_pitched(&head, &[&x, &w])
        .unwrap()
        .expect("pitched");
    b.expand_stashed(&mut made_dense).unwrap();
    assert_eq!(dl(&made_dense), dl(&dense), "made dense");
    assert_eq!(stash(pitched), stash(dense), "the stash's words");
    let w8 = b.upload(&tensor(&[hidden, 40], 33)).unwrap();
    assert!(
        b.forward_pitched(&head, &[&x, &w8]).unwrap().is_none(),
        "whole words"
    );
    let f32_gemms = emulator(64);
    let (xf, wf) = (
        f32_gemms.upload(&tensor(&[rows, hidden], 34)).unwrap(),
        f32_gemms.upload(&tensor(&[hidden, vocab], 35)).unwrap(),
    );
    assert!(
        f32_gemms
            .forward_pitched(&head, &[&xf, &wf])
            .unwrap()
            .is_none(),
        "f32"
    );
}

#[test]
fn the_bf16_cases_pass_on_the_emulated_device() {
    // Without tensor cores: the CUDA-core tiles with bf16 GEMMs, the path a bf16 plan takes on
    // a device without them.
    let b = emulator(64).with_gemm_precision(GemmPrecision::Bf16);
    for case in &conformance::bf16_cases() {
        if let Err(e) = conformance::check(&b, case) {
            panic!("{e}");
        }
    }
}

/// The same cases with tensor cores: bf16 attention on `attention_mma.cu`'s warp-wide kernels
/// (every head width they are built for, grouped heads, soft cap, no mask, sequences ending
/// inside a tile), each `mma.sync` and shuffle emulated lane by lane, forward and backward
/// against the CPU kernels. A GPU runs the same cases in `plait bench kernels --device cuda`.
#[test]
fn the_tensor_core_attention_passes_on_the_emulated_warps() {
    let b = tests::emulator::emulator_mma(64);
    let mut attention = 0;
    for case in conformance::bf16_cases() {
        if case.kind.mnemonic() != "attention" {
            continue;
        }
        attention += 1;
        match conformance::check(&b, &case) {
            Ok(p) => println!("{} max error {:.1e}", case.name, p.max_error),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(attention >= 4, "{attention} attention cases");
}

/// Context parallelism on the tensor cores: each member's queries at their whole-sequence
/// positions over the group's keys (the `qpos` masks of `attention_mma.cu`, with and without a
/// sliding window), forward and every gradient, against the CPU's `kernels::context_forward`
/// at bf16's tolerance.
#[test]
fn context_parallel_attention_passes_on_the_emulated_tensor_cores() {
    let b = tests::emulator::emulator_mma(64);
    let (local, heads, kv, d) = (96, 2, 1, 64);
    // Plain, with gpt-oss's sinks (each member's rows take their heads' sinks), and in a
    // sliding window of 70 keys (counted in whole-sequence positions, across the chunks), and
    // in Llama 4's chunks of 80 keys (whole-sequence positions too).
    for (sinks, window, chunk) in [
        (false, None, None),
        (true, None, None),
        (false, Some(70), None),
        (true, Some(70), None),
        (false, None, Some(80)),
    ] {
        let kind = OpKind::Attention {
            heads: heads as u64,
            kv_heads: kv as u64,
            scale: 0.3,
            causal: true,
            softcap: None,
            sinks,
            window,
            chunk,
        };
        let mut inputs = vec![
            tensor(&[2, local, heads * d], 80),
            tensor(&[2, 2 * local, kv * d], 81),
            tensor(&[2, 2 * local, kv * d], 82),
        ];
        if sinks {
            inputs.push(tensor(&[heads], 84));
        }
        let n = inputs.len();
        inputs.push(tensor(&[2, local, heads * d], 83));
        let grad = OpKind::Grad {
            of: Box::new(kind.clone()),
            wrt: (0..n).collect(),
        };
        for index in 0..2 {
            let at = kernels::Chunks { size: 2, index };
            for (op, n) in [(&kind, n), (&grad, n + 1)] {
                let host: Vec<&Tensor32> = inputs[..n].iter().collect();
                let want = kernels::context_forward(op, &host, at).unwrap();
                let bufs: Vec<_> = host.iter().map(|t| b.upload(t).unwrap()).collect();
                let refs: Vec<_> = bufs.iter().collect();
                let got = b
                    .context_op(op, &refs, at, kernels::Accumulate::F32)
                    .unwrap();
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    let g = b.download(g).unwrap();
                    assert_eq!(g.shape, w.shape);
                    let worst = g
                        .data
                        .iter()
                        .zip(&w.data)
                        .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
                        .fold(0f32, f32::max);
                    println!("member {index} {}: max error {worst:.1e}", op.mnemonic());
                    assert!(worst < 2e-2, "member {index} {}: {worst}", op.mnemonic());
                }
            }
        }
    }
    let t = b.transfer_stats().unwrap();
    assert_eq!(t.host_ops, 0, "context attention ran on the device: {t:?}");
}

#[test]
fn unary_functions_and_their_derivatives() {
    let b = emulator(32);
    let x = || tensor(&[7, 33], 1);
    for kind in [
        OpKind::Neg,
        OpKind::Exp,
        OpKind::Tanh,
        OpKind::Sigmoid,
        OpKind::Scale { factor: -0.3 },
        OpKind::Gelu { tanh: false },
        OpKind::Gelu { tanh: true },
        OpKind::Silu,
        OpKind::Relu,
        OpKind::Clamp { limit: 0.4 },
    ] {
        check(&b, kind, &[x()], 1e-6);
    }
    for kind in [
        OpKind::Sqrt,
        OpKind::Rsqrt,
        OpKind::Pow { exponent: 2.5 },
        OpKind::Pow { exponent: 0.0 },
    ] {
        check(&b, kind, &[positive(&[7, 33], 2, 0.25)], 1e-6);
    }
}

#[test]
fn broadcasting_arithmetic_sums_gradients_back() {
    let b = emulator(32);
    for kind in [OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div] {
        for (sa, sb) in [
            (vec![4, 5, 6], vec![4, 5, 6]),
            (vec![4, 5, 6], vec![6]),
            (vec![4, 1, 6], vec![5, 1]),
            (vec![1], vec![3, 2]),
            (vec![], vec![2, 3]),
        ] {
            let (a, z) = (tensor(&sa, 3), positive(&sb, 4, 0.5));
            check(&b, kind.clone(), &[a, z], 1e-5);
        }
    }
}

#[test]
fn norms_over_the_last_axis() {
    // Blocks of whole warps take rows up to 1024 wide one warp per row (norm.cu's `_warp`
    // kernels: a row partly across the lanes, and a row filling all 32 of each lane's
    // columns); wider rows, and blocks of 1, one block per row.
    for block in [1, 32, 256] {
        let b = emulator(block);
        for h in [48, 1024, 1030] {
            let (x, gamma, beta) = (tensor(&[2, 5, h], 5), tensor(&[h], 6), tensor(&[h], 7));
            check(
                &b,
                OpKind::LayerNorm {
                    eps: 1e-5,
                    bias: true,
                },
                &[x.clone(), gamma.clone(), beta],
                1e-5,
            );
            // Cohere's LayerNorm without a beta: the LayerNorm kernels with a null beta.
            let no_bias = OpKind::LayerNorm {
                eps: 1e-5,
                bias: false,
            };
            check(&b, no_bias, &[x.clone(), gamma.clone()], 1e-5);
            check(&b, OpKind::RmsNorm { eps: 1e-6 }, &[x, gamma], 1e-5);
        }
    }
}

#[test]
fn softmax_with_and_without_the_causal_mask() {
    let b = emulator(16);
    check(
        &b,
        OpKind::Softmax { causal: false },
        &[tensor(&[3, 4, 37], 8)],
        1e-5,
    );
    // Square, and fewer queries than keys (queries aligned with the last keys).
    check(
        &b,
        OpKind::Softmax { causal: true },
        &[tensor(&[2, 3, 9, 9], 9)],
        1e-5,
    );
    check(
        &b,
        OpKind::Softmax { causal: true },
        &[tensor(&[2, 4, 11], 10)],
        1e-5,
    );
}

#[test]
fn reductions_over_the_last_axis() {
    let b = emulator(16);
    check(&b, OpKind::ReduceSum, &[tensor(&[3, 5, 40], 36)], 1e-6);
    check(&b, OpKind::ReduceMean, &[tensor(&[7, 3], 37)], 1e-6);
}

#[test]
fn cross_entropy_and_embedding() {
    let b = emulator(64);
    let logits = tensor(&[3, 5, 50], 11);
    check(
        &b,
        OpKind::CrossEntropy,
        &[logits, ids(&[3, 5], 50, 12)],
        1e-5,
    );
    check(
        &b,
        OpKind::Embedding,
        &[tensor(&[20, 12], 13), ids(&[4, 6], 20, 14)],
        1e-6,
    );
}

#[test]
fn products_and_linears_as_gemms() {
    let b = emulator(32);
    check(
        &b,
        OpKind::MatMul,
        &[tensor(&[2, 3, 5, 8], 15), tensor(&[8, 6], 16)],
        1e-5,
    );
    check(
        &b,
        OpKind::MatMul,
        &[tensor(&[2, 3, 5, 8], 17), tensor(&[2, 3, 8, 4], 18)],
        1e-5,
    );
    check(
        &b,
        OpKind::Linear { bias: false },
        &[tensor(&[4, 6, 16], 19), tensor(&[16, 12], 20)],
        1e-5,
    );
    check(
        &b,
        OpKind::Linear { bias: true },
        &[
            tensor(&[4, 6, 16], 21),
            tensor(&[16, 12], 22),
            tensor(&[12], 23),
        ],
        1e-5,
    );
    let reshape = OpKind::Reshape {
        shape: vec![Dim::from(6), Dim::from(20)],
    };
    check(&b, reshape, &[tensor(&[4, 30], 24)], 0.0);
}

#[test]
fn fused_attention_with_grouped_heads_the_causal_mask_and_a_soft_cap() {
    let attention = |heads, kv_heads, causal, softcap| OpKind::Attention {
        heads,
        kv_heads,
        scale: 0.35,
        causal,
        softcap,
        sinks: false,
        window: None,
        chunk: None,
    };
    for block in [8, 32] {
        let b = emulator(block);
        // Keys in several tiles of `block`; sq < sk (queries aligned with the last keys).
        let (q, k, v) = (
            tensor(&[2, 37, 4 * 8], 40),
            tensor(&[2, 37, 2 * 8], 41),
            tensor(&[2, 37, 2 * 8], 42),
        );
        check(
            &b,
            attention(4, 2, true, None),
            &[q.clone(), k.clone(), v.clone()],
            2e-5,
        );
        check(
            &b,
            attention(4, 2, false, None),
            &[q, k.clone(), v.clone()],
            2e-5,
        );
        let q_short = tensor(&[2, 9, 4 * 8], 43);
        check(&b, attention(4, 2, true, Some(1.5)), &[q_short, k, v], 2e-5);
        // Values narrower than keys (multi-head latent attention).
        let (q, k, v) = (
            tensor(&[1, 12, 2 * 6], 44),
            tensor(&[1, 12, 6], 45),
            tensor(&[1, 12, 4], 46),
        );
        check(&b, attention(2, 1, true, None), &[q, k, v], 2e-5);
        // Heads wider than a tile holds (128): the one-block-per-query kernels.
        let (q, k, v) = (
            tensor(&[1, 19, 2 * 136], 47),
            tensor(&[1, 19, 136], 48),
            tensor(&[1, 19, 130], 49),
        );
        check(&b, attention(2, 1, true, Some(2.0)), &[q, k, v], 2e-5);
    }
}

/// Sliding windows (Mistral's, Gemma 2's, gpt-oss's) on every f32 path: the tiled kernels
/// (windows of 1, 5 and 20 keys over 37, across tiles of 16; with fewer queries than keys;
/// with a soft cap) and the one-block-per-query kernels of heads wider than 128.
#[test]
fn fused_attention_in_a_sliding_window() {
    let grouped = |heads, kv_heads, window, softcap| OpKind::Attention {
        heads,
        kv_heads,
        scale: 0.35,
        causal: true,
        softcap,
        sinks: false,
        window: Some(window),
        chunk: None,
    };
    let attention = |window, softcap| grouped(4, 2, window, softcap);
    for block in [8, 32] {
        let b = emulator(block);
        let (q, k, v) = (
            tensor(&[2, 37, 4 * 8], 40),
            tensor(&[2, 37, 2 * 8], 41),
            tensor(&[2, 37, 2 * 8], 42),
        );
        for window in [1, 5, 20] {
            let qkv = [q.clone(), k.clone(), v.clone()];
            check(&b, attention(window, None), &qkv, 2e-5);
        }
        let q_short = tensor(&[2, 9, 4 * 8], 43);
        check(&b, attention(6, Some(1.5)), &[q_short, k, v], 2e-5);
        let wide = grouped(2, 1, 7, None);
        let (q, k, v) = (
            tensor(&[1, 19, 2 * 136], 47),
            tensor(&[1, 19, 136], 48),
            tensor(&[1, 19, 130], 49),
        );
        check(&b, wide, &[q, k, v], 2e-5);
    }
}

/// Llama 4's chunked attention on every f32 path: the tiled kernels (chunks of 1, 6 and 20
/// keys over 37, across tiles; with fewer queries than keys; under a window) and the
/// one-block-per-query kernels of heads wider than 128.
#[test]
fn fused_attention_in_chunks() {
    let chunked = |heads, kv_heads, chunk, window| {
        OpKind::Attention {
            heads,
            kv_heads,
            scale: 0.35,
            causal: true,
            softcap: None,
            sinks: false,
            window: None,
            chunk: None,
        }
        .with_mask(ir::KeyMask {
            window,
            chunk: Some(chunk),
        })
    };
    for block in [8, 32] {
        let b = emulator(block);
        let (q, k, v) = (
            tensor(&[2, 37, 4 * 8], 50),
            tensor(&[2, 37, 2 * 8], 51),
            tensor(&[2, 37, 2 * 8], 52),
        );
        for chunk in [1, 6, 20] {
            let qkv = [q.clone(), k.clone(), v.clone()];
            check(&b, chunked(4, 2, chunk, None), &qkv, 2e-5);
        }
        check(
            &b,
            chunked(4, 2, 16, Some(5)),
            &[q.clone(), k.clone(), v.clone()],
            2e-5,
        );
        let q_short = tensor(&[2, 9, 4 * 8], 53);
        check(&b, chunked(4, 2, 12, None), &[q_short, k, v], 2e-5);
        let (q, k, v) = (
            tensor(&[1, 19, 2 * 136], 57),
            tensor(&[1, 19, 136], 58),
            tensor(&[1, 19, 130], 59),
        );
        check(&b, chunked(2, 1, 7, None), &[q, k, v], 2e-5);
    }
}

#[test]
fn rotary_with_each_scaling_and_long_positions() {
    let b = emulator(32);
    for scaling in [
        RopeScaling::None,
        RopeScaling::Linear { factor: 4.0 },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max: 64.0,
        },
        RopeScaling::Yarn {
            factor: 4.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max: 64.0,
            attention_factor: 1.2,
            truncate: true,
        },
    ] {
        let rotary = OpKind::Rotary {
            heads: 3,
            theta: 10000.0,
            scaling,
        };
        check(&b, rotary, &[tensor(&[2, 7, 3 * 8], 50)], 1e-6);
    }
    // Positions up to 10⁵ (angles up to 10⁴ radians): the frequency table keeps f64
    // precision (an f32 table is off by ~1e-4 there).
    let rotary = OpKind::Rotary {
        heads: 1,
        theta: 10000.0,
        scaling: RopeScaling::None,
    };
    check(&b, rotary, &[tensor(&[1, 100_000, 8], 51)], 1e-5);
}

#[test]
fn dropout_masks_equal_the_host_ones() {
    let b = emulator(32);
    let x = tensor(&[4, 6, 10], 60);
    let xb = b.upload(&x).unwrap();
    for (p, seed, shard) in [
        (0.1, 7, None),
        (0.5, u64::MAX - 3, None),
        (0.3, 1 << 63, Some((6, 12))),
        (0.0, 9, None),
    ] {
        let mask = DropoutMask {
            p,
            seed,
            row: 8,
            per_row: 60,
            seq: 24,
            shard,
        };
        let mut want = x.clone();
        mask.apply(&mut want.data);
        let got = b.download(&b.dropout(&xb, &mask).unwrap()).unwrap();
        assert_eq!(got, want, "{mask:?}");
        if p > 0.0 {
            assert!(got.data.contains(&0.0), "something dropped");
        }
    }
}

#[test]
fn layout_ops_as_strided_copies() {
    let b = emulator(32);
    let x = || tensor(&[2, 3, 4, 5], 31);
    check(
        &b,
        OpKind::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[x()],
        0.0,
    );
    check(
        &b,
        OpKind::Transpose {
            perm: vec![3, 0, 2, 1],
        },
        &[x()],
        0.0,
    );
    check(
        &b,
        OpKind::Split {
            axis: 2,
            sizes: vec![1, 3],
        },
        &[x()],
        0.0,
    );
    check(
        &b,
        OpKind::Split {
            axis: 3,
            sizes: vec![2, 2, 1],
        },
        &[x()],
        0.0,
    );
    check(
        &b,
        OpKind::Concat { axis: 1 },
        &[x(), tensor(&[2, 1, 4, 5], 32), tensor(&[2, 2, 4, 5], 33)],
        0.0,
    );
    check(
        &b,
        OpKind::Slice {
            axis: 3,
            start: 1,
            end: 4,
        },
        &[x()],
        0.0,
    );
    let expand = OpKind::Expand {
        shape: vec![Dim::from(2), Dim::from(3), Dim::from(4)],
    };
    check(&b, expand, &[tensor(&[3, 1], 34)], 1e-6);
}

#[test]
fn adamw_on_the_device_equals_the_cpu_update() {
    let b = emulator(32);
    let cfg = AdamWConfig::default();
    let shape = [6, 7];
    let (mut p, g, mut m) = (tensor(&shape, 25), tensor(&shape, 26), tensor(&shape, 27));
    let mut v = positive(&shape, 28, 0.0);
    let up = |t: &Tensor32| b.upload(t).unwrap();
    let (mut pb, gb, mut mb, mut vb) = (up(&p), up(&g), up(&m), up(&v));
    let before = b.transfer_stats().unwrap();
    for step in 1..=4 {
        b.adamw_frozen_variance(&cfg, &mut pb, &gb, &mut mb, &mut vb, step, 2)
            .unwrap();
        kernels::adamw_frozen_variance(&cfg, &mut p, &g, &mut m, &mut v, step, Some(2)).unwrap();
    }
    assert_eq!(b.transfer_stats().unwrap().since(before).host_ops, 0);
    assert_close(&b.download(&pb).unwrap(), &p, 1e-6, "param");
    assert_close(&b.download(&mb).unwrap(), &m, 1e-6, "m");
    assert_close(&b.download(&vb).unwrap(), &v, 1e-6, "v");
}

/// The update that also writes the compute copy (`adamw_step_copy`: a program's `AdamW` and
/// the `Copy` after it) equals, bit for bit, the update then a copy, frozen second moment
/// included; with bf16 GEMMs a matrix's copy carries its bf16 twin, the words the stash (and a
/// GEMM) would otherwise make from it, so the stash converts nothing; an odd length ends in
/// half a word. A vector gets none, nor a copy without bf16 GEMMs.
#[test]
fn adamw_with_its_copy_equals_the_update_then_the_copy() {
    let cfg = AdamWConfig::default();
    for (shape, bf16_gemms) in [
        (vec![6usize, 7], true),
        (vec![5, 3], true),
        (vec![9], true),
        (vec![6, 7], false),
    ] {
        let b = if bf16_gemms {
            emulator_bf16(32)
        } else {
            emulator(32)
        };
        let (p, g, m) = (tensor(&shape, 25), tensor(&shape, 26), tensor(&shape, 27));
        let v = positive(&shape, 28, 0.0);
        let up = |t: &Tensor32| b.upload(t).unwrap();
        let (mut p1, mut m1, mut v1, gb) = (up(&p), up(&m), up(&v), up(&g));
        let (mut p2, mut m2, mut v2) = (up(&p), up(&m), up(&v));
        let mut copy = None;
        for step in 1..=3 {
            b.adamw_frozen_variance(&cfg, &mut p1, &gb, &mut m1, &mut v1, step, 2)
                .unwrap();
            let given = copy.is_some();
            assert!(
                b.adamw_copy(
                    &cfg,
                    [&mut p2, &mut m2, &mut v2],
                    &gb,
                    (step, Some(2)),
                    &mut copy
                )
                .unwrap(),
                "{shape:?}: done on the device"
            );
            assert!(copy.is_some(), "made where not given ({given})");
        }
        let copy = copy.expect("written");
        let dup = |x| b.duplicate(x).unwrap();
        assert_eq!(
            bits(&b, &[dup(&p1), m1, v1]),
            bits(&b, &[p2, m2, v2]),
            "{shape:?}: the same update"
        );
        assert_eq!(bits(&b, &[dup(&copy)]), bits(&b, &[dup(&p1)]), "the copy");
        let launches = || b.launch_tally().expect("counted").launches();
        let before = launches();
        let Stashed::Words(twin) = b.stash_bf16(copy).unwrap() else {
            panic!("a device backend stashes");
        };
        let twin_expected = bf16_gemms && shape.len() == 2;
        assert_eq!(
            launches() - before,
            u64::from(!twin_expected),
            "{shape:?}: the stash keeps the twin (no conversion) where one was written"
        );
        let Stashed::Words(made) = b.stash_bf16(p1).unwrap() else {
            panic!("a device backend stashes");
        };
        assert_eq!(
            bits(&b, &[twin]),
            bits(&b, &[made]),
            "{shape:?}: the twin's words"
        );
    }
}

/// AdamW reads a gradient held as bf16 words alone (`adamw_step_bf16g`,
/// `adamw_step_copy_bf16g`: back from the stash for its update): bit for bit the update from
/// the same values in f32.
#[test]
fn adamw_reads_a_stashed_gradients_words() {
    let b = emulator_bf16(32);
    assert!(b.adamw_reads_grad_words());
    let cfg = AdamWConfig::default();
    let shape = [6usize, 7];
    let (p, g, m) = (tensor(&shape, 25), tensor(&shape, 26), tensor(&shape, 27));
    let v = positive(&shape, 28, 0.0);
    let run = |grad: &runtime::DeviceBuffer<Vec<f32>>, with_copy: bool| {
        let up = |t: &Tensor32| b.upload(t).unwrap();
        let (mut pb, mut mb, mut vb) = (up(&p), up(&m), up(&v));
        let mut copy = None;
        if with_copy {
            assert!(
                b.adamw_copy(
                    &cfg,
                    [&mut pb, &mut mb, &mut vb],
                    grad,
                    (1, None),
                    &mut copy
                )
                .unwrap()
            );
        } else {
            b.adamw(&cfg, &mut pb, grad, &mut mb, &mut vb, 1).unwrap();
        }
        let mut all = vec![pb, mb, vb];
        all.extend(copy);
        bits(&b, &all)
    };
    for with_copy in [false, true] {
        let from_words = run(&words_only(&b, &g), with_copy);
        let from_f32 = run(&b.upload(&bf16(&g)).unwrap(), with_copy);
        assert_eq!(from_words, from_f32, "with the copy: {with_copy}");
    }
}

/// Mixtral's router (softmax, top 2 renormalized), Qwen-MoE's (unnormalized shares) and
/// DeepSeek-V3's (sigmoid, the best 2 of 4 groups), then SwiGLU experts on real gates (zero
/// for the experts not chosen).
#[test]
fn mixture_of_experts_routers_and_experts() {
    let b = emulator(32);
    let (experts, hidden, width) = (8u64, 16, 12);
    let e = experts as usize;
    let x = tensor(&[2, 5, hidden], 71);
    let w = tensor(&[hidden, e], 72);
    let routings = [
        Routing::default(),
        Routing {
            normalize: false,
            ..Routing::default()
        },
        Routing {
            sigmoid: true,
            normalize: true,
            groups: 4,
            groups_kept: 2,
            group_top: 2,
        },
        Routing {
            sigmoid: false,
            normalize: false,
            groups: 4,
            groups_kept: 2,
            group_top: 1,
        },
    ];
    for (k, routing) in [2, 2, 3, 3].into_iter().zip(routings) {
        let router = OpKind::TopKRouter {
            experts,
            k,
            routing,
            bias: false,
        };
        check(&b, router, &[x.clone(), w.clone()], 1e-5);
    }
    let router = OpKind::TopKRouter {
        experts,
        k: 2,
        routing: Routing::default(),
        bias: false,
    };
    let gates = kernels::forward(&router, &[&x, &w], BINDING)
        .unwrap()
        .remove(0);
    assert!(gates.data.contains(&0.0), "some experts are not chosen");
    let operands = [
        x,
        gates,
        tensor(&[e, hidden, width], 73),
        tensor(&[e, hidden, width], 74),
        tensor(&[e, width, hidden], 75),
    ];
    check(
        &b,
        OpKind::MoeExperts {
            experts,
            form: Default::default(),
        },
        &operands,
        1e-5,
    );
    // Llama 4's: each gate scales its expert's input.
    let form = ir::ExpertForm {
        scales_input: true,
        ..ir::ExpertForm::SWIGLU
    };
    check(&b, OpKind::MoeExperts { experts, form }, &operands, 1e-5);
    // gpt-oss's: a biased router, experts with biases and the clamped unit (a limit that
    // bites on these values).
    let biased_router = OpKind::TopKRouter {
        experts,
        k: 2,
        routing: Routing::default(),
        bias: true,
    };
    let router_bias = tensor(&[e], 76);
    check(
        &b,
        biased_router,
        &[operands[0].clone(), w, router_bias],
        1e-5,
    );
    let form = ir::ExpertForm {
        bias: true,
        alpha: 1.702,
        limit: Some(0.5),
        up_offset: 1.0,
        scales_input: false,
    };
    let mut biased = operands.to_vec();
    biased.extend([tensor(&[e, width], 77), tensor(&[e, width], 78)]);
    check(&b, OpKind::MoeExperts { experts, form }, &biased, 1e-5);
}

/// Shard 1 of a vocabulary of 21 tokens padded to 24 (8 rows per shard: rows 8..16 here, and
/// in the loss the columns past the vocabulary's end are padding), as tp 3 places it.
#[test]
fn vocabulary_parallel_shard_ops_equal_the_cpu_kernels() {
    let b = emulator(16);
    let (h, n) = (6, 8);
    let (ids, dy) = (ids(&[2, 9], 24, 80), tensor(&[2, 9, h], 81));
    let logits = tensor(&[2, 9, n], 82);
    let cases = [
        (
            VocabShard::Embedding { start: 8 },
            vec![tensor(&[n, h], 83), ids.clone()],
        ),
        (
            VocabShard::EmbeddingGrad {
                start: 8,
                table_shape: vec![n, h],
            },
            vec![ids.clone(), dy],
        ),
        (
            VocabShard::LossStats {
                start: 16,
                valid: 5,
            },
            vec![logits.clone(), ids.clone()],
        ),
        (
            VocabShard::LossCombine,
            vec![positive(&[3, 18, 3], 84, 0.1)],
        ),
        (
            VocabShard::LossGrad {
                start: 16,
                valid: 5,
            },
            vec![logits, ids, positive(&[18], 85, 1.0), tensor(&[], 86)],
        ),
    ];
    for (op, inputs) in cases {
        let before = b.transfer_stats().unwrap();
        let bufs: Vec<_> = inputs.iter().map(|t| b.upload(t).unwrap()).collect();
        let refs: Vec<_> = bufs.iter().collect();
        let got = b.vocab_shard(&op, &refs).unwrap();
        let want = op.on_host(&inputs.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(got.len(), want.len(), "{op:?}");
        for (g, w) in got.iter().zip(&want) {
            assert_close(&b.download(g).unwrap(), w, 1e-6, op.name());
        }
        assert_eq!(
            b.transfer_stats().unwrap().since(before).host_ops,
            0,
            "{op:?}"
        );
    }
}

/// Tensor parallelism's shard of an odd-width LM head (a vocabulary of 75 padded to 76, shard 1
/// of 2: columns 38..76, 37 of them real): its bf16 product's logits held at the GEMM's padded
/// pitch give the loss statistics and gradient of the dense ones bit for bit, and the gradient
/// made as the head's bf16 operand (`shard_loss_grad_words`) is the f32 gradient rounded to
/// bf16, zero past the vocabulary's end, with no f32 gradient and no host op.
#[test]
fn a_vocabulary_shard_reads_pitched_logits_and_makes_its_gradient_as_the_heads_operand() {
    let b = emulator(64).with_gemm_precision(GemmPrecision::Bf16);
    let head = OpKind::Linear { bias: false };
    let (rows, hidden, n) = (10usize, 16usize, 38usize);
    let x = b.upload(&tensor(&[2, rows / 2, hidden], 91)).unwrap();
    let w = b.upload(&tensor(&[hidden, n], 92)).unwrap();
    let ids = ids(&[2, rows / 2], 76, 93);
    let targets = b.upload(&ids).unwrap();
    let dense = b.forward(&head, &[&x, &w], BINDING).unwrap().remove(0);
    let pitched = b
        .forward_pitched(&head, &[&x, &w])
        .unwrap()
        .expect("an odd width is held at the pitch");
    let (stats, grad) = (
        VocabShard::LossStats {
            start: 38,
            valid: 37,
        },
        VocabShard::LossGrad {
            start: 38,
            valid: 37,
        },
    );
    assert!(b.vocab_reads_pitched(&stats, 0) && b.vocab_reads_pitched(&grad, 0));
    assert!(!b.vocab_reads_pitched(&grad, 1), "only the logits");
    let before = b.transfer_stats().unwrap();
    let run = |op: &VocabShard, xs: &[&runtime::DeviceBuffer<Vec<f32>>]| {
        bits(&b, &b.vocab_shard(op, xs).unwrap())
    };
    assert_eq!(
        run(&stats, &[&pitched, &targets]),
        run(&stats, &[&dense, &targets]),
        "the statistics"
    );
    let lse = b.upload(&positive(&[rows], 94, 1.0)).unwrap();
    let dloss = b.upload(&tensor(&[], 95)).unwrap();
    let f32_grad = b
        .vocab_shard(&grad, &[&dense, &targets, &lse, &dloss])
        .unwrap();
    assert_eq!(
        run(&grad, &[&pitched, &targets, &lse, &dloss]),
        bits(&b, &f32_grad),
        "the f32 gradient"
    );
    let operand = b
        .vocab_shard_pitched(&grad, &[&pitched, &targets, &lse, &dloss])
        .unwrap()
        .expect("made as the operand");
    assert!(b.holds_words_alone(&operand), "no f32 values");
    let want = bf16(&b.download(&f32_grad[0]).unwrap());
    assert_eq!(b.download(&operand).unwrap(), want, "rounded to bf16");
    assert!(want.data.chunks(n).all(|row| row[37] == 0.0), "padding");
    assert_eq!(b.transfer_stats().unwrap().since(before).host_ops, 0);
    let f32_gemms = emulator(64);
    let refs: Vec<_> = [&dense, &targets, &lse, &dloss].to_vec();
    assert!(
        f32_gemms
            .vocab_shard_pitched(&grad, &refs)
            .unwrap()
            .is_none(),
        "no bf16 GEMM reads it in an f32 plan"
    );
}

#[test]
fn ops_without_a_lowering_take_the_host_path_and_are_counted() {
    let b = emulator(32);
    let x = b.upload(&tensor(&[1, 3, 8], 29)).unwrap();
    let before = b.transfer_stats().unwrap();
    // A top-k beyond what the routing kernel holds per token (64).
    let router = OpKind::TopKRouter {
        experts: 80,
        k: 70,
        routing: Default::default(),
        bias: false,
    };
    let w = b.upload(&tensor(&[8, 80], 35)).unwrap();
    let y = b.forward(&router, &[&x, &w], BINDING).unwrap();
    assert_eq!(y.len(), 1);
    assert_eq!(b.transfer_stats().unwrap().since(before).host_ops, 1);
    // The host path reads an operand held as bf16 words alone (its f32 values unwritten, NaN
    // on the emulator) from its words.
    let x_host = tensor(&[1, 3, 8], 29);
    let from_words = b
        .forward(&router, &[&words_only(&b, &x_host), &w], BINDING)
        .unwrap();
    let from_f32 = b
        .forward(&router, &[&b.upload(&bf16(&x_host)).unwrap(), &w], BINDING)
        .unwrap();
    assert_eq!(
        bits(&b, &from_words),
        bits(&b, &from_f32),
        "the words' values"
    );
    // Malformed operands are reported by the CPU kernels, never launched.
    let bad = b.upload(&tensor(&[3, 4], 30)).unwrap();
    let err = b
        .forward(&OpKind::MatMul, &[&bad, &bad], BINDING)
        .unwrap_err();
    assert!(err.to_string().contains("matmul"), "{err}");
}

/// q, k and v read as the column blocks of one fused projection's output (`[q | k | v]`, no
/// split made): the kept forward's output and statistics, and the kept backward's gradients
/// (apart, or written side by side in one buffer laid out the same way), equal bit for bit
/// those of the same attention on q, k and v apart, with grouped heads and a sequence that
/// ends inside a tile. Heads the tensor-core kernels are not built for are
/// refused.
#[test]
fn tensor_core_attention_reads_q_k_and_v_in_place_in_their_projections_output() {
    let b = tests::emulator::emulator_mma(64);
    for (heads, kv, d, n) in [(4usize, 2usize, 64usize, 70usize), (2, 2, 32, 40)] {
        let (attention, _) = causal_attention(heads as u64, kv as u64);
        let widths = [heads * d, kv * d, kv * d];
        let packed = tensor(&[2, n, widths.iter().sum()], 64);
        let part = |i: usize| {
            let (from, w) = (widths[..i].iter().sum::<usize>(), widths[i]);
            let rows = packed.data.chunks(packed.shape[2]);
            let data = rows.flat_map(|r| r[from..from + w].to_vec()).collect();
            Tensor32::new(vec![2, n, w], data).unwrap()
        };
        let apart: Vec<_> = (0..3).map(|i| b.upload(&part(i)).unwrap()).collect();
        let xs = [&apart[0], &apart[1], &apart[2]];
        let qkv = b.upload(&packed).unwrap();
        let shapes: Vec<Vec<usize>> = widths.iter().map(|&w| vec![2, n, w]).collect();
        let parts = [&shapes[0][..], &shapes[1][..], &shapes[2][..]];
        assert!(b.reads_packed_qkv(&attention, parts), "heads {heads} d {d}");
        let want = b
            .attention_forward_keeping(&attention, &xs, false)
            .unwrap()
            .expect("kept");
        let got = b
            .attention_forward_keeping_packed(&attention, &qkv, parts, false)
            .unwrap()
            .expect("kept, packed");
        let same = |x: Vec<Vec<u32>>, y: Vec<Vec<u32>>| {
            assert_eq!(differing(&x, &y), 0, "heads {heads} d {d}");
        };
        same(
            vec![host_bits(&b, &got.out)],
            vec![host_bits(&b, &want.out)],
        );
        same(
            vec![host_bits(&b, &got.stats)],
            vec![host_bits(&b, &want.stats)],
        );
        let dy = b.upload(&tensor(&[2, n, heads * d], 65)).unwrap();
        let kept = [&dy, &want.out, &want.stats];
        let want = b
            .attention_backward_kept(&attention, &xs, kept, false)
            .unwrap()
            .expect("kept backward");
        let got = b
            .attention_backward_kept_packed(&attention, &qkv, parts, kept, (false, false))
            .unwrap()
            .expect("kept backward, packed");
        same(bits(&b, &got.grads), bits(&b, &want.grads));
        // Written packed, as one buffer laid out as `qkv` (f32, and as bf16 words alone):
        // the three gradients side by side, bit for bit.
        for as_words in [false, true] {
            let apart = b
                .attention_backward_kept(&attention, &xs, kept, as_words)
                .unwrap()
                .expect("kept backward");
            let joined = b
                .attention_backward_kept_packed(&attention, &qkv, parts, kept, (as_words, true))
                .unwrap()
                .expect("kept backward, packed");
            assert_eq!(joined.grads.len(), 1, "one buffer");
            assert_eq!(b.shape(&joined.grads[0]), packed.shape.as_slice());
            let rows = |t: Tensor32| {
                t.data
                    .chunks(t.shape[2])
                    .map(<[f32]>::to_vec)
                    .collect::<Vec<_>>()
            };
            let parts: Vec<_> = apart
                .grads
                .iter()
                .map(|g| rows(b.download(g).unwrap()))
                .collect();
            let side_by_side: Vec<u32> = (0..2 * n)
                .flat_map(|r| parts.iter().flat_map(move |p| p[r].clone()))
                .map(f32::to_bits)
                .collect();
            same(vec![host_bits(&b, &joined.grads[0])], vec![side_by_side]);
        }
    }
    let (attention, _) = causal_attention(2, 2);
    let odd = [
        &[2, 8, 2 * 36][..],
        &[2, 8, 2 * 36][..],
        &[2, 8, 2 * 36][..],
    ];
    assert!(
        !b.reads_packed_qkv(&attention, odd),
        "36-wide heads: no MMA kernels"
    );
}

/// The tensor-core attention's forward keeps each query row's log-sum-exp (FlashAttention-2):
/// its output is the plain forward's bit for bit, and the backward from the kept statistics
/// and the output (D = dO·O in one pass, no forward recomputed) equals the recomputing one up
/// to the order D is summed in; with the output as a stash's bf16 words (`attention_dsum_bf16x`)
/// it equals, bit for bit, the same values read as f32. Without tensor cores nothing is kept.
#[test]
fn tensor_core_attention_keeps_its_row_statistics_for_the_backward() {
    let b = tests::emulator::emulator_mma(64);
    for (heads, kv, d, n) in [(2usize, 1usize, 64usize, 40usize), (2, 2, 32, 70)] {
        let (attention, grad) = causal_attention(heads as u64, kv as u64);
        let host = [
            tensor(&[2, n, heads * d], 60),
            tensor(&[2, n, kv * d], 61),
            tensor(&[2, n, kv * d], 62),
        ];
        let x: Vec<_> = host.iter().map(|t| b.upload(t).unwrap()).collect();
        let xs = [&x[0], &x[1], &x[2]];
        let dy = b.upload(&tensor(&[2, n, heads * d], 63)).unwrap();
        let runtime::backend::KeptForward {
            out: o,
            stats: lse,
            out_as_words,
        } = b
            .attention_forward_keeping(&attention, &xs, false)
            .unwrap()
            .expect("kept on the tensor cores");
        assert!(!out_as_words, "f32 unless asked");
        assert_eq!(
            b.shape(&lse),
            [2 * heads * n],
            "one statistic per query row"
        );
        let plain = b.forward(&attention, &xs, BINDING).unwrap();
        assert_eq!(bits(&b, &[o]), bits(&b, &plain), "the same output");
        // Made as words: the f32 output's words, bit for bit, from the words kernel alone.
        let before = b.launch_tally().expect("counted");
        let kf = b
            .attention_forward_keeping(&attention, &xs, true)
            .unwrap()
            .expect("kept");
        let t = b.launch_tally().expect("counted").since(&before);
        assert!(kf.out_as_words, "made as words on the tensor cores");
        assert_eq!(t.launches(), 1, "one launch: {t:?}");
        assert_eq!(
            t.get(&format!("attention_forward_words_mma{d}")).launches,
            1,
            "{t:?}"
        );
        assert_eq!(
            host_bits(&b, &kf.stats),
            host_bits(&b, &lse),
            "the same statistics"
        );
        let stash = |x| stashed_bits(&b, x);
        let f32_out = b.upload(&b.download(&plain[0]).unwrap()).unwrap();
        assert_eq!(
            stash(kf.out),
            stash(f32_out),
            "heads {heads} d {d}: O's words"
        );
        let o = &plain[0];
        let kept = b
            .attention_backward_kept(&attention, &xs, [&dy, o, &lse], false)
            .unwrap()
            .expect("the kept backward on the tensor cores");
        assert!(!kept.as_words, "f32 unless asked");
        let kept = kept.grads;
        let recomputed = b
            .forward(&grad, &[&x[0], &x[1], &x[2], &dy], BINDING)
            .unwrap();
        // Made as words: the f32 gradients' words, bit for bit, from the words kernels alone.
        let before = b.launch_tally().expect("counted");
        let as_words = b
            .attention_backward_kept(&attention, &xs, [&dy, o, &lse], true)
            .unwrap()
            .expect("kept");
        let t = b.launch_tally().expect("counted").since(&before);
        assert!(as_words.as_words, "made as words on the tensor cores");
        for kernel in ["dq", "dkv"] {
            let name = format!("attention_backward_{kernel}_words_mma{d}");
            assert_eq!(t.get(&name).launches, 1, "{name}: {t:?}");
        }
        for (i, (w, g)) in as_words.grads.into_iter().zip(&kept).enumerate() {
            let f32_grad = b.upload(&b.download(g).unwrap()).unwrap();
            assert_eq!(
                stash(w),
                stash(f32_grad),
                "heads {heads} d {d}: gradient {i}'s words"
            );
        }
        for (i, (g, w)) in kept.iter().zip(&recomputed).enumerate() {
            let (g, w) = (b.download(g).unwrap(), b.download(w).unwrap());
            assert_close(
                &g,
                &w,
                1e-4,
                &format!("heads {heads}/{kv} d {d}: gradient {i}"),
            );
        }
        // dO held as words alone (its GEMM wrote them): D from its words
        // (`attention_dsum_bf16g`), bit for bit D from the same values in f32.
        let dy_host = b.download(&dy).unwrap();
        let run_dy = |dy: &runtime::DeviceBuffer<Vec<f32>>| {
            let got = b
                .attention_backward_kept(&attention, &xs, [dy, o, &lse], false)
                .unwrap()
                .expect("kept");
            bits(&b, &got.grads)
        };
        assert_eq!(
            run_dy(&words_only(&b, &dy_host)),
            run_dy(&b.upload(&bf16(&dy_host)).unwrap()),
            "heads {heads} d {d}: dO from its words"
        );
        let o_host = b.download(o).unwrap();
        let from_words = words_only(&b, &o_host);
        let from_f32 = b.upload(&bf16(&o_host)).unwrap();
        let run = |o: &runtime::DeviceBuffer<Vec<f32>>| {
            let got = b
                .attention_backward_kept(&attention, &xs, [&dy, o, &lse], false)
                .unwrap()
                .expect("kept");
            bits(&b, &got.grads)
        };
        assert_eq!(run(&from_words), run(&from_f32), "heads {heads} d {d}");
    }
    let plain = emulator(64);
    let x = plain.upload(&tensor(&[1, 8, 64], 64)).unwrap();
    let (attention, _) = causal_attention(1, 1);
    assert!(
        plain
            .attention_forward_keeping(&attention, &[&x, &x, &x], true)
            .unwrap()
            .is_none(),
        "the f32 kernels recompute"
    );
}
