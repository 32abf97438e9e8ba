//! Loops over contiguous `f32` rows that the flex kernels share (the decoder step's and
//! the encoder's self-attention): weighted sums of rows kept in AVX2 registers, a
//! polynomial exponential, a masked softmax. Each is compiled three times, in the builds
//! that [`simd_dispatch`] writes for each kernel: with fused multiply-adds for AVX2 and FMA
//! (`Fused`), the same with the weighted sums in 16-lane vectors for AVX-512 (`Wide`), and
//! plainly for other CPUs (`Plain`).

/// How a multiply-add and eight exponentials are computed: fused and in AVX2 registers
/// (`Fused`, used only under [`has_avx2_fma`]), else a product and a sum and lane by lane
/// (a software `fmaf` would be far slower).
pub(crate) trait MulAdd {
    /// [`weighted_sums`]' vectors of sums: eight lanes, and sixteen where the form has
    /// registers that wide (else `Sum16` is never used).
    type Sum8: Lanes;
    type Sum16: Lanes;
    /// Whether [`weighted_sums`] takes 16-lane vectors first.
    const WIDE: bool = false;
    /// How many rows (or nodes) [`weighted_sums`] takes together at most: AVX-512's 32
    /// registers hold the sums of twice as many as AVX2's 16.
    const ROW_BLOCK: usize = 4;
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
    /// `x[i] = e^x[i]` as [`exp_lane`] computes it.
    fn exp8(x: &mut [f32; 8]);
    /// [`MulAdd::exp8`] on each whole 8-lane chunk of `x`.
    fn exp_chunks(x: &mut [f32]) {
        for chunk in x.chunks_exact_mut(8) {
            Self::exp8(chunk.try_into().expect("8 lanes"));
        }
    }
    /// `x[i] = exp_lane(x[i])` on each whole 8-lane chunk of `x`, bit for bit: its
    /// products and sums rounded apart, as the scalar form rounds them.
    fn exp_chunks_unfused(x: &mut [f32]) {
        for v in x.chunks_exact_mut(8).flatten() {
            *v = exp_lane(*v);
        }
    }
    /// One chunk of [`kept_max`]: `max[i]` becomes `values[i]` where `keep[i]` is
    /// non-zero and `values[i] > max[i]`.
    fn kept_max8(values: &[f32; 8], keep: &[f32; 8], max: &mut [f32; 8]);
    /// [`kept_max`]: the largest of `values` where `keep` is non-zero (−∞ when none is),
    /// over whole 8-lane chunks. A maximum's value does not depend on the order its
    /// values are met in (a NaN is passed over in every form), so each form may take its
    /// own lanes; only a zero maximum's sign may, which no softmax shows (`v − (±0)` is the
    /// same unless v is −0, and e^(−0) = e^(+0)).
    #[inline(always)]
    fn kept_max(values: &[f32], keep: &[f32]) -> f32 {
        let mut max = [f32::NEG_INFINITY; 8];
        for (v, k) in values.chunks_exact(8).zip(keep.chunks_exact(8)) {
            Self::kept_max8(
                v.try_into().expect("8 lanes"),
                k.try_into().expect("8 lanes"),
                &mut max,
            );
        }
        max.iter()
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
    }
    /// `out[i] = values[i] · factor` for each `i` of `out`.
    #[inline(always)]
    fn scaled_into(values: &[f32], factor: f32, out: &mut [f32]) {
        // Whole 8-lane chunks, then lane by lane (where LLVM would end the loop in masked
        // stores, as `Avx512Lanes::store_first` avoids them).
        let n = out.len();
        let mut chunks = out.chunks_exact_mut(8);
        let mut row = values[..n].chunks_exact(8);
        for (o, v) in (&mut chunks).zip(&mut row) {
            for (o, &v) in o.iter_mut().zip(v) {
                *o = v * factor;
            }
        }
        for (o, &v) in chunks.into_remainder().iter_mut().zip(row.remainder()) {
            *o = v * factor;
        }
    }
    /// [`kept_exp_sum`]: `values[i] = e^(values[i] − max) · keep[i]` in whole 8-lane
    /// chunks; returns their sum.
    #[inline(always)]
    fn kept_exp_sum(values: &mut [f32], max: f32, keep: &[f32]) -> f32 {
        let mut sums = [0.0f32; 8];
        for (v, k) in values.chunks_exact_mut(8).zip(keep.chunks_exact(8)) {
            let v: &mut [f32; 8] = v.try_into().expect("8 lanes");
            for lane in v.iter_mut() {
                *lane -= max;
            }
            Self::exp8(v);
            for lane in 0..8 {
                v[lane] *= k[lane];
                sums[lane] += v[lane];
            }
        }
        sums.iter().sum()
    }
}

pub(crate) struct Fused;
/// [`Fused`] with [`weighted_sums`] in 16-lane vectors, used only under [`has_avx512`].
/// Each output is the same chain of multiply-adds in the same order, so its numbers are
/// [`Fused`]'s, bit for bit.
pub(crate) struct Wide;
pub(crate) struct Plain;

impl MulAdd for Fused {
    #[cfg(target_arch = "x86_64")]
    type Sum8 = Avx2Lanes;
    #[cfg(not(target_arch = "x86_64"))]
    type Sum8 = PlainLanes<8>;
    type Sum16 = PlainLanes<16>;

    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }

    #[inline(always)]
    fn exp8(x: &mut [f32; 8]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Fused` runs only inside the `*_avx2` functions, which run only where
        // the CPU has AVX2 and FMA.
        unsafe {
            exp8_avx2(x)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Plain::exp8(x)
    }

    #[inline(always)]
    fn exp_chunks(x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `exp8`.
        unsafe {
            exp_chunks_avx2::<true>(x)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Plain::exp_chunks(x)
    }

    #[inline(always)]
    fn exp_chunks_unfused(x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `exp8`.
        unsafe {
            exp_chunks_avx2::<false>(x)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Plain::exp_chunks_unfused(x)
    }

    #[inline(always)]
    fn kept_max8(values: &[f32; 8], keep: &[f32; 8], max: &mut [f32; 8]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `exp8`.
        unsafe {
            kept_max8_avx2(values, keep, max)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Plain::kept_max8(values, keep, max)
    }

    #[inline(always)]
    fn kept_exp_sum(values: &mut [f32], max: f32, keep: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `exp8`.
        unsafe {
            kept_exp_sum_avx2(values, max, keep)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Plain::kept_exp_sum(values, max, keep)
    }

    #[inline(always)]
    fn scaled_into(values: &[f32], factor: f32, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `exp8`.
        unsafe {
            scaled_into_avx2(values, factor, out, 0)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Plain::scaled_into(values, factor, out)
    }
}

impl MulAdd for Wide {
    type Sum8 = <Fused as MulAdd>::Sum8;
    #[cfg(target_arch = "x86_64")]
    type Sum16 = Avx512Lanes;
    #[cfg(not(target_arch = "x86_64"))]
    type Sum16 = PlainLanes<16>;
    const WIDE: bool = true;
    const ROW_BLOCK: usize = 8;

    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        Fused::mul_add(a, b, c)
    }

    #[inline(always)]
    fn exp8(x: &mut [f32; 8]) {
        Fused::exp8(x)
    }

    #[inline(always)]
    fn exp_chunks(x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `kept_exp_sum`.
        unsafe {
            exp_chunks_avx512(x)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Fused::exp_chunks(x)
    }

    #[inline(always)]
    fn exp_chunks_unfused(x: &mut [f32]) {
        Fused::exp_chunks_unfused(x)
    }

    #[inline(always)]
    fn kept_max8(values: &[f32; 8], keep: &[f32; 8], max: &mut [f32; 8]) {
        Fused::kept_max8(values, keep, max)
    }

    #[inline(always)]
    fn kept_max(values: &[f32], keep: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `kept_exp_sum`.
        unsafe {
            kept_max_avx512(values, keep)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Fused::kept_max(values, keep)
    }

    #[inline(always)]
    fn scaled_into(values: &[f32], factor: f32, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `kept_exp_sum`.
        unsafe {
            scaled_into_avx512(values, factor, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Fused::scaled_into(values, factor, out)
    }

    #[inline(always)]
    fn kept_exp_sum(values: &mut [f32], max: f32, keep: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Wide` runs only inside the `*_avx512` functions, which run only where
        // the CPU has AVX-512 F and VL, AVX2 and FMA.
        unsafe {
            kept_exp_sum_avx512(values, max, keep)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Fused::kept_exp_sum(values, max, keep)
    }
}

impl MulAdd for Plain {
    type Sum8 = PlainLanes<8>;
    type Sum16 = PlainLanes<16>;

    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }

    #[inline(always)]
    fn exp8(x: &mut [f32; 8]) {
        for v in x.iter_mut() {
            *v = exp_lane(*v);
        }
    }

    #[inline(always)]
    fn kept_max8(values: &[f32; 8], keep: &[f32; 8], max: &mut [f32; 8]) {
        for lane in 0..8 {
            // Compares and selects, not `f32::max` and its NaN rule (a NaN shows anyway).
            let candidate = if keep[lane] != 0.0 {
                values[lane]
            } else {
                f32::NEG_INFINITY
            };
            max[lane] = if candidate > max[lane] {
                candidate
            } else {
                max[lane]
            };
        }
    }
}

/// A vector of running sums of `LANES` lanes, each updated by `x · c + sum`.
pub(crate) trait Lanes: Copy {
    const LANES: usize;
    fn zero() -> Self;
    /// # Safety
    /// `at..at + LANES` must be readable.
    unsafe fn load(at: *const f32) -> Self;
    /// `self · c + sum` in every lane.
    fn mul_add(self, c: f32, sum: Self) -> Self;
    /// Writes the lanes to `out[..LANES]`.
    fn store(self, out: &mut [f32]);
    /// Lanes `..count` from `at`, zeros beyond (`count ≤ LANES`).
    ///
    /// # Safety
    /// `at..at + count` must be readable.
    unsafe fn load_first(at: *const f32, count: usize) -> Self;
    /// Writes lanes `..count` to `out[..count]` (`count ≤ LANES`).
    fn store_first(self, out: &mut [f32], count: usize);
}

/// Lanes in an array, multiplied and added apart (the [`Plain`] form).
#[derive(Clone, Copy)]
pub(crate) struct PlainLanes<const L: usize>([f32; L]);

impl<const L: usize> Lanes for PlainLanes<L> {
    const LANES: usize = L;

    #[inline(always)]
    fn zero() -> Self {
        Self([0.0; L])
    }

    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the caller guarantees `at..at + L` is readable.
        Self(std::array::from_fn(|lane| unsafe { *at.add(lane) }))
    }

    #[inline(always)]
    fn mul_add(self, c: f32, sum: Self) -> Self {
        Self(std::array::from_fn(|lane| self.0[lane] * c + sum.0[lane]))
    }

    #[inline(always)]
    fn store(self, out: &mut [f32]) {
        out[..L].copy_from_slice(&self.0);
    }

    #[inline(always)]
    unsafe fn load_first(at: *const f32, count: usize) -> Self {
        // SAFETY: the caller guarantees `at..at + count` is readable.
        Self(std::array::from_fn(|lane| {
            if lane < count {
                unsafe { *at.add(lane) }
            } else {
                0.0
            }
        }))
    }

    #[inline(always)]
    fn store_first(self, out: &mut [f32], count: usize) {
        out[..count].copy_from_slice(&self.0[..count]);
    }
}

