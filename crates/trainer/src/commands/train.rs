use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use routeburn_model::{Backend, LoadArithmetic, RoutingModel};

use crate::config::{Config, ModelConfig, ModelKind};
use crate::error::TrainError;
use crate::inference::TrainedModel;
use crate::memory::check_training_fits;
use crate::run::checkpoint::save_module;
use crate::run::interrupt;
use crate::run::lr_schedule::LrSchedule;
use crate::run::skeleton::{check_new_run_dir, TrainOptions};
use crate::training::train;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Training config (TOML). Default: the embedded default config, which finishes in
    /// about two minutes on 2 CPU cores.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model to train; overrides the config's `model.kind` (with that model's default
    /// settings when the config describes the other one).
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// Run directory (default: a new folder under `runs/`).
    #[arg(long, conflicts_with = "resume")]
    pub run_dir: Option<PathBuf>,
    /// Continue the run in this directory from its latest checkpoint, with its config.
    #[arg(long, conflicts_with = "config")]
    pub resume: Option<PathBuf>,
    /// With --resume: continue from this checkpoint (`epoch-NNNN`, see RUN_DIR/checkpoints)
    /// instead of the latest, e.g. when the latest is damaged.
    #[arg(long, requires = "resume")]
    pub resume_from: Option<String>,
    /// Start from a trained model's weights, with a fresh optimiser: a run directory, a
    /// checkpoint directory, or a PyTorch checkpoint of Kool's attention model. Its
    /// `[model]` section replaces the config's; its weights are validated before epoch 1.
    #[arg(long, conflicts_with = "resume")]
    pub init_from: Option<PathBuf>,
    /// Tensor backend: ndarray, flex, cuda, or cpu (CubeCL's CPU runtime, a stand-in for
    /// CUDA's compile path) (default: the best one compiled in).
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<String>,
    /// Override `training.epochs`.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Override `training.time_limit`: the run's wall-clock budget, resumed sessions
    /// included (`90s`, `25m`, `2h`, `1h30m`).
    #[arg(long, value_parser = parse_time_limit)]
    pub time_limit: Option<String>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What to train, where, and whether it continues an earlier run.
struct Plan {
    config: Config,
    run_dir: PathBuf,
    resume: bool,
    /// The config file's directory, for relative paths inside it.
    config_dir: Option<PathBuf>,
    /// The `model.load_arithmetic` the config file states, which `--init-from` keeps.
    stated_load_arithmetic: Option<LoadArithmetic>,
}

