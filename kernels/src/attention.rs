//! Scaled dot-product `Attention` with grouped-query heads, an optional causal mask, an
//! optional soft cap on the scores (Gemma 2) and optional attention sinks (gpt-oss).
//!
//! Per (batch, query head) the scores S = scale·Q Kᵀ and the output P V are two gemms on
//! strided views of the `[B, S, heads·width]` operands (no head-major copies); the softmax runs on
//! one `[Sq, Sk]` scratch matrix reused across heads.

use crate::gemm::{Mat, MatMut, gemm};
use crate::shape::{attr_usize, expect_shape, operands};
use crate::softmax::{softmax_row, softmax_row_vjp_in_place, softmax_row_with_sink, visible_keys};
use crate::{KernelError, Tensor32};

const OP: &str = "attention";

/// The attention op's attributes, and its sinks where it has them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attention<'s> {
    pub heads: u64,
    pub kv_heads: u64,
    pub scale: f64,
    pub causal: bool,
    /// cap·tanh(s/cap) on the scaled scores before the mask (Gemma 2).
    pub softcap: Option<f64>,
    /// One more logit per query head in each row's softmax, reading no value (gpt-oss).
    pub sinks: Option<&'s Tensor32>,
    /// Each causal query sees only its window's keys, or its own chunk's (`ir::KeyMask`).
    pub mask: ir::KeyMask,
}

/// Sizes of one call: q is `[b, sq, heads·d]`, k is `[b, sk, kv·d]`, v is `[b, sk, kv·dv]`
/// and the output `[b, sq, heads·dv]` (multi-head latent attention's values are narrower
/// than its queries and keys; elsewhere `dv = d`).
struct Layout {
    b: usize,
    sq: usize,
    sk: usize,
    heads: usize,
    kv: usize,
    d: usize,
    dv: usize,
}

fn rank3(what: &'static str, t: &Tensor32) -> Result<[usize; 3], KernelError> {
    <[usize; 3]>::try_from(t.shape.as_slice()).map_err(|_| KernelError::Shape {
        op: OP,
        what,
        got: t.shape.clone(),
        want: "[B, S, heads*d]".into(),
    })
}

/// One head of a `[b, rows, heads·width]` tensor: which batch and head, and the tensor's
/// head count and per-head width.
#[derive(Clone, Copy)]
struct Head {
    b: usize,
    index: usize,
    rows: usize,
    heads: usize,
    width: usize,
}

impl Head {
    /// The head's first element and its row stride in the flat tensor.
    fn offset_and_stride(self) -> (usize, usize) {
        let w = self.heads * self.width;
        (self.b * self.rows * w + self.index * self.width, w)
    }

    fn view<'a>(self, data: &'a [f32]) -> Mat<'a> {
        let (offset, rs) = self.offset_and_stride();
        Mat {
            data,
            offset,
            rows: self.rows,
            cols: self.width,
            rs,
            cs: 1,
        }
    }

    fn view_mut<'a>(self, data: &'a mut [f32]) -> MatMut<'a> {
        let (offset, rs) = self.offset_and_stride();
        MatMut {
            data,
            offset,
            rows: self.rows,
            cols: self.width,
            rs,
            cs: 1,
        }
    }
}

impl Layout {
    fn new(
        a: &Attention<'_>,
        q: &Tensor32,
        k: &Tensor32,
        v: &Tensor32,
    ) -> Result<Layout, KernelError> {
        let (heads, kv) = (attr_usize(OP, a.heads)?, attr_usize(OP, a.kv_heads)?);
        if heads == 0 || kv == 0 || heads % kv != 0 {
            return Err(KernelError::Attribute {
                op: OP,
                reason: format!("heads {heads} must be a positive multiple of kv_heads {kv}"),
            });
        }
        let [b, sq, qw] = rank3("query", q)?;
        let [_, sk, _] = rank3("key", k)?;
        let [_, _, vw] = rank3("value", v)?;
        if qw % heads != 0 || vw % kv != 0 {
            return Err(KernelError::Shape {
                op: OP,
                what: if qw % heads != 0 { "query" } else { "value" },
                got: if qw % heads != 0 {
                    q.shape.clone()
                } else {
                    v.shape.clone()
                },
                want: format!("a width divisible by {heads} heads ({kv} for the value)"),
            });
        }
        let (d, dv) = (qw / heads, vw / kv);
        expect_shape(OP, "key", k, &[b, sk, kv * d])?;
        expect_shape(OP, "value", v, &[b, sk, kv * dv])?;
        if let Some(sinks) = a.sinks {
            expect_shape(OP, "sinks", sinks, &[heads])?;
        }
        Ok(Layout {
            b,
            sq,
            sk,
            heads,
            kv,
            d,
            dv,
        })
    }

