//! The limiter behaviour scenarios on the reference backend behind the fault wrapper, which
//! delays about a third of the requests (and injects nothing else): requests that take time
//! and interleave for real change no answer.

tollgate::scenario_tests!(Some(tollgate::testing::Backend::delayed()));
