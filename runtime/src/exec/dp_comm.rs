//! Communication-efficient data parallelism: the data-parallel gradient exchange in a smaller
//! form (`--grad-compression`), and ranks that synchronise only every few steps
//! (`--dp-sync local-sgd:H`).
//!
//! Compression encodes each rank's gradient into f32 words (bf16 halves, int8 with a scale per
//! bucket, or the top-k entries as index/value pairs), exchanges the words (an all-gather for
//! an all-reduce, an all-to-all of each destination's piece for a reduce-scatter), and every
//! rank decodes the others' words and sums them in rank order, so every rank applies the same
//! update. The words are bit patterns carried in f32 slots (communicators copy, never compute
//! on them). Top-k and int8 keep what they did not send as a residual, added to the next step's
//! gradient (error feedback: Seide et al. 2014; Lin et al. 2018, "Deep Gradient Compression");
//! top-k runs under Adam as 1-bit Adam does: a dense warm-up, then Adam's second moment frozen
//! ([`TOP_K_DENSE_STEPS`]). int8's residual is at most half a bucket's step per entry, small
//! enough that Adam needs no freeze for it.
//!
//! Local SGD (Stich 2019; Lin et al. 2020; DiLoCo's inner loop, Douillard et al. 2023) skips the
//! gradient exchange: each rank steps on its own micro-batches' mean gradient, and every H steps
//! the ranks average their parameters (plain averaging, the outer optimizer of Lin et al.).

use super::layout::flat_piece;
use crate::{Communicator, RuntimeError};

/// How data-parallel gradients cross the network.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum GradCompression {
    /// f32 as computed.
    #[default]
    None,
    /// Rounded to bfloat16 (round to nearest even): half the bytes.
    Bf16,
    /// int8 with one f32 scale (max |x| / 127) per bucket of [`INT8_BUCKET`] elements.
    Int8,
    /// The given fraction of entries with the largest magnitude (at least one), as index and
    /// value, with error feedback.
    TopK(f64),
}

/// Elements per int8 scale.
pub const INT8_BUCKET: usize = 256;

/// Top-k under Adam follows 1-bit Adam (Tang et al. 2021, "1-bit Adam: Communication
/// Efficient Large-Scale Training with Adam's Convergence Speed", §3): error feedback corrects
/// a compressed exchange only when the update is linear in the gradient, and Adam's division
/// by the running second moment is not (a coordinate held back and sent late moves by one
/// step's worth, not by what it accumulated). So the first [`TOP_K_DENSE_STEPS`] steps
/// exchange the whole gradient (its warm-up), and from then on Adam's second moment stays as
/// the warm-up left it (`kernels::adamw_frozen_variance`): the update becomes a preconditioned
/// momentum step, and the top-k exchange with error feedback carries every coordinate's
/// accumulated gradient in full. 1-bit Adam warms up for 15–25 % of a long run; a few steps
/// already give the second moment's scale (bias-corrected, it is the mean of the squared
/// gradients seen).
pub const TOP_K_DENSE_STEPS: u64 = 4;

/// When data-parallel ranks synchronise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DpSync {
    /// Every step: the gradient is reduced before each optimizer step.
    #[default]
    Sync,
    /// Local SGD: no gradient exchange; parameters averaged every `every` steps.
    LocalSgd { every: u64 },
}

/// The data-parallel exchange of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DpComm {
    pub compression: GradCompression,
    pub sync: DpSync,
}

impl DpComm {
    pub fn is_plain(&self) -> bool {
        *self == DpComm::default()
    }

    /// Whether 1-based step `step` exchanges the whole gradient: top-k's warm-up
    /// ([`TOP_K_DENSE_STEPS`]).
    pub fn dense_at(&self, step: u64) -> bool {
        matches!(self.compression, GradCompression::TopK(_))
            && self.sync == DpSync::Sync
            && step <= TOP_K_DENSE_STEPS
    }

    /// The step after which Adam's second moment stays frozen: top-k's, after its warm-up.
    pub fn frozen_variance_after(&self) -> Option<u64> {
        (matches!(self.compression, GradCompression::TopK(_)) && self.sync == DpSync::Sync)
            .then_some(TOP_K_DENSE_STEPS)
    }

