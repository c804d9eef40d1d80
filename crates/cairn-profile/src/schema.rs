//! What a profile may hold: sections (the profile itself, one per command) of typed keys.

/// The type of a key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `true` or `false` (a command line switch such as `--one-file-system`).
    Flag,
    /// One value: a string, an integer or a float (kept as the text a command line would hold).
    Value,
    /// Several values: an array of strings or numbers (a single one is taken as an array of one).
    List,
    /// A duration: `30s`, `5m`, `1h`, `500ms`, or a number of seconds.
    Duration,
    /// One of a few words.
    Choice(&'static [&'static str]),
}

impl Kind {
    /// What a value of this kind looks like, for error messages.
    pub fn expected(self) -> String {
        match self {
            Kind::Flag => "true or false".into(),
            Kind::Value => "a string or a number".into(),
            Kind::List => "an array of strings".into(),
            Kind::Duration => "a duration such as \"30s\", \"5m\" or \"1h\"".into(),
            Kind::Choice(words) => {
                let quoted: Vec<String> = words.iter().map(|w| format!("{w:?}")).collect();
                format!("one of {}", quoted.join(", "))
            }
        }
    }
}

/// One key of a section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// Its name in the file (a command line option's long name, e.g. `keep-daily`).
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// Its value is a secret: masked when shown, and a file holding one should not be readable
    /// by others.
    pub secret: bool,
}

impl Key {
    /// A key that is no secret.
    pub fn new(name: impl Into<String>, kind: Kind) -> Self {
        Key { name: name.into(), kind, secret: false }
    }
}

/// A table of keys: the profile itself, or one command's `[profile.NAME.COMMAND]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    /// The keys it may hold.
    pub keys: Vec<Key>,
    /// Its sub-tables, by name (a command's section; a subcommand's within it).
    pub sections: Vec<(String, Section)>,
    /// Any key is allowed, each a [`Kind::Value`] (e.g. `[profile.NAME.env]`: environment
    /// variables).
    pub open: bool,
}

impl Section {
    /// The key named `name`.
    pub fn key(&self, name: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.name == name)
    }

    /// The sub-table named `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// Every name valid in this table (keys and sub-tables).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.name.as_str()).chain(self.sections.iter().map(|(n, _)| n.as_str()))
    }
}

/// Everything a profile may hold: its top-level keys (the global options, [`crate::INHERIT`]) and
/// one section per command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schema {
    /// The profile's table.
    pub profile: Section,
}

/// The name of a hooks table: `[profile.NAME.hooks]` (every command) and
/// `[profile.NAME.COMMAND.hooks]` (that command).
pub const HOOKS: &str = "hooks";

/// What a hooks table may hold: `before`, `after`, `failure` and `finally` (lists of shell
/// commands), `timeout` (how long each may run) and `before-failure` (`stop` the command, the
/// default, or `continue`).
pub fn hooks_section() -> Section {
    Section {
        keys: vec![
            Key::new("before", Kind::List),
            Key::new("after", Kind::List),
            Key::new("failure", Kind::List),
            Key::new("finally", Kind::List),
            Key::new("timeout", Kind::Duration),
            Key::new("before-failure", Kind::Choice(&["stop", "continue"])),
        ],
        ..Section::default()
    }
}