/// Eight lanes in an AVX2 register, with fused multiply-adds: written with intrinsics, as
/// arrays of eight `f32`s at eight rows a block LLVM no longer kept in registers.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Avx2Lanes(std::arch::x86_64::__m256);

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2Lanes {
    const LANES: usize = 8;

    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: AVX (below AVX2) is there wherever `Fused` or `Wide` runs.
        Self(unsafe { std::arch::x86_64::_mm256_setzero_ps() })
    }

    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the caller guarantees the 8 floats; AVX as above.
        Self(unsafe { std::arch::x86_64::_mm256_loadu_ps(at) })
    }

    #[inline(always)]
    fn mul_add(self, c: f32, sum: Self) -> Self {
        // SAFETY: `Avx2Lanes` is used only by `Fused` and `Wide`, which run only where
        // the CPU has AVX2 and FMA.
        Self(unsafe { mul_add8_avx2(self.0, c, sum.0) })
    }

    #[inline(always)]
    fn store(self, out: &mut [f32]) {
        let out = &mut out[..8];
        // SAFETY: `out` holds the 8 floats; AVX as above.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), self.0) }
    }

    #[inline(always)]
    unsafe fn load_first(at: *const f32, count: usize) -> Self {
        let mut lanes = [0.0f32; 8];
        // SAFETY: the caller guarantees `at..at + count` is readable, and count ≤ 8.
        unsafe { std::ptr::copy_nonoverlapping(at, lanes.as_mut_ptr(), count) };
        // SAFETY: `lanes` holds the 8 floats.
        unsafe { Self::load(lanes.as_ptr()) }
    }

    #[inline(always)]
    fn store_first(self, out: &mut [f32], count: usize) {
        let mut lanes = [0.0f32; 8];
        self.store(&mut lanes);
        out[..count].copy_from_slice(&lanes[..count]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn mul_add8_avx2(
    x: std::arch::x86_64::__m256,
    c: f32,
    sum: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_fmadd_ps(x, _mm256_set1_ps(c), sum)
}

/// Sixteen lanes in an AVX-512 register, with fused multiply-adds: each lane is the same
/// operation as [`Avx2Lanes`]', so the numbers are the same.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Avx512Lanes(std::arch::x86_64::__m512);

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512Lanes {
    const LANES: usize = 16;

    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: `Avx512Lanes` is used only by `Wide`, which runs only where the CPU has
        // AVX-512 F and VL.
        Self(unsafe { zero16_avx512() })
    }

    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the caller guarantees the 16 floats; AVX-512 as above.
        Self(unsafe { load16_avx512(at) })
    }

    #[inline(always)]
    fn mul_add(self, c: f32, sum: Self) -> Self {
        // SAFETY: AVX-512 as above.
        Self(unsafe { mul_add16_avx512(self.0, c, sum.0) })
    }

    #[inline(always)]
    fn store(self, out: &mut [f32]) {
        let out = &mut out[..16];
        // SAFETY: `out` holds the 16 floats; AVX-512 as above.
        unsafe { store16_avx512(out.as_mut_ptr(), self.0) }
    }

    #[inline(always)]
    unsafe fn load_first(at: *const f32, count: usize) -> Self {
        if count == 8 {
            // SAFETY: the caller guarantees the 8 floats; AVX-512 as above.
            return Self(unsafe { load16_first8_avx512(at) });
        }
        // SAFETY: lanes past `count` are masked off, so neither read nor a fault; AVX-512
        // as above.
        Self(unsafe { load16_first_avx512(at, first_lanes(count)) })
    }

    #[inline(always)]
    fn store_first(self, out: &mut [f32], count: usize) {
        let out = &mut out[..count];
        // Eight lanes (any padded width's tail) by a plain 8-lane store, and loaded by a
        // plain 8-lane load: in the decoder step's kernel (one thread, POMO-sized) the
        // backward pass took 0.58–0.60 ms against 0.63–0.64 ms with masks, the
        // forward 0.56 against 0.52–0.54 ms.
        if count == 8 {
            // SAFETY: `out` holds the 8 floats; AVX-512 as above.
            return unsafe { store16_first8_avx512(out.as_mut_ptr(), self.0) };
        }
        // SAFETY: `out` holds the `count` floats written; AVX-512 as above.
        unsafe { store16_first_avx512(out.as_mut_ptr(), first_lanes(count), self.0) }
    }
}

/// # Safety
/// `at..at + 8` must be readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16_first8_avx512(at: *const f32) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the 8 floats.
    _mm512_zextps256_ps512(unsafe { _mm256_loadu_ps(at) })
}

/// # Safety
/// `at..at + 8` must be writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store16_first8_avx512(at: *mut f32, x: std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the 8 floats.
    unsafe { _mm256_storeu_ps(at, _mm512_castps512_ps256(x)) }
}

/// The mask of lanes `..count` of 16.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn first_lanes(count: usize) -> u16 {
    (((1u32 << count) - 1) & 0xFFFF) as u16
}

/// # Safety
/// The lanes of `mask` from `at` must be readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16_first_avx512(at: *const f32, mask: u16) -> std::arch::x86_64::__m512 {
    // SAFETY: the caller guarantees the masked lanes.
    unsafe { std::arch::x86_64::_mm512_maskz_loadu_ps(mask, at) }
}

/// # Safety
/// The lanes of `mask` from `at` must be writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store16_first_avx512(at: *mut f32, mask: u16, x: std::arch::x86_64::__m512) {
    // SAFETY: the caller guarantees the masked lanes.
    unsafe { std::arch::x86_64::_mm512_mask_storeu_ps(at, mask, x) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn zero16_avx512() -> std::arch::x86_64::__m512 {
    std::arch::x86_64::_mm512_setzero_ps()
}

/// # Safety
/// `at..at + 16` must be readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16_avx512(at: *const f32) -> std::arch::x86_64::__m512 {
    // SAFETY: the caller guarantees the 16 floats.
    unsafe { std::arch::x86_64::_mm512_loadu_ps(at) }
}

/// # Safety
/// `at..at + 16` must be writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store16_avx512(at: *mut f32, x: std::arch::x86_64::__m512) {
    // SAFETY: the caller guarantees the 16 floats.
    unsafe { std::arch::x86_64::_mm512_storeu_ps(at, x) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn mul_add16_avx512(
    x: std::arch::x86_64::__m512,
    c: f32,
    sum: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    _mm512_fmadd_ps(x, _mm512_set1_ps(c), sum)
}

/// Rows of one instance (and, for its key gradients, nodes) taken together, at most: see
/// [`MulAdd::ROW_BLOCK`]. They read the same keys, so each key vector loaded serves all of
/// them, and their sums are independent chains: a row alone keeps only two or three
/// vectors of sums in flight, and each multiply-add waits on the one before it.
pub(crate) const MAX_ROW_BLOCK: usize = 8;

/// How many of the `left` rows (or nodes) the form `M` takes next: its
/// [`MulAdd::ROW_BLOCK`], 4, 2 or 1.
#[inline(always)]
pub(crate) fn rows_in_block<M: MulAdd>(left: usize) -> usize {
    match left {
        left if left >= M::ROW_BLOCK => M::ROW_BLOCK,
        left if left >= 4 => 4,
        left if left >= 2 => 2,
        _ => 1,
    }
}

/// Where a weighted sum over several rows reads its coefficients and writes its outputs:
/// row r's k-th coefficient is `coefs[r·coef_stride + k·coef_step]` (k < count), its
/// output `out[r·out_stride ..][..width]`. A `coef_step` other than 1 reads coefficients
/// where another loop left them (a column of a row-major table) instead of from a
/// transposed copy.
#[derive(Clone, Copy)]
pub(crate) struct RowsAt {
    pub(crate) coef_stride: usize,
    pub(crate) coef_step: usize,
    pub(crate) count: usize,
    pub(crate) out_stride: usize,
}

impl RowsAt {
    /// Row r's coefficients `coefs[r·coef_stride ..][..count]`, one after another.
    pub(crate) fn contiguous(coef_stride: usize, count: usize, out_stride: usize) -> Self {
        Self {
            coef_stride,
            coef_step: 1,
            count,
            out_stride,
        }
    }

    /// Where row r's k-th coefficient is.
    #[inline(always)]
    fn coef(&self, r: usize, k: usize) -> usize {
        r * self.coef_stride + k * self.coef_step
    }
}

/// `R` rows' weighted sums over the same `rows`: row r's `out[..width] = Σ_k c(r, k) ·
/// rows[k·stride ..][..width]`, with c(r, k) where `at` says. Each output is summed in k
/// order whatever `R` is, so blocking rows, or the vectors' width, changes no result. The
/// sums stay in registers: four vectors of a single row at a time, three of 2 rows, and
/// in 16-lane vectors three of 4 rows and two of 8; in 8-lane vectors two of 4 rows
/// (AVX2's 16 registers: 4 × 3 sums, 3 keys and a coefficient would fill all of them, and
/// LLVM kept one sum on the stack, a store and a load between every multiply-add of its
/// chain: the step's products ran at half speed; 8 chains keep two FMA units busy).
/// Under [`Wide`] every lane is in 16-lane vectors, the last one partial (masked loads
/// and stores); otherwise in 8-lane vectors, and lanes past a multiple of 8 one by one.
/// Dense: a branch per coefficient on the mask's pattern cost more than the multiply-adds
/// it saved; where whole nodes are closed to every row of a block, [`weighted_sums_of`]
/// leaves them out by a list (adding `x · 0` leaves a sum exactly as it was).
#[inline(always)]
pub(crate) fn weighted_sums<M: MulAdd, const R: usize>(
    coefs: &[f32],
    rows: &[f32],
    (stride, width): (usize, usize),
    at: RowsAt,
    out: &mut [f32],
) {
    weighted_sums_of::<M, R, _>(coefs, rows, (stride, width), at, Every(at.count), out);
}

/// [`weighted_sums`] over the terms `terms` alone (`at.count` unused): where the others'
/// coefficients are zero, the same sums, with the multiply-adds that add `x · 0` left out.
#[inline(always)]
fn weighted_sums_of<M: MulAdd, const R: usize, T: Terms>(
    coefs: &[f32],
    rows: &[f32],
    (stride, width): (usize, usize),
    at: RowsAt,
    terms: T,
    out: &mut [f32],
) {
    let sw = (stride, width);
    if M::WIDE {
        // Every lane in 16-lane vectors, the last one partial: a masked load costs what a
        // whole one does, where an 8-lane loop after the 16-lane one had half the sums in
        // flight.
        weighted_vectors::<M::Sum16, R, true, T>(coefs, rows, sw, (at, terms), out);
        return;
    }
    let start = weighted_vectors::<M::Sum8, R, false, T>(coefs, rows, sw, (at, terms), out);
    for r in 0..R {
        for lane in start..width {
            out[r * at.out_stride + lane] = terms.iter().fold(0.0, |acc, k| {
                M::mul_add(rows[k * stride + lane], coefs[at.coef(r, k)], acc)
            });
        }
    }
}

/// [`weighted_sums`] over the `LANES`-lane vectors of lanes `..width`, in blocks: whole
/// vectors only, or (`PARTIAL`) with the last one partial too; returns where they end.
#[inline(always)]
fn weighted_vectors<V: Lanes, const R: usize, const PARTIAL: bool, T: Terms>(
    coefs: &[f32],
    rows: &[f32],
    (stride, width): (usize, usize),
    at: (RowsAt, T),
    out: &mut [f32],
) -> usize {
    let vectors = if PARTIAL {
        width.div_ceil(V::LANES)
    } else {
        width / V::LANES
    };
    // A row alone has the registers for four vectors of sums at a time, eight rows for two.
    let per_block = match R {
        1 => 4,
        8 => 2,
        4 if V::LANES == 8 => 2,
        _ => 3,
    };
    let mut start = 0;
    // The lanes of a block's last vector.
    // (Whole vectors only: a constant, so the loop has no test for a partial load.)
    let last_lanes = |start: usize, vectors: usize| {
        if PARTIAL {
            (width - start - (vectors - 1) * V::LANES).min(V::LANES)
        } else {
            V::LANES
        }
    };
    for _ in 0..vectors / per_block {
        let block = (start, last_lanes(start, per_block));
        match per_block {
            4 => weighted_rows_block::<V, R, 4, T>(coefs, rows, stride, block, at, out),
            3 => weighted_rows_block::<V, R, 3, T>(coefs, rows, stride, block, at, out),
            _ => weighted_rows_block::<V, R, 2, T>(coefs, rows, stride, block, at, out),
        }
        start += V::LANES * per_block;
    }
    let left = vectors % per_block;
    if left > 0 {
        let block = (start, last_lanes(start, left));
        match left {
            3 => weighted_rows_block::<V, R, 3, T>(coefs, rows, stride, block, at, out),
            2 => weighted_rows_block::<V, R, 2, T>(coefs, rows, stride, block, at, out),
            _ => weighted_rows_block::<V, R, 1, T>(coefs, rows, stride, block, at, out),
        }
    }
    if PARTIAL {
        width
    } else {
        vectors * V::LANES
    }
}

/// `B` vectors of lanes from `start` for `R` rows, the last vector's first `last_lanes`
/// only.
#[inline(always)]
fn weighted_rows_block<V: Lanes, const R: usize, const B: usize, T: Terms>(
    coefs: &[f32],
    rows: &[f32],
    stride: usize,
    (start, last_lanes): (usize, usize),
    (at, terms): (RowsAt, T),
    out: &mut [f32],
) {
    let mut acc = [[V::zero(); B]; R];
    let lanes = (B - 1) * V::LANES + last_lanes;
    if let Some(last) = terms.last() {
        // One bounds check each for every key row and coefficient the loop reads (the
        // terms ascend: none is beyond the last).
        assert!(
            last * stride + start + lanes <= rows.len(),
            "rows too short"
        );
        assert!(at.coef(R - 1, last) < coefs.len(), "coefficients too short");
        let first = rows[start..].as_ptr();
        for k in terms.iter() {
            let row = first.wrapping_add(k * stride);
            // A loop, not `array::from_fn`: its closure is a function of its own, which
            // LLVM once left as a call in the AVX-512 backward kernel (a call a term, and
            // every sum of the block stored and reloaded around it).
            let mut x = [V::zero(); B];
            for (b, x) in x.iter_mut().enumerate() {
                // SAFETY: row k starts at rows[k·stride + start] and is read `lanes`
                // floats on, within `rows` by the assertion above.
                *x = unsafe {
                    let at = row.add(b * V::LANES);
                    if b + 1 < B || last_lanes == V::LANES {
                        V::load(at)
                    } else {
                        V::load_first(at, last_lanes)
                    }
                };
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: r < R and k ≤ last: within `coefs` (asserted).
                let c = unsafe { *coefs.get_unchecked(at.coef(r, k)) };
                for (acc, &x) in acc.iter_mut().zip(&x) {
                    *acc = x.mul_add(c, *acc);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (b, acc) in acc.iter().enumerate() {
            let out = &mut out[r * at.out_stride + start + b * V::LANES..];
            if b + 1 < B || last_lanes == V::LANES {
                acc.store(out);
            } else {
                acc.store_first(out, last_lanes);
            }
        }
    }
}

/// Which terms k of a weighted sum are taken, in ascending order.
trait Terms: Copy {
    fn iter(self) -> impl Iterator<Item = usize>;
    /// The largest k, if any.
    fn last(self) -> Option<usize>;
}

/// Every k below a count.
#[derive(Clone, Copy)]
struct Every(usize);

impl Terms for Every {
    #[inline(always)]
    fn iter(self) -> impl Iterator<Item = usize> {
        0..self.0
    }

    #[inline(always)]
    fn last(self) -> Option<usize> {
        self.0.checked_sub(1)
    }
}

/// The listed k, ascending: the nodes some row of a block may choose
/// ([`open_nodes_of_any`], which alone makes them, in order).
#[derive(Clone, Copy)]
pub(crate) struct Listed<'a>(&'a [u32]);

impl Terms for Listed<'_> {
    #[inline(always)]
    fn iter(self) -> impl Iterator<Item = usize> {
        self.0.iter().map(|&k| k as usize)
    }

    #[inline(always)]
    fn last(self) -> Option<usize> {
        self.0.last().map(|&k| k as usize)
    }
}

/// The terms of a block's weighted sums whose coefficients may be non-zero: every one, or
/// a list of them (the nodes some row of a block may choose, or the rows at which some
/// node of a block is open).
#[derive(Clone, Copy)]
pub(crate) enum OpenTerms<'a> {
    Every(usize),
    Listed(Listed<'a>),
}

impl OpenTerms<'_> {
    /// [`weighted_sums`] over these terms (`at.count` unused): the same sums where the
    /// other terms' coefficients are zero.
    #[inline(always)]
    pub(crate) fn weighted_sums<M: MulAdd, const R: usize>(
        self,
        coefs: &[f32],
        rows: &[f32],
        stride_width: (usize, usize),
        at: RowsAt,
        out: &mut [f32],
    ) {
        match self {
            Self::Every(n) => {
                weighted_sums_of::<M, R, _>(coefs, rows, stride_width, at, Every(n), out)
            }
            Self::Listed(l) => weighted_sums_of::<M, R, _>(coefs, rows, stride_width, at, l, out),
        }
    }

    /// [`head_weighted_sums`] over these nodes.
    #[inline(always)]
    pub(crate) fn head_weighted_sums<M: MulAdd>(
        self,
        coefs: &[f32],
        values: &[f32],
        sizes: (usize, usize, usize),
        out: &mut [f32],
    ) {
        match self {
            Self::Every(n) => head_weighted_sums::<M, _>(coefs, values, sizes, Every(n), out),
            Self::Listed(l) => head_weighted_sums::<M, _>(coefs, values, sizes, l, out),
        }
    }
}

/// The nodes at which any of `R` rows of `mask` (`[R, n]`, non-zero = masked) is open:
/// listed in `into` where that leaves out at least an eighth of them, else every node
/// (reading an index per node costs more than the few multiply-adds it would save).
/// Without a branch per node: which nodes are open follows no pattern a branch predictor
/// could learn, and a mispredicted branch per node cost as much as the multiply-adds the
/// list saves.
#[inline(always)]
pub(crate) fn open_nodes_of_any<'a, const R: usize>(
    mask: &[u8],
    n: usize,
    into: &'a mut Vec<u32>,
) -> OpenTerms<'a> {
    if into.len() < n {
        into.resize(n, 0);
    }
    let rows: [&[u8]; R] = std::array::from_fn(|r| &mask[r * n..(r + 1) * n]);
    let mut count = 0;
    for k in 0..n {
        into[count] = k as u32;
        let masked_in_all = rows
            .iter()
            .fold(1u8, |all, row| all & u8::from(row[k] != 0));
        count += usize::from(masked_in_all == 0);
    }
    if 8 * count > 7 * n {
        OpenTerms::Every(n)
    } else {
        OpenTerms::Listed(Listed(&into[..count]))
    }
}

