//! The fused step's keys by feature, `[B, 3d, Np]`, from the node-major keys and values.
//!
//! In Burn's tensor operations that is a `cat`, a transposed view and a second `cat` for
//! the padding, and on flex each writes the whole tensor: ~2% of a `tiny_1` epoch. On
//! flex it is one pass over the instances instead, and on CubeCL devices one kernel (the
//! tensor operations were four launches there: a fused chain, a fill and two slice
//! assignments); on ndarray the tensor-operation form runs, which the tests compare
//! against.

use burn::tensor::Tensor;

/// The glimpse keys, logit keys and glimpse values by feature, the layout the fused
/// step's products read: made once per decode, not at every step. Detached: the step
/// gives its gradients to the node-major inputs it is passed beside.
///
/// # Shapes
/// - `glimpse_keys`, `glimpse_values`: `[B, N, H, dk]`, `logit_keys`: `[B, N, d]`
/// - output: `[B, 3d, Np]` (glimpse keys, logit keys, values), Np = N rounded up to a
///   multiple of 8, zero beyond N
pub(crate) fn keys_by_feature(
    glimpse_keys: &Tensor<4>,
    glimpse_values: &Tensor<4>,
    logit_keys: &Tensor<3>,
) -> Tensor<3> {
    let device = logit_keys.device();
    if crate::runtime::device::runs_on_flex(&device)
        || crate::runtime::device::runs_through_cubecl(&device)
    {
        by_extension(glimpse_keys, glimpse_values, logit_keys)
    } else {
        op_by_op(glimpse_keys, glimpse_values, logit_keys)
    }
}

/// [`keys_by_feature`] in Burn's tensor operations.
fn op_by_op(
    glimpse_keys: &Tensor<4>,
    glimpse_values: &Tensor<4>,
    logit_keys: &Tensor<3>,
) -> Tensor<3> {
    let [b, n, heads, dk] = glimpse_keys.dims();
    let d = heads * dk;
    let node_major = Tensor::cat(
        vec![
            glimpse_keys.clone().reshape([b, n, d]),
            logit_keys.clone(),
            glimpse_values.clone().reshape([b, n, d]),
        ],
        2,
    )
    .detach(); // [B, N, 3d]
    let by_feature = node_major.swap_dims(1, 2); // [B, 3d, N]
    let padding = n.div_ceil(8) * 8 - n;
    let zeros = Tensor::zeros([b, 3 * d, padding], &glimpse_keys.device());
    // `cat` writes a new contiguous tensor, even with nothing to append.
    Tensor::cat(vec![by_feature, zeros], 2) // [B, 3d, Np]
}

/// [`keys_by_feature`] as the backend's own operation (flex's and CubeCL's). The parts
/// may be strided views: the CubeCL kernel reads them through their strides.
#[cfg(any(feature = "flex", feature = "cube"))]
fn by_extension(
    glimpse_keys: &Tensor<4>,
    glimpse_values: &Tensor<4>,
    logit_keys: &Tensor<3>,
) -> Tensor<3> {
    use burn::backend::Dispatch;
    let [b, n, heads, dk] = glimpse_keys.dims();
    let node_major = |t: Tensor<4>| t.reshape([b, n, heads * dk]).into_dispatch();
    let out = <Dispatch as KeysByFeatureBackend>::keys_by_feature(
        node_major(glimpse_keys.clone()),
        logit_keys.clone().into_dispatch(),
        node_major(glimpse_values.clone()),
    );
    Tensor::from_dispatch(out)
}

#[cfg(not(any(feature = "flex", feature = "cube")))]
fn by_extension(_: &Tensor<4>, _: &Tensor<4>, _: &Tensor<3>) -> Tensor<3> {
    unreachable!("no backend with its own keys by feature is compiled in")
}

#[cfg(any(feature = "flex", feature = "cube"))]
use extension::KeysByFeatureBackend;

