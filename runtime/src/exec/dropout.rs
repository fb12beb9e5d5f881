//! Dropout on global element indices, so that every layout draws the same mask.
//!
//! The mask of an element is `ir::interp::dropout_keep(seed', g, p)` where `g` is the
//! element's flat index in the *global* tensor `[global batch, ...]` and `seed'` is the op's
//! seed at step 1 and a splitmix64 mix of (seed, step) afterwards (new masks every step). A
//! micro-batch's rows start at its global row; under sequence parallelism a residual-stream
//! tensor `[b, s/tp, ...]` sits at sequence offset `tp rank · s/tp`. So data, pipeline and
//! sequence parallelism, micro-batching and recomputation reproduce one device's masks (and
//! the interpreter's on the whole global batch at step 1). Under context parallelism a rank's
//! local tokens sit at their chunks' positions. The backward applies the same
//! mask to the gradient (codegen emits it as the same dropout op on `dy`).

use ir::interp::dropout_keep;

pub use crate::backend::DropoutMask;

/// Where a local dropout tensor sits in the global one.
#[derive(Debug, Clone, Copy)]
pub struct Place {
    /// Global row of the micro-batch's first sequence.
    pub row: usize,
    /// Global sequence length.
    pub seq: usize,
    /// Tensor-parallel degree and coordinate, when the residual stream is sequence-sharded.
    pub sp: Option<(usize, usize)>,
    /// This rank's chunks of the sequence under context parallelism: a local token's global
    /// position is its chunk's.
    pub cp: Option<kernels::Chunks>,
    /// 1-based training step.
    pub step: u64,
}

/// The seed of step `step` (the op's own at step 1).
pub fn step_seed(seed: u64, step: u64) -> u64 {
    if step <= 1 {
        return seed;
    }
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The mask of a local tensor of `shape` placed at `at`, where a [`DropoutMask`] describes it
/// (every placement but context parallelism's, whose tokens sit at their chunks' positions:
/// `None`, use [`apply`]).
pub fn mask(
    shape: &[usize],
    len: usize,
    p: f64,
    seed: u64,
    at: Place,
) -> Result<Option<DropoutMask>, String> {
    if !(0.0..1.0).contains(&p) {
        return Err(format!("dropout probability {p} is not in [0, 1)"));
    }
    if at.cp.is_some() {
        return Ok(None);
    }
    let b = shape.first().copied().unwrap_or(1).max(1);
    let per_row = len / b;
    let shard = match (at.sp, shape.get(1)) {
        (Some((tp, r)), Some(&s)) if tp > 1 && s * tp == at.seq => Some((s, r * s)),
        _ => None,
    };
    Ok(Some(DropoutMask {
        p,
        seed: step_seed(seed, at.step),
        row: at.row,
        per_row,
        seq: at.seq,
        shard,
    }))
}

/// Applies inverted dropout to `data` (shape `shape`) placed at `at`.
pub fn apply(
    data: &mut [f32],
    shape: &[usize],
    p: f64,
    seed: u64,
    at: Place,
) -> Result<(), String> {
    if let Some(m) = mask(shape, data.len(), p, seed, at)? {
        m.apply(data);
        return Ok(());
    }
    if p == 0.0 {
        return Ok(());
    }
    let seed = step_seed(seed, at.step);
    let scale = 1.0 / (1.0 - p);
    let b = shape.first().copied().unwrap_or(1).max(1);
    let per_row = data.len() / b;
    let cp_seq = at.seq / at.cp.map_or(1, |c| c.size.max(1));
    let sharded = match (at.sp, shape.get(1)) {
        (Some((tp, r)), Some(&s)) if tp > 1 && s * tp == cp_seq => Some((s, r * s)),
        (_, Some(&s)) if s == cp_seq => Some((s, 0)),
        _ => {
            return Err(format!(
                "dropout on {shape:?} under context parallelism: only [b, s, ..] activations \
                 (s = {cp_seq}, this rank's share of the sequence) have a place"
            ));
        }
    };
    let positions = at.cp.map(|c| c.positions(cp_seq));
    for (i, x) in data.iter_mut().enumerate() {
        let (bi, rest) = (i / per_row.max(1), i % per_row.max(1));
        let g = match sharded {
            Some((s, off)) => {
                let inner = per_row / s.max(1);
                let (si, r) = (rest / inner.max(1), rest % inner.max(1));
                let p = positions.as_ref().map_or(off + si, |v| v[off + si]);
                ((at.row + bi) * at.seq + p) * inner + r
            }
            None => (at.row + bi) * per_row + rest,
        };
        *x = if dropout_keep(seed, g as u64, p) {
            (f64::from(*x) * scale) as f32
        } else {
            0.0
        };
    }
    Ok(())
}
