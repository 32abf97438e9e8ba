use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use routeburn_model::{Backend, RoutingModel};

use crate::atomic::write_atomic;
use crate::config::ModelConfig;
use crate::error::TrainError;
use crate::export::{export, Format};
use crate::inference::TrainedModel;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The attention model to export: a run directory (its best checkpoint, else its
    /// latest), a checkpoint directory, or a PyTorch checkpoint `eval` reads.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A new (or empty) directory for the files: Kool's `args.json` and `epoch-N.pt` (N
    /// counts from 0 as in his runs: a checkpoint after 3 epochs is `epoch-2.pt`), or
    /// rl4co's `policy.ckpt`.
    #[arg(long)]
    pub out: PathBuf,
    /// Whose checkpoint to write.
    #[arg(long, value_enum, default_value_t = Format::Kool)]
    pub format: Format,
}

pub(crate) fn run(args: ExportArgs) -> Result<ExitCode, TrainError> {
    check_out_dir(&args.out)?;
    let device = Backend::resolve(None)?.device()?;
    let trained = TrainedModel::load(&args.checkpoint, &device)?;
    let (RoutingModel::Attention(model), ModelConfig::Attention(config)) =
        (&trained.model, &trained.config.model)
    else {
        return Err(TrainError::checkpoint(
            &trained.checkpoint,
            "a pointer network: `export` writes attention models",
        ));
    };
    let epochs = trained.state().map(|s| s.epochs_completed);
    let n = trained.config.problem.n;
    let exported = export(args.format, model, config, n, epochs.unwrap_or(0)).map_err(|why| {
        TrainError::checkpoint(
            &trained.checkpoint,
            format!("cannot be exported as {} model: {why}", args.format.whose()),
        )
    })?;
    std::fs::create_dir_all(&args.out).map_err(|e| TrainError::io(&args.out, e))?;
    for (name, bytes) in &exported.files {
        write_atomic(&args.out.join(name), bytes)?;
    }
    for warning in &exported.warnings {
        eprintln!("warning: {warning}");
    }
    let after = epochs.map_or(String::new(), |e| format!(" (after {e} epochs)"));
    let written: Vec<String> = exported
        .files
        .iter()
        .map(|(name, _)| args.out.join(name).display().to_string())
        .collect();
    eprintln!(
        "exported the attention model of {}{after} to {}; {}",
        trained.checkpoint.display(),
        written.join(" and "),
        how_to_load(args.format, &args.out)
    );
    Ok(ExitCode::SUCCESS)
}

/// How the other code loads the files.
fn how_to_load(format: Format, out: &Path) -> String {
    let out = out.display();
    match format {
        Format::Kool => format!(
            "in Kool's attention-learn-to-route: python eval.py DATA.pkl --model {out} --decode_strategy greedy"
        ),
        Format::Rl4co => format!(
            "in Python with rl4co: c = torch.load(\"{out}/policy.ckpt\"); policy = AttentionModelPolicy(**c[\"hyper_parameters\"][\"policy_kwargs\"]); policy.load_state_dict({{k.removeprefix(\"policy.\"): v for k, v in c[\"state_dict\"].items()}})"
        ),
    }
}

/// `--out` must be a directory without files in it: Kool's `load_model` takes a
/// directory's highest `epoch-N.pt`, which need not be the one written now, and nothing of
/// an earlier export should pass for this one.
fn check_out_dir(out: &Path) -> Result<(), TrainError> {
    if out.is_file() || out.extension().is_some_and(|e| e == "pt" || e == "ckpt") {
        return Err(TrainError::Input(format!(
            "--out {}: names a directory, for the exported files (Kool's code reads args.json and epoch-N.pt side by side)",
            out.display()
        )));
    }
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(());
    };
    match entries.filter_map(Result::ok).map(|e| e.path()).min() {
        Some(file) => Err(TrainError::Input(format!(
            "--out {}: already holds {}; export into a new directory (Kool's code loads a directory's highest epoch-N.pt)",
            out.display(),
            file.display()
        ))),
        None => Ok(()),
    }
}
