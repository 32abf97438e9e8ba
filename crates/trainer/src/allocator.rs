//! Heap settings for tensor work on the CPU.
//!
//! The CPU backends allocate a fresh buffer for nearly every tensor op, from a few hundred
//! KiB to hundreds of MiB (the encoder's `[512, 8, 101, 101]` attention scores are 167 MB).
//! glibc serves large blocks with fresh mappings (above a threshold that it caps at 32
//! MiB), so each such op pays page faults and the kernel's page zeroing: about a tenth of
//! a `tiny_1` training step and a quarter of a greedy CVRP100 evaluation
//! (`benches/README.md`, sessions 4 and 11). Here the heap serves every block (glibc
//! still maps memory when the heap cannot grow) and keeps up to [`TRIM_THRESHOLD`] of
//! freed memory for the next op.

/// Blocks glibc may serve with mappings of their own: none.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_MAX: libc::c_int = 0;
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
            libc::mallopt(libc::M_MMAP_MAX, MMAP_MAX);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}