/// The rows at which any of the `R` nodes from `first` is open, by their place k in `rows`
/// (row `at + rows[k]` of `mask`, `[·, n]`, non-zero = masked): listed in `into` where
/// that leaves out at least an eighth of them, else every k. A block of nodes' gradients
/// summed over the rows takes these: at the others, every coefficient of the block is zero
/// (as [`open_nodes_of_any`]'s nodes for a block of rows). Without a branch per row, for
/// the same reason.
#[inline(always)]
pub(crate) fn rows_open_at_any<'a, const R: usize>(
    mask: &[u8],
    (n, first): (usize, usize),
    (at, rows): (usize, &[usize]),
    into: &'a mut Vec<u32>,
) -> OpenTerms<'a> {
    if into.len() < rows.len() {
        into.resize(rows.len(), 0);
    }
    let mut count = 0;
    for (k, &r) in rows.iter().enumerate() {
        into[count] = k as u32;
        let nodes = &mask[(at + r) * n + first..][..R];
        let masked_at_all = nodes.iter().fold(1u8, |all, &m| all & u8::from(m != 0));
        count += usize::from(masked_at_all == 0);
    }
    if 8 * count > 7 * rows.len() {
        OpenTerms::Every(rows.len())
    } else {
        OpenTerms::Listed(Listed(&into[..count]))
    }
}

/// [`weighted_sums`] for `outputs` consecutive outputs, [`MulAdd::ROW_BLOCK`] at a time: output
/// r's coefficients are `coefs[r·coef_stride ..][..count]`, its sums
/// `out[r·out_stride ..][..width]`.
#[inline(always)]
pub(crate) fn weighted_sums_all<M: MulAdd>(
    outputs: usize,
    coefs: &[f32],
    rows: &[f32],
    stride_width: (usize, usize),
    at: RowsAt,
    out: &mut [f32],
) {
    let mut r = 0;
    while r < outputs {
        let count = rows_in_block::<M>(outputs - r);
        let coefs = &coefs[r * at.coef_stride..];
        let out = &mut out[r * at.out_stride..];
        match count {
            8 => weighted_sums::<M, 8>(coefs, rows, stride_width, at, out),
            4 => weighted_sums::<M, 4>(coefs, rows, stride_width, at, out),
            2 => weighted_sums::<M, 2>(coefs, rows, stride_width, at, out),
            _ => weighted_sums::<M, 1>(coefs, rows, stride_width, at, out),
        }
        r += count;
    }
}

/// Heads taken together by [`head_weighted_sums`]: four heads of two vectors of sums fill
/// eight of AVX2's sixteen registers, with the coefficient and a value vector beside them.
const HEAD_BLOCK: usize = 4;

/// Whether [`head_weighted_sums`] takes heads of `head_dim` features: whole vectors, at
/// most two of them.
pub(crate) fn heads_fit(head_dim: usize) -> bool {
    head_dim.is_multiple_of(8) && head_dim <= 16
}

/// One row's weighted values for every head: `out[h·dk ..][..dk] = Σ_n coefs[h·N + n] ·
/// values[n·H·dk + h·dk ..][..dk]` over the nodes `terms`, where `coefs` is `[H, N]` and
/// `values` `[N, H, dk]`. The heads' sums are independent chains, so [`HEAD_BLOCK`] heads
/// go through the nodes together; each output is still summed in node order, as
/// [`weighted_sums`] sums it. Call it only where [`heads_fit`] holds.
#[inline(always)]
fn head_weighted_sums<M: MulAdd, T: Terms>(
    coefs: &[f32],
    values: &[f32],
    (nodes, heads, head_dim): (usize, usize, usize),
    terms: T,
    out: &mut [f32],
) {
    let mut head = 0;
    while head < heads {
        let at = (head, nodes, heads * head_dim, terms);
        match ((heads - head).min(HEAD_BLOCK), head_dim / 8) {
            (4, 2) => heads_block::<M, 4, 2, T>(coefs, values, at, out),
            (4, _) => heads_block::<M, 4, 1, T>(coefs, values, at, out),
            (3, 2) => heads_block::<M, 3, 2, T>(coefs, values, at, out),
            (3, _) => heads_block::<M, 3, 1, T>(coefs, values, at, out),
            (2, 2) => heads_block::<M, 2, 2, T>(coefs, values, at, out),
            (2, _) => heads_block::<M, 2, 1, T>(coefs, values, at, out),
            (_, 2) => heads_block::<M, 1, 2, T>(coefs, values, at, out),
            (_, _) => heads_block::<M, 1, 1, T>(coefs, values, at, out),
        }
        head += HEAD_BLOCK;
    }
}

