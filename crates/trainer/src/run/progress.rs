//! What a run prints: a progress bar per epoch (on a terminal) and a summary line.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Config;
use crate::run::metrics::EpochMetrics;

/// The epoch's progress bar, or None when it is not wanted or stderr is no terminal.
pub(crate) fn epoch_bar(
    config: &Config,
    epoch: usize,
    steps: usize,
    verbose: bool,
) -> Option<ProgressBar> {
    if !(verbose && config.logging.progress && std::io::stderr().is_terminal()) {
        return None;
    }
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} batches, eta {eta} | {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_prefix(format!("{}/{}", epoch + 1, config.training.epochs));
    Some(pb)
}

/// The labelling progress bar (hidden unless `visible`).
pub(crate) fn labelling_bar(len: usize, visible: bool) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "labelling [{bar:30}] {pos}/{len} instances, {per_sec}, eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb
}

/// The end-of-epoch summary: `costs` is the method's description of the epoch's costs.
pub(crate) fn print_summary(m: &EpochMetrics, epochs: usize, costs: &str) {
    eprintln!(
        "epoch {}/{epochs}: {costs} | val {:.4}{} | loss {:.4} | grad norm {:.3} | {:.1}s, {:.0} inst/s",
        m.epoch,
        m.val_cost,
        m.val_gap.map_or(String::new(), |g| format!(" (gap {g:.2}%)")),
        m.loss,
        m.grad_norm,
        m.seconds,
        m.instances_per_second
    );
    eprintln!("  phases: {}", m.phases.summary());
}
