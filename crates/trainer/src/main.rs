//! `routeburn`: train, evaluate and use neural CVRP solvers.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    routeburn_trainer::allocator::tune_for_tensors();
    let cli = routeburn_trainer::cli::Cli::parse();
    match routeburn_trainer::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::from(e.exit_code())
        }
    }
}
