//! One body per check, run on every backend: the CPU always, CUDA under `--features cuda`
//! (skipped with a note when no GPU, driver or cuBLAS is found). The CPU kernels are the
//! reference.
#![allow(clippy::unwrap_used)]

use ir::{AdamWConfig, Binding, OpKind};
use kernels::Tensor32;
use runtime::Backend;

/// Deterministic values in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64) -> Tensor32 {
    Tensor32::new(shape.to_vec(), data(shape.iter().product(), seed)).unwrap()
}

fn assert_close(got: &Tensor32, want: &Tensor32, tol: f32, what: &str) {
    assert_eq!(got.shape, want.shape, "{what}: shape");
    for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Runs `kind` forward on the backend and on the CPU kernels and compares.
fn check_forward<B: Backend>(b: &B, kind: OpKind, inputs: &[Tensor32], tol: f32) {
    let bufs: Vec<B::Buffer> = inputs.iter().map(|t| b.upload(t).unwrap()).collect();
    let refs: Vec<&B::Buffer> = bufs.iter().collect();
    let binding = Binding { batch: 1, seq: 1 };
    let got = b.forward(&kind, &refs, binding).unwrap();
    let host: Vec<&Tensor32> = inputs.iter().collect();
    let want = kernels::forward(&kind, &host, binding).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_close(&b.download(g).unwrap(), w, tol, kind.mnemonic());
    }
}

fn round_trip<B: Backend>(b: &B) {
    let t = tensor(&[3, 5, 7], 1);
    let buf = b.upload(&t).unwrap();
    assert_eq!(b.shape(&buf), &[3, 5, 7]);
    assert_eq!(b.download(&buf).unwrap(), t);
    b.free(buf);
    let z = b.zeros(&[4, 0, 2]).unwrap();
    assert_eq!(
        b.download(&z).unwrap(),
        Tensor32::zeros(&[4, 0, 2]).unwrap()
    );
    let s = b.upload(&Tensor32::scalar(2.5)).unwrap();
    assert_eq!(b.download(&s).unwrap(), Tensor32::scalar(2.5));
    assert!(!b.name().is_empty());
}

fn sgemm_matches_reference<B: Backend>(b: &B) {
    let (m, k, n) = (37, 19, 23);
    let (a, x) = (tensor(&[m, k], 2), tensor(&[k, n], 3));
    let c = b
        .sgemm(&b.upload(&a).unwrap(), &b.upload(&x).unwrap())
        .unwrap();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|p| f64::from(a.data[i * k + p]) * f64::from(x.data[p * n + j]))
                .sum();
            want[i * n + j] = s as f32;
        }
    }
    let want = Tensor32::new(vec![m, n], want).unwrap();
    assert_close(&b.download(&c).unwrap(), &want, 1e-5, "sgemm");
    assert!(
        b.sgemm(&b.upload(&a).unwrap(), &b.upload(&a).unwrap())
            .is_err()
    );
}

fn matmul_ops<B: Backend>(b: &B) {
    // One weight matrix (batch folds into M), equal batch dims, broadcast batch dims.
    check_forward(
        b,
        OpKind::MatMul,
        &[tensor(&[2, 3, 5, 8], 4), tensor(&[8, 6], 5)],
        1e-5,
    );
    check_forward(
        b,
        OpKind::MatMul,
        &[tensor(&[2, 3, 5, 8], 6), tensor(&[2, 3, 8, 4], 7)],
        1e-5,
    );
    check_forward(
        b,
        OpKind::MatMul,
        &[tensor(&[2, 3, 5, 8], 8), tensor(&[1, 3, 8, 4], 9)],
        1e-5,
    );
    check_forward(
        b,
        OpKind::Linear { bias: false },
        &[tensor(&[4, 6, 16], 10), tensor(&[16, 12], 11)],
        1e-5,
    );
    check_forward(
        b,
        OpKind::Linear { bias: true },
        &[
            tensor(&[4, 6, 16], 12),
            tensor(&[16, 12], 13),
            tensor(&[12], 14),
        ],
        1e-5,
    );
}

fn other_ops<B: Backend>(b: &B) {
    check_forward(
        b,
        OpKind::Gelu { tanh: true },
        &[tensor(&[3, 10], 15)],
        1e-6,
    );
    check_forward(
        b,
        OpKind::LayerNorm {
            eps: 1e-5,
            bias: true,
        },
        &[tensor(&[3, 10], 16), tensor(&[10], 17), tensor(&[10], 18)],
        1e-5,
    );
    check_forward(
        b,
        OpKind::Split {
            axis: 1,
            sizes: vec![4, 6],
        },
        &[tensor(&[3, 10], 19)],
        0.0,
    );
    let bad = b.upload(&tensor(&[3, 4], 20)).unwrap();
    let err = b
        .forward(&OpKind::MatMul, &[&bad, &bad], Binding { batch: 1, seq: 1 })
        .unwrap_err();
    assert!(err.to_string().contains("matmul"), "{err}");
}

