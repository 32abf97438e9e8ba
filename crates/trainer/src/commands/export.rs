use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use routeburn_model::{Backend, RoutingModel};

use crate::atomic::write_atomic;
use crate::config::ModelConfig;
use crate::error::TrainError;
use crate::export::kool_checkpoint;
use crate::inference::TrainedModel;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The attention model to export: a run directory (its best checkpoint, else its
    /// latest), a checkpoint directory, or a PyTorch checkpoint `eval` reads.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A new directory for Kool's `args.json` and `epoch-N.pt` (N counts from 0 as in
    /// Kool's runs: a checkpoint after 3 epochs is `epoch-2.pt`).
    #[arg(long)]
    pub out: PathBuf,
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
            "a pointer network: `export` writes Kool's attention model",
        ));
    };
    let files = kool_checkpoint(model, config, trained.config.problem.n).map_err(|why| {
        TrainError::checkpoint(
            &trained.checkpoint,
            format!("cannot be exported to Kool's model: {why}"),
        )
    })?;
    let epochs = trained.state().map(|s| s.epochs_completed);
    let weights = args.out.join(format!(
        "epoch-{}.pt",
        epochs.unwrap_or(0).saturating_sub(1)
    ));
    std::fs::create_dir_all(&args.out).map_err(|e| TrainError::io(&args.out, e))?;
    // The weights first: a directory with args.json in it is complete.
    write_atomic(&weights, &files.weights)?;
    write_atomic(&args.out.join("args.json"), files.args.as_bytes())?;
    for warning in &files.warnings {
        eprintln!("warning: {warning}");
    }
    let after = epochs.map_or(String::new(), |e| format!(" (after {e} epochs)"));
    eprintln!(
        "exported the attention model of {}{after} to {} and args.json beside it; in Kool's attention-learn-to-route: python eval.py DATA.pkl --model {} --decode_strategy greedy",
        trained.checkpoint.display(),
        weights.display(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `--out` must not hold a Kool checkpoint already: his `load_model` takes a directory's
/// highest `epoch-N.pt`, which need not be the one written now.
fn check_out_dir(out: &std::path::Path) -> Result<(), TrainError> {
    if out.is_file() || out.extension().is_some_and(|e| e == "pt") {
        return Err(TrainError::Input(format!(
            "--out {}: names a directory, for args.json and epoch-N.pt (Kool's code reads them side by side)",
            out.display()
        )));
    }
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(());
    };
    let taken = entries.filter_map(Result::ok).map(|e| e.path()).find(|p| {
        p.file_name().is_some_and(|n| n == "args.json") || p.extension().is_some_and(|e| e == "pt")
    });
    match taken {
        Some(file) => Err(TrainError::Input(format!(
            "--out {}: already holds {}; Kool's code loads a directory's highest epoch-N.pt, so export into a new directory",
            out.display(),
            file.display()
        ))),
        None => Ok(()),
    }
}