/// [`head_weighted_sums`] for heads `first..first + H` of `V` vectors each, at
/// `(first, nodes, features per node, terms)`.
#[inline(always)]
fn heads_block<M: MulAdd, const H: usize, const V: usize, T: Terms>(
    coefs: &[f32],
    values: &[f32],
    (first, nodes, stride, terms): (usize, usize, usize, T),
    out: &mut [f32],
) {
    let head_dim = 8 * V;
    let mut acc = [[[0.0f32; 8]; V]; H];
    if let Some(last) = terms.last() {
        // One bounds check each for every value row and coefficient the loop reads (the
        // terms ascend: none is beyond the last).
        let start = first * head_dim;
        assert!(
            last * stride + start + H * head_dim <= values.len(),
            "values too short"
        );
        assert!(
            last < nodes && (first + H) * nodes <= coefs.len(),
            "coefficients too short"
        );
        for node in terms.iter() {
            for (h, acc) in acc.iter_mut().enumerate() {
                // SAFETY: (first + h)·nodes + node < (first + H)·nodes (asserted).
                let c = unsafe { *coefs.get_unchecked((first + h) * nodes + node) };
                for (v, acc) in acc.iter_mut().enumerate() {
                    let at = node * stride + start + h * head_dim + v * 8;
                    // SAFETY: at + 8 ≤ last·stride + start + H·head_dim (asserted).
                    let x: [f32; 8] =
                        std::array::from_fn(|lane| unsafe { *values.get_unchecked(at + lane) });
                    for (acc, &x) in acc.iter_mut().zip(&x) {
                        *acc = M::mul_add(x, c, *acc);
                    }
                }
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (v, acc) in acc.iter().enumerate() {
            let at = (first + h) * head_dim + v * 8;
            out[at..at + 8].copy_from_slice(acc);
        }
    }
}

const LOG2_E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Adding 1.5·2²³ rounds to the nearest integer k and leaves k in the low mantissa bits.
const ROUND: f32 = 12_582_912.0;
const ROUND_BITS: i32 = 0x4B40_0000;
/// e^r's Taylor coefficients, 1/7! first.
const EXP_TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// e^x for f32 without a libm call (glibc's `expf` is a call per element, and
/// exponentials were half of the forward pass): x = k·ln 2 + r with |r| ≤ ln 2 / 2, e^r by
/// its Taylor polynomial to degree 7 (truncation below 1e-8 relative), 2^k from the
/// exponent bits. Arguments below −87 (−∞ included) give ~1e-38, not 0: callers that need
/// exact zeros (masked nodes) set them.
#[inline(always)]
pub(crate) fn exp_lane(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + ROUND;
    let k_int = shifted.to_bits() as i32 - ROUND_BITS;
    let k = shifted - ROUND;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let p = EXP_TAYLOR[1..]
        .iter()
        .fold(EXP_TAYLOR[0], |p, &c| p * r + c);
    p * f32::from_bits(((k_int + 127) << 23) as u32)
}

/// [`Plain::kept_max8`] in AVX2 registers (LLVM kept the scalar form's lanes apart, at ~6
/// instructions a lane): `max_ps(a, b)` is `a > b ? a : b`, NaN and signed zeros included,
/// so every lane gets the scalar form's value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn kept_max8_avx2(values: &[f32; 8], keep: &[f32; 8], max: &mut [f32; 8]) {
    use std::arch::x86_64::*;
    // SAFETY: each load and the store touch exactly one of the three 8-float arrays.
    let (v, k, m) = unsafe {
        (
            _mm256_loadu_ps(values.as_ptr()),
            _mm256_loadu_ps(keep.as_ptr()),
            _mm256_loadu_ps(max.as_ptr()),
        )
    };
    // `keep != 0.0` is true for NaN too: unordered not-equal.
    let kept = _mm256_cmp_ps::<_CMP_NEQ_UQ>(k, _mm256_setzero_ps());
    let candidate = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), v, kept);
    // SAFETY: as above.
    unsafe { _mm256_storeu_ps(max.as_mut_ptr(), _mm256_max_ps(candidate, m)) };
}

/// The groups `(first chunk, chunks)` in which the AVX2 exponentials take `chunks` 8-lane
/// chunks, in order: fours, the last group taking the one to three left over with it
/// (five to seven), so no chunk runs alone unless there are fewer than four. One
/// register's exponential is a chain of ~14 dependent operations; a chunk alone after the
/// fours waited on its own chain (on a 2-core Zen 1, a row's masked softmax at n = 50
/// took ~50% longer as 4 + 1 + 1 + 1 chunks than as 7 at once).
#[cfg(target_arch = "x86_64")]
fn chunk_groups(chunks: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut first = 0;
    std::iter::from_fn(move || {
        let left = chunks - first;
        let size = if left >= 8 || left == 4 { 4 } else { left };
        (size > 0).then(|| {
            first += size;
            (first - size, size)
        })
    })
}

/// `$body` with the const `$k` bound to `$size`, one of [`chunk_groups`]' sizes (1 to 7).
#[cfg(target_arch = "x86_64")]
macro_rules! with_group_size {
    ($size:expr, $k:ident => $body:expr) => {
        with_group_size!(@ $size, $k, $body, 1 2 3 4 5 6 7)
    };
    (@ $size:expr, $k:ident, $body:expr, $($n:literal)*) => {
        match $size {
            $($n => {
                const $k: usize = $n;
                $body
            })*
            size => unreachable!("chunk_groups' sizes are 1 to 7, not {size}"),
        }
    };
}

/// [`MulAdd::kept_exp_sum`] in AVX2 registers, the same operations lane by lane. Written
/// out because LLVM compiled the generic form's products and sums lane by lane through
/// memory in some callers (a third of the forward kernel's time), depending on what was
/// inlined around it. The chunks in [`chunk_groups`], each group's exponentials side by
/// side ([`exp_avx2`]), each chunk's added to the sums in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn kept_exp_sum_avx2(values: &mut [f32], max: f32, keep: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut sums = _mm256_setzero_ps();
    for (c, k) in chunk_groups(values.len().min(keep.len()) / 8) {
        let (v, kept) = (&mut values[8 * c..8 * (c + k)], &keep[8 * c..8 * (c + k)]);
        sums = with_group_size!(k, K => kept_exp_add::<K>(v, kept, max, sums));
    }
    lane_sum(sums)
}

/// The sum of `sums`' eight lanes, in lane order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn lane_sum(sums: std::arch::x86_64::__m256) -> f32 {
    let mut lanes = [0.0f32; 8];
    // SAFETY: the store touches exactly `lanes`' eight floats.
    unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
    lanes.iter().sum()
}

/// `K` chunks of [`kept_exp_sum_avx2`] (`values` and `keep` hold `8·K` floats): each
/// replaced by `e^(v − max) · keep`, and added to `sums` in order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn kept_exp_add<const K: usize>(
    values: &mut [f32],
    keep: &[f32],
    max: f32,
    mut sums: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    assert!(values.len() == 8 * K && keep.len() == 8 * K);
    let mut x = [_mm256_setzero_ps(); K];
    for (c, x) in x.iter_mut().enumerate() {
        // SAFETY: chunk c's 8 floats are within `values` (asserted above).
        let v = unsafe { _mm256_loadu_ps(values.as_ptr().add(8 * c)) };
        *x = _mm256_sub_ps(v, _mm256_set1_ps(max));
    }
    let e = exp_avx2::<true, K>(x);
    for (c, e) in e.iter().enumerate() {
        // SAFETY: as above, for `keep` and `values`.
        unsafe {
            let kept = _mm256_mul_ps(*e, _mm256_loadu_ps(keep.as_ptr().add(8 * c)));
            _mm256_storeu_ps(values.as_mut_ptr().add(8 * c), kept);
            sums = _mm256_add_ps(sums, kept);
        }
    }
    sums
}

/// [`kept_exp_sum_avx2`] with two chunks to each 16-lane AVX-512 register: each lane's
/// operations are the same, and each chunk's half of a register is added to the 8-lane
/// sums in chunk order, so the values and the sum are the AVX2 form's bit for bit. The
/// softmaxes' exponentials were ~8% of a POMO CVRP100 step on a 2-core AVX-512 Xeon (the
/// step took 0.20 s longer with them computed twice); in 8-lane registers they used half
/// of each 16-lane unit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn kept_exp_sum_avx512(values: &mut [f32], max: f32, keep: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let chunks = values.len().min(keep.len()) / 8;
    let mut sums = _mm256_setzero_ps();
    for (c, k) in chunk_groups(chunks / 2) {
        let (v, kept) = (
            &mut values[16 * c..16 * (c + k)],
            &keep[16 * c..16 * (c + k)],
        );
        sums = with_group_size!(k, K => kept_exp_add16::<K>(v, kept, max, sums));
    }
    if chunks % 2 == 1 {
        let last = 8 * (chunks - 1)..8 * chunks;
        let (v, kept) = (&mut values[last.clone()], &keep[last]);
        sums = kept_exp_add::<1>(v, kept, max, sums);
    }
    lane_sum(sums)
}

/// `K` pairs of chunks of [`kept_exp_sum_avx512`] (`values` and `keep` hold `16·K`
/// floats): each replaced by `e^(v − max) · keep`, its low chunk then its high chunk added
/// to `sums`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn kept_exp_add16<const K: usize>(
    values: &mut [f32],
    keep: &[f32],
    max: f32,
    mut sums: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    assert!(values.len() == 16 * K && keep.len() == 16 * K);
    let mut x = [_mm512_setzero_ps(); K];
    for (c, x) in x.iter_mut().enumerate() {
        // SAFETY: pair c's 16 floats are within `values` (asserted above).
        let v = unsafe { _mm512_loadu_ps(values.as_ptr().add(16 * c)) };
        *x = _mm512_sub_ps(v, _mm512_set1_ps(max));
    }
    let e = exp_avx512::<K>(x);
    for (c, e) in e.iter().enumerate() {
        // SAFETY: as above, for `keep` and `values`.
        let kept = unsafe {
            let kept = _mm512_mul_ps(*e, _mm512_loadu_ps(keep.as_ptr().add(16 * c)));
            _mm512_storeu_ps(values.as_mut_ptr().add(16 * c), kept);
            kept
        };
        let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(kept));
        sums = _mm256_add_ps(sums, _mm512_castps512_ps256(kept));
        sums = _mm256_add_ps(sums, _mm256_castpd_ps(high));
    }
    sums
}

/// [`exp_avx2`]'s fused form on `K` 16-lane registers: the same operations lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn exp_avx512<const K: usize>(v: [std::arch::x86_64::__m512; K]) -> [std::arch::x86_64::__m512; K] {
    use std::arch::x86_64::*;
    let (mut k, mut k_int, mut r) = ([_mm512_setzero_ps(); K], [_mm512_setzero_si512(); K], v);
    for c in 0..K {
        // As in `exp_avx2`: a NaN argument stays NaN.
        let v = _mm512_min_ps(
            _mm512_set1_ps(88.0),
            _mm512_max_ps(_mm512_set1_ps(-87.0), v[c]),
        );
        let shifted = _mm512_fmadd_ps(v, _mm512_set1_ps(LOG2_E), _mm512_set1_ps(ROUND));
        k_int[c] = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(ROUND_BITS));
        k[c] = _mm512_sub_ps(shifted, _mm512_set1_ps(ROUND));
        r[c] = _mm512_fnmadd_ps(k[c], _mm512_set1_ps(LN2_HI), v);
    }
    for c in 0..K {
        r[c] = _mm512_fnmadd_ps(k[c], _mm512_set1_ps(LN2_LO), r[c]);
    }
    let mut p = [_mm512_set1_ps(EXP_TAYLOR[0]); K];
    for coefficient in &EXP_TAYLOR[1..] {
        for c in 0..K {
            p[c] = _mm512_fmadd_ps(p[c], r[c], _mm512_set1_ps(*coefficient));
        }
    }
    for c in 0..K {
        let pow2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(k_int[c], _mm512_set1_epi32(127)));
        p[c] = _mm512_mul_ps(p[c], _mm512_castsi512_ps(pow2));
    }
    p
}

/// [`exp_lane`] on eight lanes in AVX2 registers, with fused multiply-adds (LLVM keeps the
/// scalar form's lanes apart: it was ~13 instructions an element).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp8_avx2(x: &mut [f32; 8]) {
    exp_in_place::<true, 1>(x)
}

/// [`exp8_avx2`] (`FUSED`) or [`exp_lane`]'s unfused form on each whole 8-lane chunk of `x`,
/// in [`chunk_groups`], each group's side by side ([`exp_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp_chunks_avx2<const FUSED: bool>(x: &mut [f32]) {
    for (c, k) in chunk_groups(x.len() / 8) {
        let group = &mut x[8 * c..8 * (c + k)];
        with_group_size!(k, K => exp_in_place::<FUSED, K>(group));
    }
}

