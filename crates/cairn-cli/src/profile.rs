//! Profiles from the configuration file (crates/cairn-profile): which file, which profile, and
//! how its values join the command line.
//!
//! The file's schema is the command line definition itself: a profile's top-level keys are the
//! global options' long names, `[profile.NAME.COMMAND]` holds a command's options (and its
//! positional arguments, by their name: `paths` for `backup`). So a profile can set whatever a
//! command line can, and a new option needs no code here.
//!
//! Precedence, the same for every option: command-line flag > environment variable > profile >
//! built-in default. The command line is parsed once leniently to learn which options a flag or
//! an environment variable set (clap's `value_source`); every other option the profile sets is
//! added to the arguments, which are then parsed for real.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use cairn_profile::{hooks_section, Config, Key, Kind, Profile, Schema, Section, Value, HOOKS};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory};

/// Keys of a profile that are no command line option.
const PASSWORD: &str = "password";
const ENV_FILE: &str = "env-file";
const ENV: &str = "env";

/// Options that stand for one another: when the command line or the environment gives one of a
/// group, the profile's values for the others are not used either (a `--password-file` flag
/// beats a profile's `password-command`).
const GROUPS: [&[&str]; 2] = [&["repo", "repository-file"], &["password-file", "password-command", PASSWORD]];

/// Global options that choose the file and profile, and commands that take no profile.
const NOT_IN_PROFILE: [&str; 4] = ["use-profile", "config", "help", "version"];
/// (`agent` runs every profile, each in a process of its own.)
const COMMANDS_WITHOUT_PROFILE: [&str; 5] = ["help", "completions", "man", "config", "agent"];

/// Where an effective value came from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    Flag,
    Env(String),
    Profile(cairn_profile::Origin),
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag => write!(f, "flag"),
            Source::Env(var) => write!(f, "environment {var}"),
            Source::Profile(origin) => write!(f, "{origin}"),
            Source::Default => write!(f, "default"),
        }
    }
}

/// One effective setting, as `config show` prints it.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    pub key: String,
    pub value: String,
    pub source: Source,
}

/// What was loaded, for `config show` and the password.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub file: Option<PathBuf>,
    pub profile: Option<Profile>,
    pub shown: Vec<Shown>,
    /// The command being run, with its subcommand (`["repair", "index"]`).
    pub command: Vec<String>,
}

static LOADED: OnceLock<Loaded> = OnceLock::new();

/// What [`apply`] loaded (nothing before it runs).
pub(crate) fn loaded() -> &'static Loaded {
    LOADED.get_or_init(Loaded::default)
}

/// A profile's literal `password`, if the chosen profile holds one.
pub(crate) fn literal_password() -> Option<Vec<u8>> {
    let p = loaded().profile.as_ref()?;
    match &p.get("", PASSWORD)?.value {
        Value::One(s) => Some(s.as_bytes().to_vec()),
        _ => None,
    }
}

fn key_name(arg: &Arg) -> String {
    arg.get_long().map(str::to_string).unwrap_or_else(|| arg.get_id().as_str().to_string())
}

fn kind(arg: &Arg) -> Kind {
    let many = arg.get_num_args().is_some_and(|r| r.max_values() > 1);
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => Kind::Flag,
        ArgAction::Append => Kind::List,
        _ if many => Kind::List,
        _ => Kind::Value,
    }
}

fn section_of(cmd: &Command) -> Section {
    let keys = cmd
        .get_arguments()
        .filter(|a| !NOT_IN_PROFILE.contains(&key_name(a).as_str()))
        .map(|a| Key::new(key_name(a), kind(a)))
        .collect();
    let sections = cmd
        .get_subcommands()
        .filter(|s| !COMMANDS_WITHOUT_PROFILE.contains(&s.get_name()))
        .map(|s| (s.get_name().to_string(), section_of(s)))
        .collect();
    Section { keys, sections, open: false }
}