    /// The output's shape, `[b, sq, heads·dv]`.
    fn out_shape(&self) -> Vec<usize> {
        vec![self.b, self.sq, self.heads * self.dv]
    }

    /// Query head `h` of batch `b` (q, dq): `[sq, d]`.
    fn q(&self, b: usize, h: usize) -> Head {
        self.head(b, h, self.sq, self.heads, self.d)
    }

    /// Output head `h` of batch `b` (the output, its gradient): `[sq, dv]`.
    fn o(&self, b: usize, h: usize) -> Head {
        self.head(b, h, self.sq, self.heads, self.dv)
    }

    /// The key head that query head `h` reads, of batch `b`: `[sk, d]`.
    fn k(&self, b: usize, h: usize) -> Head {
        self.head(b, self.group(h), self.sk, self.kv, self.d)
    }

    /// The value head that query head `h` reads, of batch `b`: `[sk, dv]`.
    fn v(&self, b: usize, h: usize) -> Head {
        self.head(b, self.group(h), self.sk, self.kv, self.dv)
    }

    fn group(&self, h: usize) -> usize {
        h / (self.heads / self.kv)
    }

    fn head(&self, b: usize, index: usize, rows: usize, heads: usize, width: usize) -> Head {
        Head {
            b,
            index,
            rows,
            heads,
            width,
        }
    }
}

