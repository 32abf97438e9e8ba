//! The LSTM pointer network (Vinyals, Fortunato & Jaitly 2015, "Pointer Networks"), for CVRP
//! as in Nazari et al. (2018): an LSTM reads the nodes, an LSTM decoder emits one node per
//! step, and additive attention over the encoder's outputs points at the next node. It is
//! trained supervised, by teacher forcing on solver labels; decodes use the same CVRP
//! state, masks and step loop as the attention model.
//!
//! # Node features (`NODE_FEATURES` = 8)
//! | # | feature | encoder input | decoder input (the node the vehicle stands at) |
//! |---|---|---|---|
//! | 0, 1 | x, y | | |
//! | 2 | demand / capacity | | |
//! | 3 | is_depot | | |
//! | 4 | is_visited | 0 | 1 at a customer, 0 at the depot |
//! | 5 | remaining capacity / capacity | 1 | after arriving |
//! | 6 | distance to the depot | | |
//! | 7 | polar angle around the depot / π | | |
//!
//! Features 6 and 7 are what the canonical label order (a counterclockwise sweep around the
//! depot, see `routeburn_data::canonical`) is defined by, so the network need not learn
//! them from x and y.
//!
//! # Layers
//! Encoder and decoder are stacks of Burn's single-layer `Lstm` with dropout between layers
//! (PyTorch's `nn.LSTM(num_layers, dropout)` semantics); the decoder starts from the
//! encoder's final states. Pointer scores are u_j = v·tanh(W_ref e_j + W_q h_t), clipped to
//! C·tanh(u_j) (Bello et al. 2017), masked, then log-softmax.
//!
//! # Teacher forcing
//! In training the CVRP state always follows the target tour, so every target is feasible
//! and its log-probability finite. At each step a host-side coin decides the decoder's
//! input: the previous target (teacher forcing), or the node the network itself rated most
//! likely at the previous step (scheduled sampling, with the state's dynamic features).

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Lstm, LstmConfig, LstmState};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Device, Int, Tensor};

use crate::model::decode::{repeat_rows, rollout, DecodeOptions, DecodeOutput, Policy};
use crate::model::problem::DeviceBatch;
use crate::model::state::{CvrpState, LoadArithmetic};
use crate::ops::linear::per_node;
use crate::ops::matmul::MatmulPrecision;

/// Features per node; see the module docs for the list.
pub const NODE_FEATURES: usize = 8;

#[derive(Config, Debug)]
pub struct PointerNetworkConfig {
    /// LSTM hidden size (encoder, decoder and attention).
    #[config(default = 256)]
    pub hidden_dim: usize,
    /// Stacked LSTM layers in the encoder and in the decoder.
    #[config(default = 2)]
    pub num_layers: usize,
    /// Dropout between stacked LSTM layers (training only).
    #[config(default = 0.2)]
    pub dropout: f64,
    /// C in the score clipping C·tanh(·); 0 turns clipping off.
    #[config(default = 10.0)]
    pub tanh_clipping: f64,
}

impl PointerNetworkConfig {
    pub fn init(&self, device: &Device) -> PointerNetwork {
        let h = self.hidden_dim;
        PointerNetwork {
            encoder: StackedLstmConfig::new(NODE_FEATURES, h, self.num_layers, self.dropout)
                .init(device),
            decoder: StackedLstmConfig::new(NODE_FEATURES, h, self.num_layers, self.dropout)
                .init(device),
            project_reference: LinearConfig::new(h, h).with_bias(false).init(device),
            project_query: LinearConfig::new(h, h).init(device),
            score: LinearConfig::new(h, 1).with_bias(false).init(device),
            tanh_clipping: self.tanh_clipping,
        }
    }
}

#[derive(Config, Debug)]
pub struct StackedLstmConfig {
    pub d_input: usize,
    pub d_hidden: usize,
    pub num_layers: usize,
    pub dropout: f64,
}

impl StackedLstmConfig {
    pub fn init(&self, device: &Device) -> StackedLstm {
        StackedLstm {
            layers: (0..self.num_layers.max(1))
                .map(|l| {
                    let d_in = if l == 0 { self.d_input } else { self.d_hidden };
                    LstmConfig::new(d_in, self.d_hidden, true).init(device)
                })
                .collect(),
            dropout: DropoutConfig::new(self.dropout).init(),
        }
    }
}

