//! Using a trained model: loading it from a run directory and solving batches of instances
//! with greedy, sampling, multi-start and ×8-augmented decodes. Shared by `eval` and
//! `solve`; every solution is validated by the cost crate before it is returned.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor};
use routeburn_cost::{Metric, Solution};
use routeburn_data::{normalize_coords, Batch, Instance, InstanceRng};
use routeburn_model::recorded_decode::RecordedDecode;
use routeburn_model::{
    decode_chunk, decode_in_chunks, max_decode_steps, DecodeOptions, DeviceBatch, MatmulPrecision,
    NoiseShape, Policy, RoutingModel,
};

use crate::config::{Config, ModelConfig};
use crate::error::TrainError;
use crate::evaluate::{download_ints, join_rows, validated_costs};
use crate::import::{import, is_pytorch_file};
use crate::memory::check_decode_fits;
use crate::run::checkpoint::{record_error, Checkpoints, TrainState, BEST, LATEST, MODEL_FILE};
use crate::run::progress::DecodeWatch;

/// How to turn a model into solutions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Strategy {
    /// Best of this many samples per (augmented) instance; 0 means greedy.
    pub(crate) samples: usize,
    /// One rollout per first customer (POMO).
    pub(crate) multi_start: bool,
    /// Decode the 8 symmetries of the unit square and keep the best.
    pub(crate) augment8: bool,
}

impl FromStr for Strategy {
    type Err = String;
    /// `greedy`, `sample:K`, `multistart`, `aug8`, or `+`-combinations such as
    /// `multistart+aug8` and `sample:16+aug8`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut st = Strategy {
            samples: 0,
            multi_start: false,
            augment8: false,
        };
        for part in s.split('+') {
            match part {
                "greedy" => {}
                "multistart" => st.multi_start = true,
                "aug8" => st.augment8 = true,
                p if p.starts_with("sample:") => {
                    st.samples = p[7..]
                        .parse()
                        .ok()
                        .filter(|&k| k > 0)
                        .ok_or_else(|| format!("`{p}`: expected sample:K with K >= 1"))?
                }
                other => {
                    let suggestion = ["greedy", "multistart", "aug8", "sample:K"]
                        .into_iter()
                        .map(|c| (strsim::normalized_levenshtein(other, c), c))
                        .max_by(|a, b| a.0.total_cmp(&b.0))
                        .filter(|(score, _)| *score >= 0.5)
                        .map_or(String::new(), |(_, c)| format!(" (did you mean `{c}`?)"));
                    return Err(format!(
                        "unknown strategy `{other}`{suggestion}; expected greedy, sample:K, multistart, aug8 or a `+` combination"
                    ));
                }
            }
        }
        if st.samples > 0 && st.multi_start {
            return Err("sample:K and multistart cannot be combined".into());
        }
        Ok(st)
    }
}

impl Strategy {
    /// Decoder rows an instance of `n` customers takes: symmetries × samples × starts.
    pub(crate) fn rows_per_instance(&self, n: usize) -> usize {
        (if self.augment8 { 8 } else { 1 })
            * self.samples.max(1)
            * (if self.multi_start { n } else { 1 })
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = vec![];
        if self.samples > 0 {
            parts.push(format!("sample:{}", self.samples));
        }
        if self.multi_start {
            parts.push("multistart".into());
        }
        if parts.is_empty() {
            parts.push("greedy".into());
        }
        if self.augment8 {
            parts.push("aug8".into());
        }
        f.write_str(&parts.join("+"))
    }
}

/// A trained model loaded from a run directory.
pub(crate) struct TrainedModel {
    pub(crate) model: RoutingModel,
    pub(crate) config: Config,
    pub(crate) checkpoint: PathBuf,
}

