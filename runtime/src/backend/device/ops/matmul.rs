//! `MatMul` and `Linear` as GEMMs ([`Device::gemm`]: cuBLAS on a GPU), the bias as a broadcast
//! add and its gradient as a column sum.

use ir::OpKind;

use super::{Buf, Weighted};
use crate::RuntimeError;
use crate::backend::device::{Device, DeviceBackend, Gemm, GemmPrecision, KernelArg, bf16_gemm};

/// The shapes of a product `x · w` the device runs: `w` one matrix (every leading dim of `x`
/// folded into M), or both batched with equal batch dims. `None` otherwise (broadcast batch
/// dims, mismatched k): the host path.
#[derive(Clone, Copy, Debug)]
struct Product {
    m: usize,
    k: usize,
    n: usize,
    /// Matrices in the batch; 1 when `w` is one matrix.
    batch: usize,
    /// Whether `w` has the batch dims too (else one matrix serves every row of `x`).
    batched_w: bool,
    precision: GemmPrecision,
}

fn product(kind: &OpKind, xs: &[usize], ws: &[usize]) -> Option<Product> {
    let linear = matches!(kind, OpKind::Linear { .. });
    let (rx, rw) = (xs.len(), ws.len());
    if rw < 2 || rx < if linear { 1 } else { 2 } || (linear && rw != 2) {
        return None;
    }
    let (k, n) = (ws[rw - 2], ws[rw - 1]);
    if xs[rx - 1] != k {
        return None;
    }
    if rw == 2 {
        let m = xs[..rx - 1].iter().product();
        return Some(Product {
            m,
            k,
            n,
            batch: 1,
            batched_w: false,
            precision: GemmPrecision::F32,
        });
    }
    (rx == rw && xs[..rx - 2] == ws[..rw - 2]).then(|| Product {
        m: xs[rx - 2],
        k,
        n,
        batch: xs[..rx - 2].iter().product(),
        batched_w: true,
        precision: GemmPrecision::F32,
    })
}

impl Product {
    /// `y = x · w`.
    fn forward(&self) -> Gemm {
        let (m, k, n) = (self.m, self.k, self.n);
        Gemm {
            batch: self.batch,
            stride_a: m * k,
            stride_b: if self.batched_w { k * n } else { 0 },
            stride_c: m * n,
            precision: self.precision,
            ..Gemm::plain(m, k, n)
        }
    }

    /// `dx = g · wᵀ`.
    fn input_grad(&self) -> Gemm {
        let (m, k, n) = (self.m, self.k, self.n);
        Gemm {
            batch: self.batch,
            trans_b: true,
            stride_a: m * n,
            stride_b: if self.batched_w { k * n } else { 0 },
            stride_c: m * k,
            precision: self.precision,
            ..Gemm::plain(m, n, k)
        }
    }

    /// `dw = xᵀ · g`: per batch entry when `w` is batched, else one product over all rows.
    fn weight_grad(&self) -> Gemm {
        let (m, k, n) = (self.m, self.k, self.n);
        let batch = if self.batched_w { self.batch } else { 1 };
        Gemm {
            batch,
            trans_a: true,
            stride_a: m * k,
            stride_b: m * n,
            stride_c: k * n,
            precision: self.precision,
            ..Gemm::plain(k, m, n)
        }
    }
}

/// Whether `kind`'s operands are a product's `x`, `w` and (for a biased linear) a `[n]` bias;
/// its GEMMs in `precision`.
fn operands<'a, D: Device>(
    precision: GemmPrecision,
    kind: &OpKind,
    xs: &[&'a Buf<D>],
) -> Option<(Weighted<'a, D>, Product)> {
    let (x, w, bias) = match (kind, xs) {
        (OpKind::MatMul | OpKind::Linear { bias: false }, &[x, w]) => (x, w, None),
        (OpKind::Linear { bias: true }, &[x, w, bias]) => (x, w, Some(bias)),
        _ => return None,
    };
    let p = product(kind, &x.shape, &w.shape)?;
    let p = Product { precision, ..p };
    if bias.is_some_and(|b| b.shape != [p.n]) {
        return None;
    }
    Some(((x, w, bias), p))
}

