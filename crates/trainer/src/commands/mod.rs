//! One module per subcommand; the value parsers their flags share are here, so `--help`
//! lists the accepted values and a typo gets a suggestion.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use routeburn_cost::Metric;
use routeburn_model::{Backend, MatmulPrecision};

use crate::inference::Strategy;

pub(crate) mod check;
pub(crate) mod compare;
pub(crate) mod eval;
pub(crate) mod export;
pub(crate) mod gen;
pub(crate) mod import;
pub(crate) mod label;
pub(crate) mod plot;
pub(crate) mod solve;
pub(crate) mod train;

/// `--backend`: one of the backends routeburn knows (whether it is compiled in is checked
/// when the command runs).
pub(crate) fn backend_parser() -> PossibleValuesParser {
    PossibleValuesParser::new(Backend::ALL.map(Backend::name))
}

/// `--matmul-precision`: `high` or `highest` (the config's `model.matmul_precision`).
pub(crate) fn matmul_precision_parser() -> impl TypedValueParser<Value = MatmulPrecision> {
    PossibleValuesParser::new(["high", "highest"]).try_map(|s| s.parse::<MatmulPrecision>())
}

/// `--metric`: how a solution is costed.
pub(crate) fn metric_parser() -> impl TypedValueParser<Value = Metric> {
    PossibleValuesParser::new(["cvrplib", "exact"]).try_map(|s| s.parse::<Metric>())
}

/// `--strategy`: `greedy`, `sample:K`, `multistart`, `aug8` or a `+` combination.
pub(crate) fn parse_strategy(s: &str) -> Result<Strategy, String> {
    s.parse()
}