impl TrainedModel {
    /// Says which model, from which checkpoint (and which epoch), on stderr.
    pub(crate) fn announce(&self) {
        let state = self.state();
        let is_best = self
            .checkpoint
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("best-"));
        let which = match (state, is_best) {
            (Some(s), true) => s.best.map_or(String::new(), |b| {
                format!(" (the run's best: {})", b.describe())
            }),
            (Some(s), false) => format!(" (after {} epochs)", s.epochs_completed),
            (None, _) => String::new(),
        };
        eprintln!(
            "{} model from {}{which}",
            self.config.model_kind(),
            self.checkpoint.display()
        );
    }

    /// The training state saved with the checkpoint (none for a PyTorch file).
    pub(crate) fn state(&self) -> Option<TrainState> {
        Checkpoints::new(self.checkpoint.parent().unwrap_or(Path::new(".")))
            .named(
                &self
                    .checkpoint
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy(),
            )
            .ok()
            .map(|(_, s)| s)
    }

    /// The model with its products at `precision`, in its config too (`--matmul-precision`).
    pub(crate) fn with_matmul_precision(
        mut self,
        precision: MatmulPrecision,
    ) -> Result<Self, TrainError> {
        self.config.set_matmul_precision(precision)?;
        if let RoutingModel::Attention(model) = self.model {
            self.model = model.with_matmul_precision(precision).into();
        }
        Ok(self)
    }

    /// Loads the best (else the latest) checkpoint of the run in `run_dir` (or a checkpoint
    /// directory itself, or a PyTorch file) as an inference model on `device`.
    pub(crate) fn load(run_dir: &Path, device: &Device) -> Result<Self, TrainError> {
        if is_pytorch_file(run_dir) {
            let imported = import(run_dir, device)?;
            let n = imported.problem_size();
            return Ok(Self {
                model: RoutingModel::from(imported.model).valid(),
                config: Config::with_model(n, ModelConfig::Attention(imported.config)),
                checkpoint: run_dir.to_path_buf(),
            });
        }
        let (config_path, ckpt_dir) = checkpoint_of(run_dir)?;
        let config = Config::load_run(&config_path)?;
        let path = ckpt_dir.join(MODEL_FILE);
        // The config says which model the file holds; a file of another model or size
        // fails to load with an error that names both.
        let what = format!("{} model", config.model_kind());
        let load = |model: RoutingModel| -> Result<RoutingModel, TrainError> {
            // Each model's file holds its own tensors, not the enum's.
            match model {
                RoutingModel::Attention(m) => m.try_load_file(&path).map(Into::into),
                RoutingModel::Pointer(m) => m.try_load_file(&path).map(Into::into),
            }
            .map_err(|e| record_error(&path, &what, e))
        };
        let model = load(match &config.model {
            ModelConfig::Attention(a) => a.model_config().init(device).into(),
            ModelConfig::Pointer(p) => p.model_config().init(device).into(),
        })?
        .valid();
        Ok(Self {
            model,
            config,
            checkpoint: ckpt_dir,
        })
    }
}

/// The config and checkpoint directory `--checkpoint PATH` names: a run directory (its
/// best checkpoint, else its latest), a checkpoint directory, or a pointer file
/// (`RUN_DIR/checkpoints/latest`, `…/best`).
fn checkpoint_of(path: &Path) -> Result<(PathBuf, PathBuf), TrainError> {
    let run_of = |ckpt_dir: &Path| {
        let run = ckpt_dir.parent().and_then(Path::parent).unwrap_or(ckpt_dir);
        run.join("config.toml")
    };
    if path.join(MODEL_FILE).exists() {
        return Ok((run_of(path), path.to_path_buf()));
    }
    if path.is_file() && [LATEST, BEST].iter().any(|p| path.ends_with(p)) {
        let checkpoints = Checkpoints::new(path.parent().unwrap_or(Path::new(".")));
        let pointer = path.file_name().unwrap_or_default().to_string_lossy();
        let (dir, _) = checkpoints.pointed(&pointer)?;
        return Ok((run_of(&dir), dir));
    }
    let config_path = path.join("config.toml");
    if !config_path.exists() {
        return Err(TrainError::Input(format!(
            "--checkpoint {}: not a run directory (no config.toml), a checkpoint (no {MODEL_FILE}) nor a PyTorch checkpoint",
            path.display()
        )));
    }
    let config = Config::load_run(&config_path)?;
    let checkpoints = Checkpoints::new(path.join(&config.checkpointing.dir));
    let (dir, _) = match checkpoints.pointed(BEST) {
        Ok(best) => best,
        Err(_) => checkpoints.latest()?,
    };
    Ok((config_path, dir))
}

/// The 8 symmetries of the unit square.
pub(crate) fn augment(p: [f64; 2], k: usize) -> [f64; 2] {
    let [x, y] = p;
    match k {
        0 => [x, y],
        1 => [y, x],
        2 => [1.0 - x, y],
        3 => [x, 1.0 - y],
        4 => [1.0 - x, 1.0 - y],
        5 => [y, 1.0 - x],
        6 => [1.0 - y, x],
        _ => [1.0 - y, 1.0 - x],
    }
}

