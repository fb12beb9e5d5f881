//! A [`Device`] on the `simt` emulator: host memory standing in for a GPU's, the kernels of
//! `kernels/cuda` launched through `simt`, and the GEMMs (cuBLAS on a GPU) as a plain f64 loop.
//! `DeviceBackend<Emulator>` is the CUDA backend's lowering and kernel source, run without a
//! GPU.

use std::sync::Mutex;

use runtime::backend::collectives::{Collectives, DeviceCollective};
use runtime::backend::launches::LaunchTally;
use runtime::{Communicator, Device, DeviceBackend, Gemm, GemmPrecision, RuntimeError};
use simt::KernelArg;

/// Host memory standing in for a device's, with the kernels launched through `simt` on blocks
/// of `block` threads; with `tensor_cores`, bf16 attention runs `attention_mma.cu`'s warp-wide
/// products, which `simt` emulates by their fragment layouts.
#[derive(Debug)]
pub struct Emulator {
    pub block: u32,
    pub tensor_cores: bool,
    /// Every launch by kernel, with the bytes of the buffers it was handed (as the dry device
    /// counts them): which kernels a run took.
    launches: Mutex<LaunchTally>,
}

impl Emulator {
    pub fn new(block: u32, tensor_cores: bool) -> Emulator {
        Emulator {
            block,
            tensor_cores,
            launches: Mutex::default(),
        }
    }
}

impl Device for Emulator {
    type Mem = Vec<f32>;

    fn name(&self) -> String {
        format!("simt (block {})", self.block)
    }

    fn alloc_zeros(&self, len: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(vec![0.0; len])
    }

    /// NaN everywhere: an element a kernel leaves unwritten shows in its result.
    fn alloc(&self, len: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(vec![f32::NAN; len])
    }

    fn upload(&self, host: &[f32], dst: &mut Vec<f32>) -> Result<(), RuntimeError> {
        dst[..host.len()].copy_from_slice(host);
        Ok(())
    }

    fn download(&self, src: &Vec<f32>, host: &mut [f32]) -> Result<(), RuntimeError> {
        host.copy_from_slice(&src[..host.len()]);
        Ok(())
    }

    fn copy(&self, src: &Vec<f32>, dst: &mut Vec<f32>, len: usize) -> Result<(), RuntimeError> {
        dst[..len].copy_from_slice(&src[..len]);
        Ok(())
    }