/// The schema of a profile: the command line definition, plus `password`, `env-file`, `env` and
/// the hooks (the profile's, and each command's) and the agent's `schedule` section.
pub(crate) fn schema() -> Schema {
    let mut profile = section_of(&crate::cli::Cli::command());
    for (_, command) in profile.sections.iter_mut() {
        command.sections.push((HOOKS.to_string(), hooks_section()));
    }
    profile.sections.push((HOOKS.to_string(), hooks_section()));
    let mut password = Key::new(PASSWORD, Kind::Value);
    password.secret = true;
    profile.keys.push(password);
    profile.keys.push(Key::new(ENV_FILE, Kind::List));
    profile.sections.push((ENV.to_string(), Section { open: true, ..Section::default() }));
    let schedule = cairn_agent::profiles::KEYS.iter().map(|k| Key::new(*k, Kind::Value)).collect();
    profile
        .sections
        .push((cairn_agent::profiles::SECTION.to_string(), Section { keys: schedule, ..Section::default() }));
    Schema { profile }
}

/// The configuration file: `--config` (or `CAIRN_CONFIG`), else the first that exists of
/// `$XDG_CONFIG_HOME/cairn/cairn.toml` (or `~/.config/cairn/cairn.toml`) and
/// `/etc/cairn/cairn.toml`.
fn find_file(given: Option<PathBuf>) -> Option<PathBuf> {
    if given.is_some() {
        return given;
    }
    let user = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".config")),
    };
    let candidates =
        user.map(|d| d.join("cairn/cairn.toml")).into_iter().chain([PathBuf::from("/etc/cairn/cairn.toml")]);
    candidates.into_iter().find(|p| p.exists())
}

/// Warns when a file holding a literal password can be read by others than its owner.
fn warn_readable_secrets(config: &Config) {
    use std::os::unix::fs::PermissionsExt;
    let secrets = config.literal_secrets();
    let Some((profile, key, origin)) = secrets.first() else { return };
    let Ok(meta) = std::fs::metadata(config.file()) else { return };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        eprintln!(
            "cairn: warning: {origin}: profile.{profile}.{key} is a password written in a file that others can read \
             (mode {mode:03o}): chmod 600 {}, or use password-file or password-command",
            config.file().display()
        );
    }
}

/// The configuration file (as `--config` or the lookup found it) and its profiles, for the
/// agent, which runs them all.
pub(crate) fn config_file() -> Result<Config> {
    let Some(file) = loaded().file.clone() else {
        bail!("no configuration file: give --config FILE, or write $XDG_CONFIG_HOME/cairn/cairn.toml, ~/.config/cairn/cairn.toml or /etc/cairn/cairn.toml");
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("cannot read configuration file {}", file.display()))?;
    Ok(Config::parse(&text, &file, &schema())?)
}

/// Where profile `name`'s repository is and its password, from the profile alone (the agent
/// opens each profile's repository in one process): `repo` or `repository-file`; the
/// password from `CAIRN_PASSWORD` in the profile's `env` section, `password-command`,
/// `password-file` or `password`.
pub(crate) fn repository_of(config: &Config, name: &str) -> Result<(String, Vec<u8>)> {
    let p = config.profile(name)?;
    let one = |section: &str, key: &str| match p.get(section, key).map(|s| &s.value) {
        Some(Value::One(v)) => Some(v.clone()),
        _ => None,
    };
    let repo = match (one("", "repo"), one("", "repository-file")) {
        (Some(r), _) => r,
        (None, Some(f)) => {
            let text = std::fs::read_to_string(&f).with_context(|| format!("cannot read repository file {f}"))?;
            text.lines().next().unwrap_or("").trim().to_string()
        }
        (None, None) => bail!("profile {name:?} names no repository (repo or repository-file)"),
    };
    let password = if let Some(pw) = one(ENV, "CAIRN_PASSWORD") {
        pw.into_bytes()
    } else if let Some(cmd) = one("", "password-command") {
        crate::password::from_command(&cmd)?
    } else if let Some(f) = one("", "password-file") {
        crate::password::from_file(Path::new(&f))?
    } else if let Some(pw) = one("", PASSWORD) {
        pw.into_bytes()
    } else {
        bail!("profile {name:?} gives no password (password-command, password-file, password or env.CAIRN_PASSWORD)");
    };
    Ok((repo, password))
}