    /// The flags that ask for this exchange, for messages (`--grad-compression int8`).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.compression {
            GradCompression::None => {}
            GradCompression::Bf16 => parts.push("--grad-compression bf16".to_string()),
            GradCompression::Int8 => parts.push("--grad-compression int8".to_string()),
            GradCompression::TopK(f) => parts.push(format!("--grad-compression topk:{f}")),
        }
        if let DpSync::LocalSgd { every } = self.sync {
            parts.push(format!("--dp-sync local-sgd:{every}"));
        }
        if parts.is_empty() {
            "the synchronous exchange".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Words of `n` elements encoded under `c` (the same on every rank for the same `n`).
pub fn packed_len(n: usize, c: GradCompression) -> usize {
    match c {
        GradCompression::None => n,
        GradCompression::Bf16 => n.div_ceil(2),
        GradCompression::Int8 => {
            let full = n / INT8_BUCKET;
            let rest = n % INT8_BUCKET;
            full * (1 + INT8_BUCKET / 4) + if rest > 0 { 1 + rest.div_ceil(4) } else { 0 }
        }
        GradCompression::TopK(f) => 2 * top_k_count(n, f),
    }
}

/// Entries top-k sends of `n`.
fn top_k_count(n: usize, fraction: f64) -> usize {
    if n == 0 {
        return 0;
    }
    ((n as f64 * fraction).ceil() as usize).clamp(1, n)
}

/// bfloat16 of `x`, rounded to nearest even (NaN stays NaN).
fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Encodes `x` (with int8 and top-k, `residual` is added first and keeps what is not sent).
pub fn encode(x: &[f32], c: GradCompression, residual: &mut Vec<f32>) -> Vec<f32> {
    match c {
        GradCompression::None => x.to_vec(),
        GradCompression::Bf16 => x
            .chunks(2)
            .map(|p| {
                let lo = u32::from(to_bf16(p[0]));
                let hi = p.get(1).map_or(0, |&v| u32::from(to_bf16(v)));
                f32::from_bits(lo | hi << 16)
            })
            .collect(),
        GradCompression::Int8 => encode_int8_with_feedback(x, residual),
        GradCompression::TopK(f) => encode_top_k(x, f, residual),
    }
}

/// int8 with error feedback: `residual` (what earlier rounding lost) is added first, and keeps
/// what this rounding loses. Without it, an entry under half its bucket's step rounds to zero
/// every step however long it persists (a small gradient beside a large one in the same
/// bucket is never sent); with it, it is sent once it has accumulated a step's worth.
fn encode_int8_with_feedback(x: &[f32], residual: &mut Vec<f32>) -> Vec<f32> {
    if residual.len() != x.len() {
        *residual = vec![0.0; x.len()];
    }
    for (r, &v) in residual.iter_mut().zip(x) {
        *r += v;
    }
    let words = encode_int8(residual);
    let sent = decode(&words, x.len(), GradCompression::Int8);
    for (r, s) in residual.iter_mut().zip(sent) {
        *r -= s;
    }
    words
}

fn encode_int8(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(packed_len(x.len(), GradCompression::Int8));
    for bucket in x.chunks(INT8_BUCKET) {
        let max = bucket.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = max / 127.0;
        out.push(scale);
        for four in bucket.chunks(4) {
            let mut word = 0u32;
            for (j, &v) in four.iter().enumerate() {
                let q = if scale > 0.0 {
                    (v / scale).round().clamp(-127.0, 127.0) as i8
                } else {
                    0
                };
                word |= u32::from(q as u8) << (8 * j);
            }
            out.push(f32::from_bits(word));
        }
    }
    out
}

fn encode_top_k(x: &[f32], fraction: f64, residual: &mut Vec<f32>) -> Vec<f32> {
    if residual.len() != x.len() {
        *residual = vec![0.0; x.len()];
    }
    for (r, &v) in residual.iter_mut().zip(x) {
        *r += v;
    }
    let k = top_k_count(x.len(), fraction);
    // Largest magnitude first, the lower index on ties: the same choice on every run.
    let mut order: Vec<usize> = (0..x.len()).collect();
    let by_size = |a: &usize, b: &usize| {
        residual[*b]
            .abs()
            .total_cmp(&residual[*a].abs())
            .then(a.cmp(b))
    };
    if k < order.len() {
        order.select_nth_unstable_by(k, by_size);
        order.truncate(k);
    }
    order.sort_unstable();
    let mut out = Vec::with_capacity(2 * k);
    for i in order {
        out.push(f32::from_bits(i as u32));
        out.push(residual[i]);
        residual[i] = 0.0;
    }
    out
}

/// Decodes `n` elements from `words`.
pub fn decode(words: &[f32], n: usize, c: GradCompression) -> Vec<f32> {
    match c {
        GradCompression::None => words[..n].to_vec(),
        GradCompression::Bf16 => {
            let mut out = Vec::with_capacity(n);
            for w in words {
                let b = w.to_bits();
                out.push(from_bf16(b as u16));
                out.push(from_bf16((b >> 16) as u16));
            }
            out.truncate(n);
            out
        }
        GradCompression::Int8 => {
            let mut out = Vec::with_capacity(n);
            let mut at = 0;
            while out.len() < n {
                let len = (n - out.len()).min(INT8_BUCKET);
                let scale = words[at];
                at += 1;
                for w in &words[at..at + len.div_ceil(4)] {
                    let b = w.to_bits();
                    for j in 0..4 {
                        out.push(f32::from(((b >> (8 * j)) as u8) as i8) * scale);
                    }
                }
                at += len.div_ceil(4);
                out.truncate(out.len() - (len.div_ceil(4) * 4 - len));
            }
            out
        }
        GradCompression::TopK(_) => {
            let mut out = vec![0.0; n];
            for pair in words.chunks(2) {
                let i = pair[0].to_bits() as usize;
                if let (Some(slot), Some(&v)) = (out.get_mut(i), pair.get(1)) {
                    *slot = v;
                }
            }
            out
        }
    }
}

/// The rank-order sum of every member's `x`, exchanged compressed as a ring all-reduce is:
/// a compressed reduce-scatter ([`reduce_scatter`]), then each rank's summed piece compressed
/// again (with its own residual, `residual_sum`) and all-gathered. Every rank decodes the same
/// words, so every rank ends with the same sum; a rank sends 2·(n − 1)/n of the compressed
/// size, as the ring sends of the uncompressed one.
pub fn all_reduce<C: Communicator>(
    comm: &C,
    x: &[f32],
    c: GradCompression,
    residual: &mut Vec<f32>,
    residual_sum: &mut Vec<f32>,
) -> Result<Vec<f32>, RuntimeError> {
    let piece = reduce_scatter(comm, x, c, residual)?;
    let words = encode(&piece, c, residual_sum);
    let mut all = vec![0.0; words.len() * comm.size()];
    comm.all_gather(&words, &mut all)?;
    let mut out = Vec::with_capacity(piece.len() * comm.size());
    for theirs in all.chunks(words.len().max(1)) {
        out.extend(decode(theirs, piece.len(), c));
    }
    out.truncate(x.len());
    Ok(out)
}

/// This rank's flat piece (⌈n / size⌉ elements, zero-padded) of the rank-order sum of every
/// member's `x`: each member's piece for rank j is encoded alone and sent to j only.
pub fn reduce_scatter<C: Communicator>(
    comm: &C,
    x: &[f32],
    c: GradCompression,
    residual: &mut Vec<f32>,
) -> Result<Vec<f32>, RuntimeError> {
    let size = comm.size();
    let per = x.len().div_ceil(size.max(1));
    // Error feedback over the whole buffer, then one encoding per destination piece.
    let mut send = Vec::new();
    let mut words_per = 0;
    let whole_residual = residual;
    if whole_residual.len() != size * per {
        *whole_residual = vec![0.0; size * per];
    }
    for j in 0..size {
        let piece = flat_piece(x, size, j);
        let mut r = whole_residual[j * per..(j + 1) * per].to_vec();
        let words = encode(&piece, c, &mut r);
        whole_residual[j * per..(j + 1) * per].copy_from_slice(&r);
        words_per = words.len();
        send.extend(words);
    }
    let mut recv = vec![0.0; send.len()];
    comm.all_to_all(&send, &mut recv)?;
    let mut sum = vec![0.0f32; per];
    for theirs in recv.chunks(words_per.max(1)) {
        for (s, v) in sum.iter_mut().zip(decode(theirs, per, c)) {
            *s += v;
        }
    }
    Ok(sum)
}

/// Index of the data-parallel group in the executor's slots ([`program::Slot::ALL`]).
const DP_SLOT: usize = 1;

impl<B: crate::Backend, C: Communicator> super::Executor<'_, B, C> {
    /// Top-k's and int8's error-feedback residuals, named for a checkpoint (`residual/<buffer>/<phase>`:
    /// phase 0 the reduce-scatter's, 1 the summed pieces'), in name order.
    pub fn dp_residuals(&self) -> Vec<(String, Vec<f32>)> {
        let mut out: Vec<(String, Vec<f32>)> = self
            .residuals
            .iter()
            .map(|(&(b, phase), r)| (format!("residual/{}/{phase}", b.0), r.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Restores what [`Self::dp_residuals`] returned (the same programs' buffers).
    pub fn set_dp_residuals(&mut self, named: Vec<(String, Vec<f32>)>) -> Result<(), String> {
        for (name, r) in named {
            let key = name
                .strip_prefix("residual/")
                .and_then(|k| k.split_once('/'))
                .and_then(|(b, p)| Some((b.parse::<u32>().ok()?, p.parse::<u8>().ok()?)))
                .filter(|&(b, p)| (b as usize) < self.tpl.buffers.len() && p <= 1)
                .ok_or_else(|| format!("`{name}` names no gradient buffer of these programs"))?;
            self.residuals.insert((program::BufferId(key.0), key.1), r);
        }
        Ok(())
    }

    /// Sets how data-parallel gradients are exchanged; a mode the program cannot run is
    /// refused before any step (local SGD keeps whole optimizer state on every rank, so it
    /// needs ZeRO-0, where the gradient reduction is an all-reduce).
    pub fn set_dp_comm(&mut self, d: DpComm) -> Result<(), RuntimeError> {
        if let DpSync::LocalSgd { every } = d.sync
            && self.set.mesh.cp > 1
        {
            return Err(RuntimeError::DpComm {
                mode: format!("local-sgd:{every}"),
                reason: format!(
                    "each sequence is split over {} context-parallel ranks, whose gradients are \
                     shares of one sequence's and must be reduced every step; use sync",
                    self.set.mesh.cp
                ),
            });
        }
        if let DpSync::LocalSgd { every } = d.sync {
            let sharded = self.tpl.instrs.iter().any(|i| {
                matches!(
                    i,
                    program::Instr::Collective {
                        purpose: program::Purpose::GradReduce,
                        op: program::CollectiveOp::ReduceScatter,
                        ..
                    }
                )
            });
            if sharded {
                return Err(RuntimeError::DpComm {
                    mode: format!("local-sgd:{every}"),
                    reason: "its gradients are reduce-scattered (ZeRO-1 or more); compile it \
                             with --zero 0"
                        .into(),
                });
            }
        }
        self.dp_comm = d;
        Ok(())
    }

    /// Runs a data-parallel gradient reduction as the run's [`DpComm`] asks; `false` when
    /// nothing changes (the plain exchange, or a data-parallel group of one).
    pub(super) fn dp_exchange(
        &mut self,
        op: program::CollectiveOp,
        axis: Option<u8>,
        pairs: &[(program::BufferId, program::BufferId)],
    ) -> Result<bool, RuntimeError> {
        use program::CollectiveOp::{AllReduce, ReduceScatter};
        let d = self.dp_comm;
        if d.is_plain() || self.slots[DP_SLOT].is_none() {
            return Ok(false);
        }
        if d.frozen_variance_after().is_some() {
            // Top-k's gradients: Adam's second moment freezes after the warm-up for these.
            self.topk_grads.extend(pairs.iter().map(|&(_, o)| o));
        }
        if d.dense_at(self.steps) {
            return Ok(false);
        }
        let Some(comm) = self.slots[DP_SLOT].as_ref() else {
            return Ok(false);
        };
        let mut results = Vec::with_capacity(pairs.len());
        for &(i, o) in pairs {
            let x = self.host(i)?.data;
            let mut residual = self.residuals.remove(&(i, 0)).unwrap_or_default();
            let mut residual_sum = self.residuals.remove(&(i, 1)).unwrap_or_default();
            let y = match (d.sync, op, axis) {
                // Each rank steps on its own micro-batches: the mean of its gradient rather
                // than its share of the group's sum.
                (DpSync::LocalSgd { .. }, AllReduce, _) => {
                    let n = comm.size() as f32;
                    x.iter().map(|v| v * n).collect()
                }
                (DpSync::Sync, AllReduce, _) => {
                    all_reduce(comm, &x, d.compression, &mut residual, &mut residual_sum)?
                }
                (DpSync::Sync, ReduceScatter, None) => {
                    reduce_scatter(comm, &x, d.compression, &mut residual)?
                }
                _ => {
                    return Err(RuntimeError::DpComm {
                        mode: format!("{d:?}"),
                        reason: format!("a data-parallel {} along an axis", op.name()),
                    });
                }
            };
            // Error feedback (top-k's, int8's) carries the residuals to the next step.
            if matches!(
                d.compression,
                GradCompression::TopK(_) | GradCompression::Int8
            ) {
                self.residuals.insert((i, 0), residual);
                self.residuals.insert((i, 1), residual_sum);
            }
            results.push((o, y));
        }
        for (o, y) in results {
            self.put(o, y)?;
        }
        Ok(true)
    }

    /// Local SGD's outer step: every parameter (and fp32 master copy) replaced by its mean
    /// over the data-parallel group, so the replicas agree again.
    pub(super) fn average_parameters(&mut self) -> Result<(), RuntimeError> {
        let Some(comm) = self.slots[DP_SLOT].as_ref() else {
            return Ok(());
        };
        let n = comm.size() as f32;
        let mut bufs = Vec::new();
        for sh in &self.tpl.shards {
            bufs.push(sh.init);
            if let Some(b) = self
                .tpl
                .buffers
                .iter()
                .position(|b| b.role == program::Role::Master(sh.param))
            {
                bufs.push(program::BufferId(b as u32));
            }
        }
        let mut results = Vec::with_capacity(bufs.len());
        for b in bufs {
            let mut x = self.host(b)?.data;
            comm.all_reduce_sum(&mut x)?;
            for v in &mut x {
                *v /= n;
            }
            results.push((b, x));
        }
        for (b, x) in results {
            self.put(b, x)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + i as f32 / 50.0))
            .collect()
    }

    #[test]
    fn bf16_halves_the_words_and_keeps_8_bits_of_mantissa() {
        let x = wave(1001);
        let words = encode(&x, GradCompression::Bf16, &mut Vec::new());
        assert_eq!(words.len(), packed_len(x.len(), GradCompression::Bf16));
        let y = decode(&words, x.len(), GradCompression::Bf16);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= a.abs() / 256.0, "{a} {b}");
        }
        assert_eq!(to_bf16(1.0), 0x3f80);
    }

    #[test]
    fn int8_is_within_half_a_step_of_each_bucket_scale() {
        let x = wave(1000);
        let words = encode(&x, GradCompression::Int8, &mut Vec::new());
        assert_eq!(words.len(), packed_len(x.len(), GradCompression::Int8));
        // 3 full buckets of 1 + 64 words and one of 1 + 58: about a quarter of the f32 words.
        assert_eq!(words.len(), 3 * 65 + 1 + 58);
        let y = decode(&words, x.len(), GradCompression::Int8);
        for (b, (xs, ys)) in x.chunks(INT8_BUCKET).zip(y.chunks(INT8_BUCKET)).enumerate() {
            let scale = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, q) in xs.iter().zip(ys) {
                assert!((a - q).abs() <= 0.5 * scale + 1e-7, "bucket {b}: {a} {q}");
            }
        }
    }

    #[test]
    fn top_k_sends_the_largest_and_carries_the_rest() {
        let x = vec![0.1, -3.0, 0.2, 2.0, -0.05, 0.0, 1.0, 0.3];
        let mut residual = Vec::new();
        let words = encode(&x, GradCompression::TopK(0.25), &mut residual);
        let y = decode(&words, x.len(), GradCompression::TopK(0.25));
        assert_eq!(y, vec![0.0, -3.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(residual, vec![0.1, 0.0, 0.2, 0.0, -0.05, 0.0, 1.0, 0.3]);
        // Next step the carried 1.0 plus a new 0.5 wins.
        let next = vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0];
        let words = encode(&next, GradCompression::TopK(0.125), &mut residual);
        assert_eq!(decode(&words, 8, GradCompression::TopK(0.125))[6], 1.5);
    }
}