/// `x`'s bf16 twin ([`super::super::DeviceBuffer::bf16`]) for a bf16 GEMM that reads it as
/// one row-major matrix `cols` wide, made now where it has none: then this copy serves every
/// later GEMM that reads `x` (a weight's forward and backward products, an input's forward
/// product and its weight gradient) and the stash, each of which would convert it again.
/// `None` where the GEMMs are f32, the device makes no bf16 copies, or `cols` is not a
/// multiple of 8 (the twin's dense words are then not the padded rows a GEMM reads): the
/// GEMM converts `x` itself.
fn bf16_twin<'x, D: Device>(
    b: &DeviceBackend<D>,
    x: &'x Buf<D>,
    cols: usize,
) -> Result<Option<&'x D::Mem>, RuntimeError> {
    if b.gemm_precision != GemmPrecision::Bf16 || x.len == 0 || !cols.is_multiple_of(8) {
        return Ok(None);
    }
    if x.bf16.get().is_none() {
        let Some(made) = b.device.bf16_operand(&x.mem, x.len / cols, cols)? else {
            return Ok(None);
        };
        if let Err(made) = x.bf16.set(made) {
            b.device.release(made);
        }
    }
    Ok(x.bf16.get())
}

/// A GEMM operand: `x`'s f32 memory, or its bf16 twin where it has or takes one.
fn operand<'x, D: Device>(
    b: &DeviceBackend<D>,
    x: &'x Buf<D>,
    cols: usize,
    one_matrix: bool,
) -> Result<(&'x D::Mem, bool), RuntimeError> {
    if one_matrix && let Some(twin) = bf16_twin(b, x, cols)? {
        return Ok((twin, true));
    }
    Ok((&x.mem, false))
}

/// Whether op `kind` on inputs of `shapes` reads input `operand` only through its bf16 twin
/// (`Backend::reads_stashed_words`), as [`forward`] and [`backward`] would run it: a bf16
/// product's `x` or `w` that is one matrix with rows a multiple of 8 wide (a twin is read
/// before any conversion), or an operand a gradient's products do not read at all. False
/// for anything those lowerings would send to the host, which reads every operand in f32.
pub(crate) fn reads_only_bf16_twin<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    shapes: &[&[usize]],
    operand: usize,
) -> bool {
    if b.gemm_precision != GemmPrecision::Bf16 {
        return false;
    }
    if let OpKind::Grad { of, .. } = kind
        && matches!(**of, OpKind::MatMul | OpKind::Linear { .. })
        && operand + 1 == shapes.len()
        && operand >= 2
    {
        // The output gradient: both products and the bias's sums read its twin.
        return product_of_shapes(of, &shapes[..operand])
            .is_some_and(|p| g_twin_fits(&p) && shapes[operand] == out_shape(shapes[0], p.n));
    }
    if operand > 1 {
        return false;
    }
    let (of, wanted, operands) = match kind {
        OpKind::MatMul | OpKind::Linear { .. } => (kind, None, shapes),
        OpKind::Grad { of, wrt } if matches!(**of, OpKind::MatMul | OpKind::Linear { .. }) => {
            let Some((dy, xs)) = shapes.split_last() else {
                return false;
            };
            (&**of, Some((wrt, *dy)), xs)
        }
        _ => return false,
    };
    let Some(p) = product_of_shapes(of, operands) else {
        return false;
    };
    let x_as_twin = p.batch == 1 && p.k.is_multiple_of(8);
    let w_as_twin = !p.batched_w && p.n.is_multiple_of(8);
    match wanted {
        None => [x_as_twin, w_as_twin][operand],
        Some((wrt, dy)) => {
            if dy != out_shape(operands[0], p.n).as_slice() {
                return false;
            }
            // x is read by dw = xᵀ · g (wanted: operand 1), w by dx = g · wᵀ (operand 0).
            let read_by = usize::from(operand == 0);
            let dw_one = p.weight_grad().batch == 1;
            !wrt.contains(&read_by)
                || if operand == 0 {
                    x_as_twin && dw_one
                } else {
                    w_as_twin
                }
        }
    }
}