/// Reads `KEY=VALUE` lines (`#` comments, blank lines, an optional `export `) into the
/// environment, for variables not already set.
fn load_env_file(path: &Path, origin: &cairn_profile::Origin) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("{origin}: cannot read env-file {}", path.display()))?;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            bail!("{}:{}: expected KEY=VALUE", path.display(), n + 1);
        };
        let v = v.trim();
        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
        set_env_default(k.trim(), v);
    }
    Ok(())
}

fn set_env_default(k: &str, v: &str) {
    if !k.is_empty() && !k.contains('=') && !k.contains('\0') && !v.contains('\0') && std::env::var_os(k).is_none() {
        // Single-threaded: called before anything else runs.
        std::env::set_var(k, v);
    }
}

/// `***` for a secret: a key the schema marks so, or an environment variable whose name says so.
fn mask(key: &str, secret: bool, value: String) -> String {
    let upper = key.to_ascii_uppercase();
    let env_secret = key.starts_with("env.") && ["PASSWORD", "SECRET", "TOKEN"].iter().any(|w| upper.contains(w));
    if secret || env_secret {
        "***".to_string()
    } else {
        value
    }
}

/// Applies the profile: returns the arguments to parse, with the profile's values for every
/// option no flag or environment variable set.
pub(crate) fn apply(argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let root = crate::cli::Cli::command();
    let Ok(first) = root.clone().ignore_errors(true).try_get_matches_from(&argv) else {
        // --help, --version or an error the real parse reports.
        return Ok(argv);
    };
    // The command being run, and its matches (where the global options are too).
    let mut path: Vec<String> = Vec::new();
    let (mut cmd, mut m) = (&root, &first);
    while let Some((name, sub)) = m.subcommand() {
        let Some(c) = cmd.find_subcommand(name) else { break };
        path.push(name.to_string());
        (cmd, m) = (c, sub);
    }
    let given_file = m.get_one::<PathBuf>("config").cloned();
    let explicit = given_file.is_some();
    let name: Option<String> = m.get_one::<String>("use_profile").cloned();
    let Some(file) = find_file(given_file) else {
        if let Some(name) = name {
            bail!("no configuration file for profile {name:?}: give --config FILE, or write $XDG_CONFIG_HOME/cairn/cairn.toml, ~/.config/cairn/cairn.toml or /etc/cairn/cairn.toml");
        }
        let shown = effective(&root, cmd, m, &path, None);
        let _ = LOADED.set(Loaded { shown, command: path, ..Loaded::default() });
        return Ok(argv);
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("cannot read configuration file {}", file.display()))?;
    let config = Config::parse(&text, &file, &schema())?;
    warn_readable_secrets(&config);
    let profile = match name {
        Some(n) => Some(config.profile(n.as_str())?),
        // Without -p, a profile named `default` applies if the file has one.
        None if config.has("default") => Some(config.profile("default")?),
        // The agent runs every profile of the file.
        None if explicit && path.first().map(String::as_str) != Some("agent") => {
            bail!("{}: which profile? give -p NAME", file.display())
        }
        None => None,
    };
    let Some(profile) = profile else {
        let shown = effective(&root, cmd, m, &path, None);
        let _ = LOADED.set(Loaded { file: Some(file), shown, command: path, ..Loaded::default() });
        return Ok(argv);
    };
    if !COMMANDS_WITHOUT_PROFILE.contains(&path.first().map(String::as_str).unwrap_or("")) {
        for (k, s) in profile.section(ENV) {
            if let Value::One(v) = &s.value {
                set_env_default(k, v);
            }
        }
        if let Some(s) = profile.get("", ENV_FILE) {
            if let Value::List(files) = &s.value {
                for f in files {
                    load_env_file(Path::new(f), &s.origin)?;
                }
            }
        }
    }
    let extra = if COMMANDS_WITHOUT_PROFILE.contains(&path.first().map(String::as_str).unwrap_or("")) {
        (Vec::new(), Vec::new())
    } else {
        injected(&root, cmd, m, &path, &profile)?
    };
    let shown = effective(&root, cmd, m, &path, Some(&profile));
    let _ = LOADED.set(Loaded { file: Some(file), profile: Some(profile), shown, command: path });
    let (extra, last) = extra;
    let mut out = argv;
    let dashes = out.iter().position(|a| a == OsStr::new("--"));
    let at = dashes.unwrap_or(out.len());
    out.splice(at..at, extra);
    // A `last` argument (backup's command) goes after `--`, unless the command line has one.
    if dashes.is_none() && !last.is_empty() {
        out.push(OsString::from("--"));
        out.extend(last);
    }
    Ok(out)
}

