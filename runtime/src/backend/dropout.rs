//! A dropout mask as a backend applies it: which global element each local element is, and the
//! keep test of `ir::interp::dropout_keep` on it (`exec::dropout` builds it from the rank's
//! place; the device kernel `dropout` in `kernels/cuda/pointwise.cu` computes the same).

use ir::interp::dropout_keep;

/// Inverted dropout of a local tensor whose rows sit at global row `row`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    /// Drop probability, in [0, 1).
    pub p: f64,
    /// This step's seed (`exec::dropout::step_seed`).
    pub seed: u64,
    /// Global row of the local tensor's first row.
    pub row: usize,
    /// Elements per local row.
    pub per_row: usize,
    /// Global sequence length.
    pub seq: usize,
    /// Sequence-parallel placement `(local seq, offset)`: local row element `r` is token
    /// `offset + r / inner` of the global sequence (inner = per_row / local seq).
    pub shard: Option<(usize, usize)>,
}

impl DropoutMask {
    /// The global flat index of local element `i`.
    pub fn global_index(&self, i: usize) -> usize {
        let per_row = self.per_row.max(1);
        let (bi, rest) = (i / per_row, i % per_row);
        match self.shard {
            Some((s, off)) => {
                let inner = (per_row / s.max(1)).max(1);
                let (si, r) = (rest / inner, rest % inner);
                ((self.row + bi) * self.seq + off + si) * inner + r
            }
            None => (self.row + bi) * per_row + rest,
        }
    }

    /// `data` with the mask applied in place (kept elements scaled by 1/(1 − p)).
    pub fn apply(&self, data: &mut [f32]) {
        if self.p == 0.0 {
            return;
        }
        let scale = 1.0 / (1.0 - self.p);
        for (i, x) in data.iter_mut().enumerate() {
            *x = if dropout_keep(self.seed, self.global_index(i) as u64, self.p) {
                (f64::from(*x) * scale) as f32
            } else {
                0.0
            };
        }
    }
}