/// LSTM layers on top of each other, with dropout on the outputs of all but the last.
#[derive(Module, Debug)]
pub struct StackedLstm {
    layers: Vec<Lstm>,
    dropout: Dropout,
}

impl StackedLstm {
    /// # Shapes
    /// - `input`: `[B, L, d_in]`, `states`: one `[B, H]` pair per layer (zeros when `None`)
    /// - output: `[B, L, H]` from the last layer, and each layer's final state
    pub fn forward(
        &self,
        input: Tensor<3>,
        states: Option<Vec<LstmState<2>>>,
    ) -> (Tensor<3>, Vec<LstmState<2>>) {
        let mut states = states.map(Vec::into_iter);
        let mut x = input;
        let mut finals = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            let initial = states.as_mut().and_then(Iterator::next);
            let (out, state) = layer.forward(x, initial);
            finals.push(state);
            x = if l + 1 < self.layers.len() {
                self.dropout.forward(out)
            } else {
                out
            };
        }
        (x, finals)
    }
}

#[derive(Module, Debug)]
pub struct PointerNetwork {
    encoder: StackedLstm,
    decoder: StackedLstm,
    /// W_ref: encoder outputs → attention space.
    project_reference: Linear,
    /// W_q: decoder output → attention space.
    project_query: Linear,
    /// v: attention space → one score per node.
    score: Linear,
    tanh_clipping: f64,
}

/// What the decoder reuses at every step of one batch.
struct Encoded {
    /// `[R, N, 6]` the node features that do not change during a decode (0–3, 6, 7).
    static_features: Tensor<3>,
    /// `[R, N, H]` W_ref applied to the encoder outputs.
    reference: Tensor<3>,
}

impl PointerNetwork {
    /// Encodes the batch and decodes a full solution for every instance (or, with
    /// multi-start, one per instance and first customer), like the attention model.
    ///
    /// # Shapes
    /// - output `actions`: `[R, T]`, `log_likelihood`: `[R]`, R = B × rows per instance
    pub fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        let n = problem.num_nodes() - 1;
        let starts = options.rows_per_instance(n);
        let (encoded, encoder_states) = self.encode(problem);
        let encoded = Encoded {
            static_features: repeat_rows(encoded.static_features, starts),
            reference: repeat_rows(encoded.reference, starts),
        };
        let mut decoder_states = Some(
            encoder_states
                .into_iter()
                .map(|s| LstmState::new(repeat_rows(s.cell, starts), repeat_rows(s.hidden, starts)))
                .collect::<Vec<_>>(),
        );
        let temperature = options.temperature();
        rollout(problem, options, LoadArithmetic::Exact, None, |state| {
            let input = decoder_input(&encoded.static_features, state, state.last_node());
            let (log_p, states) =
                self.step_log_probs(&encoded, input, state, decoder_states.take(), temperature);
            decoder_states = Some(states);
            log_p
        })
    }

    /// Log-probabilities of every node at every step of the target tours, with the CVRP
    /// state following the targets. `teacher[t]` says whether step t's decoder input is
    /// the previous target (true) or the network's own previous choice (false); step 0
    /// always starts at the depot.
    ///
    /// # Shapes
    /// - `targets`: `[B, T]` node indices (the action grammar of the decoders), `teacher`:
    ///   T flags
    /// - output: `[B, T, N]`, −∞ at nodes the mask forbids
    pub fn teacher_forced(
        &self,
        problem: &DeviceBatch,
        targets: Tensor<2, Int>,
        teacher: &[bool],
    ) -> Tensor<3> {
        let [b, steps] = targets.dims();
        assert_eq!(teacher.len(), steps, "one teacher-forcing flag per step");
        let (encoded, encoder_states) = self.encode(problem);
        let mut states = Some(encoder_states);
        let mut state = CvrpState::new(problem.demands.clone(), problem.capacity.clone());
        let mut all_log_p = Vec::with_capacity(steps);
        let mut previous_choice: Option<Tensor<2, Int>> = None;
        for (t, &forced) in teacher.iter().enumerate() {
            let input_node = match (&previous_choice, forced) {
                (Some(choice), false) => choice.clone(),
                _ => state.last_node(),
            }; // [B, 1]
            let input = decoder_input(&encoded.static_features, &state, input_node);
            let (log_p, next) = self.step_log_probs(&encoded, input, &state, states.take(), 1.0);
            states = Some(next);
            // Only a step fed the network's own choice needs it: no argmax otherwise.
            previous_choice = (teacher.get(t + 1) == Some(&false)).then(|| log_p.clone().argmax(1));
            let [_, n] = log_p.dims();
            all_log_p.push(log_p.reshape([b, 1, n]));
            state.step(targets.clone().slice_dim(1, t..t + 1));
        }
        Tensor::cat(all_log_p, 1) // [B, T, N]
    }

    /// Runs the encoder over the nodes in index order (depot first).
    fn encode(&self, problem: &DeviceBatch) -> (Encoded, Vec<LstmState<2>>) {
        let [b, n, _] = problem.coords.dims();
        let device = problem.coords.device();
        let static_features = static_features(problem); // [B, N, 6]
        let dynamic = Tensor::cat(
            vec![
                Tensor::<3>::zeros([b, n, 1], &device), // nothing visited yet
                Tensor::<3>::ones([b, n, 1], &device),  // full vehicle
            ],
            2,
        ); // [B, N, 2]
        let (outputs, states) = self
            .encoder
            .forward(assemble(static_features.clone(), dynamic), None); // [B, N, H]
        let reference = per_node(&self.project_reference, outputs, MatmulPrecision::High); // [B, N, H]
        (
            Encoded {
                static_features,
                reference,
            },
            states,
        )
    }

    /// One decoder step: the LSTM on `input`, additive attention over the nodes.
    ///
    /// # Shapes
    /// - `input`: `[R, 1, 8]` → log-probabilities `[R, N]` and the new LSTM states
    fn step_log_probs(
        &self,
        encoded: &Encoded,
        input: Tensor<3>,
        state: &CvrpState,
        lstm_states: Option<Vec<LstmState<2>>>,
        temperature: f64,
    ) -> (Tensor<2>, Vec<LstmState<2>>) {
        let [r, n, h] = encoded.reference.dims();
        let (output, lstm_states) = self.decoder.forward(input, lstm_states); // [R, 1, H]
        let query = self.project_query.forward(output); // [R, 1, H]
        let hidden = tanh_by_exp(encoded.reference.clone() + query.expand([r, n, h])); // [R, N, H]
        let mut scores = per_node(&self.score, hidden, MatmulPrecision::High).reshape([r, n]); // [R, N]
        if self.tanh_clipping > 0.0 {
            scores = scores.tanh() * self.tanh_clipping;
        }
        if temperature != 1.0 {
            scores = scores / temperature;
        }
        let log_p = log_softmax(scores.mask_fill(state.mask(), f32::NEG_INFINITY), 1);
        (log_p, lstm_states)
    }
}

