//! The machine's f32 multiply-add peak, measured: every core runs independent chains of
//! fused multiply-adds in the widest registers it has (AVX-512, else AVX2), and the bench
//! prints GFLOP/s a core and in all. A VM's reported clock says little about the clock its
//! work runs at, so "a step runs at x% of the cores' peak" (benches/README.md) divides by
//! this figure, taken on the same machine.
//!
//! `cargo bench -p routeburn-benches --no-default-features --bench fma_peak`

#[cfg(target_arch = "x86_64")]
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
/// Multiply-adds per chain and round; rounds a thread: ~1 s on a 2.5 GHz AVX2 core.
const ROUNDS: u64 = 200_000_000;

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("fma_peak: measures x86-64 CPUs (AVX2 or AVX-512) only, nothing measured");
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Some(form) = Form::detect() else {
        println!("fma_peak: no AVX2 with FMA on this CPU, nothing measured");
        return;
    };
    let per_thread: Vec<f64> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..threads).map(|_| scope.spawn(|| form.run())).collect();
        runs.into_iter()
            .map(|run| run.join().expect("a measuring thread panicked"))
            .collect()
    });
    let cores: Vec<String> = per_thread.iter().map(|g| format!("{g:.1}")).collect();
    let total: f64 = per_thread.iter().sum();
    println!(
        "f32 FMA peak ({}, {threads} threads): {} GFLOP/s a core, {total:.1} GFLOP/s in all",
        form.name(),
        cores.join(", "),
    );
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Form {
    Avx2,
    Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Form {
    fn detect() -> Option<Self> {
        if is_x86_feature_detected!("avx512f") {
            Some(Self::Avx512)
        } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            Some(Self::Avx2)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Avx2 => "AVX2, 8 lanes",
            Self::Avx512 => "AVX-512, 16 lanes",
        }
    }

    /// GFLOP/s of one thread (2 FLOP a lane and multiply-add).
    fn run(self) -> f64 {
        let start = Instant::now();
        let (chains, lanes, checksum) = match self {
            // SAFETY: `detect` found the features each function is compiled for.
            Self::Avx2 => unsafe { chains_avx2() },
            Self::Avx512 => unsafe { chains_avx512() },
        };
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(checksum);
        (ROUNDS * chains * lanes * 2) as f64 / seconds / 1e9
    }
}

/// 12 chains of 8 lanes: AVX2's 16 registers hold them and the two operands, and 12
/// cover an FMA's latency (4–5 cycles) times the two units most cores have.
/// Returns (chains, lanes, a checksum that keeps the work).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2() -> (u64, u64, f32) {
    use std::arch::x86_64::*;
    let mut sums = [_mm256_set1_ps(1.0); 12];
    let (factor, term) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    for _ in 0..ROUNDS {
        for sum in sums.iter_mut() {
            *sum = _mm256_fmadd_ps(*sum, factor, term);
        }
    }
    let mut lanes = [0.0f32; 8];
    let total = sums
        .iter()
        .fold(_mm256_setzero_ps(), |a, &s| _mm256_add_ps(a, s));
    // SAFETY: the store writes exactly `lanes`' eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), total) };
    (12, 8, lanes.iter().sum())
}

/// 24 chains of 16 lanes in AVX-512's 32 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512() -> (u64, u64, f32) {
    use std::arch::x86_64::*;
    let mut sums = [_mm512_set1_ps(1.0); 24];
    let (factor, term) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    for _ in 0..ROUNDS {
        for sum in sums.iter_mut() {
            *sum = _mm512_fmadd_ps(*sum, factor, term);
        }
    }
    let total = sums
        .iter()
        .fold(_mm512_setzero_ps(), |a, &s| _mm512_add_ps(a, s));
    (24, 16, _mm512_reduce_add_ps(total))
}