/// Whether a flag or an environment variable set the option `id` (or one of its group).
fn given(m: &ArgMatches, cmd: &Command, root: &Command, key: &str) -> bool {
    let group = GROUPS.iter().find(|g| g.contains(&key)).copied().unwrap_or(&[]);
    let keys: Vec<&str> = if group.is_empty() { vec![key] } else { group.to_vec() };
    keys.iter().any(|k| {
        let arg = cmd.get_arguments().chain(root.get_arguments()).find(|a| key_name(a) == *k);
        arg.and_then(|a| m.try_contains_id(a.get_id().as_str()).ok().and_then(|_| m.value_source(a.get_id().as_str())))
            .is_some_and(|s| matches!(s, ValueSource::CommandLine | ValueSource::EnvVariable))
    })
}

/// The arguments the profile adds: global options, then the command's (and apart, the values of
/// an argument that comes after `--`).
type Injected = (Vec<OsString>, Vec<OsString>);

fn injected(root: &Command, cmd: &Command, m: &ArgMatches, path: &[String], profile: &Profile) -> Result<Injected> {
    let section = path.join(".");
    let mut out = Vec::new();
    let mut positional = Vec::new();
    let mut last = Vec::new();
    let scopes: Vec<(&Command, &str)> =
        if path.is_empty() { vec![(root, "")] } else { vec![(root, ""), (cmd, &section)] };
    for (c, sec) in scopes {
        for arg in c.get_arguments() {
            let key = key_name(arg);
            if NOT_IN_PROFILE.contains(&key.as_str()) || given(m, cmd, root, &key) {
                continue;
            }
            let Some(setting) = profile.get(sec, &key) else { continue };
            let values: Vec<&str> = match &setting.value {
                Value::Flag(true) => {
                    out.push(OsString::from(format!("--{key}")));
                    continue;
                }
                Value::Flag(false) => continue,
                Value::One(v) => vec![v.as_str()],
                Value::List(v) => v.iter().map(String::as_str).collect(),
            };
            for v in values {
                // Checked as the option's own parser would, so a bad value names its line.
                if let Err(e) = check_value(arg, v) {
                    let why = match std::error::Error::source(&e) {
                        Some(inner) => format!("invalid value '{v}': {inner}"),
                        None => {
                            let first = e.to_string();
                            let first = first.lines().next().unwrap_or("").trim_start_matches("error: ");
                            first.replace(" for '--value <value>'", "")
                        }
                    };
                    let sec_dot = if sec.is_empty() { String::new() } else { format!("{sec}.") };
                    bail!("{}: profile.{}.{sec_dot}{key}: {why}", setting.origin, profile.name);
                }
                match arg.get_long() {
                    Some(long) => out.push(OsString::from(format!("--{long}={v}"))),
                    None if arg.is_last_set() => last.push(OsString::from(v)),
                    None => positional.push(OsString::from(v)),
                }
            }
        }
    }
    out.extend(positional);
    Ok((out, last))
}

/// Parses `v` with `arg`'s own value parser (alone: its relations to other options are for the
/// real parse).
fn check_value(arg: &Arg, v: &str) -> Result<(), clap::Error> {
    let probe = Arg::new("value").value_parser(arg.get_value_parser().clone()).action(ArgAction::Set).long("value");
    let token = format!("--value={v}");
    Command::new("cairn").no_binary_name(true).arg(probe).try_get_matches_from([token]).map(|_| ())
}