#[cfg(any(feature = "flex", feature = "cube"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;
    #[allow(unused_imports)] // in the Fusion metadata
    use burn::tensor::Shape;

    /// [`super::keys_by_feature`] as a backend operation, untracked.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Flex: cfg(feature = "flex"),
        Cube: cfg(feature = "cube"),
        Fusion: cfg(feature = "cube")
    )]
    pub trait KeysByFeatureBackend: burn::backend::Backend {
        /// Three node-major `[B, N, d]` parts → `[B, 3d, Np]`, the parts in this order.
        #[fusion(dtype = second, shape = Shape::new([second[0], 3 * second[2], second[1].div_ceil(8) * 8]))]
        fn keys_by_feature(
            first: FloatTensor<Self>,
            second: FloatTensor<Self>,
            third: FloatTensor<Self>,
        ) -> FloatTensor<Self>;
    }

    /// Untracked on any backend that has it: the keys by feature are read detached (the
    /// step gives its gradients to the node-major parts).
    #[cfg(feature = "autodiff")]
    impl<B, C> KeysByFeatureBackend for burn::backend::autodiff::Autodiff<B, C>
    where
        B: KeysByFeatureBackend,
        C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy,
    {
        fn keys_by_feature(
            first: FloatTensor<Self>,
            second: FloatTensor<Self>,
            third: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            use burn::backend::AutodiffBackend;
            let [first, second, third] = [first, second, third].map(|t| t.into_primitive());
            <Self as AutodiffBackend>::from_inner(B::keys_by_feature(first, second, third))
        }
    }
}

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::Flex;
    use burn_flex::FlexTensor;
    use rayon::prelude::*;

    use super::KeysByFeatureBackend;
    use crate::ops::row_kernels::{floats, padded, tensor};

    /// Each instance's parts transposed side by side: `out[b, p·d + f, j] = parts[p][b, j, f]`.
    fn by_feature(parts: [&FlexTensor; 3]) -> FlexTensor {
        let shape = parts[0].layout().shape();
        let (b, n, d) = (shape[0], shape[1], shape[2]);
        let np = padded(n);
        let parts = parts.map(floats);
        let mut out = vec![0.0f32; b * 3 * d * np];
        out.par_chunks_mut((3 * d * np).max(1))
            .enumerate()
            .for_each(|(instance, out)| {
                for (p, part) in parts.iter().enumerate() {
                    let out = &mut out[p * d * np..];
                    let rows = part[instance * n * d..][..n * d].chunks_exact(d);
                    for (j, row) in rows.enumerate() {
                        for (f, &x) in row.iter().enumerate() {
                            out[f * np + j] = x;
                        }
                    }
                }
            });
        tensor(out, [b, 3 * d, np])
    }

    impl KeysByFeatureBackend for Flex {
        fn keys_by_feature(
            first: FloatTensor<Self>,
            second: FloatTensor<Self>,
            third: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            let parts = [first, second, third].map(|t| t.to_contiguous());
            by_feature([&parts[0], &parts[1], &parts[2]])
        }
    }
}

#[cfg(feature = "cube")]
mod cube_impl {
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::Shape;
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::calculate_cube_count_elemwise;
    use burn_cubecl::cubecl::prelude::*;
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    use burn_cubecl::CubeBackend;

    use super::KeysByFeatureBackend;
    use crate::runtime::cube_launch::{address_type, cube_dim};

    /// Units per cube: one output element each.
    const UNITS: u32 = 256;

    impl KeysByFeatureBackend for CubeBackend {
        fn keys_by_feature(
            first: FloatTensor<Self>,
            second: FloatTensor<Self>,
            third: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            let [b, n, d] = second.meta.shape().dims::<3>();
            let np = n.div_ceil(8) * 8;
            let (client, device) = (second.client.clone(), second.device.clone());
            let out = empty_device_contiguous_dtype(
                client.clone(),
                device,
                Shape::new([b, 3 * d, np]),
                second.dtype,
            );
            let elements = b * 3 * d * np;
            let cubes = cube_dim(&client, UNITS);
            let addresses = address_type([&first, &second, &third, &out]);
            by_feature_kernel::launch(
                &client,
                calculate_cube_count_elemwise(&client, elements, cubes),
                cubes,
                addresses,
                first.into_tensor_arg(),
                second.into_tensor_arg(),
                third.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                elements,
                n as u32,
                d as u32,
                np as u32,
                dtype_to_storage_type(out.dtype),
            );
            out
        }
    }

    /// `out[b, p·d + f, j]` = part p's `[b, j, f]` (read through its strides), 0 for the
    /// padding nodes j ≥ n: one unit per element of the contiguous output.
    #[cube(launch, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn by_feature_kernel<F: Float>(
        first: &Tensor<F>,
        second: &Tensor<F>,
        third: &Tensor<F>,
        out: &mut Tensor<F>,
        elements: usize,
        nodes: u32,
        features: u32,
        padded_nodes: u32,
        #[define(F)] _dtype: ElemType,
    ) {
        let at = ABSOLUTE_POS;
        if at < elements {
            let (features, padded_nodes) = (features as usize, padded_nodes as usize);
            let j = at % padded_nodes;
            let row = at / padded_nodes;
            let feature = row % (3 * features);
            let instance = row / (3 * features);
            let part = feature / features;
            let f = feature % features;
            let mut value = F::new(0.0);
            if j < nodes as usize {
                if part == 0 {
                    value = first
                        [instance * first.stride(0) + j * first.stride(1) + f * first.stride(2)];
                } else if part == 1 {
                    value = second
                        [instance * second.stride(0) + j * second.stride(1) + f * second.stride(2)];
                } else {
                    value = third
                        [instance * third.stride(0) + j * third.stride(1) + f * third.stride(2)];
                }
            }
            out[at] = value;
        }
    }
}

#[cfg(test)]
mod tests {
    // The fused kernels' tests and their helpers exist where a fused kernel does (flex,
    // CubeCL); an ndarray-only build compiles the rest.
    #![cfg_attr(not(any(feature = "flex", feature = "cpu")), allow(dead_code))]

    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::runtime::backend::Backend;
    use crate::test_support::{pseudo_random, read};

