//! Reading a configuration file against a [`Schema`]: every value checked and kept with its
//! origin; profiles resolved through `inherit`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::schema::{Kind, Schema, Section};
use crate::{closest, Error, INHERIT};

/// Where a value was written: a file and a line (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The configuration file.
    pub file: PathBuf,
    /// The line of the key.
    pub line: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A checked value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A [`Kind::Flag`].
    Flag(bool),
    /// A [`Kind::Value`], as the text a command line would hold.
    One(String),
    /// A [`Kind::List`].
    List(Vec<String>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Flag(b) => write!(f, "{b}"),
            Value::One(s) => write!(f, "{s:?}"),
            Value::List(v) => write!(f, "{v:?}"),
        }
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The value.
    pub value: Value,
    /// Where it was written.
    pub origin: Origin,
    /// The schema marks it secret.
    pub secret: bool,
}

/// The settings of one profile, by section (`""` for the profile's own keys, `"backup"`, or
/// `"repair.index"` for a subcommand) and key.
type Settings = BTreeMap<(String, String), Setting>;

#[derive(Debug, Clone)]
struct RawProfile {
    inherit: Option<(String, Origin)>,
    settings: Settings,
}

/// A parsed and checked configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    file: PathBuf,
    profiles: BTreeMap<String, RawProfile>,
}

/// A profile with its inherited settings merged in (a profile's own value of a key replaces the
/// inherited one; lists are replaced, not joined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Its name.
    pub name: String,
    /// The chain of profiles it was built from, itself first.
    pub chain: Vec<String>,
    settings: Settings,
}

impl Profile {
    /// The setting of `key` in `section` (`""`: the profile's own keys).
    pub fn get(&self, section: &str, key: &str) -> Option<&Setting> {
        self.settings.get(&(section.to_string(), key.to_string()))
    }

    /// Every setting: `(section, key, setting)`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &Setting)> {
        self.settings.iter().map(|((s, k), v)| (s.as_str(), k.as_str(), v))
    }

    /// The settings of one section: `(key, setting)`.
    pub fn section<'a>(&'a self, section: &'a str) -> impl Iterator<Item = (&'a str, &'a Setting)> + 'a {
        self.settings.iter().filter(move |((s, _), _)| s == section).map(|((_, k), v)| (k.as_str(), v))
    }
}

/// A [`Kind::Duration`]: a non-negative number with `ms`, `s`, `m` or `h`, or a number of seconds.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    let n: f64 = num.trim().parse().ok()?;
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    std::time::Duration::try_from_secs_f64(n * scale).ok()
}

/// The hooks a profile sets for one command: those of `[profile.NAME.hooks]` and of
/// `[profile.NAME.COMMAND.hooks]`. The profile's `before` hooks run before the command's, its
/// `after`, `failure` and `finally` hooks after the command's; the command's `timeout` and
/// `before-failure` take precedence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookSettings {
    /// Shell commands run before the command.
    pub before: Vec<String>,
    /// Run after it succeeded.
    pub after: Vec<String>,
    /// Run after it failed.
    pub failure: Vec<String>,
    /// Run after it either way.
    pub finally: Vec<String>,
    /// How long each hook may run (`None`: the front end's default).
    pub timeout: Option<std::time::Duration>,
    /// `before-failure = "continue"`: a failing `before` hook does not stop the command.
    pub before_may_fail: bool,
}

impl HookSettings {
    /// Whether there is no hook.
    pub fn is_empty(&self) -> bool {
        self.before.is_empty() && self.after.is_empty() && self.failure.is_empty() && self.finally.is_empty()
    }
}

impl Profile {
    /// The hooks for `command` (its section's name: `backup`, `repair`).
    pub fn hooks(&self, command: &str) -> HookSettings {
        let profile = crate::HOOKS.to_string();
        let own = format!("{command}.{}", crate::HOOKS);
        let list = |section: &str, key: &str| match self.get(section, key).map(|s| &s.value) {
            Some(Value::List(v)) => v.clone(),
            Some(Value::One(v)) => vec![v.clone()],
            _ => Vec::new(),
        };
        let one = |key: &str| {
            [&own, &profile].into_iter().find_map(|sec| match self.get(sec, key).map(|s| &s.value) {
                Some(Value::One(v)) => Some(v.clone()),
                _ => None,
            })
        };
        let outer_last = |key: &str| [list(&own, key), list(&profile, key)].concat();
        HookSettings {
            before: [list(&profile, "before"), list(&own, "before")].concat(),
            after: outer_last("after"),
            failure: outer_last("failure"),
            finally: outer_last("finally"),
            timeout: one("timeout").as_deref().and_then(parse_duration),
            before_may_fail: one("before-failure").as_deref() == Some("continue"),
        }
    }
}

/// Converts byte offsets of the text into line numbers.
struct Lines<'t>(&'t str);

