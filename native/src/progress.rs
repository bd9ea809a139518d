//! Progress bars on stderr for the waits a user sits through: a cache being
//! written (`storage::WritePipeline`) or uploaded (`storage::upload`), a
//! population fetched from object storage into a replica's mirror, and the
//! rows file built once for a population stored by a build from before rows
//! files (`population::PopulationStore::open_population`).
//!
//! One rule for every bar, the rule of `dataset_rt.progress` on the Python
//! side: a bar is drawn only when its caller asks (`show_progress`, which the
//! Python layer turns off for `show_progress=False` and for
//! `-q`/`--quiet`) and stderr is a terminal. Otherwise `bar` returns a hidden
//! bar, on which every call does nothing, so a caller never branches on it.
//! Never stdout, which may carry data (`inspect --json`).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What a bar counts; it sets the bar's words and number format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Records of a cache; the caller's message (`set_message`) follows the rate.
    Records,
    /// Rows of a population.
    Rows,
    /// Bytes, shown in KiB, MiB, GiB.
    Bytes,
}

/// A bar labelled `label` counting `unit`s up to `total` (None: unknown, a
/// spinner), drawn on stderr when `shown` and stderr is a terminal; a hidden
/// bar otherwise.
pub fn bar(shown: bool, label: impl Into<String>, total: Option<u64>, unit: Unit) -> ProgressBar {
    if !shown || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template(unit, total.is_some())) {
        bar.set_style(style);
    }
    bar.set_prefix(label.into());
    bar
}

fn template(unit: Unit, known_total: bool) -> &'static str {
    match (unit, known_total) {
        (Unit::Records, true) => {
            "{prefix} {bar:30} {pos}/{len} records · {per_sec:0} · {msg} · ETA {eta}"
        }
        (Unit::Records, false) => "{prefix} {spinner} {pos} records · {per_sec:0} · {msg}",
        (Unit::Rows, true) => "{prefix} {bar:30} {pos}/{len} rows · {per_sec:0} · ETA {eta}",
        (Unit::Rows, false) => "{prefix} {spinner} {pos} rows · {per_sec:0}",
        (Unit::Bytes, true) => {
            "{prefix} {bar:30} {bytes}/{total_bytes} · {bytes_per_sec} · ETA {eta}"
        }
        (Unit::Bytes, false) => "{prefix} {spinner} {bytes} · {bytes_per_sec}",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_not_asked_for_is_hidden_and_still_counts() {
        let bar = bar(false, "writing c", Some(10), Unit::Records);
        assert!(bar.is_hidden());
        bar.inc(4);
        bar.set_message("1.0 MiB");
        bar.finish_and_clear();
        assert_eq!(bar.position(), 4);
    }

    #[test]
    fn every_template_parses() {
        for unit in [Unit::Records, Unit::Rows, Unit::Bytes] {
            for known in [true, false] {
                assert!(
                    ProgressStyle::with_template(template(unit, known)).is_ok(),
                    "{unit:?} {known}"
                );
            }
        }
    }
}
