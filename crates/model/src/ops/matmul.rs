//! Matrix products at f32 accuracy on devices whose matmuls round their operands.
//!
//! CUDA's tensor cores (sm_80 and later) read an f32 matmul's operands as TF32: 10 stored
//! mantissa bits where f32 has 23. CubeCL 0.11 has no switch to turn that off. In the
//! attention model's encoder that turns greedy choices at near-ties. With TF32 emulated on
//! the CPU, Kool's CVRP100 model gives his tours on 106 of 128 validation instances, not
//! 128 (`benches/tf32`).
//!
//! `highest` splits each operand x into a head that TF32 holds exactly and the rest,
//! x = hi + lo. It sums three products, hi·lo + lo·hi + hi·hi, as CUTLASS's 3×TF32 does. Only
//! lo is rounded by the tensor cores (~2⁻²¹ of x), and lo·lo (~2⁻²⁰ of the product) is
//! left out.
//!
//! The head is Veltkamp's split, written so that FMA contraction cannot change it. NVPTX
//! contracts a product and a sum into one FMA (cubecl-llvm sets CONTRACT). With c = 8192·x,
//! which is exact, t = c + x is x·8193 rounded once, fused or not. hi = t − c is then exact
//! (Sterbenz), fused or not, and a multiple of 2¹³ ulps of x: 11 significant bits, all that
//! TF32 stores.

use burn::tensor::{Device, Tensor};

/// How the attention model's matrix products run (`model.matmul_precision`), after
/// PyTorch's `torch.set_float32_matmul_precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulPrecision {
    /// The device's own matmul: TF32 tensor cores on CUDA (sm_80+), exact f32 on the CPU.
    #[default]
    High,
    /// f32 accuracy on tensor cores too: each product as three TF32-exact products
    /// (3×TF32), about three times the matmul work. The CPU backends' products are exact
    /// already: there it is `high` ([`MatmulPrecision::on`]).
    Highest,
}

impl MatmulPrecision {
    /// The precision products run at on `device`: `highest` only where the device's
    /// matmuls round their operands, on CubeCL devices (CUDA's tensor cores, and the CPU
    /// runtime that stands in for CUDA, so that it compiles what CUDA compiles). flex's and
    /// ndarray's products are exact f32: there `highest` is `high`, at no cost.
    pub fn on(self, device: &Device) -> Self {
        match self {
            Self::Highest if crate::runtime::device::runs_through_cubecl(device) => Self::Highest,
            _ => Self::High,
        }
    }
}

impl std::fmt::Display for MatmulPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::High => "high",
            Self::Highest => "highest",
        })
    }
}

impl std::str::FromStr for MatmulPrecision {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "high" => Ok(Self::High),
            "highest" => Ok(Self::Highest),
            _ => Err(format!(
                "`{text}` is not a matmul precision: high or highest"
            )),
        }
    }
}

/// `a·b` (batched over the leading dims) at `precision`.
///
/// # Shapes
/// - `a`: `[..., M, K]`, `b`: `[..., K, N]` → `[..., M, N]`
pub(crate) fn product<const D: usize>(
    a: Tensor<D>,
    b: Tensor<D>,
    precision: MatmulPrecision,
) -> Tensor<D> {
    match precision {
        MatmulPrecision::High => a.matmul(b),
        MatmulPrecision::Highest => {
            let (a_hi, a_lo) = split(a);
            let (b_hi, b_lo) = split(b);
            // The small terms first, so that they are not lost against the large one.
            let small = a_hi.clone().matmul(b_lo) + a_lo.matmul(b_hi.clone());
            small + a_hi.matmul(b_hi)
        }
    }
}

