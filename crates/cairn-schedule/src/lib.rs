//! When the agent runs a job: schedules in a readable form or as cron expressions, and
//! durations (`90s`, `10m`, `26h`, `7d`).
//!
//! | written            | means                                   |
//! |--------------------|-----------------------------------------|
//! | `hourly`           | every hour at minute 0                  |
//! | `daily 02:30`      | every day at 02:30 (`daily`: at 00:00)  |
//! | `mon..fri 22:00`   | Monday to Friday at 22:00               |
//! | `sat,sun 09:15`    | Saturday and Sunday at 09:15            |
//! | `30 2 * * 1-5`     | a cron expression (minute hour day-of-month month day-of-week) |
//!
//! Every form becomes the same [`Schedule`]: the sets of minutes, hours, days of the month,
//! months and days of the week it fires on, in local time. No I/O: the parser takes text and
//! [`Schedule::next_after`] a time, so the fuzzer runs both.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Datelike, NaiveDate, TimeZone};

/// Why a schedule or a duration was refused, with the text and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

const FORMS: &str = "use hourly, daily HH:MM, DAYS HH:MM (mon..fri, sat,sun) or a cron expression (M H DOM MON DOW)";
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];

/// A set of small numbers (0..64) as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bits(u64);

impl Bits {
    fn has(self, n: u32) -> bool {
        n < 64 && self.0 & (1 << n) != 0
    }
    fn range(lo: u32, hi: u32, step: u32) -> Bits {
        Bits((lo..=hi).step_by(step.max(1) as usize).fold(0, |b, n| b | (1 << n)))
    }
    fn iter(self, lo: u32, hi: u32) -> impl Iterator<Item = u32> {
        (lo..=hi).filter(move |n| self.has(*n))
    }
}

/// When a job runs: the minutes, hours, days, months and weekdays (0 = Sunday) it fires on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: Bits,
    hours: Bits,
    days: Bits,
    months: Bits,
    weekdays: Bits,
    /// Cron's rule: when both the day of the month and the day of the week are restricted, a
    /// day matching either fires.
    either_day: bool,
    text: String,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Schedule {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Schedule::parse(s)
    }
}

impl Schedule {
    /// Parses a schedule in any of the forms above.
    pub fn parse(text: &str) -> Result<Schedule, Error> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
        let all = |lo, hi| Bits::range(lo, hi, 1);
        let mut s = Schedule {
            minutes: Bits(1),
            hours: all(0, 23),
            days: all(1, 31),
            months: all(1, 12),
            weekdays: all(0, 6),
            either_day: false,
            text: words.join(" "),
        };
        match lower.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["hourly"] => {}
            ["daily"] => s.hours = Bits(1),
            ["daily", time] => (s.hours, s.minutes) = clock(text, time)?,
            [days, time] if !days.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '*') => {
                s.weekdays = weekdays(text, days)?;
                (s.hours, s.minutes) = clock(text, time)?;
            }
            [m, h, dom, mon, dow] => {
                s.minutes = field(text, m, 0, 59, &[])?;
                s.hours = field(text, h, 0, 23, &[])?;
                s.days = field(text, dom, 1, 31, &[])?;
                s.months = field(text, mon, 1, 12, &MONTHS)?;
                // 7 is Sunday too.
                let bits = field(text, dow, 0, 7, &DAYS)?;
                s.weekdays = Bits((bits.0 | (bits.0 >> 7)) & 0x7f);
                s.either_day = *dom != "*" && *dow != "*";
            }
            _ => return Err(Error(format!("{text:?} is not a schedule: {FORMS}"))),
        }
        if s.months.iter(1, 12).all(|m| s.days.iter(1, 31).all(|d| d > days_in(m))) {
            return Err(Error(format!("{text:?} names no day that exists in its months")));
        }
        Ok(s)
    }

    /// The first time after `after` (strictly later, to the minute) this schedule fires, in
    /// `after`'s time zone; `None` if it does not fire within eight years. A local time that
    /// does not exist (the hour skipped when clocks go forward) is skipped, one that exists
    /// twice fires the first time.
    pub fn next_after<Tz: TimeZone>(&self, after: &DateTime<Tz>) -> Option<DateTime<Tz>> {
        let tz = after.timezone();
        let local = after.naive_local();
        let mut day = local.date();
        for _ in 0..366 * 8 {
            if self.fires_on(day) {
                for h in self.hours.iter(0, 23) {
                    for m in self.minutes.iter(0, 59) {
                        let Some(at) = day.and_hms_opt(h, m, 0) else { continue };
                        if at <= local {
                            continue;
                        }
                        if let Some(t) = tz.from_local_datetime(&at).earliest() {
                            if t > *after {
                                return Some(t);
                            }
                        }
                    }
                }
            }
            day = day.succ_opt()?;
        }
        None
    }

    /// The last time at or before `at` this schedule fired (within eight days of hourly
    /// searching back, then by days), for catching up a missed run.
    pub fn previous_at_or_before<Tz: TimeZone>(&self, at: &DateTime<Tz>) -> Option<DateTime<Tz>> {
        let tz = at.timezone();
        let local = at.naive_local();
        let mut day = local.date();
        for _ in 0..366 * 8 {
            if self.fires_on(day) {
                for h in self.hours.iter(0, 23).collect::<Vec<_>>().into_iter().rev() {
                    for m in self.minutes.iter(0, 59).collect::<Vec<_>>().into_iter().rev() {
                        let Some(t) = day.and_hms_opt(h, m, 0) else { continue };
                        if t > local {
                            continue;
                        }
                        if let Some(t) = tz.from_local_datetime(&t).earliest() {
                            if t <= *at {
                                return Some(t);
                            }
                        }
                    }
                }
            }
            day = day.pred_opt()?;
        }
        None
    }

    fn fires_on(&self, day: NaiveDate) -> bool {
        if !self.months.has(day.month()) {
            return false;
        }
        let dom = self.days.has(day.day());
        let dow = self.weekdays.has(day.weekday().num_days_from_sunday());
        if self.either_day {
            dom || dow
        } else {
            dom && dow
        }
    }
}

