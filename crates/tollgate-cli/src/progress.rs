//! Progress bars for long commands (`limits apply`, `bench-http`), with indicatif: drawn on
//! stderr only when it is a terminal, never with `--json`; otherwise hidden (no output).

use std::io::IsTerminal;

/// A bar of `len` steps labelled `what`, or a hidden one.
pub fn bar(len: u64, what: &str, enabled: bool) -> indicatif::ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    let template = format!("{{spinner}} {what} [{{bar:30}}] {{pos}}/{{len}} {{msg}}");
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        b.set_style(style.progress_chars("=> "));
    }
    b
}