/// x = hi + lo exactly, hi with at most 11 significant bits (exact in TF32), |lo| ≤ 2⁻¹⁰|x|,
/// for every normal x (subnormals, below 1.2e-38, keep fewer bits in hi).
/// Gradients pass through hi unchanged (hi' = 8193 − 8192 = 1, lo' = 0).
pub(crate) fn split<const D: usize>(x: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
    let c = x.clone() * 8192.0; // exact: a power of two
    let hi = (c.clone() + x.clone()) - c;
    let lo = x - hi.clone();
    (hi, lo)
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::runtime::backend::Backend;
    use crate::test_support::{pseudo_random, read};

    /// f32 to TF32 as PTX's `cvt.rna.tf32.f32` defines it: the nearest value with 10
    /// stored mantissa bits, ties away from zero.
    fn tf32(x: f32) -> f32 {
        f32::from_bits(x.to_bits().wrapping_add(0x1000) & 0xffff_e000)
    }

    /// Magnitudes from 2⁻³⁰ to 2³⁰, both signs, powers of two and their neighbours, zero,
    /// the smallest normal f32.
    fn awkward_values() -> Vec<f32> {
        let mut values = vec![0.0, -0.0, f32::MIN_POSITIVE];
        for (i, r) in pseudo_random(4000, 7, 1.0).into_iter().enumerate() {
            let scale = 2f32.powi((i % 61) as i32 - 30);
            values.push(r * scale);
        }
        for e in -30..30 {
            let p = 2f32.powi(e);
            for v in [
                p,
                -p,
                f32::from_bits(p.to_bits() + 1),
                f32::from_bits(p.to_bits() - 1),
            ] {
                values.push(v);
            }
        }
        values
    }

    #[test]
    fn the_head_is_exact_in_tf32_and_the_parts_sum_to_x() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let values = awkward_values();
        let x = Tensor::<1>::from_data(TensorData::new(values.clone(), [values.len()]), &device);
        let (hi, lo) = split(x);
        let (hi, lo) = (read(hi), read(lo));
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(
                tf32(hi[i]),
                hi[i],
                "{v:e}: head {:e} not exact in TF32",
                hi[i]
            );
            assert_eq!(hi[i] + lo[i], v, "{v:e}: {:e} + {:e}", hi[i], lo[i]);
            assert!(
                lo[i].abs() <= v.abs() * 2f32.powi(-10),
                "{v:e}: rest {:e}",
                lo[i]
            );
        }
    }

    /// The same heads when the sum and the difference are each contracted with the
    /// product into one FMA, as NVPTX may compile them.
    #[test]
    fn contraction_does_not_change_the_head() {
        for v in awkward_values() {
            let c = v * 8192.0;
            let plain = (c + v) - c;
            let fused_sum = v.mul_add(8192.0, v) - c;
            let fused_both = (-v).mul_add(8192.0, v.mul_add(8192.0, v));
            assert_eq!(plain.to_bits(), fused_sum.to_bits(), "{v:e}");
            assert_eq!(plain.to_bits(), fused_both.to_bits(), "{v:e}");
        }
    }

    /// Row-major `[m, k] · [k, n]` in f64 of operands that each pass through `round`
    /// first: a tensor core reading TF32 (`tf32`), or none (`|x| x`).
    fn reference(a: &[f32], b: &[f32], [m, k, n]: [usize; 3], round: fn(f32) -> f32) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|l| round(a[i * k + l]) as f64 * round(b[l * n + j]) as f64)
                    .sum();
            }
        }
        out
    }

    /// The split's three products, each of operands rounded to TF32 (as a tensor core
    /// reads them), against the exact product, relative to the sum of |a·b| terms: within
    /// f32's unit roundoff 2⁻²⁴ (measured 1.2e-8), where one TF32 product is off by 7.7e-5.
    #[test]
    fn three_tf32_products_are_as_close_as_f32() {
        let device: Device = Backend::first_on_host().unwrap().device().unwrap();
        let [m, k, n] = [9, 128, 7];
        let a = pseudo_random(m * k, 3, 2.0);
        let b = pseudo_random(k * n, 4, 0.5);
        let parts = |x: &[f32], shape: [usize; 2]| {
            let t = Tensor::<2>::from_data(TensorData::new(x.to_vec(), shape), &device);
            let (hi, lo) = split(t);
            (read(hi), read(lo))
        };
        let ((a_hi, a_lo), (b_hi, b_lo)) = (parts(&a, [m, k]), parts(&b, [k, n]));
        let exact = reference(&a, &b, [m, k, n], |x| x);
        let one_tf32 = reference(&a, &b, [m, k, n], tf32);
        let three: Vec<f64> = [(&a_hi, &b_lo), (&a_lo, &b_hi), (&a_hi, &b_hi)]
            .iter()
            .map(|(x, y)| reference(x, y, [m, k, n], tf32))
            .fold(vec![0.0; m * n], |s, p| {
                s.iter().zip(p).map(|(s, p)| s + p).collect()
            });
        // Relative to the sum of |a_il·b_lj|, the scale of a dot product's rounding.
        let scale = reference(
            &a.iter().map(|x| x.abs()).collect::<Vec<_>>(),
            &b.iter().map(|x| x.abs()).collect::<Vec<_>>(),
            [m, k, n],
            |x| x,
        );
        let worst = |approx: &[f64]| {
            (0..m * n)
                .map(|i| (approx[i] - exact[i]).abs() / scale[i])
                .fold(0.0, f64::max)
        };
        let (split_error, tf32_error) = (worst(&three), worst(&one_tf32));
        assert!(
            split_error < 2f64.powi(-24),
            "3×TF32 off by {split_error:e}"
        );
        assert!(
            tf32_error > 2f64.powi(-15),
            "TF32 alone off by only {tf32_error:e}"
        );
    }

    /// On a backend with exact f32 products, `highest` gives `high`'s product to f32
    /// rounding, batched dims included.
    #[test]
    fn highest_is_the_same_product() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let shape_a = [2, 3, 5, 16];
        let shape_b = [2, 3, 16, 4];
        let tensor = |shape: [usize; 4], seed| {
            let values = pseudo_random(shape.iter().product(), seed, 1.0);
            Tensor::<4>::from_data(TensorData::new(values, shape), &device)
        };
        let (a, b) = (tensor(shape_a, 5), tensor(shape_b, 6));
        let high = product(a.clone(), b.clone(), MatmulPrecision::High);
        let highest = product(a, b, MatmulPrecision::Highest);
        assert_eq!(highest.dims(), [2, 3, 5, 4]);
        let (high, highest) = (read(high), read(highest));
        for (x, y) in high.iter().zip(&highest) {
            assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
}