    /// Both forms of [`keys_by_feature`] (the dispatching one and the tensor-operation
    /// one), each as a flat vector.
    fn both_forms(keys: &Tensor<4>, values: &Tensor<4>, logit_keys: &Tensor<3>) -> [Vec<f32>; 2] {
        [
            read(keys_by_feature(keys, values, logit_keys)),
            read(op_by_op(keys, values, logit_keys)),
        ]
    }

    fn default_device() -> Device {
        Backend::first_on_host().unwrap().device().unwrap()
    }

    /// One instance, 3 nodes, 2 heads of 1 feature (d = 2): each part's features by node,
    /// padded with zeros to 8 nodes, written out by hand.
    #[test]
    fn keys_by_feature_is_each_part_by_feature_zero_padded() {
        let device = default_device();
        let node_major = |values: [f32; 6]| TensorData::new(values.to_vec(), [1, 3, 2]);
        let keys = Tensor::<3>::from_data(node_major([1., 2., 3., 4., 5., 6.]), &device);
        let logit_keys = Tensor::<3>::from_data(node_major([7., 8., 9., 10., 11., 12.]), &device);
        let values = Tensor::<3>::from_data(node_major([-1., -2., -3., -4., -5., -6.]), &device);
        let (keys, values) = (keys.reshape([1, 3, 2, 1]), values.reshape([1, 3, 2, 1]));
        assert_eq!(
            keys_by_feature(&keys, &values, &logit_keys).dims(),
            [1, 6, 8]
        );
        let pad = |a: f32, b: f32, c: f32| [a, b, c, 0., 0., 0., 0., 0.];
        let expected: Vec<f32> = [
            pad(1., 3., 5.),
            pad(2., 4., 6.),
            pad(7., 9., 11.),
            pad(8., 10., 12.),
            pad(-1., -3., -5.),
            pad(-2., -4., -6.),
        ]
        .concat();
        for form in both_forms(&keys, &values, &logit_keys) {
            assert_eq!(form, expected);
        }
    }

    /// A whole number of 8-node vectors: nothing to pad (a zero-width `cat`).
    #[test]
    fn keys_by_feature_without_padding() {
        let device = default_device();
        let part = |offset: f32| {
            let values: Vec<f32> = (0..8).map(|i| offset + i as f32).collect();
            Tensor::<3>::from_data(TensorData::new(values, [1, 8, 1]), &device)
        };
        let (keys, values) = (
            part(0.0).reshape([1, 8, 1, 1]),
            part(20.0).reshape([1, 8, 1, 1]),
        );
        let expected: Vec<f32> = [0.0f32, 10.0, 20.0]
            .iter()
            .flat_map(|&offset| (0..8).map(move |i| offset + i as f32))
            .collect();
        for form in both_forms(&keys, &values, &part(10.0)) {
            assert_eq!(form, expected);
        }
    }

    /// The backend's form is the tensor-operation form, value for value, on the shipped
    /// models' sizes and odd ones, with and without autodiff, with strided inputs (slices
    /// of the node projection, one of them at an offset).
    fn assert_matches_the_tensor_operations(device: &Device) {
        for device in [device.clone(), device.clone().autodiff()] {
            for [b, n, heads, dk] in [[3, 11, 8, 16], [2, 101, 8, 16], [4, 5, 2, 3], [1, 1, 1, 1]] {
                let d = heads * dk;
                let random = |seed| {
                    let data = TensorData::new(pseudo_random(b * n * d, seed, 1.0), [b, n, d]);
                    Tensor::<3>::from_data(data, &device)
                };
                let projected = Tensor::cat(vec![random(2), random(3), random(1)], 2); // [B, N, 3d]
                let keys = projected.clone().slice_dim(2, d..2 * d);
                let values = projected.slice_dim(2, 0..d);
                let [keys, values] = [keys, values].map(|t| t.reshape([b, n, heads, dk]));
                let [ours, reference] = both_forms(&keys, &values, &random(4));
                assert!(reference.iter().any(|&x| x != 0.0));
                assert_eq!(ours, reference, "[{b}, {n}, {heads}, {dk}]");
            }
        }
    }

    #[cfg(feature = "flex")]
    #[test]
    fn keys_by_feature_on_flex_matches_the_tensor_operations() {
        let device = default_device();
        assert!(crate::runtime::device::runs_on_flex(&device));
        assert_matches_the_tensor_operations(&device);
    }

    #[cfg(feature = "cpu")]
    crate::runtime::testing::test_with_64_bit_offsets!(
        cube_keys_by_feature_matches_the_tensor_operations
    );

    /// The CubeCL kernel, on CubeCL's CPU runtime.
    #[cfg(feature = "cpu")]
    #[test]
    fn cube_keys_by_feature_matches_the_tensor_operations() {
        let _alone = crate::runtime::testing::one_cube_test_at_a_time();
        assert_matches_the_tensor_operations(&Backend::Cpu.device().unwrap());
    }
}
