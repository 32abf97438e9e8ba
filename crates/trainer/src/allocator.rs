//! Heap settings for tensor work on the CPU.
//!
//! The CPU backends allocate a fresh buffer for nearly every tensor op, many of them a few
//! hundred KiB to tens of MiB. glibc serves blocks above its mmap threshold (128 KiB at
//! first, adapting upward only as such blocks are freed) with fresh mappings, so each such
//! op pays page faults and the kernel's page zeroing: about a tenth of a `tiny_1` training
//! step in a profile (README, "Performance"). Raising the threshold and the trim threshold
//! keeps freed blocks in the heap for the next step to reuse.

/// The largest mmap threshold glibc accepts on 64-bit targets (its `HEAP_MAX / 2`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Freed memory kept at the top of the heap before it is returned to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 512 << 20;

/// Applies the heap settings once, before the first tensor is allocated. Does nothing off
/// glibc, or when the user set `GLIBC_TUNABLES` (their settings win).
pub fn tune_for_tensors() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: mallopt only changes allocator parameters; it is called before any
        // other thread exists (or, from a bench, before tensor work starts), and a
        // rejected value leaves glibc's default in place.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}