impl Lines<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.0.len());
        self.0.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
    }
}

struct Ctx<'a> {
    file: &'a Path,
    lines: Lines<'a>,
}

impl Ctx<'_> {
    fn origin(&self, offset: usize) -> Origin {
        Origin { file: self.file.to_path_buf(), line: self.lines.line(offset) }
    }

    fn error(&self, offset: usize, key: &str, message: impl Into<String>) -> Error {
        Error {
            file: self.file.to_path_buf(),
            line: Some(self.lines.line(offset)),
            key: Some(key.to_string()),
            message: message.into(),
            suggestion: None,
        }
    }
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time (quote it to make it a string)",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// A scalar as a command line would hold it; `None` for arrays, tables and date-times.
fn scalar(v: &DeValue<'_>) -> Option<String> {
    match v {
        DeValue::String(s) => Some(s.to_string()),
        DeValue::Integer(i) => Some(i.to_string()),
        DeValue::Float(f) => Some(f.to_string()),
        DeValue::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

impl Config {
    /// Parses `text`, the contents of `file`, and checks every profile against `schema`. The
    /// first fault found is the error.
    pub fn parse(text: &str, file: &Path, schema: &Schema) -> Result<Config, Error> {
        let ctx = Ctx { file, lines: Lines(text) };
        let doc = DeTable::parse(text).map_err(|e| Error {
            file: file.to_path_buf(),
            line: e.span().map(|s| ctx.lines.line(s.start)),
            key: None,
            message: e.message().to_string(),
            suggestion: None,
        })?;
        let mut profiles = BTreeMap::new();
        for (key, value) in doc.get_ref() {
            let name = key.get_ref().as_ref();
            if name != "profile" {
                let mut e = ctx.error(
                    key.span().start,
                    name,
                    format!("unknown key `{name}`: the file holds only [profile.NAME] tables"),
                );
                e.suggestion = closest(name, ["profile"]).map(str::to_string);
                return Err(e);
            }
            let DeValue::Table(table) = value.get_ref() else {
                return Err(ctx.error(
                    key.span().start,
                    name,
                    format!("expected a table of profiles, found {}", type_name(value.get_ref())),
                ));
            };
            for (pkey, pvalue) in table {
                let pname = pkey.get_ref().as_ref();
                let path = format!("profile.{pname}");
                if pname.is_empty() {
                    return Err(ctx.error(pkey.span().start, &path, "a profile needs a name"));
                }
                let DeValue::Table(ptable) = pvalue.get_ref() else {
                    return Err(ctx.error(
                        pkey.span().start,
                        &path,
                        format!("expected a table (a profile), found {}", type_name(pvalue.get_ref())),
                    ));
                };
                let mut raw = RawProfile { inherit: None, settings: Settings::new() };
                check_section(&ctx, ptable, &schema.profile, "", &path, &mut raw)?;
                profiles.insert(pname.to_string(), raw);
            }
        }
        let config = Config { file: file.to_path_buf(), profiles };
        // Every inherit chain must end: resolve each profile once now.
        for name in config.profiles.keys() {
            config.profile(name)?;
        }
        Ok(config)
    }

    /// The file it was read from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The names of its profiles.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    /// Whether it holds a profile named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.profiles.contains_key(name)
    }

    /// The profile `name` with what it inherits merged in.
    pub fn profile(&self, name: &str) -> Result<Profile, Error> {
        let mut chain: Vec<String> = Vec::new();
        let mut current = name.to_string();
        let mut referrer: Option<Origin> = None;
        loop {
            let Some(raw) = self.profiles.get(&current) else {
                let mut names: Vec<&str> = self.names().collect();
                names.sort();
                let known = if names.is_empty() {
                    "the file holds none".to_string()
                } else {
                    format!("it holds {}", names.join(", "))
                };
                return Err(Error {
                    file: self.file.clone(),
                    line: referrer.as_ref().map(|o| o.line),
                    key: referrer
                        .as_ref()
                        .map(|_| format!("profile.{}.{INHERIT}", chain.last().map(String::as_str).unwrap_or(""))),
                    message: format!("no profile `{current}`: {known}"),
                    suggestion: closest(&current, self.names()).map(str::to_string),
                });
            };
            if chain.contains(&current) {
                chain.push(current);
                return Err(Error {
                    file: self.file.clone(),
                    line: referrer.map(|o| o.line),
                    key: Some(format!("profile.{}.{INHERIT}", chain[chain.len() - 2])),
                    message: format!("profiles inherit from each other in a circle: {}", chain.join(" -> ")),
                    suggestion: None,
                });
            }
            chain.push(current.clone());
            match &raw.inherit {
                Some((parent, origin)) => {
                    referrer = Some(origin.clone());
                    current = parent.clone();
                }
                None => break,
            }
        }
        let mut settings = Settings::new();
        for p in chain.iter().rev() {
            for (k, v) in &self.profiles[p].settings {
                settings.insert(k.clone(), v.clone());
            }
        }
        Ok(Profile { name: name.to_string(), chain, settings })
    }

    /// Every literal secret the file holds (a password written in it): `(profile, key, origin)`.
    pub fn literal_secrets(&self) -> Vec<(String, String, Origin)> {
        let mut out = Vec::new();
        for (name, raw) in &self.profiles {
            for ((section, key), s) in &raw.settings {
                if s.secret {
                    let key = if section.is_empty() { key.clone() } else { format!("{section}.{key}") };
                    out.push((name.clone(), key, s.origin.clone()));
                }
            }
        }
        out
    }
}

/// Checks one table against its section of the schema; adds its values to `raw`.
fn check_section(
    ctx: &Ctx<'_>,
    table: &DeTable<'_>,
    schema: &Section,
    section: &str,
    path: &str,
    raw: &mut RawProfile,
) -> Result<(), Error> {
    for (key, value) in table {
        let name = key.get_ref().as_ref();
        let at = key.span().start;
        let full = format!("{path}.{name}");
        if section.is_empty() && name == INHERIT {
            let DeValue::String(parent) = value.get_ref() else {
                return Err(ctx.error(
                    at,
                    &full,
                    format!("expected a profile name (a string), found {}", type_name(value.get_ref())),
                ));
            };
            raw.inherit = Some((parent.to_string(), ctx.origin(at)));
            continue;
        }
        if let Some(sub) = schema.section(name) {
            let DeValue::Table(t) = value.get_ref() else {
                return Err(ctx.error(
                    at,
                    &full,
                    format!("expected a table ([{full}]), found {}", type_name(value.get_ref())),
                ));
            };
            let sub_section = if section.is_empty() { name.to_string() } else { format!("{section}.{name}") };
            check_section(ctx, t, sub, &sub_section, &full, raw)?;
            continue;
        }
        let (kind, secret) = match schema.key(name) {
            Some(k) => (k.kind, k.secret),
            None if schema.open => (Kind::Value, false),
            None => {
                let mut e = ctx.error(at, &full, format!("unknown key `{name}`"));
                let mut names: Vec<&str> = schema.names().collect();
                if section.is_empty() {
                    names.push(INHERIT);
                }
                e.suggestion = closest(name, names).map(str::to_string);
                return Err(e);
            }
        };
        let value = check_value(ctx, at, &full, kind, value)?;
        raw.settings.insert((section.to_string(), name.to_string()), Setting { value, origin: ctx.origin(at), secret });
    }
    Ok(())
}

/// Checks a value against its kind.
fn check_value(ctx: &Ctx<'_>, at: usize, full: &str, kind: Kind, value: &Spanned<DeValue<'_>>) -> Result<Value, Error> {
    let v = value.get_ref();
    let wrong = || ctx.error(at, full, format!("expected {}, found {}", kind.expected(), type_name(v)));
    match kind {
        Kind::Flag => match v {
            DeValue::Boolean(b) => Ok(Value::Flag(*b)),
            _ => Err(wrong()),
        },
        Kind::Value => match v {
            DeValue::Boolean(_) => Err(wrong()),
            _ => scalar(v).map(Value::One).ok_or_else(wrong),
        },
        Kind::Duration => match v {
            DeValue::String(_) | DeValue::Integer(_) | DeValue::Float(_) => {
                let text = scalar(v).unwrap_or_default();
                match parse_duration(&text) {
                    Some(_) => Ok(Value::One(text)),
                    None => Err(ctx.error(at, full, format!("expected {}, found {text:?}", kind.expected()))),
                }
            }
            _ => Err(wrong()),
        },
        Kind::Choice(words) => match v {
            DeValue::String(word) if words.contains(&word.as_ref()) => Ok(Value::One(word.to_string())),
            DeValue::String(word) => {
                let mut e = ctx.error(at, full, format!("expected {}, found {:?}", kind.expected(), word.as_ref()));
                e.suggestion = closest(word, words.iter().copied()).map(str::to_string);
                Err(e)
            }
            _ => Err(wrong()),
        },
        Kind::List => match v {
            DeValue::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items.iter() {
                    match item.get_ref() {
                        DeValue::String(_) | DeValue::Integer(_) | DeValue::Float(_) => {
                            out.push(scalar(item.get_ref()).unwrap_or_default())
                        }
                        other => {
                            return Err(ctx.error(
                                item.span().start,
                                full,
                                format!("expected {}, found an array holding {}", kind.expected(), type_name(other)),
                            ))
                        }
                    }
                }
                Ok(Value::List(out))
            }
            DeValue::String(_) | DeValue::Integer(_) | DeValue::Float(_) => {
                Ok(Value::List(vec![scalar(v).unwrap_or_default()]))
            }
            _ => Err(wrong()),
        },
    }
}
