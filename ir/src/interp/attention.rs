//! Scaled dot-product `Attention` with grouped-query heads, an optional causal mask, an
//! optional soft cap on the scores and optional attention sinks.

use super::KernelError;
use super::index::{to_usize, zeros};
use super::softmax::{softmax_row, softmax_row_vjp, softmax_row_with_sink, visible_keys};
use crate::tensor::Tensor;

/// The attention op's attributes and its operands' sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attention {
    pub heads: u64,
    pub kv_heads: u64,
    pub scale: f64,
    pub causal: bool,
    /// cap·tanh(s/cap) on the scaled scores before the mask (Gemma 2).
    pub softcap: Option<f64>,
    /// Only the keys of a sliding window or of the query's own chunk are visible (causal
    /// only).
    pub mask: crate::KeyMask,
}

/// Sizes of one call: q is `[b, sq, heads·d]`, k is `[b, sk, kv·d]`, v is `[b, sk, kv·dv]`,
/// the output `[b, sq, heads·dv]` (`dv < d` in multi-head latent attention).
struct Layout {
    b: usize,
    sq: usize,
    sk: usize,
    heads: usize,
    kv: usize,
    d: usize,
    dv: usize,
}

impl Layout {
    fn new(a: &Attention, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Layout, KernelError> {
        let (heads, kv) = (to_usize(a.heads)?, to_usize(a.kv_heads)?);
        if heads == 0 || kv == 0 || heads % kv != 0 {
            return Err(KernelError::new(format!(
                "heads {heads} must be a positive multiple of kv_heads {kv}"
            )));
        }
        let [b, sq, qw] = rank3(q)?;
        let [bk, sk, kw] = rank3(k)?;
        if qw % heads != 0 {
            return Err(KernelError::new(format!(
                "query width {qw} is not divisible by {heads} heads"
            )));
        }
        let d = qw / heads;
        let [bv, sv, vw] = rank3(v)?;
        if bk != b || kw != kv * d || bv != b || sv != sk || !vw.is_multiple_of(kv) {
            return Err(KernelError::new(format!(
                "key {:?} must be [{b}, S, {}] and value {:?} [{b}, S, {kv}·dv]",
                k.shape,
                kv * d,
                v.shape,
            )));
        }
        Ok(Layout {
            b,
            sq,
            sk,
            heads,
            kv,
            d,
            dv: vw / kv,
        })
    }

    /// Flat index of channel 0 of query head `h` at (batch `b`, position `i`).
    fn q_at(&self, b: usize, i: usize, h: usize) -> usize {
        (b * self.sq + i) * self.heads * self.d + h * self.d
    }

    /// Flat index of channel 0 of output head `h` at (`b`, `i`).
    fn o_at(&self, b: usize, i: usize, h: usize) -> usize {
        (b * self.sq + i) * self.heads * self.dv + h * self.dv
    }

    /// Flat index of channel 0 of the key head read by query head `h` at (`b`, key `j`).
    fn kv_at(&self, b: usize, j: usize, h: usize) -> usize {
        (b * self.sk + j) * self.kv * self.d + self.group(h) * self.d
    }

    /// Flat index of channel 0 of the value head read by query head `h` at (`b`, key `j`).
    fn v_at(&self, b: usize, j: usize, h: usize) -> usize {
        (b * self.sk + j) * self.kv * self.dv + self.group(h) * self.dv
    }

    fn group(&self, h: usize) -> usize {
        h / (self.heads / self.kv)
    }

    /// Sinks, where given, are one logit per query head.
    fn check_sinks(&self, sinks: Option<&Tensor>) -> Result<(), KernelError> {
        match sinks {
            Some(s) if s.shape != [self.heads] => Err(KernelError::new(format!(
                "attention sinks {:?} must be [{}] (one per query head)",
                s.shape, self.heads
            ))),
            _ => Ok(()),
        }
    }

    fn out_shape(&self) -> [usize; 3] {
        [self.b, self.sq, self.heads * self.dv]
    }
}

fn rank3(t: &Tensor) -> Result<[usize; 3], KernelError> {
    <[usize; 3]>::try_from(t.shape.as_slice()).map_err(|_| {
        KernelError::new(format!(
            "attention operands must be [B, S, heads*d], got {:?}",
            t.shape
        ))
    })
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Attention {
    /// The scores of one (batch, head, query) row: scale·q·k, soft-capped where the op caps.
    fn scores(&self, l: &Layout, q: &Tensor, k: &Tensor, b: usize, h: usize, i: usize) -> Vec<f64> {
        let qi = &q.data[l.q_at(b, i, h)..][..l.d];
        (0..l.sk)
            .map(|j| {
                let s = self.scale * dot(qi, &k.data[l.kv_at(b, j, h)..][..l.d]);
                self.softcap.map_or(s, |cap| cap * (s / cap).tanh())
            })
            .collect()
    }

    /// The attention probabilities of a row of `scores`, masked keys zero, and the share of
    /// the head's sink logit (zero without sinks).
    fn probs(&self, l: &Layout, scores: &[f64], i: usize, sink: Option<f64>) -> (Vec<f64>, f64) {
        let mut p = vec![0.0; l.sk];
        let visible = visible_keys(i, l.sq, l.sk, self.causal);
        // Keys before the window or the query's chunk take no share (their weights stay 0).
        let first = usize::try_from(self.mask.first_key(visible as u64)).unwrap_or(visible);
        let (shown, out) = (&scores[first..], &mut p[first..]);
        let sunk = match sink {
            None => {
                softmax_row(shown, visible - first, out);
                0.0
            }
            Some(s) => softmax_row_with_sink(shown, visible - first, s, out),
        };
        (p, sunk)
    }

    /// The gradient through the soft cap: d(cap·tanh(s/cap))/ds = 1 − (capped/cap)².
    fn uncap(&self, capped: &[f64], ds: &mut [f64]) {
        if let Some(cap) = self.softcap {
            for (d, &c) in ds.iter_mut().zip(capped) {
                *d *= 1.0 - (c / cap) * (c / cap);
            }
        }
    }

    pub(crate) fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        sinks: Option<&Tensor>,
    ) -> Result<Tensor, KernelError> {
        let l = Layout::new(self, q, k, v)?;
        l.check_sinks(sinks)?;
        let mut out = zeros(&l.out_shape())?;
        for b in 0..l.b {
            for h in 0..l.heads {
                let sink = sinks.map(|s| s.data[h]);
                for i in 0..l.sq {
                    let (p, _) = self.probs(&l, &self.scores(&l, q, k, b, h, i), i, sink);
                    let o = l.o_at(b, i, h);
                    for (j, &pj) in p.iter().enumerate() {
                        let vj = &v.data[l.v_at(b, j, h)..][..l.dv];
                        for (oc, &vc) in out.data[o..o + l.dv].iter_mut().zip(vj) {
                            *oc += pj * vc;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// With P the probabilities and dO the output gradient, per row:
    /// dV += Pᵀ dO, dP = dO Vᵀ, dS = softmax'(dP), dQ = scale·dS K, dK += scale·dSᵀ Q.
    /// Query heads sharing a kv head accumulate into the same dK/dV slice. A sink reads no
    /// value, so its logit's gradient is its share times −Σ P·dP (softmax's rule, dP = 0).
    /// Returns dq, dk, dv and, with sinks, their gradient.
    pub(crate) fn vjp(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        sinks: Option<&Tensor>,
        g: &Tensor,
    ) -> Result<Vec<Tensor>, KernelError> {
        let l = Layout::new(self, q, k, v)?;
        l.check_sinks(sinks)?;
        if g.shape != l.out_shape() {
            return Err(KernelError::new(format!(
                "output gradient {:?} must be {:?}",
                g.shape,
                l.out_shape()
            )));
        }
        let mut dq = zeros(&q.shape)?;
        let mut dk = zeros(&k.shape)?;
        let mut dv = zeros(&v.shape)?;
        let mut dsinks = vec![0.0; l.heads];
        for b in 0..l.b {
            for (h, dsink) in dsinks.iter_mut().enumerate() {
                let sink = sinks.map(|s| s.data[h]);
                for i in 0..l.sq {
                    let scores = self.scores(&l, q, k, b, h, i);
                    let (p, sunk) = self.probs(&l, &scores, i, sink);
                    let qo = l.q_at(b, i, h);
                    let oo = l.o_at(b, i, h);
                    let go = &g.data[oo..oo + l.dv];
                    let mut dp = vec![0.0; l.sk];
                    for (j, (&pj, dpj)) in p.iter().zip(dp.iter_mut()).enumerate() {
                        let vo = l.v_at(b, j, h);
                        *dpj = dot(go, &v.data[vo..vo + l.dv]);
                        for (dvc, &gc) in dv.data[vo..vo + l.dv].iter_mut().zip(go) {
                            *dvc += pj * gc;
                        }
                    }
                    let mut ds = vec![0.0; l.sk];
                    softmax_row_vjp(&p, &dp, &mut ds);
                    *dsink -= sunk * dot(&p, &dp);
                    self.uncap(&scores, &mut ds);
                    for (j, &dsj) in ds.iter().enumerate() {
                        let kvo = l.kv_at(b, j, h);
                        for c in 0..l.d {
                            dq.data[qo + c] += self.scale * dsj * k.data[kvo + c];
                            dk.data[kvo + c] += self.scale * dsj * q.data[qo + c];
                        }
                    }
                }
            }
        }
        let mut grads = vec![dq, dk, dv];
        if sinks.is_some() {
            grads.push(Tensor::new(vec![l.heads], dsinks));
        }
        Ok(grads)
    }
}
