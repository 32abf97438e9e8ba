//! `routeburn`: train, evaluate and use neural CVRP solvers.

fn main() -> std::process::ExitCode {
    routeburn_trainer::allocator::tune_for_tensors();
    routeburn_trainer::cli::main()
}