    fn launch(
        &self,
        kernel: &'static str,
        grid: u32,
        block: u32,
        args: &mut [KernelArg<'_, Vec<f32>>],
    ) -> Result<(), RuntimeError> {
        let bytes = args
            .iter()
            .map(|a| match a {
                KernelArg::Out(m) => 4 * m.len() as u64,
                KernelArg::In(m) => 4 * m.len() as u64,
                _ => 0,
            })
            .sum();
        if let Ok(mut t) = self.launches.lock() {
            t.add(kernel, bytes);
        }
        let mut host: Vec<KernelArg<'_, [f32]>> = args
            .iter_mut()
            .map(|a| match a {
                KernelArg::Out(m) => KernelArg::Out(m.as_mut_slice()),
                KernelArg::In(m) => KernelArg::In(m.as_slice()),
                KernelArg::Null => KernelArg::Null,
                KernelArg::I64(v) => KernelArg::I64(*v),
                KernelArg::I32(v) => KernelArg::I32(*v),
                KernelArg::F64(v) => KernelArg::F64(*v),
                KernelArg::Broadcast(b) => KernelArg::Broadcast(*b),
                KernelArg::Strided(s) => KernelArg::Strided(*s),
                KernelArg::Attention(a) => KernelArg::Attention(*a),
            })
            .collect();
        simt::launch(kernel, grid, block, &mut host).map_err(|e| RuntimeError::DeviceLaunch {
            kernel,
            message: e.to_string(),
        })
    }

    /// `to_bf16`'s copy of the matrix, made by the kernel the CUDA device runs for it.
    fn bf16_operand(
        &self,
        x: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Vec<f32>>, RuntimeError> {
        let pitch = cols.next_multiple_of(8);
        let mut y = self.alloc(rows * pitch / 2)?;
        let i = |n: usize| KernelArg::I64(n as i64);
        self.launch(
            "to_bf16",
            kernels::device::to_bf16_grid(1, rows, pitch),
            self.block,
            &mut [
                KernelArg::Out(&mut y),
                KernelArg::In(x),
                i(1),
                i(rows),
                i(cols),
                i(rows * cols),
                i(pitch),
            ],
        )?;
        Ok(Some(y))
    }

    fn gemm(
        &self,
        g: &Gemm,
        a: &Vec<f32>,
        b: &Vec<f32>,
        c: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        // Element (r, col) of a stored [rows, cols] operand: f32, or `bf16_operand`'s words.
        let element = |m: &[f32], given: bool, cols: usize, r: usize, col: usize| {
            if !given {
                return m[r * cols + col];
            }
            bf16_at(m, r * cols.next_multiple_of(8) + col)
        };
        // Counted as the CUDA device launches it (operand copies, products, copies out of a
        // padded pitch), as the dry device counts it.
        if let Ok(mut t) = self.launches.lock() {
            for (kernel, bytes) in runtime::backend::device::bf16_gemm::launches(g) {
                t.add(kernel, bytes);
            }
        }
        // Rows of `c` at its own pitch where it has one (the columns past `n` left as they are).
        let ld = if g.c_pitch != 0 { g.c_pitch } else { g.n };
        let stride_c = if g.c_pitch != 0 { g.m * ld } else { g.stride_c };
        for e in 0..g.batch {
            let (a, b) = (&a[e * g.stride_a..], &b[e * g.stride_b..]);
            // Element offsets of c count its own elements: bf16 ones where it is words.
            let c0 = e * stride_c;
            for i in 0..g.m {
                for j in 0..g.n {
                    let round = |v: f32| match g.precision {
                        GemmPrecision::F32 => v,
                        GemmPrecision::Bf16 => kernels::device::round_bf16(v),
                    };
                    let s: f64 = (0..g.k)
                        .map(|p| {
                            let x = if g.trans_a {
                                element(a, g.given_bf16[0], g.m, p, i)
                            } else {
                                element(a, g.given_bf16[0], g.k, i, p)
                            };
                            let y = if g.trans_b {
                                element(b, g.given_bf16[1], g.k, j, p)
                            } else {
                                element(b, g.given_bf16[1], g.n, p, j)
                            };
                            f64::from(round(x)) * f64::from(round(y))
                        })
                        .sum();
                    let at = c0 + i * ld + j;
                    let before = match (g.accumulate, g.c_words) {
                        (false, _) => 0.0,
                        (true, true) => bf16_at(c, at),
                        (true, false) => c[at],
                    };
                    // cuBLAS adds beta·c to the f32 product, then rounds once.
                    let v = s as f32 + before;
                    if g.c_words {
                        set_bf16(c, at, v);
                    } else {
                        c[at] = v;
                    }
                }
            }
        }
        Ok(())
    }

    fn block_size(&self) -> u32 {
        self.block
    }

    fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    fn launch_tally(&self) -> Option<LaunchTally> {
        self.launches.lock().ok().map(|t| t.clone())
    }
}

/// Element `i` of `words` (bf16, two to a word, in order) as an f32.
fn bf16_at(words: &[f32], i: usize) -> f32 {
    let w = words[i / 2].to_bits();
    f32::from_bits(if i.is_multiple_of(2) {
        w << 16
    } else {
        w & 0xffff_0000
    })
}

/// Element `i` of `words` (bf16, two to a word, in order) set to `v` rounded to nearest even, as
/// cuBLAS writes a bf16 output (`Gemm::c_words`).
fn set_bf16(words: &mut [f32], i: usize, v: f32) {
    let half = kernels::device::round_bf16(v).to_bits() >> 16;
    let w = words[i / 2].to_bits();
    let w = if i.is_multiple_of(2) {
        (w & 0xffff_0000) | half
    } else {
        (w & 0x0000_ffff) | (half << 16)
    };
    words[i / 2] = f32::from_bits(w);
}

/// The device backend on the emulator, with blocks of `block` threads.
pub fn emulator(block: u32) -> DeviceBackend<Emulator> {
    DeviceBackend::on(Emulator::new(block, false))
}

/// [`emulator_bf16`] on a device with tensor cores: bf16 attention on the warp-wide kernels of
/// `attention_mma.cu`, as a GPU of compute capability 8.0 or newer runs it.
pub fn emulator_mma(block: u32) -> DeviceBackend<Emulator> {
    DeviceBackend::on(Emulator::new(block, true)).with_gemm_precision(GemmPrecision::Bf16)
}

/// [`emulator`] with the ops' GEMMs on bf16-rounded operands, as cuBLAS's
/// `CUBLAS_COMPUTE_32F_FAST_16BF` multiplies them.
pub fn emulator_bf16(block: u32) -> DeviceBackend<Emulator> {
    emulator(block).with_gemm_precision(GemmPrecision::Bf16)
}

/// The emulator's stand-in for NCCL: collectives on emulated device memory (host vectors)
/// through the ranks' host communicator, so that the executor's device-collective path
/// (layouts arranged on the device, no staging through `download`/`upload`) runs without a
/// GPU. It moves no bytes the backend counts as host transfers, as NCCL moves none.
#[derive(Debug, Default)]
pub struct EmulatedCollectives;

impl Collectives<Vec<f32>> for EmulatedCollectives {
    fn run(
        &self,
        group: &dyn Communicator,
        op: DeviceCollective,
        input: &Vec<f32>,
        len: usize,
        output: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        let out_len = op.out_len(len, group.size());
        let (send, recv) = (&input[..len], &mut output[..out_len]);
        match op {
            DeviceCollective::AllReduce => {
                recv.copy_from_slice(send);
                group.all_reduce_sum(recv)
            }
            DeviceCollective::AllGather => group.all_gather(send, recv),
            DeviceCollective::ReduceScatter => group.reduce_scatter_sum(send, recv),
            DeviceCollective::AllToAll => group.all_to_all(send, recv),
        }
    }

    fn open(&self, _group: &dyn Communicator) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// NCCL's group semantics on the threads communicator: the sends are posted, the
    /// receives taken (each acknowledged with a receipt), then the group waits for its sends'
    /// receipts, so a send is done only once received; a program whose groups wait on each
    /// other under NCCL hangs here too (and times out naming the rank).
    fn exchange(
        &self,
        world: &dyn Communicator,
        sends: &[(&Vec<f32>, usize, usize)],
        recvs: &mut [(&mut Vec<f32>, usize, usize)],
    ) -> Result<(), RuntimeError> {
        for (buf, len, peer) in sends {
            world.send(&buf[..*len], *peer, DATA_TAG)?;
        }
        for (buf, len, peer) in recvs.iter_mut() {
            world.recv(&mut buf[..*len], *peer, DATA_TAG)?;
            world.send(&[1.0], *peer, RECEIPT_TAG)?;
        }
        for (_, _, peer) in sends {
            world.recv(&mut [0.0], *peer, RECEIPT_TAG)?;
        }
        Ok(())
    }
}

/// The tags of [`EmulatedCollectives`]' point-to-point messages and their receipts on the
/// world communicator: fixed (NCCL matches a pair's messages in issue order, without tags),
/// at the top of the tag range, which the executor's folded tags reach only past 16 000
/// micro-batch tags.
const DATA_TAG: u32 = runtime::MAX_TAG;
const RECEIPT_TAG: u32 = runtime::MAX_TAG - 1;

/// [`emulator`] whose collectives run on its buffers ([`EmulatedCollectives`]).
pub fn emulator_with_collectives(block: u32) -> DeviceBackend<Emulator> {
    emulator(block).with_collectives(std::sync::Arc::new(EmulatedCollectives))
}
