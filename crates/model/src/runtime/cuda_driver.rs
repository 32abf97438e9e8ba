//! What the CUDA backend needs from the machine, checked before any work starts: the
//! NVIDIA driver (`libcuda.so.1`, loaded at run time), a GPU it can see, and the CUDA
//! toolkit's `libdevice.10.bc` (CubeCL's LLVM path links it into kernels that use exp, log
//! or tanh). Without them Burn would panic deep inside cudarc.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::path::PathBuf;

use thiserror::Error;

/// Why the CUDA backend cannot run here (`backend.rs` turns it into its own error; this
/// module imports nothing of the crate's).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct NoCudaDriver(pub String);

/// The driver library cudarc loads.
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";

/// Checks the driver, a device and libdevice.
pub fn check() -> Result<(), NoCudaDriver> {
    check_driver(DRIVER_LIBRARY)?;
    find_libdevice().map(|_| ())
}

/// Loads `library` and asks it for its devices.
pub fn check_driver(library: &str) -> Result<(), NoCudaDriver> {
    let name = std::ffi::CString::new(library).expect("no NUL in a library name");
    // SAFETY: dlopen/dlsym/dlerror with valid C strings; the two driver entry points are
    // called with the signatures of the CUDA driver API (cuInit, cuDeviceGetCount).
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let reason = dlerror_text();
            return Err(NoCudaDriver(format!(
                "{library} cannot be loaded ({reason}): install the NVIDIA driver, or use --backend flex"
            )));
        }
        let init = libc::dlsym(handle, c"cuInit".as_ptr());
        let count = libc::dlsym(handle, c"cuDeviceGetCount".as_ptr());
        if init.is_null() || count.is_null() {
            return Err(NoCudaDriver(format!(
                "{library} has no cuInit/cuDeviceGetCount: not an NVIDIA driver library"
            )));
        }
        let init: extern "C" fn(c_uint) -> c_int = std::mem::transmute(init);
        let count: extern "C" fn(*mut c_int) -> c_int = std::mem::transmute(count);
        let status = init(0);
        if status != 0 {
            return Err(NoCudaDriver(format!(
                "the NVIDIA driver did not start (cuInit error {status}): is a GPU present and the driver loaded?"
            )));
        }
        let mut devices: c_int = 0;
        if count(&mut devices) != 0 || devices == 0 {
            return Err(NoCudaDriver(
                "the NVIDIA driver sees no GPU: use --backend flex".into(),
            ));
        }
    }
    Ok(())
}

unsafe fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libc.
    let e: *const c_char = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `nvvm/libdevice/libdevice.10.bc` under `$CUDA_PATH`, `$CUDA_HOME` or `/usr/local/cuda`.
pub fn find_libdevice() -> Result<PathBuf, NoCudaDriver> {
    let roots: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .chain([PathBuf::from("/usr/local/cuda")])
        .collect();
    roots
        .iter()
        .map(|r| r.join("nvvm/libdevice/libdevice.10.bc"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            NoCudaDriver(format!(
                "libdevice.10.bc not found (looked in {}): install the CUDA toolkit's nvvm, or set CUDA_PATH",
                roots
                    .iter()
                    .map(|r| r.join("nvvm/libdevice").display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_an_error_naming_the_library() {
        let e = check_driver("libcuda-does-not-exist.so.1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("libcuda-does-not-exist.so.1 cannot be loaded"),
            "{e}"
        );
        assert!(e.contains("install the NVIDIA driver"), "{e}");
    }

    #[test]
    fn this_machine_either_has_a_gpu_or_says_what_is_missing() {
        // On a machine without the driver (CI, this project's machines) the real check
        // must name libcuda.so.1; on a GPU machine it passes.
        if let Err(e) = check_driver(DRIVER_LIBRARY) {
            assert!(
                e.to_string().contains(DRIVER_LIBRARY) || e.to_string().contains("NVIDIA driver"),
                "{e}"
            );
        }
        let libdevice = find_libdevice();
        if let Err(e) = &libdevice {
            assert!(e.to_string().contains("libdevice.10.bc not found"), "{e}");
        }
    }
}