/// [`exp_chunks_avx2`]'s fused form with two chunks to each 16-lane AVX-512 register (the
/// last chunk alone when their count is odd): the same operations lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn exp_chunks_avx512(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let chunks = x.len() / 8;
    for (c, k) in chunk_groups(chunks / 2) {
        let group = &mut x[16 * c..16 * (c + k)];
        with_group_size!(k, K => {
            let mut v = [_mm512_setzero_ps(); K];
            for (p, v) in v.iter_mut().enumerate() {
                // SAFETY: pair p's 16 floats are within `group` (16·K floats).
                *v = unsafe { _mm512_loadu_ps(group.as_ptr().add(16 * p)) };
            }
            for (p, e) in exp_avx512::<K>(v).iter().enumerate() {
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(group.as_mut_ptr().add(16 * p), *e) };
            }
        });
    }
    if chunks % 2 == 1 {
        exp_in_place::<true, 1>(&mut x[8 * (chunks - 1)..8 * chunks]);
    }
}

/// `K` chunks (`x` holds `8·K` floats) of [`exp_chunks_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp_in_place<const FUSED: bool, const K: usize>(x: &mut [f32]) {
    use std::arch::x86_64::*;
    assert!(x.len() == 8 * K);
    let mut v = [_mm256_setzero_ps(); K];
    for (c, v) in v.iter_mut().enumerate() {
        // SAFETY: chunk c's eight floats are within `x` (asserted above).
        *v = unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * c)) };
    }
    let e = exp_avx2::<FUSED, K>(v);
    for (c, e) in e.iter().enumerate() {
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(x.as_mut_ptr().add(8 * c), *e) };
    }
}

/// [`exp8_avx2`] (`FUSED`) or [`exp_lane`]'s unfused form on `K` registers, step by step
/// across them: one register's exponential is a chain of ~14 dependent operations, and
/// `K` chains side by side give the core independent work at every step (on a 2-core
/// Zen 1, four took ~20% fewer samples than one in a POMO CVRP100 step's exponentials).
/// Each lane gets the same operations in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp_avx2<const FUSED: bool, const K: usize>(
    v: [std::arch::x86_64::__m256; K],
) -> [std::arch::x86_64::__m256; K] {
    use std::arch::x86_64::*;
    let (mut k, mut k_int, mut r) = ([_mm256_setzero_ps(); K], [_mm256_setzero_si256(); K], v);
    for c in 0..K {
        // max(lo, v) and min(hi, ·) return their second operand when it is NaN: NaN stays.
        let v = _mm256_min_ps(
            _mm256_set1_ps(88.0),
            _mm256_max_ps(_mm256_set1_ps(-87.0), v[c]),
        );
        let shifted = mul_add_avx2::<FUSED>(v, _mm256_set1_ps(LOG2_E), _mm256_set1_ps(ROUND));
        k_int[c] = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(ROUND_BITS));
        k[c] = _mm256_sub_ps(shifted, _mm256_set1_ps(ROUND));
        r[c] = sub_mul_avx2::<FUSED>(k[c], _mm256_set1_ps(LN2_HI), v);
    }
    for c in 0..K {
        r[c] = sub_mul_avx2::<FUSED>(k[c], _mm256_set1_ps(LN2_LO), r[c]);
    }
    let mut p = [_mm256_set1_ps(EXP_TAYLOR[0]); K];
    for coefficient in &EXP_TAYLOR[1..] {
        for c in 0..K {
            p[c] = mul_add_avx2::<FUSED>(p[c], r[c], _mm256_set1_ps(*coefficient));
        }
    }
    for c in 0..K {
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(k_int[c], _mm256_set1_epi32(127)));
        p[c] = _mm256_mul_ps(p[c], _mm256_castsi256_ps(pow2));
    }
    p
}

/// `a·b + c`, fused or rounded apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn mul_add_avx2<const FUSED: bool>(
    a: std::arch::x86_64::__m256,
    b: std::arch::x86_64::__m256,
    c: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if FUSED {
        _mm256_fmadd_ps(a, b, c)
    } else {
        _mm256_add_ps(_mm256_mul_ps(a, b), c)
    }
}

/// `c − a·b`, fused or rounded apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn sub_mul_avx2<const FUSED: bool>(
    a: std::arch::x86_64::__m256,
    b: std::arch::x86_64::__m256,
    c: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if FUSED {
        _mm256_fnmadd_ps(a, b, c)
    } else {
        _mm256_sub_ps(c, _mm256_mul_ps(a, b))
    }
}

/// The largest of `values` where `keep` is non-zero (−∞ when none is), over whole 8-lane
/// chunks.
#[inline(always)]
pub(crate) fn kept_max<M: MulAdd>(values: &[f32], keep: &[f32]) -> f32 {
    M::kept_max(values, keep)
}

/// [`MulAdd::kept_max`] in 16-lane AVX-512 registers: two chunks a register (the last
/// chunk alone in the low half when their count is odd), each lane's running maximum
/// kept as [`kept_max8_avx2`] keeps it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn kept_max_avx512(values: &[f32], keep: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let chunks = values.len().min(keep.len()) / 8;
    let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
    for pair in 0..chunks.div_ceil(2) {
        let lanes: __mmask16 = if 2 * pair + 1 < chunks {
            0xFFFF
        } else {
            0x00FF
        };
        // SAFETY: the masked lanes are within the whole chunks of `values` and `keep`.
        let (v, k) = unsafe {
            (
                _mm512_maskz_loadu_ps(lanes, values.as_ptr().add(16 * pair)),
                _mm512_maskz_loadu_ps(lanes, keep.as_ptr().add(16 * pair)),
            )
        };
        // `keep != 0.0` is true for NaN too: unordered not-equal.
        let kept = _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(lanes, k, _mm512_setzero_ps());
        let candidate = _mm512_mask_blend_ps(kept, _mm512_set1_ps(f32::NEG_INFINITY), v);
        max = _mm512_max_ps(candidate, max);
    }
    // Halves against halves: no lane holds NaN (`max_ps` returns its second operand, the
    // running maximum, when the candidate is NaN), so the order changes no value.
    let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(max));
    let eight = _mm256_max_ps(_mm512_castps512_ps256(max), _mm256_castpd_ps(high));
    let four = _mm_max_ps(
        _mm256_castps256_ps128(eight),
        _mm256_extractf128_ps::<1>(eight),
    );
    let two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    let one = _mm_max_ss(two, _mm_shuffle_ps::<0b01>(two, two));
    _mm_cvtss_f32(one)
}

/// [`MulAdd::scaled_into`] in 16-lane AVX-512 registers, the last few lanes in an 8-lane
/// register and one by one (no masked stores).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn scaled_into_avx512(values: &[f32], factor: f32, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    assert!(values.len() >= n);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: lanes i..i + 16 are within `values` and `out` (n ≤ values.len()).
        unsafe {
            let v = _mm512_loadu_ps(values.as_ptr().add(i));
            _mm512_storeu_ps(
                out.as_mut_ptr().add(i),
                _mm512_mul_ps(v, _mm512_set1_ps(factor)),
            );
        }
        i += 16;
    }
    scaled_into_avx2(values, factor, out, i);
}

/// [`MulAdd::scaled_into`] from lane `from` on, in 8-lane AVX2 registers, the last few
/// lanes one by one. LLVM vectorised the generic loop 64 lanes at a time and left rows
/// shorter than that (every softmax of a CVRP50 step) to scalar products: a tenth of the
/// AVX2 forward kernel's time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn scaled_into_avx2(values: &[f32], factor: f32, out: &mut [f32], from: usize) {
    use std::arch::x86_64::*;
    let n = out.len();
    assert!(values.len() >= n);
    let mut i = from;
    while i + 8 <= n {
        // SAFETY: lanes i..i + 8 are within `values` and `out` (n ≤ values.len()).
        unsafe {
            let v = _mm256_loadu_ps(values.as_ptr().add(i));
            _mm256_storeu_ps(
                out.as_mut_ptr().add(i),
                _mm256_mul_ps(v, _mm256_set1_ps(factor)),
            );
        }
        i += 8;
    }
    for (o, &v) in out[i..].iter_mut().zip(&values[i..n]) {
        *o = v * factor;
    }
}

/// `values[i] = e^(values[i] − max) · keep[i]` in whole 8-lane chunks; returns their sum.
#[inline(always)]
pub(crate) fn kept_exp_sum<M: MulAdd>(values: &mut [f32], max: f32, keep: &[f32]) -> f32 {
    M::kept_exp_sum(values, max, keep)
}

/// Masked softmax in place over padded lanes (`keep`: 1 at nodes that may be chosen, 0 at
/// masked nodes and padding, which get weight exactly 0), max-subtracted as Burn's own
/// `softmax` is.
#[inline(always)]
pub(crate) fn masked_softmax<M: MulAdd>(values: &mut [f32], keep: &[f32]) {
    let max = kept_max::<M>(values, keep);
    let inverse = 1.0 / kept_exp_sum::<M>(values, max, keep);
    // In whole 8-lane chunks: over a slice of unknown length LLVM left the loop scalar.
    for chunk in values.chunks_exact_mut(8) {
        for v in chunk {
            *v *= inverse;
        }
    }
}

/// [`masked_softmax`] of `R` rows of padded lanes (`values` and `keep`: `[R, Np]`), each
/// row's first `n` weights written to `out[r·out_stride ..][..n]`: the same numbers, in
/// three passes over the rows (maxima, then exponentials and sums, then weights), so that
/// each pass's rows are independent chains rather than one row's serial reductions after
/// another.
#[inline(always)]
pub(crate) fn masked_softmax_rows<M: MulAdd, const R: usize>(
    (values, keep): (&mut [f32], &[f32]),
    np: usize,
    out: &mut [f32],
    (n, out_stride): (usize, usize),
) {
    // Loops, not `array::from_fn`: its closure is a function of its own, compiled
    // without the caller's AVX2, into which the AVX2 exponential cannot be inlined.
    let mut max = [0.0f32; R];
    for (r, max) in max.iter_mut().enumerate() {
        *max = kept_max::<M>(&values[r * np..][..np], &keep[r * np..][..np]);
    }
    let mut inverse = [0.0f32; R];
    for (r, inverse) in inverse.iter_mut().enumerate() {
        let row = &mut values[r * np..][..np];
        *inverse = 1.0 / kept_exp_sum::<M>(row, max[r], &keep[r * np..][..np]);
    }
    for (r, inverse) in inverse.iter().enumerate() {
        M::scaled_into(
            &values[r * np..][..n],
            *inverse,
            &mut out[r * out_stride..][..n],
        );
    }
}