fn backward_matches_kernels<B: Backend>(b: &B) {
    let (x, w, dy) = (
        tensor(&[5, 8], 21),
        tensor(&[8, 3], 22),
        tensor(&[5, 3], 23),
    );
    let up = |t: &Tensor32| b.upload(t).unwrap();
    let (xb, wb, dyb) = (up(&x), up(&w), up(&dy));
    let got = b.backward(&OpKind::MatMul, &[&xb, &wb], &[&dyb]).unwrap();
    let want = kernels::backward(&OpKind::MatMul, &[&x, &w], &[&dy]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.as_ref().unwrap(), w.as_ref().unwrap());
        assert_close(&b.download(g).unwrap(), w, 1e-5, "matmul backward");
    }
}

fn adamw_matches_kernels<B: Backend>(b: &B) {
    let cfg = AdamWConfig::default();
    let (mut p, g, mut m, mut v) = (
        tensor(&[6, 7], 24),
        tensor(&[6, 7], 25),
        tensor(&[6, 7], 26),
        Tensor32::new(vec![6, 7], data(42, 27).iter().map(|x| x.abs()).collect()).unwrap(),
    );
    let up = |t: &Tensor32| b.upload(t).unwrap();
    let (mut pb, gb, mut mb, mut vb) = (up(&p), up(&g), up(&m), up(&v));
    for step in 1..=3 {
        b.adamw(&cfg, &mut pb, &gb, &mut mb, &mut vb, step).unwrap();
        kernels::adamw(&cfg, &mut p, &g, &mut m, &mut v, step).unwrap();
    }
    b.synchronize().unwrap();
    assert_eq!(b.download(&pb).unwrap(), p);
    assert_eq!(b.download(&mb).unwrap(), m);
    assert_eq!(b.download(&vb).unwrap(), v);
}

/// Declares each body as a test on every backend.
macro_rules! on_every_backend {
    ($($body:ident),* $(,)?) => {
        mod cpu {
            $(
                #[test]
                fn $body() {
                    super::$body(&runtime::CpuBackend::new());
                }
            )*
        }

        #[cfg(feature = "cuda")]
        mod cuda {
            $(
                #[test]
                fn $body() {
                    match runtime::CudaBackend::new(0) {
                        Ok(b) => super::$body(&b),
                        // On a GPU machine, PLAIT_REQUIRE_CUDA=1 turns the skip into a failure.
                        Err(e) if std::env::var_os("PLAIT_REQUIRE_CUDA").is_some() => {
                            panic!("PLAIT_REQUIRE_CUDA is set but: {e}")
                        }
                        Err(e) => eprintln!(
                            "skipped: no GPU: cuda::{} ({e})",
                            stringify!($body)
                        ),
                    }
                }
            )*
        }
    };
}

on_every_backend!(
    round_trip,
    sgemm_matches_reference,
    matmul_ops,
    other_ops,
    backward_matches_kernels,
    adamw_matches_kernels,
);

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_is_a_clear_error() {
    let err = runtime::CudaBackend::new(0).unwrap_err();
    assert_eq!(err, runtime::RuntimeError::NotCompiledWithCudaSupport);
    assert!(err.to_string().contains("--features"), "{err}");
}

/// A larger product on the GPU against the CPU, and its rate (printed with --nocapture).
#[cfg(feature = "cuda")]
#[test]
fn cuda_sgemm_at_size() {
    let Ok(gpu) = runtime::CudaBackend::new(0) else {
        return;
    };
    let cpu = runtime::CpuBackend::new();
    let n = 1024;
    let (a, x) = (tensor(&[n, n], 30), tensor(&[n, n], 31));
    let (ga, gx) = (gpu.upload(&a).unwrap(), gpu.upload(&x).unwrap());
    let got = gpu.download(&gpu.sgemm(&ga, &gx).unwrap()).unwrap();
    let want = cpu.sgemm(&a, &x).unwrap();
    assert_close(&got, &want, 1e-4, "sgemm 1024");
    let n = 8192;
    let (a, x) = (tensor(&[n, n], 32), tensor(&[n, n], 33));
    let (ga, gx) = (gpu.upload(&a).unwrap(), gpu.upload(&x).unwrap());
    drop(gpu.sgemm(&ga, &gx).unwrap());
    gpu.synchronize().unwrap();
    let t = std::time::Instant::now();
    let reps = 10;
    for _ in 0..reps {
        drop(gpu.sgemm(&ga, &gx).unwrap());
    }
    gpu.synchronize().unwrap();
    let secs = t.elapsed().as_secs_f64() / f64::from(reps);
    let tflops = 2.0 * (n as f64).powi(3) / secs / 1e12;
    println!(
        "{}: sgemm {n}^3 in {:.2} ms = {tflops:.1} TFLOP/s",
        gpu.name(),
        secs * 1e3
    );
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    if let Err(e) = runtime::CudaBackend::new(0) {
        assert!(
            matches!(e, runtime::RuntimeError::NoCudaDevice { .. }),
            "{e:?}"
        );
    }
    // An ordinal past the last device is always refused without panicking.
    assert!(runtime::CudaBackend::new(1 << 20).is_err());
}
