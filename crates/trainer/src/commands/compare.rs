//! `routeburn compare-backends`: the same seed, config and initial weights on every
//! backend compiled into the binary, side by side.
//!
//! For each backend it runs K real training steps through [`train`] (the config's epochs
//! become K epochs of one batch each, so every step's loss is recorded), then reports
//! seconds per step and per phase, instances per second, the process's peak resident
//! memory during that backend's run, and numerical agreement with the first backend:
//! the first backend decodes the agreement instances greedily with the initial weights,
//! every other backend scores those same tours ([`AttentionModel::follow`]), and the
//! largest difference in a tour's log-likelihood per step of the tour is compared with the
//! pair's tolerance ([`tolerance`]). Instances, sampling noise and the initial weights come from
//! the host, so the backends see identical inputs; a backend beyond the tolerance fails
//! the comparison (exit status 1). How many of the backend's own greedy tours differ is
//! reported too, but not judged: at a near-tie (common in an untrained model) any
//! rounding may turn a choice, and the tour diverges from there.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use burn::module::Module;
use burn::tensor::{Tensor, TensorData, Transaction};
use clap::Args;
use routeburn_data::InstanceRng;
use routeburn_model::cubecl_config::{self, CompileCounts};
use routeburn_model::launches::{self, ByKernel, Issued};
use routeburn_model::{
    AttentionModel, Backend, DecodeOptions, DeviceBatch, MatmulPrecision, RoutingModel,
};

use crate::config::{BaselineKind, Config, ModelConfig, ModelKind};
use crate::error::TrainError;
use crate::evaluate::{int_data_to_i64, read_back};
use crate::inference::TrainedModel;
use crate::run::checkpoint::{record_error, save_module};
use crate::run::metrics::{EpochMetrics, Phase};
use crate::run::skeleton::{seeded, training_device, TrainOptions};
use crate::training::train;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Training config (TOML); default: the embedded default config. Only the attention
    /// model is compared.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A trained model to compare instead of the config's freshly initialised one: a run
    /// directory, a checkpoint, or Kool et al.'s `.pt` (as `eval --checkpoint`). Its
    /// weights start every backend and its config replaces `--config`; a trained model's
    /// sharp choices test agreement where it matters.
    #[arg(long, conflicts_with = "config")]
    pub checkpoint: Option<PathBuf>,
    /// Training steps per backend.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Backends to compare, comma-separated (default: every compiled one). The first is
    /// the reference for agreement.
    #[arg(long, value_delimiter = ',', value_parser = super::backend_parser())]
    pub backends: Vec<String>,
    /// Largest allowed difference in a tour's log-likelihood per step of the tour,
    /// between a backend and the first (default: per backend, from measured error: 1e-5
    /// between CPU backends, 2e-2 with cuda, whose f32 matmuls run in TF32, 1e-4 with cuda
    /// at `--matmul-precision highest`).
    #[arg(long)]
    pub tolerance: Option<f64>,
    /// Instances in the agreement check (a greedy decode of each).
    #[arg(long, default_value_t = 256)]
    pub agreement_instances: usize,
    /// Where to keep the runs (default: a new folder under the system's temp directory,
    /// removed afterwards).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// On CubeCL backends (cuda, cpu): count fusion explorations, autotuned shapes and
    /// (with `CUBECL_CUDA_DUMP_PTX=DIR`) loaded kernels in step 1, step 2 (the first with
    /// Adam's moments) and steps 3..K; exit status 1 when steps 3..K explore or tune
    /// anything (use --steps 3 or more). Fusion logging slows the steps down: read the
    /// timings from a run without it.
    #[arg(long)]
    pub count_compiles: bool,
    /// With `--count-compiles`: time every kernel on the device, one at a time, and report
    /// each phase's kernel time beside its launches (the device's busy time; the steps
    /// run slower, so read wall times from a run without it).
    #[arg(long, requires = "count_compiles")]
    pub time_kernels: bool,
    /// `highest`: every product of the attention model at f32 accuracy, as three TF32
    /// products on CUDA's tensor cores (about 3× the matmul work); `high`: the device's own
    /// (TF32 on CUDA). Default: the model's `model.matmul_precision`.
    #[arg(long, value_parser = super::matmul_precision_parser())]
    pub matmul_precision: Option<MatmulPrecision>,
}

/// What one backend did.
struct BackendReport {
    backend: Backend,
    steps: Vec<EpochMetrics>,
    peak_rss_bytes: Option<u64>,
    /// Of its own greedy decode.
    log_likelihoods: Vec<f32>,
    actions: Vec<i64>,
    /// Of the first backend's greedy tours (that backend's own, for the first).
    followed_log_likelihoods: Vec<f32>,
    /// With `--count-compiles` on a CubeCL backend.
    compiles: Option<StepCompiles>,
}

