use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use routeburn_model::Backend;

use crate::atomic::write_atomic;
use crate::config::{Config, ModelConfig};
use crate::error::TrainError;
use crate::import::{import, rl4co};
use crate::run::checkpoint::{save_module, Checkpoints, TrainState, MODEL_FILE};

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// A PyTorch checkpoint of Kool et al.'s attention model (`epoch-99.pt`), with its
    /// `args.json` beside it.
    pub checkpoint: PathBuf,
    /// The run directory to write: `config.toml` and a checkpoint that `eval`, `solve` and
    /// `train --init-from` accept.
    #[arg(long)]
    pub out: PathBuf,
}

pub(crate) fn run(args: ImportArgs) -> Result<ExitCode, TrainError> {
    if args.out.join("config.toml").exists() {
        return Err(TrainError::Input(format!(
            "--out {}: already a run directory; choose a new one",
            args.out.display()
        )));
    }
    let device = Backend::resolve(None)?.device()?;
    let imported = import(&args.checkpoint, &device)?;
    let a = &imported.config;
    let summary = format!(
        "d = {}, {} layers, {} heads, {:?} normalisation, tanh clipping {}, load arithmetic {:?}",
        a.embed_dim, a.num_layers, a.num_heads, a.normalization, a.tanh_clipping, a.load_arithmetic
    );
    let trained_on = match imported.graph_size {
        Some(n) => format!("trained on {n} customers"),
        None => format!(
            "the file does not say for how many customers: [problem] n = {} in config.toml",
            rl4co::ASSUMED_GRAPH_SIZE
        ),
    };
    let config = Config::with_model(
        imported.problem_size(),
        ModelConfig::Attention(imported.config),
    );
    std::fs::create_dir_all(&args.out).map_err(|e| TrainError::io(&args.out, e))?;
    write_atomic(&args.out.join("config.toml"), config.to_toml().as_bytes())?;
    let checkpoints = Checkpoints::new(args.out.join(&config.checkpointing.dir));
    let dir = checkpoints.save(
        &Checkpoints::name(0, None),
        config.checkpointing.keep_last,
        |dir| {
            save_module(&imported.model, &dir.join(MODEL_FILE), "model")?;
            Ok(TrainState::imported(&config))
        },
    )?;
    eprintln!(
        "imported {} ({summary}; {trained_on}) into {}",
        args.checkpoint.display(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
