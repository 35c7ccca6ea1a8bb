//! Progress on standard error while the example imports and delivers: two bars (rows
//! imported, deliveries completed), drawn only when standard error is a terminal, so that the
//! report on standard output and any redirected or captured output stay as they are.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;

/// The bars; nothing at all when standard error is not a terminal.
pub struct Progress {
    bars: Option<(MultiProgress, ProgressBar, ProgressBar, JoinHandle<()>)>,
}

impl Progress {
    /// Starts the bars: `rows` to import, and the deliveries `completed` so far (read every
    /// 100 ms).
    pub fn start(rows: u64, completed: Arc<AtomicU64>) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { bars: None };
        }
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let style = |template: &str| {
            ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ")
        };
        let import = multi.add(ProgressBar::new(rows));
        import.set_style(style("importing  [{bar:40}] {pos}/{len} rows ({eta})"));
        let deliver = multi.add(ProgressBar::no_length());
        deliver.set_style(style("delivering {spinner} {pos} deliveries completed"));
        let ticker = {
            let deliver = deliver.clone();
            tokio::spawn(async move {
                loop {
                    deliver.set_position(completed.load(Ordering::Relaxed));
                    deliver.tick();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        Progress {
            bars: Some((multi, import, deliver, ticker)),
        }
    }

    /// `n` more rows imported.
    pub fn imported(&self, n: u64) {
        if let Some((_, import, _, _)) = &self.bars {
            import.inc(n);
        }
    }

    /// Clears the bars (before the report is printed).
    pub fn finish(self) {
        if let Some((multi, import, deliver, ticker)) = self.bars {
            ticker.abort();
            import.finish_and_clear();
            deliver.finish_and_clear();
            let _ = multi.clear();
        }
    }
}
