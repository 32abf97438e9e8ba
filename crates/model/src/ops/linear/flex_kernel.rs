/// A matrix in a slice: `values[row * row_stride + col * col_stride]`.
pub(super) struct Strided<'a> {
    pub values: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> Strided<'a> {
    pub fn rows(values: &'a [f32], cols: usize) -> Self {
        Self {
            values,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose of a row-major matrix of `cols` columns.
    pub fn transposed(values: &'a [f32], cols: usize) -> Self {
        Self {
            values,
            row_stride: 1,
            col_stride: cols,
        }
    }

    fn covers(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || (rows - 1) * self.row_stride + (cols - 1) * self.col_stride < self.values.len()
    }
}

/// `lhs[m, k] · rhs[k, n]`, row-major, plus `row` added to every output row if given.
pub(super) fn product(
    [m, n, k]: [usize; 3],
    row: Option<&[f32]>,
    lhs: Strided,
    rhs: Strided,
) -> Vec<f32> {
    assert!(lhs.covers(m, k) && rhs.covers(k, n) && row.is_none_or(|r| r.len() == n));
    // Without a bias the output is not zeroed first: gemm writes every entry.
    let mut out = row.map_or_else(|| Vec::with_capacity(m * n), |row| row.repeat(m));
    // flex's own threshold: below it a product is not worth splitting across threads.
    let parallelism = if m * n * k >= 192 * 192 * 192 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    let accumulate = row.is_some();
    // SAFETY: every index gemm reads is within the slices (checked above), and it
    // writes the m × n entries of `out`'s allocation; without `accumulate` it reads none
    // of them (it zeroes them when k = 0), so the uninitialised capacity is only written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.values.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.values.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            // gemm's `dst = alpha·dst + beta·lhs·rhs`.
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            parallelism,
        );
        out.set_len(m * n);
    }
    out
}

/// The sum of every row of a row-major `[R, cols]` matrix.
pub(super) fn column_sums(values: &[f32], cols: usize) -> Vec<f32> {
    let mut sums = vec![0.0; cols];
    for row in values.chunks_exact(cols) {
        for (sum, v) in sums.iter_mut().zip(row) {
            *sum += v;
        }
    }
    sums
}
