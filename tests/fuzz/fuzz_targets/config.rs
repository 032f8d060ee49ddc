//! See targets.rs: the body lives there, shared with tests/fuzz_regressions.rs.
#![no_main]

#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::config(data));