/// Whether op `kind` on inputs of `shapes` reads input `operand` as the bf16 GEMM operand it
/// may be held as ([`DeviceBackend::alloc_operand`]; `Backend::reads_pitched`): the output
/// gradient of a bias-free bf16 product of one matrix, which both its GEMMs read as that copy
/// (a bias's gradient would sum it in f32).
pub(super) fn reads_operand_form(
    precision: GemmPrecision,
    kind: &OpKind,
    shapes: &[&[usize]],
    operand: usize,
) -> bool {
    let OpKind::Grad { of, .. } = kind else {
        return false;
    };
    let Some((dy, xs)) = shapes.split_last() else {
        return false;
    };
    operand + 1 == shapes.len()
        && precision == GemmPrecision::Bf16
        && matches!(**of, OpKind::MatMul | OpKind::Linear { bias: false })
        && product_of_shapes(of, xs).is_some_and(|p| {
            operand_form_fits(&p, false) && *dy == out_shape(xs[0], p.n).as_slice()
        })
}

/// Whether product `p` (biased or not), run as bf16 GEMMs, reads its output gradient as an
/// operand-form buffer: one matrix, no bias.
fn operand_form_fits(p: &Product, biased: bool) -> bool {
    p.batch == 1 && !biased && !empty(p)
}

/// [`operands`]' product from shapes alone: `None` where the lowering would refuse them.
fn product_of_shapes(kind: &OpKind, shapes: &[&[usize]]) -> Option<Product> {
    let (x, w, bias) = match (kind, shapes) {
        (OpKind::MatMul | OpKind::Linear { bias: false }, &[x, w]) => (x, w, None),
        (OpKind::Linear { bias: true }, &[x, w, bias]) => (x, w, Some(bias)),
        _ => return None,
    };
    let p = product(kind, x, w)?;
    if bias.is_some_and(|b| b != [p.n]) || empty(&p) {
        return None;
    }
    Some(p)
}

fn out_shape(x: &[usize], n: usize) -> Vec<usize> {
    let mut shape = x[..x.len() - 1].to_vec();
    shape.push(n);
    shape
}

fn empty(p: &Product) -> bool {
    p.m == 0 || p.k == 0 || p.n == 0 || p.batch == 0
}

pub(super) fn forward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(((x, w, bias), p)) = operands::<D>(b.gemm_precision, kind, xs) else {
        return Ok(None);
    };
    let mut y = product_of(b, x, w, &p)?;
    if let Some(bias) = bias
        && y.len > 0
    {
        let block = b.device.block_size();
        b.device.launch(
            "add_bias",
            super::row_grid(y.len / p.n),
            block,
            &mut [
                KernelArg::Out(&mut y.mem),
                KernelArg::In(&bias.mem),
                super::size(y.len),
                super::size(p.n),
            ],
        )?;
    }
    Ok(Some(y))
}

/// `x · w` into a new buffer (zeros for an empty product, which no GEMM writes).
fn product_of<D: Device>(
    b: &DeviceBackend<D>,
    x: &Buf<D>,
    w: &Buf<D>,
    p: &Product,
) -> Result<Buf<D>, RuntimeError> {
    let shape = out_shape(&x.shape, p.n);
    if empty(p) {
        return b.alloc_zeroed(&shape);
    }
    let mut y = b.alloc(&shape)?;
    let mut g = p.forward();
    let (xm, x_given) = operand(b, x, p.k, p.batch == 1)?;
    let (wm, w_given) = operand(b, w, p.n, !p.batched_w)?;
    g.given_bf16 = [x_given, w_given];
    b.device.gemm(&g, xm, wm, &mut y.mem)?;
    Ok(y)
}