/// One solved instance.
#[derive(Debug, Clone)]
pub(crate) struct Solved {
    pub(crate) solution: Solution,
    /// Cost in the instance's own metric.
    pub(crate) cost: f64,
}

/// Solves instances that all have the same n. With `normalize`, coordinates are mapped
/// into the unit square first (CVRPLIB instances); costs are always computed on the
/// instances' own coordinates under `metric` (None: each instance's default).
#[allow(clippy::too_many_arguments)]
pub(crate) fn solve_batch(
    model: &(impl Policy + Sync),
    instances: &[&Instance],
    strategy: Strategy,
    normalize: bool,
    metric: Option<Metric>,
    check_every: usize,
    rng: &mut InstanceRng,
    device: &Device,
) -> Result<Vec<Solved>, TrainError> {
    let (batch, problem, options) =
        upload_batch(instances, strategy, normalize, check_every, rng, device)?;
    let parts = decode_batch(model, &batch, &problem, &options, device);
    best_solutions(instances, &batch, parts, strategy, metric)
}

/// `problem` (`batch` on the device) decoded eagerly, in the chunks `device` takes best.
fn decode_batch(
    model: &(impl Policy + Sync),
    batch: &Batch,
    problem: &DeviceBatch,
    options: &DecodeOptions,
    device: &Device,
) -> Vec<Tensor<2, Int>> {
    let chunk = decode_chunk(device, batch.n + 1);
    let rollouts = batch.size * options.rows_per_instance(batch.n);
    let chunks = batch.size.div_ceil(chunk.max(1));
    let _watch = DecodeWatch::start(rollouts, batch.n, chunks * max_decode_steps(batch.n));
    decode_in_chunks(model, problem, 0..batch.size, options, chunk)
}

/// `eval --graph`: batches of one size decoded through a decode recorded as a device graph
/// (CUDA graphs) on the first of them and replayed on each next one, its instances written
/// into the recorded inputs (`eval` pads a last, partial batch to that size on CubeCL
/// devices: [`padded_batch`]). A batch of another size decodes eagerly, and so does every
/// batch where the backend records no graph (said once, on stderr, with the reason). One
/// recording per evaluation: it costs four decodes, more than it saves on a size met once
/// (a directory of CVRPLIB instances).
pub(crate) struct GraphSolver<'a, P: Policy> {
    model: &'a P,
    strategy: Strategy,
    normalize: bool,
    check_every: usize,
    recorded: Option<RecordedDecode<P>>,
    refused: bool,
    /// Batches decoded by replaying the graph.
    pub(crate) replays: usize,
}

impl<'a, P: Policy + Sync + Clone> GraphSolver<'a, P> {
    /// Greedy, multi-start and ×8-augmented decodes only: a sampled decode reads noise
    /// drawn per batch.
    pub(crate) fn new(
        model: &'a P,
        strategy: Strategy,
        normalize: bool,
        check_every: usize,
    ) -> Result<Self, TrainError> {
        if strategy.samples > 0 {
            return Err(TrainError::Input(format!(
                "--graph decodes greedily (greedy, multistart, aug8); got --strategy {strategy}"
            )));
        }
        Ok(Self {
            model,
            strategy,
            normalize,
            check_every,
            recorded: None,
            refused: false,
            replays: 0,
        })
    }

    /// [`solve_batch`] for `instances`, through the recorded graph where it can.
    pub(crate) fn solve(
        &mut self,
        instances: &[&Instance],
        device: &Device,
    ) -> Result<Vec<Solved>, TrainError> {
        let batch = expanded_batch(instances, self.strategy, self.normalize)?;
        let options = decode_options(self.strategy, self.check_every);
        let parts = match &self.recorded {
            Some(recorded) if recorded.fits(&batch) => {
                self.replays += 1;
                vec![recorded
                    .replay(&batch)
                    .map_err(|e| TrainError::Failed(e.to_string()))?]
            }
            Some(_) => self.eager(&batch, &options, device),
            None if self.refused => self.eager(&batch, &options, device),
            None => match RecordedDecode::record(self.model, &batch, &options, device) {
                Ok((recorded, actions)) => {
                    self.recorded = Some(recorded);
                    vec![actions]
                }
                Err(why) => {
                    eprintln!("device graph: not recorded ({why}); decoding eagerly");
                    self.refused = true;
                    self.eager(&batch, &options, device)
                }
            },
        };
        best_solutions(instances, &batch, parts, self.strategy, None)
    }