fn days_in(month: u32) -> u32 {
    match month {
        2 => 29,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `HH:MM` as single-hour and single-minute sets.
fn clock(text: &str, time: &str) -> Result<(Bits, Bits), Error> {
    let bad = || Error(format!("{text:?}: {time:?} is not a time of day: write HH:MM, e.g. 02:30"));
    let (h, m) = time.split_once(':').ok_or_else(bad)?;
    let h: u32 = number(h).filter(|h| *h < 24).ok_or_else(bad)?;
    let m: u32 = number(m).filter(|m| *m < 60 && time.len() <= 5).ok_or_else(bad)?;
    Ok((Bits(1 << h), Bits(1 << m)))
}

fn number(s: &str) -> Option<u32> {
    (!s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
}

/// `mon..fri`, `sat,sun`, `fri..mon` (a range may wrap past Sunday), `mon`.
fn weekdays(text: &str, days: &str) -> Result<Bits, Error> {
    let day = |d: &str| {
        DAYS.iter().position(|n| *n == d).map(|i| i as u32).ok_or_else(|| {
            Error(format!("{text:?}: {d:?} is not a day: use mon, tue, wed, thu, fri, sat, sun, a range mon..fri or a list sat,sun"))
        })
    };
    let mut bits = 0u64;
    for part in days.split(',') {
        match part.split_once("..") {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut d = a;
                loop {
                    bits |= 1 << d;
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => bits |= 1 << day(part)?,
        }
    }
    Ok(Bits(bits))
}

/// One cron field: `*`, `N`, `A-B`, any of them `/STEP`, comma lists; `names` (lower case)
/// stand for `lo`, `lo + 1`, … (Sunday is 0, January 1).
fn field(text: &str, f: &str, lo: u32, hi: u32, names: &[&str]) -> Result<Bits, Error> {
    let bad = |why: &str| Error(format!("{text:?}: cron field {f:?} {why} ({lo}-{hi} allowed)"));
    let value = |v: &str| -> Result<u32, Error> {
        let first = if names.len() == 12 { 1 } else { 0 };
        if let Some(i) = names.iter().position(|n| *n == v) {
            return Ok(i as u32 + first);
        }
        match v.parse::<u32>() {
            Ok(n) if (lo..=hi).contains(&n) && v.len() <= 2 => Ok(n),
            _ => Err(bad(&format!("has {v:?}, not a number in range"))),
        }
    };
    let mut bits = 0u64;
    for part in f.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => match s.parse::<u32>() {
                Ok(s) if (1..=hi).contains(&s) => (r, s),
                _ => return Err(bad(&format!("has step {s:?}"))),
            },
            None => (part, 1),
        };
        let (a, b) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                None if step > 1 => (value(r)?, hi),
                None => (value(r)?, value(r)?),
            },
        };
        if a > b {
            return Err(bad(&format!("has the range {a}-{b} backwards")));
        }
        bits |= Bits::range(a, b, step).0;
    }
    Ok(Bits(bits))
}