/// A product without a bias held at the padded pitch its bf16 GEMM writes its rows at
/// ([`DeviceBuffer::pitch`](crate::backend::device::DeviceBuffer)): cuBLAS writes them into the
/// output itself, with no scratch and no copy out (`unpad_rows`). `None` where the product is
/// not padded so (its rows are whole 16-byte words), or not a bf16 one.
pub(in crate::backend::device) fn forward_pitched<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(((x, w, None), p)) = operands::<D>(b.gemm_precision, kind, xs) else {
        return Ok(None);
    };
    if empty(&p) || p.precision != GemmPrecision::Bf16 || p.batch != 1 {
        return Ok(None);
    }
    let mut g = p.forward();
    let (xm, x_given) = operand(b, x, p.k, true)?;
    let (wm, w_given) = operand(b, w, p.n, !p.batched_w)?;
    g.given_bf16 = [x_given, w_given];
    let Some(pitch) = bf16_gemm::padded_output(&g) else {
        return Ok(None);
    };
    g.c_pitch = pitch;
    let mut y = b.alloc_pitched(&out_shape(&x.shape, p.n), pitch)?;
    b.device.gemm(&g, xm, wm, &mut y.mem)?;
    Ok(Some(y))
}

/// A biased linear's output made as bf16 words alone ([`super::words`]): the bias rounded to
/// bf16 in every row of the words (`bias_rows_words`), then the bf16 GEMM adding its product
/// to them (`Gemm::accumulate`: the f32 sum rounded once), written as words in place: the
/// bias rounded to bf16 first, as PyTorch's autocast gives a bf16 linear its bias. No f32 product is made. Where
/// cuBLAS cannot write the product as words (rows not whole 16-byte words), the product in
/// f32 and its words with the bias added after (`add_bias_to_words`). `None` without a bias,
/// or for rows of odd width.
pub(super) fn forward_words<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
) -> Result<Option<Buf<D>>, RuntimeError> {
    let Some(((x, w, Some(bias)), p)) = operands::<D>(b.gemm_precision, kind, xs) else {
        return Ok(None);
    };
    if empty(&p) || !p.n.is_multiple_of(2) {
        return Ok(None);
    }
    let mut g = p.forward();
    g.c_words = p.precision == GemmPrecision::Bf16 && p.batch == 1;
    if g.c_words && bf16_gemm::writes_words(&g) {
        return onto_bias_words(b, (x, w, bias), &p, g).map(Some);
    }
    let mut y = product_of(b, x, w, &p)?;
    let mut words = b.device.alloc(y.len.div_ceil(2))?;
    let block = b.device.block_size();
    b.device.launch(
        "add_bias_to_words",
        super::row_grid(y.len / p.n),
        block,
        &mut [
            KernelArg::Out(&mut words),
            KernelArg::In(&y.mem),
            KernelArg::In(&bias.mem),
            super::size(y.len),
            super::size(p.n),
        ],
    )?;
    if let Err(w) = y.bf16.set(words) {
        b.device.release(w);
    }
    y.bf16_exact = true;
    // The product was scratch: the output holds its words alone until expanded.
    b.drop_f32(&mut y)?;
    Ok(Some(y))
}

/// `x · w + bias` as words alone: the bias's words in every row, the bf16 GEMM `g` (which
/// writes words) adding its product onto them.
fn onto_bias_words<D: Device>(
    b: &DeviceBackend<D>,
    (x, w, bias): (&Buf<D>, &Buf<D>, &Buf<D>),
    p: &Product,
    mut g: Gemm,
) -> Result<Buf<D>, RuntimeError> {
    let mut y = super::output_buffer(b, &out_shape(&x.shape, p.n), true)?;
    let len = y.len;
    let block = b.device.block_size();
    b.device.launch(
        "bias_rows_words",
        super::row_grid(len / p.n),
        block,
        &mut [
            KernelArg::Out(super::written::<D>(&mut y)),
            KernelArg::In(&bias.mem),
            super::size(len),
            super::size(p.n),
        ],
    )?;
    let (xm, x_given) = operand(b, x, p.k, true)?;
    let (wm, w_given) = operand(b, w, p.n, !p.batched_w)?;
    g.given_bf16 = [x_given, w_given];
    g.accumulate = true;
    b.device.gemm(&g, xm, wm, super::written::<D>(&mut y))?;
    Ok(y)
}