    fn eager(
        &self,
        batch: &Batch,
        options: &DecodeOptions,
        device: &Device,
    ) -> Vec<Tensor<2, Int>> {
        let problem = DeviceBatch::upload(batch, None, device);
        decode_batch(self.model, batch, &problem, options, device)
    }
}

/// The instances a batch of `part` (one of `chunks` of at most `chunk` instances of one n)
/// is decoded as. On a CubeCL device (`pad`) a last, partial batch after full ones is
/// padded with copies of its last instance to `chunk`: a batch of another size has other
/// shapes, which CubeCL explores and autotunes again (measured on its CPU runtime: 10
/// fusion explorations and 10 autotuned shapes for a last batch of 20 after two of 40) and
/// which a device graph recorded on the full size cannot replay,
/// while the copies' rows cost a GPU little. The caller keeps the first `part.len()`
/// solutions.
pub(crate) fn padded_batch<'i>(
    part: &[&'i Instance],
    chunk: usize,
    chunks: usize,
    pad: bool,
) -> Vec<&'i Instance> {
    let last = *part.last().expect("a batch has an instance");
    let copies = match pad && chunks > 1 {
        true => chunk.saturating_sub(part.len()),
        false => 0,
    };
    part.iter()
        .copied()
        .chain(std::iter::repeat_n(last, copies))
        .collect()
}

/// Each instance's best row of `parts`, the `[rows, steps]` actions of a decode of `batch`
/// (`instances` expanded by `strategy`): validated, then costed on the instance itself.
fn best_solutions(
    instances: &[&Instance],
    batch: &Batch,
    parts: Vec<Tensor<2, Int>>,
    strategy: Strategy,
    metric: Option<Metric>,
) -> Result<Vec<Solved>, TrainError> {
    let (actions, steps) = join_rows(download_ints(parts, "the decoded tours")?);
    // Validated against the (transformed) batch: feasibility does not depend on coordinates.
    let rows_per_decoded = decode_options(strategy, 1).rows_per_instance(batch.n);
    let row_costs = validated_costs(batch, &actions, steps, rows_per_decoded)?;
    let rows_per_original = strategy.rows_per_instance(batch.n);
    let mut solved = Vec::with_capacity(instances.len());
    for (i, inst) in instances.iter().enumerate() {
        let range = i * rows_per_original..(i + 1) * rows_per_original;
        // Symmetries preserve distances only up to the normalisation's scale, so pick the
        // best row by the batch cost, then cost it on the original instance.
        let best = range
            .clone()
            .min_by(|&a, &b| row_costs[a].total_cmp(&row_costs[b]))
            .expect("at least one row");
        let solution = Solution::from_actions(&actions[best * steps..(best + 1) * steps])
            .map_err(|e| TrainError::Infeasible(format!("{}: {e}", inst.name())))?;
        let cost = inst
            .cost(&solution, metric.unwrap_or_else(|| inst.default_metric()))
            .map_err(|e| TrainError::Infeasible(format!("{}: {e}", inst.name())))?;
        solved.push(Solved { solution, cost });
    }
    Ok(solved)
}

/// The decode `strategy` asks for, of `instances` (all of one n) expanded into their
/// symmetries and sample copies: the host batch, the same on `device`, and the options.
pub(crate) fn upload_batch(
    instances: &[&Instance],
    strategy: Strategy,
    normalize: bool,
    check_every: usize,
    rng: &mut InstanceRng,
    device: &Device,
) -> Result<(Batch, DeviceBatch, DecodeOptions), TrainError> {
    let batch = expanded_batch(instances, strategy, normalize)?;
    let options = decode_options(strategy, check_every);
    let size = (batch.size, batch.n + 1, options.rows_per_instance(batch.n));
    check_decode_fits(device, size, &strategy.to_string())?;
    let noise = (strategy.samples > 0).then_some((
        NoiseShape {
            rows_per_instance: options.rows_per_instance(batch.n),
        },
        rng,
    ));
    let problem = DeviceBatch::upload(&batch, noise, device);
    Ok((batch, problem, options))
}

