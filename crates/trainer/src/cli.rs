use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands;
use crate::error::TrainError;
use routeburn_model::Backend;

/// Neural solvers for the Capacitated Vehicle Routing Problem, trained with Burn.
#[derive(Debug, Parser)]
#[command(name = "routeburn", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Do not keep compiled GPU kernels on disk (CubeCL backends; default: kept in
    /// `~/.cache/routeburn/kernels`, see the README, "Backends"). Also
    /// `ROUTEBURN_KERNEL_CACHE=off`.
    #[arg(long, global = true)]
    no_kernel_cache: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Generate random instances (Kool et al.'s uniform distribution) to JSONL or .vrp files.
    Gen(commands::gen::GenArgs),
    /// Validate a solution (.sol) for an instance (.vrp) and print its cost.
    ///
    /// Exit status: 0 for a feasible solution, 1 for an infeasible one, 2 for unreadable or
    /// malformed input.
    Check(commands::check::CheckArgs),
    /// Solve a JSONL dataset with the classical heuristic (savings + local search) and write
    /// it as labels for supervised training; reports the gap to any reference costs.
    Label(commands::label::LabelArgs),
    /// Train a model (default: the attention model with REINFORCE on the embedded config).
    Train(commands::train::TrainArgs),
    /// Evaluate a trained model on a JSONL dataset or a directory of .vrp files.
    Eval(commands::eval::EvalArgs),
    /// Solve CVRPLIB .vrp instances with a trained model, writing .sol (and .svg) files.
    Solve(commands::solve::SolveArgs),
    /// Import a PyTorch checkpoint of Kool et al.'s attention model into a run directory.
    ///
    /// `eval` and `solve` also take such a file as `--checkpoint` directly.
    Import(commands::import::ImportArgs),
    /// Export a trained attention model as a PyTorch checkpoint: Kool et al.'s (`epoch-N.pt`
    /// and `args.json`, which his `eval.py` and `run.py --load_path` load) or rl4co's.
    Export(commands::export::ExportArgs),
    /// Draw a run's training curves (SVG) from its metrics.csv.
    Plot(commands::plot::PlotArgs),
    /// Run the same training steps (seed, config, initial weights) on every compiled
    /// backend: time per step and phase, instances/s, peak memory, numerical agreement.
    ///
    /// Exit status 1 when a backend disagrees with the first beyond the tolerance.
    CompareBackends(commands::compare::CompareArgs),
}

/// Parses the command line, runs the command, prints any error with its causes, and
/// returns the exit status.
pub fn main() -> ExitCode {
    pin_default_device();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            let mut said = e.to_string();
            eprintln!("error: {said}");
            let mut source = std::error::Error::source(&e);
            // A file error's message already ends with the OS's reason; say each once.
            while let Some(s) = source {
                let cause = s.to_string();
                if !said.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                    said.push_str(&cause);
                }
                source = s.source();
            }
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The exit status of each kind of error: 2 for bad input (a file, config, flag or
/// checkpoint), 1 for a run or a solve that started and could not go on.
pub fn exit_code(e: &TrainError) -> u8 {
    match e {
        TrainError::NonFinite { .. }
        | TrainError::Infeasible(_)
        | TrainError::Failed(_)
        | TrainError::Device { .. } => 1,
        TrainError::Interrupted { signal, .. } => (128 + signal).clamp(1, 255) as u8,
        TrainError::Data(_)
        | TrainError::Backend(_)
        | TrainError::Config { .. }
        | TrainError::Checkpoint { .. }
        | TrainError::Input(_)
        | TrainError::Io { .. }
        | TrainError::Partial(_) => 2,
    }
}

/// Burn 0.22.1 builds some state on `Device::default()`, which in a binary with cuda
/// compiled in is CUDA: its `ModuleOptimizer::load_record` did, so resuming a CPU run on a
/// machine without a GPU panicked (routeburn's own Adam now loads onto the run's device). A
/// CPU default is always there; routeburn names every device it uses itself. Runs first in
/// `main`, before any thread exists; `BURN_DEVICE` set by the user is kept.
fn pin_default_device() {
    if std::env::var_os("BURN_DEVICE").is_none() {
        // Burn's own CPU backends only (not CubeCL's CPU runtime).
        if let Ok(cpu @ (Backend::Flex | Backend::Ndarray)) = Backend::first_on_host() {
            std::env::set_var("BURN_DEVICE", cpu.name());
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, TrainError> {
    routeburn_model::cubecl_config::set_kernel_cache(!cli.no_kernel_cache);
    match cli.command {
        Command::Gen(args) => commands::gen::run(args),
        Command::Check(args) => commands::check::run(args),
        Command::Label(args) => commands::label::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Solve(args) => commands::solve::run(args),
        Command::Plot(args) => commands::plot::run(args),
        Command::Import(args) => commands::import::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::CompareBackends(args) => commands::compare::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that fails at a read (on CUDA a kernel's fault surfaces there) stops the
    /// command with status 1 and says what was being read and why, not a panic.
    #[test]
    fn a_failed_device_read_is_an_error_naming_what_was_read() {
        let err = TrainError::device("the step's tours", "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(
            err.to_string(),
            "the device failed while reading the step's tours: CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        assert_eq!(exit_code(&err), 1);
    }

    /// The `routeburn ...` command lines of the user-facing docs, as written.
    fn documented_command_lines() -> Vec<(String, Vec<String>)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut lines = Vec::new();
        for doc in ["README.md", "docs/config.md"] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            let mut in_code = false;
            for line in text.lines() {
                if line.starts_with("```") {
                    in_code = !in_code;
                    continue;
                }
                let command = line.split('#').next().unwrap_or("").trim();
                // `routeburn ...`, or a built binary's path (`target/.../routeburn ...`).
                let program = command.split_whitespace().next().unwrap_or("");
                if in_code && (program == "routeburn" || program.ends_with("/routeburn")) {
                    let words = command.split_whitespace().map(String::from).collect();
                    lines.push((format!("{doc}: {command}"), words));
                }
            }
        }
        lines
    }

    /// Every `routeburn` line in the README parses as the CLI defines it, and the repository
    /// files it names (configs, data) exist; what it writes (`--out`, `runs/`) may not yet.
    #[test]
    fn readme_command_lines_parse_and_name_existing_files() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let lines = documented_command_lines();
        assert!(lines.len() >= 10, "the README's commands were found");
        for (line, words) in lines {
            if let Err(e) = Cli::try_parse_from(&words) {
                panic!("{line}: {e}");
            }
            for pair in words.windows(2) {
                let (flag, arg) = (&pair[0], &pair[1]);
                let output = flag.starts_with("--out");
                if !output && (arg.starts_with("configs/") || arg.starts_with("data/")) {
                    assert!(root.join(arg).exists(), "{line}: {arg} does not exist");
                }
            }
        }
    }
}
