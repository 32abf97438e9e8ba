use burn::backend::backend_extension;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;

use super::cube_kernel;

/// The rows `[B × N, d]` for Fusion.
fn embed_metadata(
    coords: &TensorSpec,
    _demands: &TensorSpec,
    _capacity: &TensorSpec,
    depot_weight: &TensorSpec,
    _depot_bias: &TensorSpec,
    _customer_weight: &TensorSpec,
    _customer_bias: &TensorSpec,
) -> TensorSpec {
    let [b, n, _] = coords.shape.dims::<3>();
    let [_, d] = depot_weight.shape.dims::<2>();
    TensorSpec::new(Shape::new([b * n, d]), depot_weight.dtype)
}

/// The four parameters' gradients, each its parameter's shape.
fn grads_metadata(
    _coords: &TensorSpec,
    _demands: &TensorSpec,
    _capacity: &TensorSpec,
    depot_weight: &TensorSpec,
    customer_weight: &TensorSpec,
    _grad_out: &TensorSpec,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    let [_, d] = depot_weight.shape.dims::<2>();
    let spec = |shape: Shape| TensorSpec::new(shape, depot_weight.dtype);
    (
        spec(depot_weight.shape.clone()),
        spec(Shape::new([d])),
        spec(customer_weight.shape.clone()),
        spec(Shape::new([d])),
    )
}

/// [`super::embed`] as a backend operation.
#[backend_extension(
    Autodiff: cfg(feature = "autodiff"),
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube")
)]
pub trait NodeEmbeddingBackend: burn::backend::Backend {
    /// See [`super::embed`]; weights `[in, d]`, biases `[d]`.
    #[fusion(meta = embed_metadata)]
    fn embed_nodes(
        coords: FloatTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        depot_weight: FloatTensor<Self>,
        depot_bias: FloatTensor<Self>,
        customer_weight: FloatTensor<Self>,
        customer_bias: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// The embedding's backward pass on CubeCL, as its own operation.
#[backend_extension(Cube, Fusion)]
pub trait NodeEmbeddingGradsBackend: burn::backend::Backend {
    /// The gradients of the depot's weight and bias and the customers' weight and bias
    /// from the rows' gradient `grad_out` `[B × N, d]`.
    #[allow(clippy::type_complexity)]
    #[fusion(meta = grads_metadata)]
    fn embed_nodes_grads(
        coords: FloatTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        depot_weight: FloatTensor<Self>,
        customer_weight: FloatTensor<Self>,
        grad_out: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

impl NodeEmbeddingBackend for CubeBackend {
    fn embed_nodes(
        coords: FloatTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        depot_weight: FloatTensor<Self>,
        depot_bias: FloatTensor<Self>,
        customer_weight: FloatTensor<Self>,
        customer_bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        cube_kernel::forward([
            coords,
            demands,
            capacity,
            depot_weight,
            depot_bias,
            customer_weight,
            customer_bias,
        ])
    }
}

impl NodeEmbeddingGradsBackend for CubeBackend {
    fn embed_nodes_grads(
        coords: FloatTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        depot_weight: FloatTensor<Self>,
        _customer_weight: FloatTensor<Self>,
        grad_out: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [_, d] = depot_weight.meta.shape().dims::<2>();
        let [dw, db, cw, cb] = cube_kernel::backward([coords, demands, capacity, grad_out], d);
        (dw, db, cw, cb)
    }
}

#[cfg(feature = "autodiff")]
mod autodiff {
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::autodiff::Autodiff;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::Cube;

    use super::{NodeEmbeddingBackend, NodeEmbeddingGradsBackend};

    #[derive(Debug)]
    struct CubeEmbeddingBackward;

    impl Backward<Cube, 7> for CubeEmbeddingBackward {
        /// The coordinates, the demands, the capacities and the two weights.
        type State = [FloatTensor<Cube>; 5];

        fn backward(self, ops: Ops<Self::State, 7>, grads: &mut Gradients, _: &mut Checkpointer) {
            let [coords, demands, capacity, depot_weight, customer_weight] = ops.state;
            let grad_out = grads.consume::<Cube>(&ops.node);
            let (dw, db, cw, cb) = Cube::embed_nodes_grads(
                coords,
                demands,
                capacity,
                depot_weight,
                customer_weight,
                grad_out,
            );
            // The coordinates and demands are data: no gradient of theirs is read.
            let [_, _, _, dw_node, db_node, cw_node, cb_node] = ops.parents;
            for (node, grad) in [(dw_node, dw), (db_node, db), (cw_node, cw), (cb_node, cb)] {
                if let Some(node) = node {
                    grads.register::<Cube>(node.id, grad);
                }
            }
        }
    }

    impl<C: CheckpointStrategy> NodeEmbeddingBackend for Autodiff<Cube, C> {
        fn embed_nodes(
            coords: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            depot_weight: FloatTensor<Self>,
            depot_bias: FloatTensor<Self>,
            customer_weight: FloatTensor<Self>,
            customer_bias: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            let nodes = [
                coords.node(),
                demands.node(),
                capacity.node(),
                depot_weight.node(),
                depot_bias.node(),
                customer_weight.node(),
                customer_bias.node(),
            ];
            let [coords, demands, capacity, depot_weight, customer_weight] =
                [coords, demands, capacity, depot_weight, customer_weight]
                    .map(|t| t.into_primitive());
            let out = Cube::embed_nodes(
                coords.clone(),
                demands.clone(),
                capacity.clone(),
                depot_weight.clone(),
                depot_bias.into_primitive(),
                customer_weight.clone(),
                customer_bias.into_primitive(),
            );
            let state = [coords, demands, capacity, depot_weight, customer_weight];
            match CubeEmbeddingBackward
                .prepare::<C>(nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
    }
}
