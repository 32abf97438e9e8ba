//! Global gradient-norm clipping (PyTorch's `clip_grad_norm_`).
//!
//! Burn's `GradientClippingConfig::Norm` clips each parameter tensor on its own, which is
//! not what Kool et al. (or PyTorch users) mean by "max grad norm": here the norm is taken
//! over all gradients together and every gradient is scaled by the same factor. The factor
//! stays on the device, so clipping adds no host sync.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    total: Option<Tensor<1>>,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            let s = g.square().sum(); // [1]
            self.total = Some(match self.total.take() {
                Some(t) => t + s,
                None => s,
            });
        }
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: Tensor<1>,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            let factor = self.factor.clone().reshape([1; D]);
            self.grads.register(param.id, g * factor);
        }
    }
}

/// Scales all gradients so their global L2 norm is at most `max_norm` (no-op when
/// `max_norm` is 0) and returns the norm before clipping, as a `[1]` device tensor.
pub fn clip_global_norm<M: Module>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> Option<Tensor<1>> {
    let mut norm = SquaredNorm { grads, total: None };
    module.visit(&mut norm);
    let total_norm = norm.total?.sqrt(); // [1]
    if max_norm > 0.0 {
        // min(1, max_norm / (norm + 1e-6)), as in torch.nn.utils.clip_grad_norm_.
        let factor = (total_norm.clone().add_scalar(1e-6))
            .recip()
            .mul_scalar(max_norm)
            .clamp_max(1.0);
        module.visit(&mut Scale { grads, factor });
    }
    Some(total_norm)
}
