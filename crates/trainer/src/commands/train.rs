use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use routeburn_model::Backend;

use crate::config::{Config, ModelKind};
use crate::error::CliError;
use crate::training::{train, TrainOptions};

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Training config (TOML). Default: the embedded default config, which finishes in
    /// about two minutes on 2 CPU cores.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model to train; overrides the config's `model.kind`.
    #[arg(long, value_parser = parse_model)]
    pub model: Option<ModelKind>,
    /// Run directory (default: a new folder under `runs/`).
    #[arg(long, conflicts_with = "resume")]
    pub run_dir: Option<PathBuf>,
    /// Continue the run in this directory from its latest checkpoint, with its config.
    #[arg(long, conflicts_with = "config")]
    pub resume: Option<PathBuf>,
    /// Tensor backend: ndarray, flex or cuda (default: the best one compiled in).
    #[arg(long)]
    pub backend: Option<String>,
    /// Override `training.epochs`.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_model(s: &str) -> Result<ModelKind, String> {
    s.parse()
}

pub fn run(args: TrainArgs) -> Result<ExitCode, CliError> {
    let backend = Backend::resolve(args.backend.as_deref())?;
    let (mut config, run_dir, resume, config_dir) = match &args.resume {
        Some(dir) => {
            let path = dir.join("config.toml");
            if !path.exists() {
                return Err(CliError::Input(format!(
                    "--resume {}: not a run directory (no config.toml)",
                    dir.display()
                )));
            }
            (Config::load(&path)?, dir.clone(), true, None)
        }
        None => {
            let (config, stem, dir) = match &args.config {
                Some(path) => (
                    Config::load_as(path, args.model)?,
                    path.file_stem()
                        .map_or("run".into(), |s| s.to_string_lossy().into_owned()),
                    path.parent().map(Path::to_path_buf),
                ),
                None => (
                    Config::embedded_default_as(args.model)?,
                    "default".to_string(),
                    None,
                ),
            };
            let run_dir = match &args.run_dir {
                Some(d) => d.clone(),
                None => new_run_dir(Path::new("runs"), &stem)?,
            };
            (config, run_dir, false, dir)
        }
    };
    if let Some(m) = args.model {
        if resume && m != config.model.kind {
            return Err(CliError::Input(format!(
                "--model {m}: the run in {} trains `{}`",
                run_dir.display(),
                config.model.kind
            )));
        }
        config.model.kind = m;
    }
    if let Some(e) = args.epochs {
        if e == 0 {
            return Err(CliError::Input("--epochs must be at least 1".into()));
        }
        config.training.epochs = e;
    }
    if !args.quiet {
        let batches = match config.model.kind {
            ModelKind::GtRl => format!("{} batches", config.training.batches_per_epoch),
            ModelKind::PtrNet => format!("passes over {} labels", config.supervised.labels),
        };
        eprintln!(
            "training {} on {} ({} customers, {} epochs x {batches} x {}) in {}",
            config.model.kind,
            backend,
            config.problem.n,
            config.training.epochs,
            config.training.batch_size,
            run_dir.display()
        );
    }
    let summary = train(TrainOptions {
        config,
        run_dir,
        backend,
        resume,
        stop_after_epochs: None,
        verbose: !args.quiet,
        config_dir,
        init_weights: None,
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

/// `runs/{stem}-NNN`, the first number not taken.
fn new_run_dir(root: &Path, stem: &str) -> Result<PathBuf, CliError> {
    for i in 1..10_000 {
        let dir = root.join(format!("{stem}-{i:03}"));
        if !dir.exists() {
            return Ok(dir);
        }
    }
    Err(CliError::Input(format!(
        "{}: too many runs named {stem}",
        root.display()
    )))
}