/// `[dx, dw]`, and `db` after them for a biased linear; those `wanted` marks false are `None`
/// (not computed: a `Grad` op that asks only for `dx` runs one GEMM). `dx` and `dw` with their
/// `as_words` mark true are written by their GEMM as bf16 words alone where cuBLAS can
/// ([`bf16_gemm::writes_words`]; the buffer says so: `f32_lazy`), else in f32.
pub(super) fn backward<D: Device>(
    b: &DeviceBackend<D>,
    kind: &OpKind,
    xs: &[&Buf<D>],
    g: &Buf<D>,
    wanted: &[bool],
    as_words: [bool; 2],
) -> Result<Option<Vec<Option<Buf<D>>>>, RuntimeError> {
    let Some(((x, w, bias), p)) = operands::<D>(b.gemm_precision, kind, xs) else {
        return Ok(None);
    };
    if g.shape != out_shape(&x.shape, p.n) {
        return Ok(None);
    }
    let want = |i: usize| wanted.get(i).copied().unwrap_or(true);
    // Both products read g ([m, n]): as the operand it is held as (the cross-entropy's
    // gradient), as its twin where it has one (made as words), else a bf16 plan's converts it
    // once for the two.
    let operand_form = DeviceBackend::<D>::is_operand(g);
    let bf16 = p.precision == GemmPrecision::Bf16;
    if operand_form && !(bf16 && operand_form_fits(&p, bias.is_some())) {
        return Err(RuntimeError::DeviceLaunch {
            kernel: "gemm",
            message: format!(
                "a product's output gradient held as a bf16 GEMM operand reached a product that \
                 does not read it so ({p:?}, biased: {})",
                bias.is_some()
            ),
        });
    }
    let twin = g.bf16.get().filter(|_| {
        operand_form || (p.precision == GemmPrecision::Bf16 && g_twin_fits(&p) && !empty(&p))
    });
    let g16 = if twin.is_none()
        && p.precision == GemmPrecision::Bf16
        && p.batch == 1
        && want(0)
        && want(1)
        && !empty(&p)
    {
        b.device.bf16_operand(&g.mem, p.m, p.n)?
    } else {
        None
    };
    let (g_in, g_given) = match (twin, &g16) {
        (Some(m), _) | (None, Some(m)) => (m, true),
        (None, None) => (&g.mem, false),
    };
    let mut out = Vec::with_capacity(3);
    for (i, words) in as_words.into_iter().enumerate() {
        if !want(i) {
            out.push(None);
            continue;
        }
        // dx = g · wᵀ reads w as the forward did; dw = xᵀ · g reads x so (stored [m, k]).
        let (mut gemm, a, bm, shape) = if i == 0 {
            let mut dx = p.input_grad();
            let (wm, w_given) = operand(b, w, p.n, !p.batched_w && !empty(&p))?;
            dx.given_bf16 = [g_given, w_given];
            (dx, g_in, wm, &x.shape)
        } else {
            let mut dw = p.weight_grad();
            let (xm, x_given) = operand(b, x, p.k, dw.batch == 1 && !empty(&p))?;
            dw.given_bf16 = [x_given, g_given];
            (dw, xm, g_in, &w.shape)
        };
        gemm.c_words = words && !empty(&p) && bf16_gemm::writes_words(&gemm);
        let mut d = if empty(&p) {
            b.alloc_zeroed(shape)?
        } else {
            super::output_buffer(b, shape, gemm.c_words)?
        };
        if !empty(&p) {
            b.device.gemm(&gemm, a, bm, super::written::<D>(&mut d))?;
        }
        out.push(Some(d));
    }
    if let Some(m) = g16 {
        b.device.release(m);
    }
    if bias.is_some() {
        out.push(if want(2) {
            Some(bias_grad(b, g, p.n)?)
        } else {
            None
        });
    }
    Ok(Some(out))
}

/// A bias's gradient: `g` summed over every row (from its words where it has only those).
fn bias_grad<D: Device>(
    b: &DeviceBackend<D>,
    g: &Buf<D>,
    n: usize,
) -> Result<Buf<D>, RuntimeError> {
    super::column_total(b, g, g.len / n.max(1), n)
}

/// Whether a product's output gradient can be read as its twin in a bf16 plan (`[m, n]` words,
/// rows of whole 16-byte words, one matrix), as both of the linear's products and its bias's
/// column sums then read it.
fn g_twin_fits(p: &Product) -> bool {
    p.batch == 1 && p.n.is_multiple_of(8)
}
