//! Burn's device graphs (CUDA graphs) on a whole decode: [`RecordedDecode`], a greedy
//! decode recorded once and replayed on each next batch of the same size (`routeburn eval
//! --graph`), and [`probe`], a developer's check of whether a decode records, what a replay
//! saves and whether it gives the same tours (`eval --graph-probe`, run by `gpu-check`).
//!
//! Both record through `crate::runtime::device_graph`, which reports a refusal with its
//! reason. A replay reads and writes the buffers the recording used, so the next batch is
//! written into the recorded input buffer in place.

use std::time::Instant;

use burn::backend::{Backend as _, BackendGraph, Dispatch};
use burn::tensor::{Device, Int, Tensor};

use routeburn_data::Batch;

use crate::model::decode::{DecodeOptions, DecodeOutput, Policy};
use crate::model::problem::DeviceBatch;
use crate::runtime::device_graph::{record, write_in_place, DeviceGraphError};

/// A decode recorded as a device graph: each [`replay`](Self::replay) decodes another batch
/// of the recorded one's size, written into the recorded inputs, as one launch.
pub struct RecordedDecode<P: Policy> {
    /// The model whose parameters the graph reads: a copy, sharing their buffers, kept
    /// for as long as the graph.
    _policy: P,
    graph: BackendGraph<Dispatch>,
    /// The buffer the recorded decode read its coordinates, demands and capacities from.
    inputs: Tensor<1>,
    /// The recorded decode's outputs, which each replay overwrites.
    output: DecodeOutput,
    batch_size: usize,
    n: usize,
}

impl<P: Policy + Clone> RecordedDecode<P> {
    /// Records `policy`'s decode of `batch` (greedy or multi-start; no sampling noise) on
    /// `device` and returns it with the recorded decode's `[R, T]` actions, the batch's
    /// tours. Where the backend has no device graphs (every CPU backend), the reason.
    pub fn record(
        policy: &P,
        batch: &Batch,
        options: &DecodeOptions,
        device: &Device,
    ) -> Result<(Self, Tensor<2, Int>), DeviceGraphError> {
        let inputs = DeviceBatch::upload_flat(batch, device);
        // The views into `inputs` are made inside the recorded decode, so that the graph
        // reads the buffer itself, which each replay's batch overwrites.
        let decode = || policy.decode(&DeviceBatch::from_flat(&inputs, batch), options);
        let (graph, output) = record(device, decode)?;
        let policy = policy.clone();
        // A recording launches nothing: the first replay decodes the recorded batch,
        // whose values `inputs` already holds.
        // SAFETY: as in `replay`; every buffer the graph uses is alive (the parameters,
        // `inputs`, `output`, the pinned intermediates).
        unsafe { Dispatch::graph_replay(device.as_dispatch(), &graph) }
            .map_err(|e| DeviceGraphError::backend("replaying the graph", e))?;
        let actions = output.actions.clone();
        let recorded = Self {
            _policy: policy,
            graph,
            inputs,
            output,
            batch_size: batch.size,
            n: batch.n,
        };
        Ok((recorded, actions))
    }

    /// Whether `batch` has the recorded one's size and n, which a replay decodes.
    pub fn fits(&self, batch: &Batch) -> bool {
        (batch.size, batch.n) == (self.batch_size, self.n)
    }

    /// Decodes `batch` (as many instances of the same n as the recorded one) by writing it
    /// into the recorded inputs and replaying the graph; its `[R, T]` actions, which the
    /// next replay overwrites: read them first.
    pub fn replay(&self, batch: &Batch) -> Result<Tensor<2, Int>, DeviceGraphError> {
        if !self.fits(batch) {
            return Err(DeviceGraphError::OtherBatch {
                size: batch.size,
                n: batch.n,
                recorded_size: self.batch_size,
                recorded_n: self.n,
            });
        }
        let device = self.inputs.device();
        let dispatch = device.as_dispatch();
        let written = write_in_place(&self.inputs, DeviceBatch::instance_values(batch))?;
        // No host wait between the write and the replay: the replay first drains the
        // queued operations (the write among them) onto the stream it launches on, so the
        // write runs before it. `written` (the same buffer) is kept until then: fusion
        // drops queued work whose outputs are dropped before it runs.
        // SAFETY: every buffer the recorded decode read or wrote is alive while `self` is:
        // the model's parameters (held by the copy in `_policy`), the inputs (`inputs`), the
        // outputs (`output`), and the intermediates (the views among them), which
        // `graph_prepare` pinned in the persistent pool. The write above and the caller's
        // read of the actions are on the same stream, ordered around the replay.
        let replayed = unsafe { Dispatch::graph_replay(dispatch, &self.graph) };
        drop(written);
        replayed.map_err(|e| DeviceGraphError::backend("replaying the graph", e))?;
        Ok(self.output.actions.clone())
    }
}

/// What [`probe`] found.
#[derive(Debug, Clone)]
pub struct GraphProbe {
    /// Why the decode does not replay as a device graph; `None` when it does.
    pub refused: Option<String>,
    /// Each eager decode, tours read back to the host included.
    pub eager_seconds: Vec<f64>,
    /// Each replay, tours read back included (empty when refused).
    pub replay_seconds: Vec<f64>,
    /// Replays whose tours differ from the first eager decode's.
    pub replays_differing: usize,
}