impl Attention<'_> {
    /// The scores scale·Q Kᵀ of (batch `b`, head `h`) into `s` `[sq, sk]`, soft-capped where
    /// the op caps.
    fn scores(
        &self,
        l: &Layout,
        q: &Tensor32,
        k: &Tensor32,
        b: usize,
        h: usize,
        s: &mut [f32],
    ) -> Result<(), KernelError> {
        gemm(
            self.scale as f32,
            l.q(b, h).view(&q.data),
            l.k(b, h).view(&k.data).t(),
            0.0,
            MatMut::rm(s, 0, l.sq, l.sk),
        )?;
        if let Some(cap) = self.softcap {
            let cap = cap as f32;
            s.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
        }
        Ok(())
    }

    /// The gradient through the soft cap, from the capped scores: 1 − (capped/cap)².
    fn uncap(&self, capped: &[f32], ds: &mut [f32]) {
        if let Some(cap) = self.softcap {
            let cap = cap as f32;
            for (d, &c) in ds.iter_mut().zip(capped) {
                *d *= 1.0 - (c / cap) * (c / cap);
            }
        }
    }

    /// The probabilities P = softmax(scores) of (batch `b`, head `h`) into `p` `[sq, sk]`,
    /// and each row's sink share into `sunk` `[sq]` (zero without sinks).
    /// `at`: each query's position in the keys' order (keys at positions up to it are visible
    /// to a causal query); `None`: the queries are the last `sq` of the `sk` keys.
    #[allow(clippy::too_many_arguments)]
    fn probs(
        &self,
        l: &Layout,
        (q, k): (&Tensor32, &Tensor32),
        b: usize,
        h: usize,
        p: &mut [f32],
        sunk: &mut [f32],
        at: Option<&[usize]>,
    ) -> Result<(), KernelError> {
        self.scores(l, q, k, b, h, p)?;
        let sink = self.sinks.map(|s| s.data[h]);
        if l.sk > 0 {
            for ((i, row), share) in p.chunks_exact_mut(l.sk).enumerate().zip(sunk) {
                let visible = match at {
                    Some(pos) if self.causal => pos.get(i).map_or(l.sk, |&x| x + 1),
                    _ => visible_keys(i, l.sq, l.sk, self.causal),
                }
                .min(l.sk);
                // Keys before the window or the query's chunk take no share (their weights
                // are zeroed).
                let first = usize::try_from(self.mask.first_key(visible as u64)).unwrap_or(visible);
                let (before, row) = row.split_at_mut(first);
                before.fill(0.0);
                let visible = visible - first;
                *share = match sink {
                    None => {
                        softmax_row(row, visible);
                        0.0
                    }
                    Some(s) => softmax_row_with_sink(row, visible, s),
                };
            }
        }
        Ok(())
    }

    pub(crate) fn forward(
        &self,
        q: &Tensor32,
        k: &Tensor32,
        v: &Tensor32,
    ) -> Result<Tensor32, KernelError> {
        self.forward_at(q, k, v, None)
    }

    /// [`Attention::forward`] with each query at its own position among the keys (`at`).
    pub(crate) fn forward_at(
        &self,
        q: &Tensor32,
        k: &Tensor32,
        v: &Tensor32,
        at: Option<&[usize]>,
    ) -> Result<Tensor32, KernelError> {
        let l = Layout::new(self, q, k, v)?;
        let mut out = Tensor32::zeros(&l.out_shape())?;
        let mut p = vec![0f32; l.sq * l.sk];
        let mut sunk = vec![0f32; l.sq];
        for b in 0..l.b {
            for h in 0..l.heads {
                self.probs(&l, (q, k), b, h, &mut p, &mut sunk, at)?;
                gemm(
                    1.0,
                    Mat::rm(&p, 0, l.sq, l.sk),
                    l.v(b, h).view(&v.data),
                    0.0,
                    l.o(b, h).view_mut(&mut out.data),
                )?;
            }
        }
        Ok(out)
    }

    /// With P the probabilities and dO the output gradient, per (batch, head):
    /// dV += Pᵀ dO, dP = dO Vᵀ, dS = softmax'(dP), dQ = scale·dS K, dK += scale·dSᵀ Q.
    /// Query heads sharing a kv head accumulate into the same dK/dV columns. A sink reads no
    /// value: its logit's gradient is its share times −Σ P·dP (softmax's rule with dP = 0).
    /// Returns dq, dk, dv and, where the op has sinks, their gradient.
    pub(crate) fn vjp(
        &self,
        q: &Tensor32,
        k: &Tensor32,
        v: &Tensor32,
        g: &Tensor32,
    ) -> Result<Vec<Tensor32>, KernelError> {
        self.vjp_at(q, k, v, g, None)
    }

    /// [`Attention::vjp`] with each query at its own position among the keys (`at`).
    pub(crate) fn vjp_at(
        &self,
        q: &Tensor32,
        k: &Tensor32,
        v: &Tensor32,
        g: &Tensor32,
        at: Option<&[usize]>,
    ) -> Result<Vec<Tensor32>, KernelError> {
        let l = Layout::new(self, q, k, v)?;
        expect_shape(OP, "output gradient", g, &l.out_shape())?;
        let mut dq = Tensor32::zeros(&q.shape)?;
        let mut dk = Tensor32::zeros(&k.shape)?;
        let mut dv = Tensor32::zeros(&v.shape)?;
        let mut dsinks = vec![0f64; l.heads];
        let mut p = vec![0f32; l.sq * l.sk];
        let mut sunk = vec![0f32; l.sq];
        let mut ds = vec![0f32; l.sq * l.sk];
        // The capped scores, kept for the cap's gradient (only when the op caps).
        let mut capped = vec![
            0f32;
            if self.softcap.is_some() {
                l.sq * l.sk
            } else {
                0
            }
        ];
        let scale = self.scale as f32;
        for b in 0..l.b {
            for (h, dsink) in dsinks.iter_mut().enumerate() {
                self.probs(&l, (q, k), b, h, &mut p, &mut sunk, at)?;
                if self.softcap.is_some() {
                    self.scores(&l, q, k, b, h, &mut capped)?;
                }
                let go = l.o(b, h).view(&g.data);
                let pm = Mat::rm(&p, 0, l.sq, l.sk);
                gemm(1.0, pm.t(), go, 1.0, l.v(b, h).view_mut(&mut dv.data))?;
                gemm(
                    1.0,
                    go,
                    l.v(b, h).view(&v.data).t(),
                    0.0,
                    MatMut::rm(&mut ds, 0, l.sq, l.sk),
                )?;
                if l.sk > 0 {
                    let rows = p.chunks_exact(l.sk).zip(ds.chunks_exact_mut(l.sk));
                    for ((pr, dr), &share) in rows.zip(&sunk) {
                        *dsink -= f64::from(share) * softmax_row_vjp_in_place(pr, dr);
                    }
                }
                self.uncap(&capped, &mut ds);
                let dsm = Mat::rm(&ds, 0, l.sq, l.sk);
                gemm(
                    scale,
                    dsm,
                    l.k(b, h).view(&k.data),
                    0.0,
                    l.q(b, h).view_mut(&mut dq.data),
                )?;
                gemm(
                    scale,
                    dsm.t(),
                    l.q(b, h).view(&q.data),
                    1.0,
                    l.k(b, h).view_mut(&mut dk.data),
                )?;
            }
        }
        let mut grads = vec![dq, dk, dv];
        if self.sinks.is_some() {
            grads.push(Tensor32::new(
                vec![l.heads],
                dsinks.into_iter().map(|x| x as f32).collect(),
            )?);
        }
        Ok(grads)
    }
}

/// Attention's q, k and v, and its sinks where it has them.
pub(crate) fn operands_of<'t>(
    inputs: &[&'t Tensor32],
    sinks: bool,
) -> Result<Operands<'t>, KernelError> {
    Ok(if sinks {
        let [q, k, v, s] = operands(OP, inputs)?;
        (q, k, v, Some(s))
    } else {
        let [q, k, v] = operands(OP, inputs)?;
        (q, k, v, None)
    })
}

/// q, k, v and the optional sinks of one attention call.
pub(crate) type Operands<'t> = (
    &'t Tensor32,
    &'t Tensor32,
    &'t Tensor32,
    Option<&'t Tensor32>,
);