/// Node counts padded to whole 8-lane vectors.
pub(crate) fn padded(nodes: usize) -> usize {
    nodes.div_ceil(8) * 8
}
/// `fn $name(args)` that runs `$kernel::<M>(args)`, a kernel generic over [`MulAdd`], in
/// the best form the CPU allows, picked at run time: [`Wide`] compiled for AVX-512 F and
/// VL, else [`Fused`] compiled for AVX2 and FMA, else [`Plain`].
macro_rules! simd_dispatch {
    ($(#[$meta:meta])* fn $name:ident => $kernel:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$meta])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) {
                    $kernel::<$crate::ops::row_kernels::Wide>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) {
                    $kernel::<$crate::ops::row_kernels::Fused>($($arg),*)
                }
                if $crate::ops::row_kernels::has_avx512() {
                    // SAFETY: the CPU supports AVX-512 (F and VL), AVX2 and FMA (checked).
                    return unsafe { avx512($($arg),*) };
                }
                if $crate::ops::row_kernels::has_avx2_fma() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked).
                    return unsafe { avx2($($arg),*) };
                }
            }
            $kernel::<$crate::ops::row_kernels::Plain>($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// Whether the `avx512f,avx512vl` builds of the kernels (with [`Wide`]) may run.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && has_avx2_fma()
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// A contiguous f32 flex tensor's values, without a copy.
pub(crate) fn floats(t: &burn_flex::FlexTensor) -> &[f32] {
    t.as_slice::<f32>()
        .expect("the fused operations run in f32 on contiguous tensors")
}

/// Node indices from contiguous flex ints (i64 or i32, as the device's settings say).
pub(crate) fn node_indices(t: &burn_flex::FlexTensor) -> Vec<usize> {
    if let Some(nodes) = t.as_slice::<i64>() {
        return nodes.iter().map(|&v| v as usize).collect();
    }
    let nodes = t.as_slice::<i32>();
    let nodes = nodes.expect("contiguous i32 or i64 node indices");
    nodes.iter().map(|&v| v as usize).collect()
}

/// `len` floats for a kernel that writes each of them before anything reads it: a
/// decoder step's outputs and gradients are written whole, and zeroing them first (as
/// `vec![0.0; len]` does: ~13 MB a POMO CVRP100 decode step, ~5% of a CVRP50 training
/// step's time) is a pass over memory that nothing reads. Debug builds, the tests', fill
/// them with NaN instead, so that a value read before it is written shows in every result
/// it reaches.
pub(crate) fn unwritten(len: usize) -> Vec<f32> {
    if cfg!(debug_assertions) {
        return vec![f32::NAN; len];
    }
    let mut values = Vec::with_capacity(len);
    // SAFETY: the capacity is `len`, and the caller writes every value before any is
    // read (the debug builds' NaN shows where it does not); burn-flex leaves its own
    // outputs unwritten the same way.
    #[allow(clippy::uninit_vec)]
    unsafe {
        values.set_len(len)
    };
    values
}

/// A contiguous f32 flex tensor of `shape` that takes `values` over.
pub(crate) fn tensor(
    values: Vec<f32>,
    shape: impl Into<burn::tensor::Shape>,
) -> burn_flex::FlexTensor {
    burn_flex::FlexTensor::new(
        burn::backend::Bytes::from_elems(values),
        burn_flex::Layout::contiguous(shape.into()),
        burn::backend::DType::F32,
    )
}

/// A kernel's outputs from one run, each with its name.
#[cfg(test)]
pub(crate) type NamedOutputs = Vec<(&'static str, Vec<f32>)>;

/// Of a kernel's three forms `[Plain, Fused, Wide]`, those this CPU can run: a test that
/// calls a form directly, not through [`simd_dispatch`], would otherwise stop on an illegal
/// instruction where the CPU lacks AVX-512 (or AVX2).
#[cfg(test)]
pub(crate) fn forms_this_cpu_runs<T>([plain, fused, wide]: [T; 3]) -> Vec<T> {
    #[cfg(target_arch = "x86_64")]
    let (can_fuse, can_widen) = (has_avx2_fma(), has_avx512());
    #[cfg(not(target_arch = "x86_64"))]
    let (can_fuse, can_widen) = (false, false);
    let mut forms = vec![plain];
    if can_fuse {
        forms.push(fused);
    }
    if can_fuse && can_widen {
        forms.push(wide);
    }
    forms
}

/// Runs a kernel in each form this CPU can run and checks the forms against each other:
/// [`Wide`] must give [`Fused`]'s numbers bit for bit, and [`Plain`] (products and sums
/// rounded apart) the same to 1e-4 relative. A machine picks one form at run time, so
/// without this a test there checks only that one.
#[cfg(test)]
pub(crate) fn assert_forms_agree(
    context: &str,
    plain: impl FnOnce() -> NamedOutputs,
    fused: impl FnOnce() -> NamedOutputs,
    wide: impl FnOnce() -> NamedOutputs,
) {
    #[cfg(target_arch = "x86_64")]
    let (can_fuse, can_widen) = (has_avx2_fma(), has_avx512());
    #[cfg(not(target_arch = "x86_64"))]
    let (can_fuse, can_widen) = (false, false);
    if !can_fuse {
        eprintln!("skipped: this CPU has no AVX2 and FMA");
        return;
    }
    let fused = fused();
    for ((name, want), (_, got)) in fused.iter().zip(&plain()) {
        for (i, (&w, &g)) in want.iter().zip(got).enumerate() {
            let close = w == g || (w - g).abs() <= 1e-4 * w.abs().max(1.0);
            assert!(close, "{context}: plain {name}[{i}] {g} against {w}");
        }
    }
    if !can_widen {
        eprintln!("Wide not checked: this CPU has no AVX-512 F and VL");
        return;
    }
    for ((name, want), (_, got)) in fused.iter().zip(&wide()) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(want) == bits(got),
            "{context}: {name} differs under AVX-512"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::pseudo_random;

    /// The polynomial exponential against libm's, where it is used (softmax arguments are
    /// at most 0) and beyond.
    #[test]
    fn exp_lane_matches_exp_to_a_few_ulp() {
        let mut worst = 0.0f32;
        for i in 0..=170_000 {
            let x = -87.0 + i as f32 * 1e-3;
            let (ours, libm) = (exp_lane(x), x.exp());
            worst = worst.max((ours - libm).abs() / libm);
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert!(exp_lane(f32::NEG_INFINITY) < 1e-37);
        assert_eq!(exp_lane(0.0), 1.0);
        // Eight lanes at a time, both ways (the AVX2 one where the CPU has it), NaN kept.
        let check = |exp8: fn(&mut [f32; 8])| {
            let mut x = [-100.0, -87.0, -3.5, -1e-3, 0.0, 0.7, 20.0, f32::NAN];
            let want = x.map(f32::exp);
            exp8(&mut x);
            assert!(x[0] < 1e-37, "{}", x[0]);
            for (got, want) in x[1..7].iter().zip(&want[1..7]) {
                assert!((got - want).abs() <= 5e-7 * want, "{got} vs {want}");
            }
            assert!(x[7].is_nan());
        };
        check(Plain::exp8);
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            check(Fused::exp8);
        }
    }

    /// The heads taken together give each head's weighted sum bit for bit, in both forms,
    /// at head sizes of one and two vectors and head counts that leave partial blocks.
    #[test]
    fn head_weighted_sums_match_one_head_at_a_time() {
        let mut state = 99u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (nodes, heads, head_dim) in
            [(21, 8, 16), (101, 8, 16), (5, 3, 8), (1, 1, 16), (7, 6, 8)]
        {
            let d = heads * head_dim;
            let coefs: Vec<f32> = (0..heads * nodes).map(|_| next()).collect();
            let values: Vec<f32> = (0..nodes * d).map(|_| next()).collect();
            let one_head = |head: usize, out: &mut [f32], fused: bool| {
                let at = RowsAt::contiguous(0, nodes, 0);
                let (c, v) = (&coefs[head * nodes..], &values[head * head_dim..]);
                let o = &mut out[head * head_dim..];
                match fused {
                    false => weighted_sums::<Plain, 1>(c, v, (d, head_dim), at, o),
                    #[cfg(target_arch = "x86_64")]
                    true => unsafe { weighted_sums_avx2(c, v, (d, head_dim), at, o) },
                    #[cfg(not(target_arch = "x86_64"))]
                    true => weighted_sums::<Plain, 1>(c, v, (d, head_dim), at, o),
                }
            };
            let (mut want, mut got) = (vec![0.0; d], vec![0.0; d]);
            for head in 0..heads {
                one_head(head, &mut want, false);
            }
            let every = Every(nodes);
            head_weighted_sums::<Plain, _>(
                &coefs,
                &values,
                (nodes, heads, head_dim),
                every,
                &mut got,
            );
            assert_eq!(got, want, "{nodes} nodes, {heads} heads of {head_dim}");
            #[cfg(target_arch = "x86_64")]
            if has_avx2_fma() {
                for head in 0..heads {
                    one_head(head, &mut want, true);
                }
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                unsafe {
                    head_weighted_sums_avx2(&coefs, &values, (nodes, heads, head_dim), &mut got)
                };
                assert_eq!(
                    got, want,
                    "fused: {nodes} nodes, {heads} heads of {head_dim}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn weighted_sums_avx2(c: &[f32], v: &[f32], sw: (usize, usize), at: RowsAt, o: &mut [f32]) {
        weighted_sums::<Fused, 1>(c, v, sw, at, o)
    }

    /// `R` rows' weighted sums in 16-lane vectors (`Wide`) and in 8-lane ones (`Fused`),
    /// bit for bit, and against a plain sum in k order to within f32 rounding: widths
    /// that are 16-lane vectors and blocks of them only, leave one 8-lane vector, or
    /// leave single lanes; row blocks of 1, 2, 4 and 8; strides wider than the width;
    /// each row's coefficients one after another, and as a column of a table (every
    /// eighth float).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn wide_weighted_sums_give_the_eight_lane_numbers() {
        if !has_avx512() {
            eprintln!("skipped: this CPU has no AVX-512 F and VL");
            return;
        }
        #[target_feature(enable = "avx2,fma")]
        fn fused<const R: usize>(c: &[f32], v: &[f32], sw: (usize, usize), at: RowsAt) -> Vec<f32> {
            let mut out = vec![f32::NAN; R * at.out_stride];
            weighted_sums::<Fused, R>(c, v, sw, at, &mut out);
            out
        }
        #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
        fn wide<const R: usize>(c: &[f32], v: &[f32], sw: (usize, usize), at: RowsAt) -> Vec<f32> {
            let mut out = vec![f32::NAN; R * at.out_stride];
            weighted_sums::<Wide, R>(c, v, sw, at, &mut out);
            out
        }
        let mut state = 7u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for width in [1, 7, 8, 15, 16, 24, 31, 40, 48, 64, 72, 128, 136] {
            for count in [1, 5, 21] {
                let stride = width + 3;
                let rows: Vec<f32> = (0..count * stride).map(|_| next()).collect();
                let coefs: Vec<f32> = (0..8 * count).map(|_| next()).collect();
                let column = RowsAt {
                    coef_stride: 1,
                    coef_step: 8,
                    count,
                    out_stride: width,
                };
                for at in [RowsAt::contiguous(count, count, width), column] {
                    let sw = (stride, width);
                    // SAFETY: the CPU has AVX-512 F and VL, AVX2 and FMA (checked above).
                    let pairs = unsafe {
                        [
                            (
                                wide::<1>(&coefs, &rows, sw, at),
                                fused::<1>(&coefs, &rows, sw, at),
                            ),
                            (
                                wide::<2>(&coefs, &rows, sw, at),
                                fused::<2>(&coefs, &rows, sw, at),
                            ),
                            (
                                wide::<4>(&coefs, &rows, sw, at),
                                fused::<4>(&coefs, &rows, sw, at),
                            ),
                            (
                                wide::<8>(&coefs, &rows, sw, at),
                                fused::<8>(&coefs, &rows, sw, at),
                            ),
                        ]
                    };
                    for (wide, fused) in pairs {
                        let (wide_bits, fused_bits): (Vec<u32>, Vec<u32>) = (
                            wide.iter().map(|x| x.to_bits()).collect(),
                            fused.iter().map(|x| x.to_bits()).collect(),
                        );
                        assert_eq!(wide_bits, fused_bits, "width {width}, {count} rows summed");
                        for (i, &got) in wide.iter().enumerate() {
                            let (r, lane) = (i / width, i % width);
                            let want: f32 = (0..count)
                                .map(|k| coefs[at.coef(r, k)] * rows[k * stride + lane])
                                .sum();
                            assert!((got - want).abs() <= 1e-5, "width {width}: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    /// The AVX2 `kept_exp_sum` gives the bits of the generic form, its operations taken
    /// one at a time (a subtraction, [`exp8_avx2`], a product, a sum), kept and masked
    /// lanes alike.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_kept_exp_sum_gives_the_generic_forms_bits() {
        if !has_avx2_fma() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        /// The trait's generic form, with [`Fused`]'s exponential.
        struct Generic;
        impl MulAdd for Generic {
            type Sum8 = PlainLanes<8>;
            type Sum16 = PlainLanes<16>;
            fn mul_add(a: f32, b: f32, c: f32) -> f32 {
                Fused::mul_add(a, b, c)
            }
            fn exp8(x: &mut [f32; 8]) {
                Fused::exp8(x)
            }
            fn kept_max8(values: &[f32; 8], keep: &[f32; 8], max: &mut [f32; 8]) {
                Plain::kept_max8(values, keep, max)
            }
        }
        // Every group size of `chunk_groups`: fewer than four chunks, whole fours, and
        // fours whose last group takes one, two or three more.
        for chunks in [1, 2, 3, 4, 5, 6, 7, 13, 64, 66, 67] {
            let values = pseudo_random(8 * chunks, 11, 20.0);
            let keep: Vec<f32> = (0..8 * chunks).map(|i| f32::from(i % 3 != 1)).collect();
            let (mut got, mut want) = (values.clone(), values);
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            let got_sum = unsafe { kept_exp_sum_avx2(&mut got, 3.25, &keep) };
            let want_sum = Generic::kept_exp_sum(&mut want, 3.25, &keep);
            assert_eq!(got_sum.to_bits(), want_sum.to_bits(), "{chunks} chunks");
            assert_eq!(bits(&got), bits(&want), "{chunks} chunks");
        }
    }

    /// The AVX-512 `kept_exp_sum` gives the AVX2 form's bits: odd and even chunk counts,
    /// every group size of pairs, kept and masked lanes, arguments past both clamps (and
    /// its sums fail it when a register's high chunk is added before its low one).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_kept_exp_sum_gives_the_avx2_bits() {
        if !has_avx512() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        for chunks in [1, 2, 3, 4, 5, 7, 8, 9, 13, 14, 15, 16, 17, 64, 66, 67] {
            // Within a few units of each other, so that the order of the sums shows.
            let mut values = pseudo_random(8 * chunks, 12, 3.0);
            // Past the clamps: a masked lane (its e^88 times 0) and the last.
            let last = values.len() - 1;
            (values[1], values[last]) = (200.0, -300.0);
            let keep: Vec<f32> = (0..8 * chunks).map(|i| f32::from(i % 3 != 1)).collect();
            let (mut got, mut want) = (values.clone(), values);
            // SAFETY: the CPU has AVX-512 F, AVX2 and FMA (checked above).
            let (got_sum, want_sum) = unsafe {
                (
                    kept_exp_sum_avx512(&mut got, 3.25, &keep),
                    kept_exp_sum_avx2(&mut want, 3.25, &keep),
                )
            };
            assert_eq!(got_sum.to_bits(), want_sum.to_bits(), "{chunks} chunks");
            assert_eq!(bits(&got), bits(&want), "{chunks} chunks");
        }
    }

    /// The AVX2 exponential with its products and sums rounded apart gives [`exp_lane`]'s
    /// bits, across the range and at its edges, on whole slices and chunk by chunk.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn unfused_avx2_exp_gives_exp_lanes_bits() {
        if !has_avx2_fma() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        let edges = [
            f32::NEG_INFINITY,
            -1e30,
            -87.5,
            -87.0,
            -0.0,
            0.0,
            88.0,
            89.0,
        ];
        let sweep = (0..=200_000).map(|i| -100.0 + i as f32 * 1e-3);
        let mut inputs: Vec<f32> = edges.into_iter().chain(sweep).collect();
        inputs.resize(padded(inputs.len()), 0.0);
        let want: Vec<f32> = inputs.iter().map(|&x| exp_lane(x)).collect();
        // Whole slices (25,002 chunks: fours, the last group six) and chunk by chunk.
        let mut got = inputs.clone();
        Fused::exp_chunks_unfused(&mut got);
        for (k, chunk) in inputs.chunks_exact(8).enumerate() {
            let mut lanes: [f32; 8] = chunk.try_into().expect("8 lanes");
            Fused::exp_chunks_unfused(&mut lanes);
            let want = &want[8 * k..8 * k + 8];
            assert_eq!(bits(&lanes), bits(want), "at {chunk:?}");
            assert_eq!(bits(&got[8 * k..8 * k + 8]), bits(want), "at {chunk:?}");
        }
        // Every group size of `chunk_groups`, from the edges on.
        for chunks in [1, 2, 3, 4, 5, 6, 7, 13] {
            let mut part = inputs[..8 * chunks].to_vec();
            Fused::exp_chunks_unfused(&mut part);
            assert_eq!(bits(&part), bits(&want[..8 * chunks]), "{chunks} chunks");
        }
        let mut nan = [f32::NAN; 8];
        Fused::exp_chunks_unfused(&mut nan);
        assert!(nan.iter().all(|x| x.is_nan()));
    }

    /// The fused exponential on whole slices, in every group size of [`chunk_groups`],
    /// gives [`MulAdd::exp8`]'s bits chunk by chunk.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn exp_chunks_give_exp8s_bits() {
        if !has_avx2_fma() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        for chunks in [1, 2, 3, 4, 5, 6, 7, 13, 14, 15, 66, 67] {
            let inputs = pseudo_random(8 * chunks, 5, 40.0);
            let mut got = inputs.clone();
            Fused::exp_chunks(&mut got);
            // Two chunks a register under AVX-512: even and odd counts, every group size.
            let mut wide = inputs.clone();
            if has_avx512() {
                // SAFETY: the CPU has AVX-512 F, AVX2 and FMA (checked).
                unsafe { exp_chunks_avx512(&mut wide) };
            }
            for (k, chunk) in inputs.chunks_exact(8).enumerate() {
                let mut want: [f32; 8] = chunk.try_into().expect("8 lanes");
                Fused::exp8(&mut want);
                assert_eq!(bits(&got[8 * k..8 * k + 8]), bits(&want), "{chunks} chunks");
                if has_avx512() {
                    let wide = &wide[8 * k..8 * k + 8];
                    assert_eq!(bits(wide), bits(&want), "{chunks} chunks, AVX-512");
                }
            }
        }
    }

    /// The AVX2 scaling is each lane's own product, from every start and for every length
    /// around the 8-lane chunks (short rows were all LLVM's scalar tail before).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_scaling_is_each_lanes_product() {
        if !has_avx2_fma() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        let values = pseudo_random(70, 4, 30.0);
        for n in 0..=values.len() {
            for from in [0, 1, 8, 9].into_iter().filter(|&f| f <= n) {
                let mut out = vec![f32::NAN; n];
                // SAFETY: the CPU has AVX2 (checked above).
                unsafe { scaled_into_avx2(&values, 0.37, &mut out, from) };
                for (i, (&o, &v)) in out.iter().zip(&values).enumerate() {
                    let want = if i < from { f32::NAN } else { v * 0.37 };
                    assert_eq!(o.to_bits(), want.to_bits(), "n {n}, from {from}, lane {i}");
                }
            }
        }
    }

    /// The AVX-512 maximum and scaling against the eight-lane forms: the same bits over
    /// odd and even chunk counts, kept and masked lanes (none kept, a kept NaN); a maximum
    /// of signed zeros only the same value (its sign follows the order the zeros are met
    /// in, and a softmax subtracts it from every value, where ±0 give the same).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_kept_max_and_scaling_give_the_eight_lane_bits() {
        if !has_avx512() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        for chunks in [1, 2, 3, 4, 7, 13, 16, 17] {
            let mut values = pseudo_random(8 * chunks, 9, 30.0);
            values[0] = f32::NAN;
            let masks: [fn(usize) -> bool; 4] =
                [|_| true, |i| i % 3 != 1, |i| i % 11 == 4, |_| false];
            for (m, kept) in masks.iter().enumerate() {
                let keep: Vec<f32> = (0..values.len()).map(|i| f32::from(kept(i))).collect();
                // SAFETY: the CPU has AVX-512 F, AVX2 and FMA (checked above).
                let wide = unsafe { kept_max_avx512(&values, &keep) };
                let eight = kept_max::<Fused>(&values, &keep);
                assert_eq!(wide.to_bits(), eight.to_bits(), "{chunks} chunks, mask {m}");
            }
            for n in [8 * chunks - 7, 8 * chunks - 1, 8 * chunks] {
                let (mut wide, mut eight) = (vec![0.0; n], vec![0.0; n]);
                // SAFETY: as above.
                unsafe { scaled_into_avx512(&values, 0.37, &mut wide) };
                Fused::scaled_into(&values, 0.37, &mut eight);
                assert_eq!(bits(&wide), bits(&eight), "{n} lanes");
            }
        }
        let mut signed_zeros = [-0.0f32; 16];
        signed_zeros[8..].fill(0.0);
        // SAFETY: as above.
        let wide = unsafe { kept_max_avx512(&signed_zeros, &[1.0; 16]) };
        assert!(wide == 0.0 && kept_max::<Fused>(&signed_zeros, &[1.0; 16]) == 0.0);
    }

    /// The exponentials' groups, by hand: every chunk once and in order, fours, and the
    /// one to three left over in the last group.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn chunk_groups_take_fours_and_the_rest_with_the_last() {
        let groups = |chunks| chunk_groups(chunks).collect::<Vec<_>>();
        assert_eq!(groups(0), []);
        assert_eq!(groups(3), [(0, 3)]);
        assert_eq!(groups(4), [(0, 4)]);
        assert_eq!(groups(7), [(0, 7)]);
        assert_eq!(groups(8), [(0, 4), (4, 4)]);
        assert_eq!(groups(13), [(0, 4), (4, 4), (8, 5)]);
        assert_eq!(groups(15), [(0, 4), (4, 4), (8, 7)]);
        for chunks in 0..100 {
            let mut next = 0;
            for (first, size) in chunk_groups(chunks) {
                assert_eq!(first, next, "{chunks} chunks");
                assert!(
                    (4..=7).contains(&size) || chunks < 4,
                    "{chunks} chunks: {size}"
                );
                next += size;
            }
            assert_eq!(next, chunks);
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn head_weighted_sums_avx2(c: &[f32], v: &[f32], sizes: (usize, usize, usize), o: &mut [f32]) {
        head_weighted_sums::<Fused, _>(c, v, sizes, Every(sizes.0), o)
    }

    /// The open nodes of any of a block's rows, by hand: a node masked in every row is
    /// left out, one open in any row kept; where few are left out, every node.
    #[test]
    fn open_nodes_of_any_row_by_hand() {
        #[rustfmt::skip]
        let mask = [
            1, 0, 1, 1, 0,
            1, 1, 1, 0, 0,
        ];
        let mut list = Vec::new();
        let listed = |open: OpenTerms| match open {
            OpenTerms::Listed(Listed(l)) => l.to_vec(),
            OpenTerms::Every(n) => panic!("every one of {n} nodes"),
        };
        assert_eq!(
            listed(open_nodes_of_any::<2>(&mask, 5, &mut list)),
            [1, 3, 4]
        );
        assert_eq!(
            listed(open_nodes_of_any::<1>(&mask[5..], 5, &mut list)),
            [3, 4]
        );
        assert!(listed(open_nodes_of_any::<1>(&[1, 1], 2, &mut list)).is_empty());
        // Fifteen of sixteen open: every node, not a list; seven of eight: a list.
        let mut one_closed = [0u8; 16];
        one_closed[3] = 1;
        let fifteen = open_nodes_of_any::<1>(&one_closed, 16, &mut list);
        assert!(matches!(fifteen, OpenTerms::Every(16)));
        let seven = listed(open_nodes_of_any::<1>(&one_closed[..8], 8, &mut list));
        assert_eq!(seven, [0, 1, 2, 4, 5, 6, 7]);
    }

    /// The rows at which some node of a block is open, by hand: a row where every node of
    /// the block is masked is left out, by its place in the rows taken; where few are left
    /// out, every row.
    #[test]
    fn rows_open_at_any_node_by_hand() {
        #[rustfmt::skip]
        let mask = [
            0, 1, 1, 0,
            1, 1, 1, 1,
            1, 0, 1, 1,
            0, 0, 1, 1,
            1, 1, 0, 0,
        ];
        let mut list = Vec::new();
        let listed = |open: OpenTerms| match open {
            OpenTerms::Listed(Listed(l)) => l.to_vec(),
            OpenTerms::Every(n) => panic!("every one of {n} rows"),
        };
        // Nodes 1 and 2 of rows 0 to 4: open in rows 2 and 3 only (node 1), and 4 (node 2).
        let every_row = [0, 1, 2, 3, 4];
        let open = rows_open_at_any::<2>(&mask, (4, 1), (0, &every_row), &mut list);
        assert_eq!(listed(open), [2, 3, 4]);
        // Rows 1, 2 and 4 from row 0, node 2 alone: open in row 4, the third taken.
        let some = [1, 2, 4];
        let open = rows_open_at_any::<1>(&mask, (4, 2), (0, &some), &mut list);
        assert_eq!(listed(open), [2]);
        // From row 1 (`at`): rows 1 + 0 and 1 + 3, nodes 0 to 3: open in row 4 only.
        let open = rows_open_at_any::<4>(&mask, (4, 0), (1, &[0, 3]), &mut list);
        assert_eq!(listed(open), [1]);
        // Fifteen of sixteen rows open: every row, not a list; seven of eight: a list.
        let mut one_closed = [0u8; 16];
        one_closed[3] = 1;
        let rows: Vec<usize> = (0..16).collect();
        let fifteen = rows_open_at_any::<1>(&one_closed, (1, 0), (0, &rows), &mut list);
        assert!(matches!(fifteen, OpenTerms::Every(16)));
        let seven = rows_open_at_any::<1>(&one_closed, (1, 0), (0, &rows[..8]), &mut list);
        assert_eq!(listed(seven), [0, 1, 2, 4, 5, 6, 7]);
    }

    /// Sums over the rows at which some node of a block is open are the sums over every
    /// row, bit for bit, where the other rows' coefficients are zero of either sign: a
    /// block of nodes' sums over rows, each node's coefficients a column of a `[rows, N]`
    /// table (as the backward pass's node gradients take them), for blocks of 1 to 8.
    #[test]
    fn sums_over_open_rows_are_the_sums_over_all() {
        let (rows, nodes, d) = (29, 19, 40);
        let values = crate::test_support::pseudo_random(rows * d, 7, 1.0);
        for seed in 0..4u64 {
            let coefs = crate::test_support::pseudo_random(rows * nodes, 8 + seed, 1.0);
            // Each row closes the nodes before a point of its own, and some after it.
            let mask: Vec<u8> = (0..rows * nodes)
                .map(|i| (i / nodes, i % nodes))
                .map(|(row, node)| {
                    node < (row * 5 + seed as usize) % nodes || (row + node).is_multiple_of(5)
                })
                .map(u8::from)
                .collect();
            let masked: Vec<f32> = (coefs.iter().zip(&mask))
                .map(|(&c, &m)| if m != 0 { 0.0f32.copysign(c) } else { c })
                .collect();
            let sums = (&masked[..], &values[..], &mask[..]);
            let sizes = (rows, nodes, d);
            open_rows_sums::<Plain, 1>(sums, sizes, seed);
            open_rows_sums::<Plain, 4>(sums, sizes, seed);
            open_rows_sums::<Plain, 8>(sums, sizes, seed);
            #[cfg(target_arch = "x86_64")]
            if has_avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA (checked).
                unsafe { open_rows_sums_avx2(sums, sizes, seed) };
            }
            #[cfg(target_arch = "x86_64")]
            if has_avx512() {
                // SAFETY: the CPU has AVX-512 F and VL, AVX2 and FMA (checked).
                unsafe { open_rows_sums_avx512(sums, sizes, seed) };
            }
        }
    }

    /// One block of [`sums_over_open_rows_are_the_sums_over_all`]: `R` nodes from node 2.
    #[inline(always)]
    fn open_rows_sums<M: MulAdd, const R: usize>(
        (coefs, values, mask): (&[f32], &[f32], &[u8]),
        (rows, nodes, d): (usize, usize, usize),
        seed: u64,
    ) {
        let first = 2;
        let over_rows = RowsAt {
            coef_stride: 1,
            coef_step: nodes,
            count: rows,
            out_stride: d,
        };
        let (taken, mut list): (Vec<usize>, _) = ((0..rows).collect(), Vec::new());
        let open = rows_open_at_any::<R>(mask, (nodes, first), (0, &taken), &mut list);
        assert!(matches!(open, OpenTerms::Listed(_)), "{R} nodes");
        let (mut all, mut listed) = (vec![0.0; R * d], vec![0.0; R * d]);
        let c = &coefs[first..];
        weighted_sums::<M, R>(c, values, (d, d), over_rows, &mut all);
        open.weighted_sums::<M, R>(c, values, (d, d), over_rows, &mut listed);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&listed), bits(&all), "{R} nodes, seed {seed}");
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn open_rows_sums_avx2(sums: (&[f32], &[f32], &[u8]), sizes: (usize, usize, usize), seed: u64) {
        open_rows_sums::<Fused, 1>(sums, sizes, seed);
        open_rows_sums::<Fused, 2>(sums, sizes, seed);
        open_rows_sums::<Fused, 4>(sums, sizes, seed);
        open_rows_sums::<Fused, 8>(sums, sizes, seed);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    fn open_rows_sums_avx512(
        sums: (&[f32], &[f32], &[u8]),
        sizes: (usize, usize, usize),
        seed: u64,
    ) {
        open_rows_sums::<Wide, 4>(sums, sizes, seed);
        open_rows_sums::<Wide, 8>(sums, sizes, seed);
    }

    /// Sums over the nodes some row may choose are the sums over all nodes, bit for bit,
    /// where the other nodes' coefficients are zero of either sign (as a masked node's
    /// are), in the plain and fused forms, for row blocks of 1 to 8 and for one row's
    /// heads together.
    #[test]
    fn sums_over_open_nodes_are_the_sums_over_all() {
        let (nodes, heads, head_dim) = (37, 4, 16);
        let d = heads * head_dim;
        let values = crate::test_support::pseudo_random(nodes * d, 5, 1.0);
        for seed in 0..4u64 {
            let coefs = crate::test_support::pseudo_random(8 * heads * nodes, 6 + seed, 1.0);
            // A third of the nodes closed in every row, and a quarter of the rest in each.
            let mask: Vec<u8> = (0..8 * nodes)
                .map(|i| (i / nodes, i % nodes))
                .map(|(row, node)| {
                    node.is_multiple_of(3) || (row * 7 + node * 5 + seed as usize).is_multiple_of(4)
                })
                .map(u8::from)
                .collect();
            // A row's coefficients for every head, zero (of either sign) where it is masked.
            let masked: Vec<f32> = (coefs.iter().enumerate())
                .map(|(i, &c)| {
                    let (row, node) = (i / (heads * nodes), i % nodes);
                    if mask[row * nodes + node] != 0 {
                        0.0f32.copysign(c)
                    } else {
                        c
                    }
                })
                .collect();
            let at = RowsAt::contiguous(heads * nodes, nodes, d);
            let mut list = Vec::new();
            macro_rules! block {
                ($m:ty, $r:literal) => {{
                    let open = open_nodes_of_any::<$r>(&mask, nodes, &mut list);
                    assert!(matches!(open, OpenTerms::Listed(_)), "{} rows", $r);
                    let (mut all, mut listed) = (vec![0.0; $r * d], vec![0.0; $r * d]);
                    for head in 0..heads {
                        let (c, v) = (&masked[head * nodes..], &values[head * head_dim..]);
                        let sw = (d, head_dim);
                        weighted_sums::<$m, $r>(c, v, sw, at, &mut all[head * head_dim..]);
                        let out = &mut listed[head * head_dim..];
                        open.weighted_sums::<$m, $r>(c, v, sw, at, out);
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&listed), bits(&all), "{} rows, seed {seed}", $r);
                    if $r == 1 {
                        let sizes = (nodes, heads, head_dim);
                        open.head_weighted_sums::<$m>(&masked, &values, sizes, &mut listed);
                        assert_eq!(bits(&listed), bits(&all), "heads together, seed {seed}");
                    }
                }};
            }
            block!(Plain, 1);
            block!(Plain, 2);
            block!(Plain, 4);
            block!(Plain, 8);
            #[cfg(target_arch = "x86_64")]
            if has_avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA (checked).
                unsafe { listed_sums_avx2(&masked, &values, &mask, (nodes, heads, head_dim)) };
            }
        }
    }

    /// The fused and wide forms of [`sums_over_open_nodes_are_the_sums_over_all`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn listed_sums_avx2(coefs: &[f32], values: &[f32], mask: &[u8], sizes: (usize, usize, usize)) {
        let (nodes, heads, head_dim) = sizes;
        let d = heads * head_dim;
        let at = RowsAt::contiguous(heads * nodes, nodes, d);
        let mut list = Vec::new();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let open = open_nodes_of_any::<4>(mask, nodes, &mut list);
        let (mut all, mut listed) = (vec![0.0; 4 * d], vec![0.0; 4 * d]);
        for head in 0..heads {
            let (c, v) = (&coefs[head * nodes..], &values[head * head_dim..]);
            weighted_sums::<Fused, 4>(c, v, (d, head_dim), at, &mut all[head * head_dim..]);
            let out = &mut listed[head * head_dim..];
            open.weighted_sums::<Fused, 4>(c, v, (d, head_dim), at, out);
        }
        assert_eq!(bits(&listed), bits(&all), "fused, 4 rows");
        let open = open_nodes_of_any::<1>(mask, nodes, &mut list);
        let sizes = (nodes, heads, head_dim);
        head_weighted_sums::<Fused, _>(coefs, values, sizes, Every(nodes), &mut all);
        open.head_weighted_sums::<Fused>(coefs, values, sizes, &mut listed);
        assert_eq!(bits(&listed[..d]), bits(&all[..d]), "fused, heads together");
    }

    /// The largest kept value, by hand, and the same bits from both forms: signed zeros,
    /// infinities, NaN (kept and masked), nothing kept.
    #[test]
    fn kept_max_takes_the_largest_kept_value_in_both_forms() {
        let values = [
            -0.0,
            0.0,
            3.5,
            -2.0,
            9.0,
            f32::NAN,
            f32::NEG_INFINITY,
            1.0, //
            7.0,
            -1.0,
            0.5,
            f32::INFINITY,
            2.0,
            -0.0,
            4.0,
            6.0,
        ];
        let keep_all = [1.0; 16];
        let mut keep_some = [0.0; 16];
        for i in [0, 1, 2, 3, 7, 9, 10, 14] {
            keep_some[i] = 1.0;
        }
        let mut keep_nan = keep_some;
        keep_nan[5] = 1.0;
        assert_eq!(kept_max::<Plain>(&values, &keep_some), 4.0);
        assert_eq!(kept_max::<Plain>(&values, &keep_all), f32::INFINITY);
        assert_eq!(kept_max::<Plain>(&values, &[0.0; 16]), f32::NEG_INFINITY);
        let zeros = [-0.0, 0.0, 0.0, -0.0, -0.0, -0.0, 0.0, -0.0];
        assert!(kept_max::<Plain>(&zeros, &[1.0; 8]) == 0.0);
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            for keep in [keep_all, keep_some, keep_nan, [0.0; 16]] {
                let (fused, plain) = (
                    kept_max::<Fused>(&values, &keep),
                    kept_max::<Plain>(&values, &keep),
                );
                assert_eq!(fused.to_bits(), plain.to_bits(), "keep {keep:?}");
            }
            // One chunk (the kept NaN is then its lane's last word), and −0 then +0 in
            // every lane.
            let mut signed_zeros = [-0.0; 16];
            signed_zeros[8..].fill(0.0);
            let cases = [
                (&values[..8], &keep_nan[..8]),
                (&signed_zeros[..], &keep_all[..]),
                (&zeros[..], &keep_all[..8]),
            ];
            for (values, keep) in cases {
                let fused = kept_max::<Fused>(values, keep);
                let plain = kept_max::<Plain>(values, keep);
                assert_eq!(fused.to_bits(), plain.to_bits(), "{values:?}");
            }
        }
    }
}
