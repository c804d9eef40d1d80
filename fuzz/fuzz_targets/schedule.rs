//! The agent's schedules and durations (crates/cairn-schedule): any text parses or is refused
//! without panicking; a schedule that parses has a next time after a fixed instant that is
//! later than it, and a previous one at or before it, and its text parses to the same schedule.
#![no_main]

use cairn_schedule::{parse_duration, Schedule};
use chrono::{DateTime, Utc};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = parse_duration(text);
    let Ok(s) = Schedule::parse(text) else { return };
    let from: DateTime<Utc> = DateTime::from_timestamp(1_795_000_000, 0).unwrap();
    if let Some(next) = s.next_after(&from) {
        assert!(next > from);
    }
    if let Some(prev) = s.previous_at_or_before(&from) {
        assert!(prev <= from);
    }
    assert_eq!(Schedule::parse(&s.to_string()).as_ref(), Ok(&s));
});
