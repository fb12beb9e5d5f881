//! How matrix products accumulate over their contracted dimension.
//!
//! `F32` (the default) is sgemm: fast, and the usual f32 rounding at every partial sum. `F64`
//! multiplies the f32 operands in f64 (each product exact) and rounds once per result element:
//! the result then hardly depends on how the contraction was split or ordered, which is what
//! a tensor-parallel run needs to reproduce one device (its ranks each sum a slice of the
//! contracted dimension and an all-reduce adds the slices). The mode is set per call, for the
//! calling thread only ([`crate::forward_with`], [`crate::backward_with`]).

use std::cell::Cell;

/// Accumulation precision of matrix products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accumulate {
    /// sgemm.
    #[default]
    F32,
    /// Products and sums in f64, one rounding to f32 per result.
    F64,
}

thread_local! {
    static MODE: Cell<Accumulate> = const { Cell::new(Accumulate::F32) };
}

/// The calling thread's mode.
pub(crate) fn current() -> Accumulate {
    MODE.with(Cell::get)
}

/// Runs `f` with the calling thread's mode set to `mode` (restored afterwards, also on
/// unwinding).
pub(crate) fn scoped<T>(mode: Accumulate, f: impl FnOnce() -> T) -> T {
    struct Restore(Accumulate);
    impl Drop for Restore {
        fn drop(&mut self) {
            MODE.with(|m| m.set(self.0));
        }
    }
    let _restore = Restore(MODE.with(|m| m.replace(mode)));
    f()
}