/// Every setting that has a value, and where it came from: the global options, and the
/// profile's per-command sections.
fn effective(root: &Command, cmd: &Command, m: &ArgMatches, path: &[String], profile: Option<&Profile>) -> Vec<Shown> {
    let mut shown = Vec::new();
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    for arg in root.get_arguments() {
        let key = key_name(arg);
        if NOT_IN_PROFILE.contains(&key.as_str()) {
            continue;
        }
        let id = arg.get_id().as_str();
        let source = m.try_contains_id(id).ok().and_then(|_| m.value_source(id));
        let flag_value = || {
            let raw: Vec<String> = m
                .try_get_raw(id)
                .ok()
                .flatten()
                .map(|vs| vs.map(|v| v.to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            match raw.as_slice() {
                [one] if one == "true" || one == "false" => one.clone(),
                [one] => format!("{one:?}"),
                many => format!("{many:?}"),
            }
        };
        let from_profile = profile.and_then(|p| p.get("", &key)).filter(|_| !given(m, cmd, root, &key));
        let (value, source) = match (source, from_profile) {
            (Some(ValueSource::CommandLine), _) => (flag_value(), Source::Flag),
            (Some(ValueSource::EnvVariable), _) => {
                (flag_value(), Source::Env(arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default()))
            }
            (_, Some(s)) => (s.value.to_string(), Source::Profile(s.origin.clone())),
            (Some(ValueSource::DefaultValue), None) => (flag_value(), Source::Default),
            _ => continue,
        };
        if matches!(arg.get_action(), ArgAction::SetTrue) && value == "false" {
            continue;
        }
        seen.insert(key.clone(), ());
        shown.push(Shown { value: mask(&key, false, value), key, source });
    }
    let _ = path;
    if let Some(p) = profile {
        for (section, key, s) in p.iter() {
            let full = if section.is_empty() { key.to_string() } else { format!("{section}.{key}") };
            if section.is_empty() && seen.contains_key(key) {
                continue;
            }
            let env_overrides = section == ENV && std::env::var(key).ok().is_some_and(|v| Value::One(v) != s.value);
            let source = if env_overrides { Source::Env(key.to_string()) } else { Source::Profile(s.origin.clone()) };
            shown.push(Shown { value: mask(&full, s.secret, s.value.to_string()), key: full, source });
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_command_line() {
        let s = schema();
        assert_eq!(s.profile.key("repo").map(|k| k.kind), Some(Kind::Value));
        assert_eq!(s.profile.key("json").map(|k| k.kind), Some(Kind::Flag));
        assert!(s.profile.key("use-profile").is_none() && s.profile.key("config").is_none());
        let backup = s.profile.section("backup").unwrap();
        assert_eq!(backup.key("paths").map(|k| k.kind), Some(Kind::List));
        assert_eq!(backup.key("exclude").map(|k| k.kind), Some(Kind::List));
        assert_eq!(backup.key("one-file-system").map(|k| k.kind), Some(Kind::Flag));
        assert_eq!(s.profile.section("forget").unwrap().key("keep-daily").map(|k| k.kind), Some(Kind::Value));
        assert!(s.profile.section("check").unwrap().key("read-data-subset").is_some());
        assert!(s.profile.section("repair").unwrap().section("index").is_some());
        assert!(s.profile.key(PASSWORD).unwrap().secret);
        assert!(s.profile.section("man").is_none());
        assert!(s.profile.section("hooks").unwrap().key("before").is_some());
        assert_eq!(s.profile.section("backup").unwrap().section("hooks"), Some(&hooks_section()));
    }

    #[test]
    fn masks_secret_names() {
        assert_eq!(mask("env.AWS_SECRET_ACCESS_KEY", false, "x".into()), "***");
        assert_eq!(mask("password", true, "x".into()), "***");
        assert_eq!(mask("repo", false, "/r".into()), "/r");
    }
}