/// tanh(x) = 1 − 2 / (e^{2x} + 1), on x clamped to ±15 (where tanh is 1 to f32 precision,
/// and e^{2x} cannot overflow into a NaN gradient).
///
/// burn-flex evaluates `tanh` with glibc's scalar `tanhf`, and evaluates it again in the
/// backward; over the attention's `[R, N, H]` at every step that was a third of a
/// pointer-network epoch, and `exp` costs a fraction of `tanhf`.
fn tanh_by_exp<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let e = (x.clamp(-15.0, 15.0) * 2.0).exp();
    (e + 1.0).recip().mul_scalar(-2.0).add_scalar(1.0)
}

/// The masked negative log-likelihood of target pointers, averaged over every target
/// position inside its tour's true length (padding after it counts for nothing).
///
/// # Shapes
/// - `pointer_log_probs`: `[B, T, N]`, `targets`: `[B, T]`, `valid`: `[B, T]` (true inside
///   the true length) → `[1]`
pub fn pointer_network_loss(
    pointer_log_probs: Tensor<3>,
    targets: Tensor<2, Int>,
    valid: Tensor<2, Bool>,
) -> Tensor<1> {
    let count = valid.clone().int().sum().float(); // [1]
    pointer_network_nll_sum(pointer_log_probs, targets, valid) / count
}

/// The negative log-likelihood of the valid target positions, summed (not averaged): a
/// shard of a batch divides it by the whole batch's count of targets.
///
/// # Shapes
/// - `pointer_log_probs`: `[B, T, N]`, `targets`, `valid`: `[B, T]` → `[1]`
pub fn pointer_network_nll_sum(
    pointer_log_probs: Tensor<3>,
    targets: Tensor<2, Int>,
    valid: Tensor<2, Bool>,
) -> Tensor<1> {
    let [b, t, _] = pointer_log_probs.dims();
    let target_log_p = pointer_log_probs
        .gather(2, targets.reshape([b, t, 1]))
        .reshape([b, t]); // [B, T]

    // mask_fill, not a product: a padded position may hold −∞, and −∞ × 0 is NaN.
    let kept = target_log_p.mask_fill(valid.bool_not(), 0.0); // [B, T]
    -kept.sum()
}