/// Parses a duration: a whole number with `s`, `m`, `h` or `d` (`90s`, `10m`, `26h`, `7d`).
pub fn parse_duration(text: &str) -> Result<Duration, Error> {
    let bad = || Error(format!("{text:?} is not a duration: write a number with s, m, h or d, e.g. 10m or 26h"));
    let t = text.trim();
    let unit = t.chars().last().ok_or_else(bad)?;
    let mult = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86400,
        _ => return Err(bad()),
    };
    let n: u64 = t[..t.len() - 1].parse().map_err(|_| bad())?;
    n.checked_mul(mult).filter(|s| *s <= 10 * 365 * 86400).map(Duration::from_secs).ok_or_else(bad)
}

/// The name a duration is written with (`600` seconds: `10m`).
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        s if s % 86400 == 0 => format!("{}d", s / 86400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{FixedOffset, Utc};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn next(sched: &str, from: &str) -> String {
        Schedule::parse(sched).unwrap().next_after(&at(from)).unwrap().to_rfc3339()
    }

    #[test]
    fn readable_forms() {
        assert_eq!(next("daily 02:30", "2026-11-28T17:00:00Z"), "2026-11-29T02:30:00+00:00");
        assert_eq!(next("daily 02:30", "2026-11-28T02:29:59Z"), "2026-11-28T02:30:00+00:00");
        assert_eq!(next("daily 02:30", "2026-11-28T02:30:00Z"), "2026-11-29T02:30:00+00:00");
        assert_eq!(next("hourly", "2026-11-28T17:00:00Z"), "2026-11-28T18:00:00+00:00");
        assert_eq!(next("daily", "2026-11-28T17:00:00Z"), "2026-11-29T00:00:00+00:00");
        // 2026-11-28 is a Saturday.
        assert_eq!(next("mon..fri 22:00", "2026-11-28T17:00:00Z"), "2026-11-30T22:00:00+00:00");
        assert_eq!(next("Sat,Sun 09:15", "2026-11-28T17:00:00Z"), "2026-11-29T09:15:00+00:00");
        assert_eq!(next("fri..mon 01:00", "2026-12-01T00:00:00Z"), "2026-12-04T01:00:00+00:00");
        assert_eq!(next("wed 7:05", "2026-11-28T00:00:00Z"), "2026-12-02T07:05:00+00:00");
    }

    #[test]
    fn cron_expressions() {
        assert_eq!(next("30 2 * * 1-5", "2026-11-28T17:00:00Z"), "2026-11-30T02:30:00+00:00");
        assert_eq!(next("*/15 * * * *", "2026-11-28T17:01:00Z"), "2026-11-28T17:15:00+00:00");
        assert_eq!(next("0 0 1 jan *", "2026-11-28T17:00:00Z"), "2027-01-01T00:00:00+00:00");
        assert_eq!(next("0 12 29 2 *", "2026-11-28T17:00:00Z"), "2028-02-29T12:00:00+00:00");
        // Day of month or day of week, as cron has it: the 1st, or a Sunday.
        assert_eq!(next("0 0 1 * sun", "2026-11-28T17:00:00Z"), "2026-11-29T00:00:00+00:00");
        assert_eq!(next("0 0 1 * 7", "2026-11-28T17:00:00Z"), "2026-11-29T00:00:00+00:00");
        assert_eq!(next("5,35 9-10/1 * * *", "2026-11-28T10:35:00Z"), "2026-11-29T09:05:00+00:00");
    }

    #[test]
    fn time_zones_and_catch_up() {
        let tz = FixedOffset::east_opt(3600).unwrap();
        let from = at("2026-11-28T17:00:00Z").with_timezone(&tz);
        let n = Schedule::parse("daily 02:30").unwrap().next_after(&from).unwrap();
        assert_eq!(n.to_rfc3339(), "2026-11-29T02:30:00+01:00");
        let s = Schedule::parse("daily 02:30").unwrap();
        assert_eq!(
            s.previous_at_or_before(&at("2026-11-28T17:00:00Z")).unwrap().to_rfc3339(),
            "2026-11-28T02:30:00+00:00"
        );
        assert_eq!(
            s.previous_at_or_before(&at("2026-11-28T02:30:00Z")).unwrap().to_rfc3339(),
            "2026-11-28T02:30:00+00:00"
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        for (text, says) in [
            ("", "not a schedule"),
            ("daily 25:00", "not a time of day"),
            ("daily 02:60", "not a time of day"),
            ("moon..fri 22:00", "\"moon\" is not a day"),
            ("61 * * * *", "\"61\""),
            ("* * * *", "not a schedule"),
            ("0 0 31 2 *", "no day that exists"),
            ("0 0 * * 5-1", "backwards"),
            ("*/0 * * * *", "step"),
        ] {
            let e = Schedule::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("26h").unwrap(), Duration::from_secs(26 * 3600));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86400));
        for bad in ["", "10", "m", "-1m", "1.5h", "99999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    }
}
