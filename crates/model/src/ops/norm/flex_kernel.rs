/// Per feature: the mean and the biased variance.
pub(super) fn moments(x: &[f32], d: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = (x.len() / d).max(1) as f64;
    let mut sums = vec![0.0f64; d];
    for row in x.chunks_exact(d) {
        for (sum, &v) in sums.iter_mut().zip(row) {
            *sum += f64::from(v);
        }
    }
    let mean: Vec<f32> = sums.iter().map(|s| (s / rows) as f32).collect();
    sums.fill(0.0);
    for row in x.chunks_exact(d) {
        for ((sum, &v), &m) in sums.iter_mut().zip(row).zip(&mean) {
            let c = f64::from(v - m);
            *sum += c * c;
        }
    }
    let variance = sums.iter().map(|s| (s / rows) as f32).collect();
    (mean, variance)
}

pub(super) fn inverse_std(variance: &[f32], epsilon: f64) -> Vec<f32> {
    variance
        .iter()
        .map(|&v| (1.0 / (f64::from(v) + epsilon).sqrt()) as f32)
        .collect()
}

/// `(x − mean) · gamma / std + beta`, row by row, appended to `out`.
pub(super) fn normalise(x: &[f32], stats: [&[f32]; 4], out: &mut Vec<f32>) {
    let [mean, inv_std, gamma, beta] = stats;
    let d = mean.len();
    let scale: Vec<f32> = gamma.iter().zip(inv_std).map(|(g, s)| g * s).collect();
    for row in x.chunks_exact(d) {
        let row = row.iter().zip(mean).zip(&scale).zip(beta);
        out.extend(row.map(|(((&v, &m), &s), &b)| (v - m) * s + b));
    }
}

/// One group's input gradient, appended to `x_grad`, given the output's; its sums of
/// `∂y·x̂` and `∂y` per feature (its share of gamma's and beta's gradients) are added
/// to `sums`.
pub(super) fn backward(
    x: &[f32],
    grad_out: &[f32],
    [mean, inv_std, gamma]: [&[f32]; 3],
    x_grad: &mut Vec<f32>,
    sums: &mut [Vec<f64>; 2],
) {
    let d = mean.len();
    let rows = (x.len() / d).max(1) as f64;
    let (mut beta_sums, mut gamma_sums) = (vec![0.0f64; d], vec![0.0f64; d]);
    for (row, grad) in x.chunks_exact(d).zip(grad_out.chunks_exact(d)) {
        let group_sums = beta_sums.iter_mut().zip(gamma_sums.iter_mut());
        let stats = mean.iter().zip(inv_std);
        for (((beta_sum, gamma_sum), (&v, &g)), (&m, &s)) in
            group_sums.zip(row.iter().zip(grad)).zip(stats)
        {
            *beta_sum += f64::from(g);
            *gamma_sum += f64::from(g * ((v - m) * s));
        }
    }
    // Per feature: ∂x = gamma·s·(∂y − mean(∂y) − x̂·mean(∂y·x̂)), x̂ = (x − mean)·s.
    let mean_grad: Vec<f32> = beta_sums.iter().map(|t| (t / rows) as f32).collect();
    let projection: Vec<f32> = (gamma_sums.iter().zip(inv_std))
        .map(|(t, &s)| (t / rows) as f32 * s)
        .collect();
    let scale: Vec<f32> = gamma.iter().zip(inv_std).map(|(g, s)| g * s).collect();
    for (row, grad) in x.chunks_exact(d).zip(grad_out.chunks_exact(d)) {
        let per_feature = mean
            .iter()
            .zip(&mean_grad)
            .zip(projection.iter().zip(&scale));
        x_grad.extend(
            row.iter()
                .zip(grad)
                .zip(per_feature)
                .map(|((&v, &g), ((&m, &mg), (&p, &k)))| k * (g - mg - (v - m) * p)),
        );
    }
    for (total, group) in [gamma_sums, beta_sums].iter().enumerate() {
        for (t, g) in sums[total].iter_mut().zip(group) {
            *t += g;
        }
    }
}