/// `instances` expanded into the symmetries and sample copies `strategy` decodes, as one
/// host batch (instance-major, then symmetry, then copy).
fn expanded_batch(
    instances: &[&Instance],
    strategy: Strategy,
    normalize: bool,
) -> Result<Batch, TrainError> {
    let variants = if strategy.augment8 { 8 } else { 1 };
    let copies = strategy.samples.max(1);
    let expanded = expand(instances, variants, copies, normalize)?;
    Batch::from_instances(&expanded).map_err(|e| TrainError::Input(e.to_string()))
}

fn decode_options(strategy: Strategy, check_every: usize) -> DecodeOptions {
    if strategy.samples > 0 {
        DecodeOptions::sample(1.0)
    } else {
        DecodeOptions::greedy()
    }
    .with_multi_start(strategy.multi_start)
    .with_check_every(check_every)
    .without_log_likelihood()
}

/// Each instance's `variants` symmetries (unit square first when `normalize`), each
/// `copies` times: instance-major, then symmetry, then copy.
fn expand(
    instances: &[&Instance],
    variants: usize,
    copies: usize,
    normalize: bool,
) -> Result<Vec<Instance>, TrainError> {
    let mut expanded = Vec::with_capacity(instances.len() * variants * copies);
    for inst in instances {
        if !inst.has_coords() {
            return Err(TrainError::Input(format!(
                "instance `{}` has no coordinates (EXPLICIT weights only); the model needs coordinates",
                inst.name()
            )));
        }
        let base = if normalize {
            normalize_coords(inst.coords())
        } else {
            inst.coords().to_vec()
        };
        for k in 0..variants {
            let coords: Vec<[f64; 2]> = base.iter().map(|&p| augment(p, k)).collect();
            let moved = Instance::from_nodes(
                inst.name(),
                coords,
                inst.node_demands()[1..].to_vec(),
                inst.capacity(),
                None,
            )
            .map_err(|e| TrainError::Input(format!("{}: {e}", inst.name())))?;
            for _ in 0..copies {
                expanded.push(moved.clone());
            }
        }
    }
    Ok(expanded)
}

#[cfg(test)]
mod tests {
    use routeburn_data::Generator;
    use routeburn_model::Backend;

    use super::*;
    use crate::config::AttentionConfig;

    #[test]
    fn a_partial_batch_is_padded_with_its_last_instance_on_cubecl_devices_only() {
        let mut rng = InstanceRng::new(1);
        let set = Generator::uniform(5).sample_many(&mut rng, 3, "i");
        let part: Vec<&Instance> = set.iter().collect();
        let names = |v: Vec<&Instance>| v.iter().map(|i| i.name().to_string()).collect::<Vec<_>>();
        let (i0, i1, i2) = ("i000000", "i000001", "i000002");
        assert_eq!(names(padded_batch(&part, 5, 2, true)), [i0, i1, i2, i2, i2]);
        // Not on flex or ndarray, not for a batch that is the only one, not when full.
        assert_eq!(names(padded_batch(&part, 5, 2, false)), [i0, i1, i2]);
        assert_eq!(names(padded_batch(&part, 5, 1, true)), [i0, i1, i2]);
        assert_eq!(names(padded_batch(&part, 3, 2, true)), [i0, i1, i2]);
    }

    /// What padding a partial batch relies on: an instance's solution does not depend on the
    /// other rows of its batch (no batch statistics in the encoder, no row's decode cut
    /// short by another's), so the padded batch's first solutions are the unpadded one's.
    #[test]
    fn a_padded_batch_solves_its_instances_as_the_unpadded_one() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let model =
            RoutingModel::Attention(AttentionConfig::default().model_config().init(&device));
        let mut rng = InstanceRng::new(7);
        let set = Generator::uniform(12).sample_many(&mut rng, 3, "i");
        let refs: Vec<&Instance> = set.iter().collect();
        for strategy in ["greedy", "multistart", "aug8"] {
            let strategy: Strategy = strategy.parse().unwrap();
            let mut solve = |instances: &[&Instance]| {
                solve_batch(
                    &model, instances, strategy, false, None, 1, &mut rng, &device,
                )
                .unwrap()
            };
            let alone = solve(&refs);
            let padded = solve(&padded_batch(&refs, 8, 2, true));
            assert_eq!(padded.len(), 8);
            for (a, p) in alone.iter().zip(&padded) {
                assert_eq!(a.solution, p.solution, "{strategy}");
                assert_eq!(a.cost, p.cost, "{strategy}");
            }
        }
    }
}
