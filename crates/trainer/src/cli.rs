use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands;
use crate::error::CliError;

/// Neural solvers for the Capacitated Vehicle Routing Problem, trained with Burn.
#[derive(Debug, Parser)]
#[command(name = "routeburn", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
    /// Draw a run's training curves (SVG) from its metrics.csv.
    Plot(commands::plot::PlotArgs),
    /// Run the same training steps (seed, config, initial weights) on every compiled
    /// backend: time per step and phase, instances/s, peak memory, numerical agreement.
    ///
    /// Exit status 1 when a backend disagrees with the first beyond the tolerance.
    CompareBackends(commands::compare::CompareArgs),
}

pub fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Gen(args) => commands::gen::run(args),
        Command::Check(args) => commands::check::run(args),
        Command::Label(args) => commands::label::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Solve(args) => commands::solve::run(args),
        Command::Plot(args) => commands::plot::run(args),
        Command::CompareBackends(args) => commands::compare::run(args),
    }
}