/// Decodes `problem` eagerly `runs` times, then records one decode as a device graph and
/// replays it `runs` times, timing each and comparing the replays' tours with the eager
/// ones. On a backend without device graphs (flex, ndarray, CubeCL's CPU runtime) the
/// recording is refused and the reason reported.
pub fn probe(
    policy: &impl Policy,
    problem: &DeviceBatch,
    options: &DecodeOptions,
    runs: usize,
) -> GraphProbe {
    let device = problem.coords.device();
    let decode = || policy.decode(problem, options);
    let mut eager_seconds = Vec::with_capacity(runs);
    let mut eager_tours = None;
    for _ in 0..runs.max(1) {
        let clock = Instant::now();
        let tours = read_tours(decode().actions);
        eager_seconds.push(clock.elapsed().as_secs_f64());
        eager_tours.get_or_insert(tours);
    }
    let mut found = GraphProbe {
        refused: None,
        eager_seconds,
        replay_seconds: Vec::new(),
        replays_differing: 0,
    };
    let (graph, recorded) = match record(&device, decode) {
        Ok(recorded) => recorded,
        Err(why) => {
            found.refused = Some(why.to_string());
            return found;
        }
    };
    for _ in 0..runs.max(1) {
        let clock = Instant::now();
        // SAFETY: every buffer the recorded decode read or wrote is alive until the graph
        // is dropped at the end of this function: the model's parameters (borrowed by
        // `policy`), the batch (borrowed), the recorded output (`recorded`), and the
        // intermediates, which `graph_prepare` pinned in the persistent pool. Nothing else
        // runs on the device meanwhile, and the read below is on the same stream.
        let replayed = unsafe { Dispatch::graph_replay(device.as_dispatch(), &graph) };
        if let Err(e) = replayed {
            found.refused = Some(DeviceGraphError::backend("replaying the graph", e).to_string());
            return found;
        }
        let tours = read_tours(recorded.actions.clone());
        found.replay_seconds.push(clock.elapsed().as_secs_f64());
        if Some(&tours) != eager_tours.as_ref() {
            found.replays_differing += 1;
        }
    }
    found
}

/// `[R, T]` tours, read back to the host.
fn read_tours(actions: Tensor<2, Int>) -> Vec<i64> {
    actions
        .into_data()
        .try_into_vec_as::<i64>()
        .expect("int tensor data converts to i64")
}

#[cfg(test)]
mod tests {
    use routeburn_data::{Batch, Generator, InstanceRng};

    use super::*;
    use crate::model::small_model;
    use crate::runtime::backend::Backend;

    /// Two batches of 4 CVRP10 instances.
    fn two_batches() -> (Batch, Batch) {
        let generator = Generator::uniform(10);
        let mut rng = InstanceRng::new(11);
        let first = generator.sample_batch(&mut rng, 4);
        (first, generator.sample_batch(&mut rng, 4))
    }

    /// The CPU backends have no device graphs: recording says why, and nothing is written.
    #[test]
    fn recording_is_refused_with_the_reason_where_there_are_no_device_graphs() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let model = small_model(&device);
        let (first, _) = two_batches();
        let refused = RecordedDecode::record(&model, &first, &DecodeOptions::greedy(), &device)
            .err()
            .expect("no device graph on a CPU backend");
        assert!(
            matches!(
                refused,
                DeviceGraphError::Backend {
                    step: "opening the capture",
                    ..
                }
            ),
            "{refused}"
        );
        let inputs = DeviceBatch::upload_flat(&first, &device);
        let values = DeviceBatch::instance_values(&first);
        if !crate::runtime::device::runs_through_cubecl(&device) {
            assert!(write_in_place(&inputs, values).is_err());
        }
    }

    /// On CubeCL's CPU runtime: the second batch written into the first's input buffer is
    /// what a decode from that buffer then reads: it gives the second batch's own tours (a
    /// fresh upload's), which differ from the first's.
    #[test]
    fn cube_write_in_place_refreshes_a_decodes_inputs() {
        let Some(device) = crate::runtime::testing::device_of(Backend::Cpu) else {
            return;
        };
        let _alone = crate::runtime::testing::one_cube_test_at_a_time();
        let model = small_model(&device);
        let options = DecodeOptions::greedy();
        let tours = |problem: &DeviceBatch| read_tours(model.decode(problem, &options).actions);
        let (first, second) = two_batches();
        let inputs = DeviceBatch::upload_flat(&first, &device);
        let first_tours = tours(&DeviceBatch::from_flat(&inputs, &first));
        assert_eq!(
            first_tours,
            tours(&DeviceBatch::upload(&first, None, &device))
        );
        let values = DeviceBatch::instance_values(&second);
        let written = write_in_place(&inputs, values.clone()).unwrap();
        Dispatch::sync(device.as_dispatch()).unwrap();
        drop(written);
        let buffer = inputs.clone().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(buffer, values);
        let refreshed = tours(&DeviceBatch::from_flat(&inputs, &second));
        assert_eq!(
            refreshed,
            tours(&DeviceBatch::upload(&second, None, &device))
        );
        assert_ne!(refreshed, first_tours);
        assert!(write_in_place(&inputs, vec![0.0; 3]).is_err());
    }
}
