//! Ctrl-C (SIGINT) and SIGTERM: the run finishes the step it is in, saves what it has and
//! exits with 128 + the signal (130, 143); a second signal exits at once.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::low_level;

use crate::error::TrainError;

/// The first signal received, 0 while none.
static PENDING: AtomicI32 = AtomicI32::new(0);
/// Training steps taken by this process (for the test hook).
static STEPS: AtomicUsize = AtomicUsize::new(0);

/// Installs the handlers (the `train` command does, once). A write past a file-size limit
/// (`ulimit -f`) then fails as a write error instead of killing the process.
pub(crate) fn install() -> Result<(), TrainError> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: setting a signal's disposition to "ignore" runs no code of ours.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    for signal in [SIGINT, SIGTERM] {
        // SAFETY: the action only swaps an atomic and calls `_exit`, both async-signal-safe.
        unsafe {
            low_level::register(signal, move || {
                if PENDING.swap(signal, Ordering::SeqCst) != 0 {
                    low_level::exit(128 + signal);
                }
            })
        }
        .map_err(|e| TrainError::Input(format!("cannot install the signal handlers: {e}")))?;
    }
    Ok(())
}

/// The signal that asked the run to stop, if one did.
pub(crate) fn pending() -> Option<i32> {
    match PENDING.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The name the user knows a signal by.
pub(crate) fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Called after every training step. For tests of the handlers:
/// `ROUTEBURN_RAISE_AFTER_STEPS=K` sends this process the signals in
/// `ROUTEBURN_RAISE_SIGNALS` (`INT`, `TERM`, or `INT,INT` for a second Ctrl-C; default
/// `INT`) after its K-th step, through the real handlers.
pub(crate) fn step_done() {
    static RAISE_AFTER: OnceLock<Option<usize>> = OnceLock::new();
    let raise_after = RAISE_AFTER.get_or_init(|| {
        std::env::var("ROUTEBURN_RAISE_AFTER_STEPS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    });
    let steps = STEPS.fetch_add(1, Ordering::SeqCst) + 1;
    if *raise_after != Some(steps) {
        return;
    }
    let signals = std::env::var("ROUTEBURN_RAISE_SIGNALS").unwrap_or_else(|_| "INT".into());
    for s in signals.split(',') {
        let _ = low_level::raise(if s == "TERM" { SIGTERM } else { SIGINT });
    }
}
