//! NVRTC compiles `kernels/cuda` when the CUDA backend opens a device (feature `cuda`).
//!
//! The kernels are compiled to a cubin for the device's own architecture (`sm_XY`), not to
//! PTX: the driver JIT-compiles PTX only when its own PTX ISA is at least NVRTC's, so PTX from
//! a newer NVRTC (PyTorch's wheels often bring one) fails to load on an older driver
//! (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`), while a cubin of the same CUDA major version loads
//! under CUDA's minor-version compatibility. PTX stays the fallback for a device newer than
//! NVRTC knows (no `sm_XY` target), which the driver can still JIT.

use std::ffi::{CStr, CString, c_char};

use cudarc::nvrtc::{result, sys};

use super::kernel_cache;
use crate::RuntimeError;

/// The options every compilation uses: the target only (NVRTC's defaults otherwise, fused
/// multiply-adds included: they change a loss by ~1e-7 relative, far inside issue 15's 1e-4).
fn options(target: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={target}")]
}

pub(crate) fn present() -> bool {
    // SAFETY: only tries to dlopen the NVRTC library by its candidate names.
    #[allow(unsafe_code)]
    unsafe {
        sys::is_culib_present()
    }
}

fn missing() -> RuntimeError {
    RuntimeError::NoCudaDevice {
        reason: "the NVRTC library (libnvrtc.so), which compiles plait's kernels, was not found; add its folder to LD_LIBRARY_PATH".into(),
    }
}

fn failed(target: &str, message: String) -> RuntimeError {
    RuntimeError::DeviceLaunch {
        kernel: "nvrtc",
        message: format!("compiling kernels/cuda for {target}: {message}"),
    }
}

/// What NVRTC produces: `Ptx` (text, for `compute_XY`) or `Cubin` (machine code, `sm_XY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Ptx,
    Cubin,
}

/// `kernels/cuda` compiled for compute capability `major.minor` (no device needed: the CUDA
/// build's tests compile it wherever the NVRTC library is found): the PTX text's or the
/// cubin's bytes, from the kernel cache ([`super::kernel_cache`]) when an earlier run or rank
/// built them with the same source, options and NVRTC.
pub fn compile_kernels(major: i32, minor: i32, output: Output) -> Result<Vec<u8>, RuntimeError> {
    if !present() {
        return Err(missing());
    }
    let target = match output {
        Output::Ptx => format!("compute_{major}{minor}"),
        Output::Cubin => format!("sm_{major}{minor}"),
    };
    let options = options(&target);
    let version = version();
    let key = kernel_cache::Key::new(
        &target,
        &[
            kernels::device::CUDA_SOURCE.as_bytes(),
            options.join(" ").as_bytes(),
            version.as_bytes(),
        ],
    );
    let bytes = kernel_cache::get_or_build(&key, || compile(&target, &options, output))?;
    Ok(bytes.as_ref().clone())
}

/// NVRTC's version, as "major.minor" (part of the cache key: another NVRTC builds anew).
fn version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC writes two ints through the pointers.
    #[allow(unsafe_code)]
    let ok = unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .is_ok();
    if ok {
        format!("{major}.{minor}")
    } else {
        "unknown".into()
    }
}

fn compile(target: &str, options: &[String], output: Output) -> Result<Vec<u8>, RuntimeError> {
    let source = CString::new(kernels::device::CUDA_SOURCE)
        .map_err(|e| failed(target, format!("the source holds a NUL byte: {e}")))?;
    let program = Program(
        result::create_program(&source, Some(c"plait_kernels.cu"))
            .map_err(|e| failed(target, format!("{e:?}")))?,
    );
    program.compile(options, target)?;
    program.output(output, target)
}

/// An NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Program {
    fn compile(&self, options: &[String], target: &str) -> Result<(), RuntimeError> {
        // SAFETY: `self.0` was made by `create_program` and is destroyed only by `drop`.
        #[allow(unsafe_code)]
        unsafe { result::compile_program(self.0, options) }
            .map_err(|e| failed(target, format!("{e:?}\n{}", self.log())))
    }

    fn log(&self) -> String {
        // SAFETY: as in `compile`; NVRTC's log is NUL-terminated.
        #[allow(unsafe_code)]
        unsafe {
            result::get_program_log(self.0)
                .map(|log| CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned())
                .unwrap_or_default()
        }
    }

    fn output(&self, output: Output, target: &str) -> Result<Vec<u8>, RuntimeError> {
        let bytes = match output {
            // SAFETY: as in `compile`, after a successful compilation.
            #[allow(unsafe_code)]
            Output::Ptx => unsafe { result::get_ptx(self.0) }.map(|text| {
                let text: Vec<u8> = text.into_iter().map(|c| c as u8).collect();
                text.split(|&b| b == 0).next().unwrap_or_default().to_vec()
            }),
            Output::Cubin => self.cubin(),
        };
        bytes.map_err(|e| failed(target, format!("{e:?}")))
    }

    fn cubin(&self) -> Result<Vec<u8>, result::NvrtcError> {
        let mut size = 0usize;
        // SAFETY: as in `compile`; the buffer is sized by NVRTC's own count.
        #[allow(unsafe_code)]
        unsafe {
            sys::nvrtcGetCUBINSize(self.0, &mut size).result()?;
            let mut bytes = vec![0u8; size];
            sys::nvrtcGetCUBIN(self.0, bytes.as_mut_ptr().cast::<c_char>()).result()?;
            Ok(bytes)
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` is live and destroyed once, here.
        #[allow(unsafe_code)]
        let _ = unsafe { result::destroy_program(self.0) };
    }
}
