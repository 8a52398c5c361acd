//! The text log format: tracing-subscriber's default format (`Full`), with the access log's
//! lines written faster.
//!
//! `serve` logs one line per request (target `tollgate::access`). Through the default format
//! that line cost about as much as the rest of a `/healthz` request: the timestamp goes
//! through `core::fmt` piece by piece, and every field name is painted with `nu_ansi_term`
//! styles even when colours are off. [`Text`] writes an access line itself — the same bytes:
//! timestamp, level, target, fields — and hands every other event (other targets, events
//! inside a span, a terminal with colours) to the default format. A test compares the two
//! formats' output, line for line.
//!
//! The fields are written as the default field formatter (`DefaultFields`) writes them:
//! `Text` is meant for a subscriber that keeps it (the builder's default).

use std::cell::{Cell, RefCell};
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{DefaultVisitor, Format, Full, Writer};
use tracing_subscriber::fmt::time::SystemTime as DefaultTimer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The target of the access log's lines (tollgate-server's `access.rs` and `wire.rs`).
const ACCESS: &str = "tollgate::access";

/// The text format (module docs).
#[derive(Debug, Default)]
pub struct Text {
    standard: Format<Full, DefaultTimer>,
}

thread_local! {
    /// The second of the last timestamp written on this thread, and its
    /// `YYYY-MM-DDTHH:MM:SS.` text.
    static SECOND: Cell<(u64, [u8; 20])> = const { Cell::new((u64::MAX, [0; 20])) };
    /// The line being written.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if meta.target() != ACCESS || writer.has_ansi_escapes() || ctx.event_scope().is_some() {
            return self.standard.format_event(ctx, writer, event);
        }
        let written = LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                return None;
            };
            line.clear();
            if !timestamp(&mut line) {
                return None;
            }
            line.push(' ');
            line.push_str(level(meta.level()));
            line.push(' ');
            line.push_str(meta.target());
            line.push_str(": ");
            let mut fields = Fields {
                out: &mut line,
                empty: true,
                result: Ok(()),
            };
            event.record(&mut fields);
            let result = fields.result;
            line.push('\n');
            Some(result.and_then(|()| writer.write_str(&line)))
        });
        match written {
            Some(r) => r,
            // A clock before 1970 or past 9999, or a line written while this thread was
            // writing one (a value's formatting that logs).
            None => self.standard.format_event(ctx, writer, event),
        }
    }
}

/// The level as the default format writes it: five characters, right-aligned.
fn level(l: &Level) -> &'static str {
    match *l {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    }
}

/// Append the time now as the default timer writes it (RFC 3339 in UTC, microseconds:
/// `2026-12-05T10:11:12.123456Z`). False, with nothing written, for a time the fast path
/// does not write (before 1970, after 9999).
fn timestamp(out: &mut String) -> bool {
    let Ok(since) = SystemTime::now().duration_since(UNIX_EPOCH) else {
        return false;
    };
    let secs = since.as_secs();
    let (cached, mut prefix) = SECOND.get();
    if cached != secs {
        let Some(p) = second_text(secs) else {
            return false;
        };
        prefix = p;
        SECOND.set((secs, prefix));
    }
    // ASCII by construction.
    out.push_str(std::str::from_utf8(&prefix).unwrap_or_default());
    let mut micros = [b'0'; 6];
    let mut v = since.subsec_micros();
    for d in micros.iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out.push_str(std::str::from_utf8(&micros).unwrap_or_default());
    out.push('Z');
    true
}

/// `YYYY-MM-DDTHH:MM:SS.` of the second `secs` after the epoch, for years up to 9999.
fn second_text(secs: u64) -> Option<[u8; 20]> {
    let ts = jiff::Timestamp::from_second(i64::try_from(secs).ok()?).ok()?;
    let dt = ts.to_zoned(jiff::tz::TimeZone::UTC).datetime();
    if !(0..=9999).contains(&dt.year()) {
        return None;
    }
    let mut s = String::with_capacity(20);
    write!(
        s,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    )
    .ok()?;
    s.as_bytes().try_into().ok()
}

/// Writes an event's fields as the default field formatter does: `name=value` separated by
/// spaces, the message first as written (its Debug form), values in their Debug form.
struct Fields<'a> {
    out: &'a mut String,
    /// Whether no field was written yet.
    empty: bool,
    result: fmt::Result,
}