/// Features 0–3, 6 and 7 of every node.
///
/// # Shapes
/// - output: `[B, N, 6]` as x, y, demand/capacity, is_depot, distance, angle/π
fn static_features(problem: &DeviceBatch) -> Tensor<3> {
    let [b, n, _] = problem.coords.dims();
    let device = problem.coords.device();
    let coords = problem.coords.clone(); // [B, N, 2]
    let depot = coords.clone().slice_dim(1, 0..1); // [B, 1, 2]
    let relative = coords.clone() - depot.expand([b, n, 2]); // [B, N, 2]
    let dx = relative.clone().slice_dim(2, 0..1); // [B, N, 1]
    let dy = relative.slice_dim(2, 1..2);
    let distance = (dx.clone().powi_scalar(2) + dy.clone().powi_scalar(2)).sqrt();
    let angle = dy.atan2(dx) / std::f64::consts::PI;
    let demand = problem.demand_fraction().reshape([b, n, 1]);
    let is_depot = Tensor::<1, Int>::arange(0..n as i64, &device)
        .equal_elem(0)
        .float()
        .reshape([1, n, 1])
        .expand([b, n, 1]);
    Tensor::cat(vec![coords, demand, is_depot, distance, angle], 2)
}

/// Puts the static and dynamic features in the documented order.
///
/// # Shapes
/// - `static_features`: `[B, L, 6]`, `dynamic`: `[B, L, 2]` → `[B, L, 8]`
fn assemble(static_features: Tensor<3>, dynamic: Tensor<3>) -> Tensor<3> {
    Tensor::cat(
        vec![
            static_features.clone().slice_dim(2, 0..4),
            dynamic,
            static_features.slice_dim(2, 4..6),
        ],
        2,
    )
}

/// The decoder input: the features of `node` under the current state.
///
/// # Shapes
/// - `static_features`: `[R, N, 6]`, `node`: `[R, 1]` → `[R, 1, 8]`
fn decoder_input(
    static_features: &Tensor<3>,
    state: &CvrpState,
    node: Tensor<2, Int>,
) -> Tensor<3> {
    let [r, _, f] = static_features.dims();
    let gathered = static_features
        .clone()
        .gather(1, node.clone().reshape([r, 1, 1]).expand([r, 1, f])); // [R, 1, 6]
    let is_visited = node.not_equal_elem(0).float().reshape([r, 1, 1]);
    let remaining = state.remaining_capacity_fraction().reshape([r, 1, 1]);
    assemble(gathered, Tensor::cat(vec![is_visited, remaining], 2))
}

impl Policy for PointerNetwork {
    fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        PointerNetwork::decode(self, problem, options)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;
    use crate::runtime::backend::Backend;

    /// Against the standard library's tanh and its derivative 1 − tanh², from −40 to 40
    /// (past the clamp on both sides).
    #[test]
    fn tanh_by_exp_matches_tanh_and_its_gradient() {
        let device = Backend::first_on_host()
            .unwrap()
            .device()
            .unwrap()
            .autodiff();
        let xs: Vec<f32> = (-400..=400).map(|i| i as f32 / 10.0).collect();
        let len = xs.len();
        let x = Tensor::<1>::from_data(TensorData::new(xs.clone(), [len]), &device).require_grad();
        let y = tanh_by_exp(x.clone());
        let grads = y.clone().sum().backward();
        let y: Vec<f32> = y.into_data().try_to_vec().unwrap();
        let dy: Vec<f32> = x.grad(&grads).unwrap().into_data().try_to_vec().unwrap();
        for (i, &v) in xs.iter().enumerate() {
            let t = (v as f64).tanh();
            assert!((y[i] as f64 - t).abs() < 1e-6, "tanh({v}): {} vs {t}", y[i]);
            let d = 1.0 - t * t;
            assert!(
                (dy[i] as f64 - d).abs() < 1e-5,
                "tanh'({v}): {} vs {d}",
                dy[i]
            );
        }
    }
}
