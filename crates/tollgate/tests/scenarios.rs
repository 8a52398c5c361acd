//! The limiter behaviour scenarios on the reference backend (MemoryStore). The DynamoDB
//! backend runs the same scenarios (crates/tollgate-dynamodb/tests/limiter_scenarios.rs).

tollgate::scenario_tests!(Some(tollgate::testing::Backend::memory()));