impl Fields<'_> {
    fn pad(&mut self) {
        if self.empty {
            self.empty = false;
        } else {
            self.out.push(' ');
        }
    }

    /// Write one field the way the default formatter's own visitor does.
    fn standard(&mut self, f: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let mut v = DefaultVisitor::new(Writer::new(self.out), self.empty);
        f(&mut v);
        let r = tracing_subscriber::field::VisitOutput::finish(v);
        // The default visitor pads before (and writes) every field but tracing-log's.
        self.empty = false;
        if self.result.is_ok() {
            self.result = r;
        }
    }

    /// A float as its Debug form writes it.
    fn f64_value(&mut self, value: f64) {
        let Some(k) = thousandths(value) else {
            self.result = write!(self.out, "{value:?}");
            return;
        };
        let mut digits = itoa::Buffer::new();
        self.out.push_str(digits.format(k / 1000));
        self.out.push('.');
        let frac = k % 1000;
        let three = [
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ];
        // Trailing zeros dropped, but one digit kept.
        let kept = match three {
            [_, b'0', b'0'] => &three[..1],
            [_, _, b'0'] => &three[..2],
            _ => &three[..],
        };
        self.out
            .push_str(std::str::from_utf8(kept).unwrap_or_default());
    }

    /// `name=` (a raw identifier's name without its `r#`).
    fn name(&mut self, field: &Field) {
        self.pad();
        let name = field.name();
        self.out.push_str(name.strip_prefix("r#").unwrap_or(name));
        self.out.push('=');
    }
}

/// Whether the default format escapes a character of a message (terminal control
/// characters: ESC, BEL, BS, FF, DEL and
/// U+0080 to U+009F).
fn escaped(c: char) -> bool {
    matches!(
        c,
        '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' | '\u{80}'..='\u{9f}'
    )
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if name.starts_with("log.") {
            // tracing-log's metadata fields: the default visitor decides.
            return self.standard(|v| v.record_debug(field, value));
        }
        if name == "message" {
            let (start, empty) = (self.out.len(), self.empty);
            self.pad();
            let at = self.out.len();
            self.result = write!(self.out, "{value:?}");
            if self.out[at..].chars().any(escaped) {
                // Written with its control characters escaped, by the default visitor.
                self.out.truncate(start);
                self.empty = empty;
                self.result = Ok(());
                self.standard(|v| v.record_debug(field, value));
            }
            return;
        }
        self.name(field);
        self.result = write!(self.out, "{value:?}");
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"))
        } else {
            self.record_debug(field, &value)
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.result.is_err() || field.name().starts_with("log.") || field.name() == "message" {
            return self.record_debug(field, &value);
        }
        self.name(field);
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.result.is_err() || field.name().starts_with("log.") || field.name() == "message" {
            return self.record_debug(field, &value);
        }
        self.name(field);
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.result.is_err() || field.name().starts_with("log.") || field.name() == "message" {
            return self.record_debug(field, &value);
        }
        self.name(field);
        self.f64_value(value);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_err() {
            return;
        }
        self.standard(|v| v.record_error(field, value));
    }
}

