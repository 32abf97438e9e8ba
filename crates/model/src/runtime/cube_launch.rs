//! How the crate's CubeCL kernels are launched: the units of a cube, and the offsets the
//! kernels index their tensors with.
//!
//! A CubeCL kernel indexes with 32-bit offsets unless it is launched otherwise, so a tensor
//! of more than `u32::MAX` elements would be read and written at its offset modulo 2³²:
//! wrong numbers, with no error. Training can reach that size on a large GPU: a POMO step
//! at n = 200 and batch 512 scores 102,400 rollouts × 400 steps × 201 nodes ≈ 8.2 × 10⁹
//! log-probabilities. Every kernel here is declared `address_type = "dynamic"` and
//! launched with the widest type its tensors need, as Burn's own kernels are: the same
//! 32-bit kernels as before at every size that fits, 64-bit offsets beyond it.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::AddressType;
use burn_cubecl::cubecl::CubeDim;
use burn_cubecl::tensor::CubeTensor;

/// Every kernel's cube: `units`, or fewer where the runtime runs fewer at once. CubeCL's
/// CPU runtime gives each unit of a cube with barriers its own thread and spins at
/// `sync_cube`, so more units than cores (2 here) made a step take minutes.
pub(crate) fn cube_dim(client: &cubecl::client::Client, units: u32) -> CubeDim {
    let most = client.properties().hardware.max_units_per_cube;
    #[cfg(all(test, feature = "cpu"))]
    let most = for_tests::units_instead().unwrap_or(most);
    CubeDim::new_1d(units.min(most).max(1))
}

/// The address type a kernel reading and writing `tensors` must be launched with: 64-bit
/// where one of them has more elements than a `u32` counts.
pub(crate) fn address_type<'a>(tensors: impl IntoIterator<Item = &'a CubeTensor>) -> AddressType {
    let needed = tensors
        .into_iter()
        .map(CubeTensor::required_address_type)
        .max()
        .unwrap_or_default();
    #[cfg(all(test, feature = "cpu"))]
    if let Some(wide) = for_tests::wide_instead() {
        return wide;
    }
    needed
}

/// Launch settings a GPU would choose, on demand, so that the tests can run each kernel
/// as a GPU runs it on CubeCL's CPU runtime: 64-bit offsets on tensors small enough for a
/// test, and more units a cube than this machine has cores (a GPU's 64 to 256, so that
/// units outnumber an instance's nodes and some have none).
#[cfg(all(test, feature = "cpu"))]
pub(crate) mod for_tests {
    use super::AddressType;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

    /// Process-wide, as the fusion server launches on its own thread.
    static WIDE: AtomicBool = AtomicBool::new(false);
    /// Units a cube at most instead of the runtime's; 0: the runtime's.
    static UNITS: AtomicU32 = AtomicU32::new(0);
    /// Launches given a setting of this module.
    static GIVEN: AtomicUsize = AtomicUsize::new(0);

    /// `U64` (counted) while [`with_wide_addresses`] runs.
    pub(super) fn wide_instead() -> Option<AddressType> {
        WIDE.load(Ordering::SeqCst).then(|| {
            GIVEN.fetch_add(1, Ordering::SeqCst);
            AddressType::U64
        })
    }

    /// The units a cube at most (counted) while [`with_units`] runs.
    pub(super) fn units_instead() -> Option<u32> {
        let units = UNITS.load(Ordering::SeqCst);
        (units > 0).then(|| {
            GIVEN.fetch_add(1, Ordering::SeqCst);
            units
        })
    }

    /// Runs `f` (a test) with every kernel given 64-bit offsets; the number of kernels it
    /// launched.
    pub(crate) fn with_wide_addresses(f: impl FnOnce()) -> usize {
        with(|| WIDE.store(true, Ordering::SeqCst), f)
    }

    /// Runs `f` (a test) with up to `units` units a cube in every kernel; the number of
    /// kernels it launched.
    pub(crate) fn with_units(units: u32, f: impl FnOnce()) -> usize {
        with(|| UNITS.store(units, Ordering::SeqCst), f)
    }

    /// Runs `f` with the setting `set` makes; the launches given it. It holds the lock the
    /// tests that launch kernels take (`crate::runtime::testing::one_cube_test_at_a_time`,
    /// which `f` may take again), so no other test's kernels run meanwhile; `f` must read
    /// its results before it returns.
    fn with(set: impl FnOnce(), f: impl FnOnce()) -> usize {
        let _alone = crate::runtime::testing::one_cube_test_at_a_time();
        GIVEN.store(0, Ordering::SeqCst);
        set();
        // Back to the runtime's settings even where `f` fails, for the tests after it.
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                WIDE.store(false, Ordering::SeqCst);
                UNITS.store(0, Ordering::SeqCst);
            }
        }
        let _reset = Reset;
        f();
        GIVEN.load(Ordering::SeqCst)
    }
}
