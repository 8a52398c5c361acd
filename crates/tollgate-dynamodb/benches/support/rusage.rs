//! Process CPU time for the benches (`getrusage(RUSAGE_SELF)`: every thread of this process;
//! DynamoDB Local runs in its own).

use std::time::Duration;

/// Process CPU time (user, system) so far.
pub fn cpu() -> (Duration, Duration) {
    // SAFETY: `getrusage` writes into the zeroed struct we own; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// User plus system CPU time so far.
#[allow(dead_code)]
pub fn cpu_total() -> Duration {
    let (u, s) = cpu();
    u + s
}