pub fn run(args: CompareArgs) -> Result<ExitCode, TrainError> {
    if args.steps == 0 {
        return Err(TrainError::Input("--steps must be at least 1".into()));
    }
    if args.count_compiles && args.steps < 3 {
        // Steps 3.. are what the check judges; with fewer it would pass vacuously.
        return Err(TrainError::Input(
            "--count-compiles needs --steps 3 or more (step 2 is Adam's first with moments)".into(),
        ));
    }
    let backends = backends(&args.backends)?;
    let (config, config_dir, trained) = model_source(&args, backends[0])?;
    let mut config = per_step_config(config, args.steps);
    if let Some(precision) = args.matmul_precision {
        config.set_matmul_precision(precision)?;
    }

    let (work_dir, remove_after) = match &args.work_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("routeburn-compare-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&work_dir).map_err(|e| TrainError::io(&work_dir, e))?;
    let counting = match args.count_compiles {
        // Before any tensor exists: Burn and CubeCL read their configuration once.
        true => cubecl_config::count_compiles_in(&work_dir.join(COUNTS_DIR))
            .map_err(|e| TrainError::Input(format!("--count-compiles: {e}"))),
        false => Ok(()),
    };
    let result = counting.and_then(|()| {
        compare(
            &args,
            &backends,
            (&config, config_dir),
            trained.as_ref(),
            &work_dir,
        )
    });
    if remove_after {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    let reports = result?;
    let (mut table, agree) = render(&reports, &config, args.tolerance);
    let (counts, compiled_once) = compile_table(&reports);
    table.push_str(&counts);
    table.push_str(&launch_table(&reports, args.time_kernels));
    print!("{table}");
    Ok(if agree && compiled_once {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The backends named by `--backends`, or every compiled one, CPU first.
fn backends(names: &[String]) -> Result<Vec<Backend>, TrainError> {
    if names.is_empty() {
        // Fastest-first order is for the default; a comparison reads better CPU-first.
        let mut b = Backend::compiled();
        b.sort_by_key(|b| Backend::ALL.iter().position(|a| a == b));
        return Ok(b);
    }
    names
        .iter()
        .map(|name| Backend::resolve(Some(name)).map_err(TrainError::from))
        .collect()
}

/// What is compared: a checkpoint's config and trained attention model (loaded on
/// `first`'s device), or a config file's (with its directory, where its paths start) or
/// the embedded default's, trained from fresh weights.
fn model_source(
    args: &CompareArgs,
    first: Backend,
) -> Result<(Config, Option<PathBuf>, Option<AttentionModel>), TrainError> {
    match (&args.checkpoint, &args.config) {
        (Some(path), _) => {
            let mut trained = TrainedModel::load(path, &first.device()?)?;
            if let Some(precision) = args.matmul_precision {
                trained = trained.with_matmul_precision(precision)?;
            }
            let RoutingModel::Attention(model) = trained.model else {
                return Err(TrainError::Input(format!(
                    "{}: compare-backends compares the attention model, this is the {} model",
                    path.display(),
                    trained.config.model_kind()
                )));
            };
            Ok((trained.config, None, Some(model)))
        }
        (None, Some(path)) => Ok((
            Config::load_as(path, Some(ModelKind::Attention))?,
            path.parent().map(Path::to_path_buf),
            None,
        )),
        (None, None) => Ok((
            Config::embedded_default_as(Some(ModelKind::Attention))?,
            None,
            None,
        )),
    }
}

const COUNTS_DIR: &str = "compile-counts";

/// What CubeCL explored and tuned in step 1, step 2 and steps 3..K, and the kernels each
/// of the training steps' phases launched in steps 3..K, and those launched outside every
/// phase (work a phase queued and fusion ran after it ended, between two phases).
#[derive(Debug, Clone)]
struct StepCompiles {
    first: CompileCounts,
    second: CompileCounts,
    later: CompileCounts,
    later_kernels: Vec<(Phase, ByKernel)>,
    later_outside: ByKernel,
}

/// The compile counters after a step, the kernels launched so far in each of a training
/// step's phases (not in validation or the end-of-epoch baseline test), and outside every
/// phase.
#[derive(Debug, Clone)]
struct CountsAfterStep {
    compiles: CompileCounts,
    by_phase: Vec<(Phase, ByKernel)>,
    outside: ByKernel,
}

/// Generated instances the validation after each step decodes at most.
const VALIDATION_SIZE: usize = 64;

/// The config as K epochs of one batch: each step's loss and cost become a metrics row.
/// The rollout baseline's end-of-epoch t-test and the validation then run after every
/// step, outside its timing, so the t-test's set is cut to one batch and the validation
/// to [`VALIDATION_SIZE`] generated instances (the default 1,000, decoded multi-start at
/// CVRP100, took ~50 s after each step on 2 cores); the learning rate is held constant.
/// Every backend runs the same number of shards (the config's, else 1): batch norm
/// normalises each shard by its own statistics, so the CPU backends' default (one shard a
/// core) would train differently from CubeCL's one shard before any arithmetic differed.
fn per_step_config(mut config: Config, steps: usize) -> Config {
    let t = &mut config.training;
    t.shards = Some(t.shards.unwrap_or(1));
    t.epochs = steps;
    t.lr_decay = 1.0;
    t.lr_final = None;
    let r = &mut config.reinforce;
    r.batches_per_epoch = 1;
    if r.baseline == BaselineKind::Rollout {
        r.baseline_eval_size = r.baseline_eval_size.min(t.batch_size);
    }
    let v = &mut config.validation;
    v.file = None;
    v.size = v.size.min(VALIDATION_SIZE);
    config.checkpointing.every_epochs = steps;
    config.checkpointing.keep_last = 1;
    config
}

/// Runs every backend from the same initial weights: `trained`'s, or the config's
/// seeded initialisation.
fn compare(
    args: &CompareArgs,
    backends: &[Backend],
    (config, config_dir): (&Config, Option<PathBuf>),
    trained: Option<&AttentionModel>,
    work_dir: &Path,
) -> Result<Vec<BackendReport>, TrainError> {
    let reference = backends[0];
    let init_path = work_dir.join("initial.bpk");
    let ModelConfig::Attention(attention) = &config.model else {
        return Err(TrainError::Input(
            "compare-backends compares the attention model".into(),
        ));
    };
    let attention = attention.model_config();
    match trained {
        Some(model) => save_module(model, &init_path, "initial weights")?,
        None => {
            let device = training_device(reference, config.training.precision)?;
            let model = seeded(&device, Some(config.training.seed), || {
                attention.init(&device)
            });
            save_module(&model, &init_path, "initial weights")?;
        }
    }
    let generator = config.generator()?;
    let agreement_batch = generator.sample_batch(
        &mut InstanceRng::new(config.validation.seed ^ 0x6167_7265),
        args.agreement_instances.max(1),
    );

    let mut reports = Vec::new();
    for &backend in backends {
        eprintln!(
            "compare-backends: {backend}: {} training steps of batch {}",
            config.training.epochs, config.training.batch_size
        );
        let device = training_device(backend, config.training.precision)?;
        let model = seeded(&device, None, || attention.init(&device))
            .try_load_file(&init_path)
            .map_err(|e| record_error(&init_path, "initial weights", e))?;
        let problem = DeviceBatch::upload(&agreement_batch, None, &device);
        let decoded = agreement_decode(&model, &problem, reports.first(), backend)?;

        reset_peak_rss();
        let run_dir = work_dir.join(backend.name());
        let _ = std::fs::remove_dir_all(&run_dir);
        let options = TrainOptions {
            config: config.clone(),
            run_dir,
            backend,
            resume: false,
            resume_from: None,
            stop_after_epochs: None,
            verbose: false,
            config_dir: config_dir.clone(),
            init_weights: Some(init_path.clone()),
            validate_initial: false,
            after_epoch: None,
        };
        let (steps, compiles) = match args.count_compiles && backend.traits().counts_compiles {
            true => train_counting(options, &work_dir.join(COUNTS_DIR), args.time_kernels)?,
            false => (train(options)?.epochs, None),
        };
        reports.push(BackendReport {
            backend,
            steps,
            peak_rss_bytes: peak_rss(),
            log_likelihoods: decoded.log_likelihoods,
            actions: decoded.actions,
            followed_log_likelihoods: decoded.followed,
            compiles,
        });
    }
    Ok(reports)
}

/// One backend's agreement decodes, read back.
struct AgreementDecode {
    actions: Vec<i64>,
    log_likelihoods: Vec<f32>,
    followed: Vec<f32>,
}

/// The greedy decode of the agreement instances and, after the first backend, the
/// log-likelihoods of the first backend's tours on this one (one read for both).
fn agreement_decode(
    model: &AttentionModel,
    problem: &DeviceBatch,
    reference: Option<&BackendReport>,
    backend: Backend,
) -> Result<AgreementDecode, TrainError> {
    let out = model.decode(problem, &DecodeOptions::greedy());
    let mut transaction = Transaction::default()
        .register(out.actions)
        .register(out.log_likelihood);
    if let Some(reference) = reference {
        let rows = reference.log_likelihoods.len();
        let steps = reference.actions.len() / rows;
        // Node indices are exact in f32; the tours ride as floats, as uploads do.
        let tours: Vec<f32> = reference.actions.iter().map(|&a| a as f32).collect();
        let tours = Tensor::<2>::from_data(
            TensorData::new(tours, [rows, steps]),
            &problem.coords.device(),
        )
        .int();
        transaction = transaction.register(model.follow(problem, &tours).log_likelihood);
    }
    let mut data = read_back(transaction, "the decode's tours and log-likelihoods")?.into_iter();
    let actions = int_data_to_i64(data.next().expect("actions"));
    let mut floats = || -> Result<Vec<f32>, TrainError> {
        data.next()
            .expect("log-likelihoods")
            .try_into_vec_as::<f32>()
            .map_err(|e| TrainError::Failed(format!("{backend}: log-likelihoods: {e:?}")))
    };
    let log_likelihoods = floats()?;
    let followed = match reference {
        Some(_) => floats()?,
        None => log_likelihoods.clone(),
    };
    Ok(AgreementDecode {
        actions,
        log_likelihoods,
        followed,
    })
}

/// Trains with the compile counters read after every step (each step is an epoch here),
/// and the kernel launches of the steps' phases watched.
fn train_counting(
    mut options: TrainOptions,
    counts_dir: &Path,
    time_kernels: bool,
) -> Result<(Vec<EpochMetrics>, Option<StepCompiles>), TrainError> {
    let _watch = launches::watch(time_kernels);
    let after_steps = Arc::new(Mutex::new(vec![counts_after_step(counts_dir)]));
    let (log, dir) = (after_steps.clone(), counts_dir.to_path_buf());
    options.after_epoch = Some(Arc::new(move |_: &EpochMetrics| {
        let counts = counts_after_step(&dir);
        log.lock().unwrap_or_else(|e| e.into_inner()).push(counts);
    }));
    let steps = train(options)?.epochs;
    let counts = after_steps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let at = |k: usize| &counts[k.min(counts.len() - 1)];
    let last = counts.len() - 1;
    let compiles = |k: usize| at(k).compiles;
    Ok((
        steps,
        Some(StepCompiles {
            first: compiles(1).since(compiles(0)),
            second: compiles(2).since(compiles(1)),
            later: compiles(last).since(compiles(2.min(last))),
            later_kernels: kernels_since(&at(last).by_phase, &at(2.min(last)).by_phase),
            later_outside: at(last).outside.since(&at(2.min(last)).outside),
        }),
    ))
}

fn counts_after_step(counts_dir: &Path) -> CountsAfterStep {
    CountsAfterStep {
        compiles: CompileCounts::read(counts_dir),
        by_phase: Phase::step_phases()
            .map(|p| (p, launches::by_kernel(|label| label == p.launch_label())))
            .collect(),
        outside: launches::by_kernel(|label| label == 0),
    }
}

/// Each phase's kernels launched between `earlier` and `now`.
fn kernels_since(
    now: &[(Phase, ByKernel)],
    earlier: &[(Phase, ByKernel)],
) -> Vec<(Phase, ByKernel)> {
    let before = |p: Phase| earlier.iter().find(|(q, _)| *q == p).map(|(_, k)| k);
    now.iter()
        .map(|(p, k)| (*p, k.since(before(*p).unwrap_or(&ByKernel::default()))))
        .collect()
}

/// The compile counters of each CubeCL backend, and whether every one explored and tuned
/// nothing from step 3 on.
fn compile_table(reports: &[BackendReport]) -> (String, bool) {
    let counted: Vec<_> = reports
        .iter()
        .filter_map(|r| r.compiles.as_ref().map(|c| (r.backend, c)))
        .collect();
    if counted.is_empty() {
        return (String::new(), true);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\ncompiles (fusion explorations / autotuned shapes / PTX kernels loaded, and the \
         seconds the autotunes spent compiling and timing their candidates); step 2 is the \
         first with Adam's moments, so it explores the optimizer's new stream once:\n"
    );
    let _ = writeln!(
        s,
        "| backend | step 1 | step 2 | steps 3.. | autotuning s (1 / 2 / 3..) | compiled once |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    let mut all_once = true;
    for (backend, c) in counted {
        let show = |c: CompileCounts| {
            let ptx = c.ptx_kernels.map_or("-".into(), |p| p.to_string());
            format!("{} / {} / {ptx}", c.explorations, c.autotunes)
        };
        let once = c.later.explorations == 0 && c.later.autotunes == 0;
        all_once &= once;
        let verdict = if once { "yes" } else { "NO" };
        let tuning = |c: CompileCounts| format!("{:.1}", c.tuning.as_secs_f64());
        let _ = writeln!(
            s,
            "| {backend} | {} | {} | {} | {} / {} / {} | {verdict} |",
            show(c.first),
            show(c.second),
            show(c.later),
            tuning(c.first),
            tuning(c.second),
            tuning(c.later)
        );
    }
    (s, all_once)
}

/// Kernels launched per step in steps 3..K by each CubeCL backend counted: per phase (with
/// their device milliseconds when timed), then the kernels launched most.
fn launch_table(reports: &[BackendReport], timed: bool) -> String {
    let mut s = String::new();
    for r in reports {
        let (Some(compiles), Some(later)) = (&r.compiles, r.steps.get(2..)) else {
            continue;
        };
        if later.is_empty() {
            continue;
        }
        let k = later.len() as f64;
        let summed = |p: Phase| {
            let launched = later.iter().map(|m| m.phases.launched(p));
            launched.fold(Issued::default(), |a, b| a + b)
        };
        let cell = |i: Issued| {
            let n = i.launches as f64 / k;
            match timed {
                true => format!("{n:.0} ({:.2} ms)", 1e3 * i.kernel_time.as_secs_f64() / k),
                false => format!("{n:.0}"),
            }
        };
        let _ = writeln!(
            s,
            "
{}: kernels launched per step, steps 3..{}{}:
",
            r.backend,
            r.steps.len(),
            if timed {
                " (and their device time, each timed on its own)"
            } else {
                ""
            }
        );
        let phases: Vec<Phase> = Phase::step_phases().collect();
        let names: Vec<&str> = phases.iter().map(|p| p.name()).collect();
        let _ = writeln!(s, "| {} | {OUTSIDE} | step |", names.join(" | "));
        let _ = writeln!(s, "|{}---|---|", "---|".repeat(phases.len()));
        let mut cells: Vec<String> = phases.iter().map(|&p| cell(summed(p))).collect();
        let outside = compiles.later_outside.total();
        cells.push(cell(outside));
        let total = phases.iter().fold(outside, |a, &p| a + summed(p));
        let _ = writeln!(s, "| {} | {} |", cells.join(" | "), cell(total));
        let mut columns: Vec<(&str, &ByKernel)> = (compiles.later_kernels.iter())
            .map(|(p, k)| (p.name(), k))
            .collect();
        columns.push((OUTSIDE, &compiles.later_outside));
        s.push_str(&most_launched_table(&columns, k, timed));
    }
    s
}

/// The launch table's column for kernels launched between phases.
const OUTSIDE: &str = "between phases";

/// The kernels launched most per step (of `steps`), with the phases that launched them: a
/// column for each phase (or [`OUTSIDE`]) that launched any, then the total (and its device
/// milliseconds when timed).
fn most_launched_table(by_phase: &[(&str, &ByKernel)], steps: f64, timed: bool) -> String {
    let phases: Vec<&(&str, &ByKernel)> =
        by_phase.iter().filter(|(_, k)| !k.0.is_empty()).collect();
    let total = phases
        .iter()
        .fold(ByKernel::default(), |a, (_, k)| a.plus(k));
    let names: Vec<&str> = phases.iter().map(|(p, _)| *p).collect();
    let mut s = format!(
        "\nmost launched, per step:\n\n| kernel | {} | all |{}\n|---|{}---|{}\n",
        names.join(" | "),
        if timed { " ms |" } else { "" },
        "---|".repeat(phases.len()),
        if timed { "---|" } else { "" }
    );
    for (name, tally) in total.most_launched().into_iter().take(12) {
        let per_step = |launches: u64| format!("{:.1}", launches as f64 / steps);
        let cells: Vec<String> = phases
            .iter()
            .map(|(_, k)| per_step(k.0.get(name).map_or(0, |i| i.launches)))
            .collect();
        let ms = 1e3 * tally.kernel_time.as_secs_f64() / steps;
        let _ = writeln!(
            s,
            "| {name} | {} | {} |{}",
            cells.join(" | "),
            per_step(tally.launches),
            if timed {
                format!(" {ms:.3} |")
            } else {
                String::new()
            }
        );
    }
    s
}

/// The largest difference in a tour's log-likelihood per step of the tour allowed between
/// backends `a` and `b` when `--tolerance` is not given: the larger of the two backends'
/// own, each about 5–7× the largest measured (benches/README.md, "Session 24": 256 tours
/// each of untrained models at n = 10, 20, 50 and 100, three seeds, and of Kool's three
/// trained models). CPU backends differ by at most 1.5e-6 a step (flex against ndarray;
/// CubeCL's CPU runtime 3.6e-7 at n = 10): f32's rounding. With every matmul's operands
/// rounded to TF32, as cuda's tensor-core matmuls read f32 on sm_80+ GPUs (no switch
/// turns it off), by up to 3.8e-3 a step, the most on a trained model, whose sharp
/// logits magnify the products' error. At `model.matmul_precision = "highest"` (three
/// TF32 products each) by at most 2.1e-6 with TF32 emulated, as exact f32; cuda's 1e-4
/// leaves room for what the emulation does not model (FMA contraction, libdevice's
/// exp, log and tanh), not measured on a GPU yet.
fn tolerance(a: Backend, b: Backend, precision: MatmulPrecision) -> f64 {
    let own = |backend: Backend| -> f64 {
        match (backend, precision) {
            (Backend::Cuda, MatmulPrecision::High) => 2e-2,
            (Backend::Cuda, MatmulPrecision::Highest) => 1e-4,
            _ => 1e-5,
        }
    };
    own(a).max(own(b))
}

/// Agreement of one backend with the reference: the largest difference in the
/// log-likelihoods of the reference's greedy tours scored on both, absolute and per step
/// of the tour (|Δll| / its steps), and how many of the two backends' own greedy tours
/// differ.
fn agreement(reference: &BackendReport, other: &BackendReport) -> (f64, f64, usize) {
    let rows = reference.log_likelihoods.len();
    // Row i's tour: its actions without the trailing depot padding.
    let tour = |actions: &[i64], i: usize| -> Vec<i64> {
        let steps = actions.len() / rows;
        let row = &actions[i * steps..(i + 1) * steps];
        let end = row.iter().rposition(|&a| a != 0).map_or(0, |p| p + 1);
        row[..end].to_vec()
    };
    let (mut absolute, mut per_step, mut differing) = (0.0f64, 0.0f64, 0);
    for i in 0..rows {
        let reference_tour = tour(&reference.actions, i);
        differing += usize::from(reference_tour != tour(&other.actions, i));
        let (a, b) = (
            reference.log_likelihoods[i] as f64,
            other.followed_log_likelihoods[i] as f64,
        );
        // NaN (and −∞, a tour the other backend masks) must fail, not vanish in a max.
        let d = match (a - b).abs() {
            d if d.is_nan() => f64::INFINITY,
            d => d,
        };
        absolute = absolute.max(d);
        per_step = per_step.max(d / reference_tour.len().max(1) as f64);
    }
    (absolute, per_step, differing)
}

/// The comparison's table (a row a backend: its step time, phases, peak memory and
/// agreement with the first backend) and its loss table, and whether every backend agreed.
fn render(reports: &[BackendReport], config: &Config, tolerance: Option<f64>) -> (String, bool) {
    let color = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let (red, green, reset) = if color {
        ("\x1b[31m", "\x1b[32m", "\x1b[0m")
    } else {
        ("", "", "")
    };
    // compare-backends runs only the attention model.
    let precision = match &config.model {
        ModelConfig::Attention(a) => a.matmul_precision,
        ModelConfig::Pointer(_) => MatmulPrecision::High,
    };
    let mut s = table_header(config, precision);
    let mut all_agree = true;
    let reference = &reports[0];
    for r in reports {
        let _ = write!(s, "{}", timing_cells(r, config.training.batch_size));
        let rss = r
            .peak_rss_bytes
            .map_or("n/a".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
        let (verdict, diff, differing) = if std::ptr::eq(r, reference) {
            (
                "reference".to_string(),
                "- | -".to_string(),
                "-".to_string(),
            )
        } else {
            let (absolute, per_step, n) = agreement(reference, r);
            let tolerance = tolerance
                .unwrap_or_else(|| self::tolerance(reference.backend, r.backend, precision));
            let ok = per_step <= tolerance;
            all_agree &= ok;
            let v = if ok {
                format!("{green}ok (tolerance {tolerance:e}){reset}")
            } else {
                format!("{red}FAIL (tolerance {tolerance:e}){reset}")
            };
            (v, format!("{absolute:.2e} | {per_step:.2e}"), n.to_string())
        };
        let _ = writeln!(s, " {rss} | {diff} | {differing} | {verdict} |");
    }

    s.push_str(&loss_table(reports, config.training.epochs));
    if !all_agree {
        let _ = writeln!(
            s,
            "\n{red}backends disagree beyond float tolerance: see the agreement column{reset}"
        );
    }
    (s, all_agree)
}

/// What was run, and the comparison table's head.
fn table_header(config: &Config, precision: MatmulPrecision) -> String {
    let t = &config.training;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nn = {}, batch {}, {} steps, baseline {}{}, seed {}, {} shard(s) on every backend (training.shards), matmul precision {precision}; first step excluded from the timing (warm-up)\n",
        config.problem.n, t.batch_size, t.epochs, format!("{:?}", config.reinforce.baseline).to_lowercase(),
        config.reinforce.starts.map_or(String::new(), |k| format!(" from {k} starts")),
        t.seed, t.shards.unwrap_or(1),
    );
    let _ = write!(s, "| backend | s/step | inst/s |");
    for p in Phase::step_phases() {
        let _ = write!(s, " {} |", p.name());
    }
    let _ = writeln!(
        s,
        " peak RSS | max abs Δll | max Δll per step | own greedy tours differing | agreement |"
    );
    let _ = write!(s, "|---|---|---|");
    for _ in Phase::step_phases() {
        let _ = write!(s, "---|");
    }
    let _ = writeln!(s, "---|---|---|---|---|");
    s
}

/// A backend's row up to its phases: the mean seconds a step, instances a second and each
/// phase's mean seconds.
fn timing_cells(r: &BackendReport, batch_size: usize) -> String {
    // Step 1 pays one-time costs (allocator warm-up, lazy kernels): leave it out when
    // there is more than one.
    let timed: &[EpochMetrics] = if r.steps.len() > 1 {
        &r.steps[1..]
    } else {
        &r.steps
    };
    let k = timed.len() as f64;
    let phase = |p: Phase| timed.iter().map(|m| m.phases.seconds(p)).sum::<f64>() / k;
    let per_step: f64 = Phase::step_phases().map(phase).sum();
    let mut s = format!(
        "| {} | {:.3} | {:.0} |",
        r.backend,
        per_step,
        batch_size as f64 / per_step
    );
    for p in Phase::step_phases() {
        let _ = write!(s, " {:.3} |", phase(p));
    }
    s
}

/// Each step's loss (and train cost) on every backend, side by side.
fn loss_table(reports: &[BackendReport], steps: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\nloss (train cost) per step:\n");
    let _ = write!(s, "| step |");
    for r in reports {
        let _ = write!(s, " {} |", r.backend);
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "|---|{}", "---|".repeat(reports.len()));
    for i in 0..steps {
        let _ = write!(s, "| {} |", i + 1);
        for r in reports {
            match r.steps.get(i) {
                Some(m) => {
                    let _ = write!(s, " {:.5} ({:.4}) |", m.loss, m.train_cost);
                }
                None => {
                    let _ = write!(s, " - |");
                }
            }
        }
        let _ = writeln!(s);
    }
    s
}

/// Linux: resets the process's peak RSS ("5" to clear_refs), so the next reading covers
/// only what follows. Elsewhere a no-op, and the peak is then the process's.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The process's peak resident set size (VmHWM), where the OS reports it.
fn peak_rss() -> Option<u64> {
    crate::memory::proc_bytes("/proc/self/status", "VmHWM:")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn report(backend: Backend, ll: Vec<f32>, actions: Vec<i64>) -> BackendReport {
        BackendReport {
            backend,
            steps: Vec::new(),
            peak_rss_bytes: None,
            followed_log_likelihoods: ll.clone(),
            log_likelihoods: ll,
            actions,
            compiles: None,
        }
    }

    #[test]
    fn compile_table_fails_when_later_steps_compile() {
        let counts = |explorations, autotunes| CompileCounts {
            explorations,
            autotunes,
            tuning: Duration::from_millis(1200 * autotunes as u64),
            ptx_kernels: None,
        };
        let steps = |later| StepCompiles {
            first: counts(40, 3),
            second: counts(5, 0),
            later,
            later_kernels: vec![],
            later_outside: ByKernel::default(),
        };
        let mut once = report(Backend::Cpu, vec![], vec![]);
        once.compiles = Some(steps(counts(0, 0)));
        let mut again = report(Backend::Cuda, vec![], vec![]);
        again.compiles = Some(steps(counts(2, 0)));
        let flex = report(Backend::Flex, vec![], vec![]);
        let (table, ok) = compile_table(&[flex, once]);
        assert!(ok, "{table}");
        let row = "| cpu | 40 / 3 / - | 5 / 0 / - | 0 / 0 / - | 3.6 / 0.0 / 0.0 | yes |";
        assert!(table.contains(row), "{table}");
        let (table, ok) = compile_table(&[again]);
        assert!(!ok);
        let row = "| cuda | 40 / 3 / - | 5 / 0 / - | 2 / 0 / - | 3.6 / 0.0 / 0.0 | NO |";
        assert!(table.contains(row), "{table}");
        assert_eq!(
            compile_table(&[report(Backend::Flex, vec![], vec![])]),
            (String::new(), true)
        );
    }

    /// Steps 3..K's launches per phase, averaged, and the kernels by launches per step.
    #[test]
    fn launch_table_averages_steps_after_the_second() {
        use crate::run::metrics::PhaseTimes;

        let step = |forward: u64, backward: u64| {
            let mut phases = PhaseTimes::default();
            let ms = |n: u64| Duration::from_micros(10 * n);
            for (phase, n) in [(Phase::Forward, forward), (Phase::Backward, backward)] {
                let issued = Issued {
                    launches: n,
                    kernel_time: ms(n),
                };
                phases.add_launched(phase, issued);
            }
            EpochMetrics {
                phases,
                ..Default::default()
            }
        };
        let tally = |launches, ms| Issued {
            launches,
            kernel_time: Duration::from_millis(ms),
        };
        let kernels = |pairs: &[(&str, Issued)]| {
            ByKernel(pairs.iter().map(|(k, i)| (k.to_string(), *i)).collect())
        };
        let forward = kernels(&[
            ("FusedElemwise", tally(200, 2)),
            ("StepKernel", tally(40, 8)),
        ]);
        let backward = kernels(&[("FusedElemwise", tally(100, 1))]);
        let mut r = report(Backend::Cpu, vec![], vec![]);
        // Steps 1 and 2 compile and are left out: 3 and 4 average to 150 and 50.
        r.steps = vec![
            step(9000, 9000),
            step(700, 700),
            step(100, 40),
            step(200, 60),
        ];
        r.compiles = Some(StepCompiles {
            first: CompileCounts::default(),
            second: CompileCounts::default(),
            later: CompileCounts::default(),
            later_kernels: vec![
                (Phase::Forward, forward),
                (Phase::Baseline, ByKernel::default()),
                (Phase::Backward, backward),
            ],
            later_outside: kernels(&[("SubOp", tally(60, 3))]),
        });
        let table = launch_table(std::slice::from_ref(&r), true);
        // The launches between phases (30 a step) are a column of their own, and in the step.
        assert!(table.contains("| 0 (0.00 ms) | 0 (0.00 ms) | 150 (1.50 ms) | 0 (0.00 ms) | 0 (0.00 ms) | 50 (0.50 ms) | 0 (0.00 ms) | 30 (1.50 ms) | 230 (3.50 ms) |"), "{table}");
        let fused = table
            .find("| FusedElemwise | 100.0 | 50.0 | 0.0 | 150.0 | 1.500 |")
            .expect(&table);
        let sub = table.find("| SubOp | 0.0 | 0.0 | 30.0 | 30.0 | 1.500 |");
        let step = table.find("| StepKernel | 20.0 | 0.0 | 0.0 | 20.0 | 4.000 |");
        assert!(fused < sub.expect(&table), "{table}");
        assert!(fused < step.expect(&table), "{table}");
        // Phases that launched nothing get no column.
        assert!(
            table.contains("| kernel | forward | backward | between phases | all | ms |"),
            "{table}"
        );
        assert!(launch_table(&[report(Backend::Flex, vec![], vec![])], false).is_empty());
    }

    #[test]
    fn agreement_scores_the_references_tours_and_counts_differing_ones() {
        // Two instances, tours 1 0 2 (3 steps) and 2 1 (2 steps), padded to 4. The second
        // backend's own second tour differs: counted, but the instance still counts, by
        // its log-likelihood of the reference's tour.
        let a = report(
            Backend::Ndarray,
            vec![-1.0, -2.0],
            vec![1, 0, 2, 0, 2, 1, 0, 0],
        );
        let mut b = report(
            Backend::Flex,
            vec![-1.0, -9.0],
            vec![1, 0, 2, 0, 1, 2, 0, 0],
        );
        b.followed_log_likelihoods = vec![-1.375, -2.0];
        assert_eq!(agreement(&a, &b), (0.375, 0.125, 1));
        // Per step of the reference's tour; padding with more trailing depot steps is the
        // same tour.
        let mut c = report(
            Backend::Flex,
            vec![-1.0, -2.0],
            vec![1, 0, 2, 0, 0, 0, 2, 1, 0, 0, 0, 0],
        );
        c.followed_log_likelihoods = vec![-1.0, -2.5];
        assert_eq!(agreement(&a, &c), (0.5, 0.25, 0));
        // A NaN, or a tour the other backend masks (−∞), fails whatever the tolerance.
        for bad in [f32::NAN, f32::NEG_INFINITY] {
            let mut e = report(
                Backend::Flex,
                vec![-1.0, -2.0],
                vec![1, 0, 2, 0, 2, 1, 0, 0],
            );
            e.followed_log_likelihoods = vec![bad, -2.0];
            assert_eq!(agreement(&a, &e).1, f64::INFINITY);
        }
    }

    /// A recipe's config becomes K epochs of one batch, validated after each on 64
    /// generated instances instead of its file.
    #[test]
    fn per_step_config_cuts_the_validation() {
        let text = include_str!("../../../../configs/cvrp100_60min.toml");
        let config = Config::from_toml(text, "cvrp100_60min.toml").unwrap();
        assert!(config.validation.file.is_some());
        let config = per_step_config(config, 3);
        assert_eq!(config.validation.file, None);
        assert_eq!(config.validation.size, VALIDATION_SIZE);
        assert_eq!(config.training.epochs, 3);
        assert_eq!(config.reinforce.batches_per_epoch, 1);
        assert_eq!(
            (config.training.lr_decay, config.training.lr_final),
            (1.0, None)
        );
    }

    #[test]
    fn cuda_gets_the_tf32_tolerance_whichever_side_it_is_on() {
        use MatmulPrecision::{High, Highest};
        assert_eq!(tolerance(Backend::Flex, Backend::Ndarray, High), 1e-5);
        assert_eq!(tolerance(Backend::Flex, Backend::Cpu, High), 1e-5);
        assert_eq!(tolerance(Backend::Flex, Backend::Cuda, High), 2e-2);
        assert_eq!(tolerance(Backend::Cuda, Backend::Flex, High), 2e-2);
        assert_eq!(tolerance(Backend::Cuda, Backend::Flex, Highest), 1e-4);
        assert_eq!(tolerance(Backend::Flex, Backend::Ndarray, Highest), 1e-5);
    }
}
