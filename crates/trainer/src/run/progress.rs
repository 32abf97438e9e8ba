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

/// Customers from which a decode's steps are shown as they go (on a terminal): below it a
/// whole decode takes about a second or less on 2 cores.
const SHOWN_FROM_CUSTOMERS: usize = 500;

/// A bar over a long decode's steps, fed from another thread by
/// [`routeburn_model::decode_steps_taken`] while the decode runs; hidden for decodes of
/// fewer than [`SHOWN_FROM_CUSTOMERS`] customers and where stderr is no terminal. `steps`
/// is the most the decode can take (every chunk 2n steps); a batch whose tours all end
/// sooner finishes early, so the time left is an upper bound.
pub(crate) struct DecodeWatch {
    bar: ProgressBar,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl DecodeWatch {
    /// Starts watching a decode of `rollouts` rollouts of `n` customers, at most `steps`
    /// steps in all.
    pub(crate) fn start(rollouts: usize, n: usize, steps: usize) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let shown = n >= SHOWN_FROM_CUSTOMERS && std::io::stderr().is_terminal();
        let bar = match shown {
            true => ProgressBar::new(steps as u64),
            false => ProgressBar::hidden(),
        };
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] step {pos}/{len} at most, {elapsed}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(format!("encoding {n} customers"));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let poller = shown.then(|| {
            let (bar, done) = (bar.clone(), done.clone());
            let start = routeburn_model::decode_steps_taken();
            std::thread::spawn(move || {
                let mut stepping = false;
                while !done.load(Ordering::Relaxed) {
                    let steps = routeburn_model::decode_steps_taken() - start;
                    // The time left is reckoned from the steps' rate, not the encoder's.
                    if steps > 0 && !stepping {
                        stepping = true;
                        bar.reset_eta();
                        bar.set_style(decoding_style());
                        bar.set_message(format!("decoding {rollouts} rollouts of {n} customers"));
                    }
                    bar.set_position(steps as u64);
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            })
        });
        Self { bar, done, poller }
    }
}

/// [`DecodeWatch`]'s bar once the decode steps: with the time left at most.
fn decoding_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{msg} [{bar:30}] step {pos}/{len} at most, {elapsed}, at most {eta} left",
    )
    .expect("valid template")
    .progress_chars("=> ")
}

impl Drop for DecodeWatch {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        self.bar.finish_and_clear();
    }
}

/// A bar over the instances `eval` has solved (hidden where stderr is no terminal or there
/// is one batch).
pub(crate) fn instances_bar(instances: usize, batches: usize) -> ProgressBar {
    if batches < 2 || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(instances as u64);
    pb.set_style(
        ProgressStyle::with_template("solving [{bar:30}] {pos}/{len} instances, eta {eta}")
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
