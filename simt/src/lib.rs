//! plait's SIMT emulator: the device kernels of `kernels/cuda` compiled for the host (by
//! `build.rs`, under the CUDA shim of `cpp/simt.hpp`) and launched as on a GPU, each thread
//! block's threads as fibers that switch at `__syncthreads()`.
//!
//! It exists so that the kernels the CUDA backend runs are tested on every machine, against the
//! `kernels` crate's CPU kernels, and so that every launch's arguments are checked against the
//! kernel's declaration. It is slow (one host thread) and it is not a GPU: it cannot find
//! races between threads of a block, only wrong results, bad launches and barriers some
//! threads skip.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

pub use kernels::device::{AttentionShape, Broadcast, KernelArg, Strided};

/// Why an emulated launch failed.
#[derive(Debug, thiserror::Error)]
pub enum SimtError {
    /// The emulator refused the launch or the kernel broke a rule (see `message`).
    #[error("simt: kernel `{kernel}`: {message}")]
    Launch { kernel: String, message: String },
    /// A kernel name with a NUL byte.
    #[error("simt: kernel name {kernel:?} contains a NUL byte")]
    BadName { kernel: String },
}

#[allow(unsafe_code)]
unsafe extern "C" {
    fn plait_simt_launch(
        name: *const c_char,
        signature: *const c_char,
        grid: c_uint,
        block: c_uint,
        args: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn plait_simt_kernel_signature(name: *const c_char, out: *mut c_char, out_len: usize) -> c_int;
}

/// The argument letters of kernel `name` as declared (see [`KernelArg::letter`]), or `None`
/// when no kernel has that name.
pub fn signature(name: &str) -> Option<String> {
    let c_name = CString::new(name).ok()?;
    let mut out = [0u8; 64];
    // SAFETY: `c_name` is NUL-terminated and `out` is writable for its length; the callee
    // writes at most `out.len()` bytes, NUL included.
    #[allow(unsafe_code)]
    let status =
        unsafe { plait_simt_kernel_signature(c_name.as_ptr(), out.as_mut_ptr().cast(), out.len()) };
    (status == 0).then(|| c_string(&out))
}

/// One argument's value as the kernel receives it (its address goes in the launch's array).
enum Slot {
    Ptr(*mut f32),
    I64(i64),
    I32(i32),
    F64(f64),
    Broadcast(Broadcast),
    Strided(Strided),
    Attention(AttentionShape),
}

impl Slot {
    fn of(arg: &mut KernelArg<'_, [f32]>) -> Slot {
        match arg {
            KernelArg::Out(s) => Slot::Ptr(s.as_mut_ptr()),
            KernelArg::In(s) => Slot::Ptr(s.as_ptr().cast_mut()),
            KernelArg::Null => Slot::Ptr(std::ptr::null_mut()),
            KernelArg::I64(v) => Slot::I64(*v),
            KernelArg::I32(v) => Slot::I32(*v),
            KernelArg::F64(v) => Slot::F64(*v),
            KernelArg::Broadcast(b) => Slot::Broadcast(*b),
            KernelArg::Strided(s) => Slot::Strided(*s),
            KernelArg::Attention(a) => Slot::Attention(*a),
        }
    }

    fn address(&mut self) -> *mut c_void {
        match self {
            Slot::Ptr(p) => std::ptr::from_mut(p).cast(),
            Slot::I64(v) => std::ptr::from_mut(v).cast(),
            Slot::I32(v) => std::ptr::from_mut(v).cast(),
            Slot::F64(v) => std::ptr::from_mut(v).cast(),
            Slot::Broadcast(b) => std::ptr::from_mut(b).cast(),
            Slot::Strided(s) => std::ptr::from_mut(s).cast(),
            Slot::Attention(a) => std::ptr::from_mut(a).cast(),
        }
    }
}

/// Runs kernel `name` on a 1-D grid of `grid` blocks of `block` threads (a power of two up to
/// 1024). Host slices stand for device buffers: a kernel reads its `In` slices and writes its
/// `Out` ones, and must stay inside them, as on a GPU (the kernels' tests check this by
/// comparing every element with the CPU kernels).
pub fn launch(
    name: &str,
    grid: u32,
    block: u32,
    args: &mut [KernelArg<'_, [f32]>],
) -> Result<(), SimtError> {
    let c_name = CString::new(name).map_err(|_| SimtError::BadName {
        kernel: name.to_owned(),
    })?;
    let declared: Vec<char> = signature(name).unwrap_or_default().chars().collect();
    let letters: String = args
        .iter()
        .enumerate()
        .map(|(i, a)| a.letter(declared.get(i).copied()))
        .collect();
    let c_letters = CString::new(letters).map_err(|_| SimtError::BadName {
        kernel: name.to_owned(),
    })?;
    let mut slots: Vec<Slot> = args.iter_mut().map(Slot::of).collect();
    let mut addresses: Vec<*mut c_void> = slots.iter_mut().map(Slot::address).collect();
    let mut error = [0u8; 512];
    // SAFETY: every address points into `slots`, alive and unmoved for the call; the callee
    // checks the argument letters against the kernel's declaration before it reads them, and
    // the buffers behind the pointers are the caller's slices (see the function's doc).
    #[allow(unsafe_code)]
    let status = unsafe {
        plait_simt_launch(
            c_name.as_ptr(),
            c_letters.as_ptr(),
            grid,
            block,
            addresses.as_mut_ptr(),
            error.as_mut_ptr().cast(),
            error.len(),
        )
    };
    if status == 0 {
        Ok(())
    } else {
        Err(SimtError::Launch {
            kernel: name.to_owned(),
            message: c_string(&error),
        })
    }
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_registered_with_its_signature() {
        assert_eq!(signature("unary_forward").as_deref(), Some("pclid"));
        assert_eq!(signature("binary_forward").as_deref(), Some("pccBli"));
        assert_eq!(signature("no_such_kernel"), None);
    }

    #[test]
    fn a_launch_out_of_step_with_the_declaration_is_refused() {
        let x = [1.0f32; 4];
        let mut y = [0.0f32; 4];
        let err = launch(
            "unary_forward",
            1,
            4,
            &mut [KernelArg::Out(&mut y), KernelArg::In(&x), KernelArg::I32(4)],
        )
        .expect_err("too few arguments");
        assert!(err.to_string().contains("takes (pclid)"), "{err}");
        let err = launch("nope", 1, 4, &mut []).expect_err("unknown");
        assert!(err.to_string().contains("no kernel named nope"), "{err}");
        let err = launch(
            "unary_forward",
            1,
            3,
            &mut [
                KernelArg::Out(&mut y),
                KernelArg::In(&x),
                KernelArg::I64(4),
                KernelArg::I32(0),
                KernelArg::F64(0.0),
            ],
        )
        .expect_err("block of 3");
        assert!(err.to_string().contains("power of two"), "{err}");
    }

    #[test]
    fn a_grid_stride_kernel_covers_every_element() {
        let x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let mut y = vec![0.0f32; 1000];
        launch(
            "unary_forward",
            3,
            32,
            &mut [
                KernelArg::Out(&mut y),
                KernelArg::In(&x),
                KernelArg::I64(1000),
                KernelArg::I32(0),
                KernelArg::F64(0.0),
            ],
        )
        .expect("launch");
        assert!(y.iter().zip(&x).all(|(a, b)| *a == -*b));
    }

    #[test]
    fn a_race_between_threads_of_a_block_shows() {
        // In thread order every read would see its neighbour's write; shuffled phases make
        // some reads see the value from before (what a GPU may do).
        let (blocks, threads) = (4u32, 64u32);
        let mut out = vec![0.0f32; (blocks * threads) as usize];
        launch(
            "simt_selftest_race",
            blocks,
            threads,
            &mut [KernelArg::Out(&mut out)],
        )
        .expect("launch");
        let synchronized = |i: usize| {
            let (b, t) = (i / threads as usize, i % threads as usize);
            let prev = (t + threads as usize - 1) % threads as usize;
            (b * 1000 + prev + 1) as f32
        };
        let stale = (0..out.len())
            .filter(|&i| out[i] != synchronized(i))
            .count();
        assert!(
            stale > 0 && stale < out.len(),
            "{stale} of {} reads stale",
            out.len()
        );
    }

    #[test]
    fn block_reductions_meet_at_barriers() {
        // mean_all: one block, a tree reduction over shared memory with a barrier per level.
        let x: Vec<f32> = (1..=100).map(|i| i as f32).collect();
        let mut out = [0.0f32];
        for block in [1, 2, 8, 64, 256] {
            launch(
                "mean_all",
                1,
                block,
                &mut [
                    KernelArg::Out(&mut out),
                    KernelArg::In(&x),
                    KernelArg::I64(100),
                ],
            )
            .expect("launch");
            assert_eq!(out[0], 50.5, "block {block}");
        }
    }

    #[test]
    fn warps_shuffle_among_their_own_lanes() {
        let mut out = vec![0.0f32; 128];
        launch(
            "simt_selftest_shuffle",
            1,
            128,
            &mut [KernelArg::Out(&mut out)],
        )
        .expect("launch");
        for (t, v) in out.iter().enumerate() {
            let want = if (t / 32) % 2 == 1 {
                528.0 * 32.0
            } else {
                528.0
            };
            assert_eq!(*v, want, "thread {t}");
        }
    }

    #[test]
    fn a_warp_multiplies_its_fragments_as_the_tensor_cores_do() {
        let mut out = vec![0.0f32; 16 * 8];
        launch("simt_selftest_mma", 1, 32, &mut [KernelArg::Out(&mut out)]).expect("launch");
        for r in 0..16i32 {
            for n in 0..8i32 {
                let want: i32 = (0..16).map(|k| (r - k) * (k + 2 * n)).sum();
                assert_eq!(out[(r * 8 + n) as usize], want as f32, "D[{r}][{n}]");
            }
        }
    }

    #[test]
    fn a_warp_loads_matrices_as_ldmatrix_does() {
        let mut out = vec![0.0f32; 64 * 4];
        launch(
            "simt_selftest_ldmatrix",
            1,
            32,
            &mut [KernelArg::Out(&mut out)],
        )
        .expect("launch");
        // M_m[i][j] = 64m + 8i + j; a word's value is its lower half + 1000 · its upper half.
        let m = |m: usize, i: usize, j: usize| (64 * m + 8 * i + j) as f32;
        for lane in 0..32 {
            let (i, j) = (lane / 4, 2 * (lane % 4));
            for k in 0..4 {
                let plain = m(k, i, j) + 1000.0 * m(k, i, j + 1);
                let trans = m(k, j, i) + 1000.0 * m(k, j + 1, i);
                assert_eq!(out[lane * 4 + k], plain, "lane {lane} matrix {k}");
                assert_eq!(
                    out[(32 + lane) * 4 + k],
                    trans,
                    "lane {lane} matrix {k}, .trans"
                );
            }
        }
    }

    #[test]
    fn threads_that_skip_a_barrier_are_an_error() {
        let mut out = vec![0.0f32; 64];
        let e = launch(
            "simt_selftest_skipped_barrier",
            1,
            64,
            &mut [KernelArg::Out(&mut out)],
        )
        .expect_err("refused");
        assert!(e.to_string().contains("__syncthreads"), "{e}");
    }
}
