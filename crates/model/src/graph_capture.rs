//! A probe of Burn's device graphs (CUDA graphs) on a whole decode: does a decode record as
//! one graph, how long does a replay take against the eager decode, and do the two give the
//! same tours? A developer's tool (`routeburn eval --graph-probe`, run by `gpu-check`);
//! evaluation itself does not capture.
//!
//! It takes `burn::tensor::capture`'s steps (prepare, three warm-up decodes, the recorded
//! one), but calls the backend for each itself: `capture` folds a refusal into a silent
//! fallback (re-running the closure), and the probe's point is to say why a decode does not
//! record. Every replay reads the inputs the recorded decode read. An evaluation would have
//! to refresh them in place between replays (the graph holds raw device pointers), which is
//! cubecl's `ComputeClient::write` on the tensors' handles: Burn 0.22.1 has no tensor
//! operation that writes into an existing buffer.

use std::time::Instant;

use burn::backend::{Backend as _, BackendGraph, Dispatch};
use burn::tensor::{Device, Int, Tensor};

use crate::decode::{DecodeOptions, DecodeOutput, Policy};
use crate::problem::DeviceBatch;

/// Warm-up decodes before the recorded one: Burn's own `capture` runs three, since fusion
/// takes a different path (and allocates other buffers) the first time it sees a stream.
const WARM_UP_DECODES: usize = 3;

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
            found.refused = Some(why);
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
            found.refused = Some(reason("replaying the graph", e));
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

/// Records one decode as a device graph, with its output tensors; the backend's error at
/// the step that failed otherwise.
fn record(
    device: &Device,
    decode: impl Fn() -> DecodeOutput,
) -> Result<(BackendGraph<Dispatch>, DecodeOutput), String> {
    let dispatch = device.as_dispatch();
    Dispatch::graph_prepare(dispatch).map_err(|e| reason("preparing the pools", e))?;
    for _ in 0..WARM_UP_DECODES {
        // Kept until the sync: fusion drops work whose output is dropped before it runs.
        let warm_up = decode();
        Dispatch::sync(dispatch).map_err(|e| reason("a warm-up decode", e))?;
        drop(warm_up);
    }
    Dispatch::graph_start_capture(dispatch).map_err(|e| reason("opening the capture", e))?;
    let recorded = decode();
    let graph = Dispatch::graph_stop_capture(dispatch)
        .map_err(|e| reason("closing the capture of a decode", e))?;
    Ok((graph, recorded))
}

/// The step that failed and the backend's error, on one line.
fn reason(step: &str, error: impl std::fmt::Display) -> String {
    let lines: Vec<String> = (error.to_string().lines())
        .map(|line| line.trim().to_string())
        .filter(|line| !line.is_empty())
        .collect();
    format!("{step}: {}", lines.join(" "))
}

/// `[R, T]` tours, read back to the host.
fn read_tours(actions: Tensor<2, Int>) -> Vec<i64> {
    actions
        .into_data()
        .try_into_vec_as::<i64>()
        .expect("int tensor data converts to i64")
}