/// `k` when `v` is the double nearest `k / 1000` for a whole `k` below 10^15 (so a
/// millisecond latency rounded to the microsecond), `v` not negative.
///
/// Then `v`'s Debug form is `k / 1000` in decimal, trailing zeros dropped but one: a decimal
/// of at most 15 significant digits is the only one of that length or shorter that reads
/// back as its double, so it is the shortest form that does, which Debug writes (in
/// positional notation from 1e-4 to 1e16).
fn thousandths(v: f64) -> Option<u64> {
    if !(v.is_sign_positive() && v < 1e12) {
        return None;
    }
    let k = (v * 1000.0).round();
    (k / 1000.0 == v).then_some(k as u64)
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Sink {
        type Writer = Sink;
        fn make_writer(&'a self) -> Sink {
            self.clone()
        }
    }

    /// Events of every shape the access log and its neighbours take.
    fn events() {
        let peer: std::net::SocketAddr = "127.0.0.1:50312".parse().unwrap();
        let e = std::io::Error::other("disk on fire");
        tracing::info!(
            target: "tollgate::access",
            request_id = %"0123456789abcdef0123456789abcdef",
            peer = %peer,
            principal = %"gw",
            method = %"POST",
            path = %"/v1/acquire",
            route = %"/v1/acquire",
            status = 200u16,
            latency_ms = 0.123,
            "request"
        );
        tracing::info!(
            target: "tollgate::access",
            request_id = %"x",
            peer = %peer,
            principal = "-",
            method = "-",
            path = "-",
            route = "unparsed",
            status = 400u16,
            latency_ms = 0.0,
            "request"
        );
        for latency in [
            0.0,
            -0.0,
            0.001,
            0.01,
            0.1,
            0.123,
            0.12,
            0.102,
            1.0,
            12.5,
            1234.567,
            0.1 + 0.2,
            999_999_999_999.999,
            1e12,
            1e-7,
            -1.5,
            3e20,
            f64::NAN,
            f64::INFINITY,
        ] {
            tracing::info!(target: "tollgate::access", status = 429u16, latency_ms = latency, "request");
        }
        tracing::info!(target: "tollgate::access", n = -5i64, yes = true, big = 1u128 << 100, "request");
        tracing::info!(target: "tollgate::access", r#type = "quoted \"value\"", debug = ?Some(3), "request");
        tracing::info!(target: "tollgate::access", error = &e as &(dyn std::error::Error + 'static), "request");
        tracing::info!(target: "tollgate::access", "message with \x1b[31mcolour\x1b[0m and \u{85}");
        tracing::info!(target: "tollgate::access", "message {} formatted", 42);
        tracing::info!(target: "tollgate::access", path = %"/a\x1bb", "escaped only in messages");
        tracing::info!(target: "tollgate::access", message = "explicit message field", after = 1);
        tracing::info!(target: "tollgate::access", first = 1, "message after a field");
        tracing::info!(target: "tollgate::access", no_message = 1);
        tracing::info!(target: "tollgate::access", "");
        tracing::warn!(target: "tollgate::access", status = 500u16, "at warn");
        tracing::info!(target: "tollgate::serve", listening = %"127.0.0.1:8080", "another target");
        let span = tracing::info_span!("a span", k = 1);
        let _in = span.enter();
        tracing::info!(target: "tollgate::access", status = 200u16, "inside a span");
    }

    fn run(text: bool) -> String {
        let sink = Sink::default();
        let b = tracing_subscriber::fmt()
            .with_writer(sink.clone())
            .with_ansi(false)
            .with_max_level(Level::TRACE);
        if text {
            tracing::subscriber::with_default(b.event_format(Text::default()).finish(), events);
        } else {
            tracing::subscriber::with_default(b.finish(), events);
        }
        let out = sink.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    /// Everything after the timestamp, line by line; and each timestamp's shape.
    fn without_time(out: &str) -> Vec<String> {
        out.lines()
            .map(|l| {
                let (ts, rest) = l.split_once(' ').unwrap();
                assert_eq!(ts.len(), 27, "{l}");
                assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{l}");
                ts.parse::<jiff::Timestamp>()
                    .unwrap_or_else(|e| panic!("{ts}: {e}"));
                rest.to_string()
            })
            .collect()
    }

    #[test]
    fn writes_what_the_default_format_writes() {
        let ours = run(true);
        let theirs = run(false);
        assert_eq!(
            without_time(&ours),
            without_time(&theirs),
            "\n{ours}\n{theirs}"
        );
        assert_eq!(ours.lines().count(), 34, "{ours}");
    }

    #[test]
    fn thousandths_are_written_as_debug_writes_them() {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..200_000 {
            let k = match next() % 4 {
                0 => next() % 1000,
                1 => next() % 1_000_000,
                2 => next() % 1_000_000_000,
                _ => next() % 1_000_000_000_000_000,
            };
            let v = k as f64 / 1000.0;
            assert_eq!(thousandths(v), Some(k), "{v:?}");
            let mut out = String::new();
            let mut f = Fields {
                out: &mut out,
                empty: true,
                result: Ok(()),
            };
            f.f64_value(v);
            assert_eq!(out, format!("{v:?}"), "{k}");
        }
    }

    #[test]
    fn timestamps_are_the_default_timers() {
        for (secs, want) in [
            (0u64, "1970-01-01T00:00:00."),
            (59, "1970-01-01T00:00:59."),
            (86_399, "1970-01-01T23:59:59."),
            (951_782_400, "2000-02-29T00:00:00."),
            (1_764_930_672, "2025-12-05T10:31:12."),
            (4_102_444_800, "2100-01-01T00:00:00."),
            (253_402_127_999, "9999-12-29T23:59:59."),
        ] {
            let ours = second_text(secs).unwrap();
            assert_eq!(std::str::from_utf8(&ours).unwrap(), want);
        }
        assert_eq!(second_text(253_402_300_800), None, "year 10000");
        // Our timer between two readings of the default one: the same second as one of
        // them, and the same shape.
        let default_now = || {
            let mut s = String::new();
            tracing_subscriber::fmt::time::FormatTime::format_time(
                &DefaultTimer,
                &mut Writer::new(&mut s),
            )
            .unwrap();
            s
        };
        let before = default_now();
        let mut ours = String::new();
        assert!(timestamp(&mut ours));
        let after = default_now();
        assert_eq!(ours.len(), before.len(), "{ours} {before}");
        assert!(
            ours[..20] == before[..20] || ours[..20] == after[..20],
            "{before} {ours} {after}"
        );
        assert!(before <= ours && ours <= after, "{before} {ours} {after}");
    }
}