pub(crate) fn run(args: TrainArgs) -> Result<ExitCode, TrainError> {
    let backend = Backend::resolve(args.backend.as_deref())?;
    // A backend that cannot run here (no NVIDIA driver, no GPU) says so before any work.
    backend.device()?;
    interrupt::install()?;
    let mut plan = plan(&args)?;
    if let Some(e) = args.epochs {
        if e == 0 {
            return Err(TrainError::Input("--epochs must be at least 1".into()));
        }
        plan.config.training.epochs = e;
    }
    if let Some(limit) = &args.time_limit {
        plan.config.training.time_limit = Some(limit.clone());
    }
    let init_weights = match &args.init_from {
        Some(source) => Some(take_weights_from(source, &mut plan, backend, args.quiet)?),
        None => None,
    };
    let origin = match (&args.config, &args.resume) {
        (_, Some(run)) => run.join("config.toml").display().to_string(),
        (Some(path), None) => path.display().to_string(),
        (None, None) => "the embedded default config".to_string(),
    };
    check_training_fits(&backend.device()?, &plan.config, &origin)?;
    if !args.quiet {
        announce(&plan, backend);
    }
    let summary = train(TrainOptions {
        config: plan.config,
        run_dir: plan.run_dir,
        backend,
        resume: plan.resume,
        resume_from: args.resume_from.clone(),
        stop_after_epochs: None,
        verbose: !args.quiet,
        config_dir: plan.config_dir,
        validate_initial: init_weights.is_some(),
        after_epoch: None,
        init_weights,
    })?;
    if !args.quiet {
        if let (Some(first), Some(last)) = (summary.epochs.first(), summary.epochs.last()) {
            eprintln!(
                "done: validation cost {:.4} -> {:.4}; metrics in {}",
                first.val_cost,
                last.val_cost,
                summary.run_dir.join("metrics.csv").display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_time_limit(s: &str) -> Result<String, String> {
    crate::config::parse_duration(s).map(|_| s.to_string())
}

/// `--init-from SOURCE`: the source's model section replaces the plan's, and its weights
/// are written into the new run directory (`initial-weights.bpk`), whose path is returned.
fn take_weights_from(
    source: &Path,
    plan: &mut Plan,
    backend: Backend,
    quiet: bool,
) -> Result<PathBuf, TrainError> {
    let trained = TrainedModel::load(source, &backend.device()?)?;
    let mut model = trained.config.model.clone();
    let kept = match (&mut model, plan.stated_load_arithmetic) {
        (ModelConfig::Attention(m), Some(stated)) => {
            let changed = m.load_arithmetic != stated;
            m.load_arithmetic = stated;
            changed.then_some(stated)
        }
        _ => None,
    };
    if !quiet && (model != plan.config.model || kept.is_some()) {
        let keeping = match kept {
            Some(LoadArithmetic::Exact) => ", keeping its load_arithmetic = \"exact\"",
            Some(LoadArithmetic::Float32) => ", keeping its load_arithmetic = \"float32\"",
            None => "",
        };
        eprintln!(
            "--init-from {}: training its {} model ([model] of the config replaced{keeping})",
            source.display(),
            trained.config.model_kind()
        );
    }
    plan.config.model = model;
    std::fs::create_dir_all(&plan.run_dir).map_err(|e| TrainError::io(&plan.run_dir, e))?;
    let path = plan.run_dir.join("initial-weights.bpk");
    match &trained.model {
        RoutingModel::Attention(m) => save_module(m, &path, "initial weights")?,
        RoutingModel::Pointer(m) => save_module(m, &path, "initial weights")?,
    }
    Ok(path)
}

/// `--resume DIR` continues that run with its own config; otherwise `--config` (or the
/// embedded default) starts a new run in `--run-dir` (or a new folder under `runs/`).
fn plan(args: &TrainArgs) -> Result<Plan, TrainError> {
    if let Some(dir) = &args.resume {
        let path = dir.join("config.toml");
        if !path.exists() {
            return Err(TrainError::Input(format!(
                "--resume {}: not a run directory (no config.toml)",
                dir.display()
            )));
        }
        let config = Config::load_run(&path)?;
        if let Some(m) = args.model.filter(|&m| m != config.model_kind()) {
            return Err(TrainError::Input(format!(
                "--model {m}: the run in {} trains the {} model",
                dir.display(),
                config.model_kind()
            )));
        }
        // Runs made before input paths were pinned name them relative to where they
        // started, usually an ancestor of the run directory (`runs/NAME` in a checkout).
        return Ok(Plan {
            config,
            run_dir: dir.clone(),
            resume: true,
            config_dir: std::path::absolute(dir).ok(),
            stated_load_arithmetic: None,
        });
    }
    let (config, stated_load_arithmetic, stem, config_dir) = match &args.config {
        Some(path) => {
            let (config, stated) = Config::load_stating_load_arithmetic(path, args.model)?;
            let stem = path.file_stem();
            let stem = stem.map_or("run".into(), |s| s.to_string_lossy().into_owned());
            (config, stated, stem, path.parent().map(Path::to_path_buf))
        }
        None => (
            Config::embedded_default_as(args.model)?,
            None,
            "default".to_string(),
            None,
        ),
    };
    let run_dir = match &args.run_dir {
        Some(d) => d.clone(),
        None => new_run_dir(Path::new("runs"), &stem)?,
    };
    // Before any output, and before `--init-from` writes its weights there.
    check_new_run_dir(&run_dir)?;
    Ok(Plan {
        config,
        run_dir,
        resume: false,
        config_dir,
        stated_load_arithmetic,
    })
}

fn announce(plan: &Plan, backend: Backend) {
    let config = &plan.config;
    let batches = match config.model {
        ModelConfig::Attention(_) => format!("{} batches", config.reinforce.batches_per_epoch),
        ModelConfig::Pointer(_) => format!("passes over {} labels", config.supervised.labels),
    };
    eprintln!(
        "training the {} model on {} ({} customers, {} epochs x {batches} x {}) in {}",
        config.model_kind(),
        backend,
        config.problem.n,
        config.training.epochs,
        config.training.batch_size,
        plan.run_dir.display()
    );
    eprintln!("{}", LrSchedule::new(&config.training).describe());
}

/// `runs/{stem}-NNN`, the first number not taken.
fn new_run_dir(root: &Path, stem: &str) -> Result<PathBuf, TrainError> {
    for i in 1..10_000 {
        let dir = root.join(format!("{stem}-{i:03}"));
        if !dir.exists() {
            return Ok(dir);
        }
    }
    Err(TrainError::Input(format!(
        "{}: too many runs named {stem}",
        root.display()
    )))
}
