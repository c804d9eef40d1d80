//! The configuration file: values and their origins, inheritance, and one-line errors.

use std::path::Path;

use cairn_profile::{hooks_section, parse_duration, Config, Error, HookSettings, Key, Kind, Schema, Section, Value};

/// A schema shaped like the `cairn` binary's.
fn schema() -> Schema {
    let mut password = Key::new("password", Kind::Value);
    password.secret = true;
    let backup = Section {
        keys: vec![
            Key::new("paths", Kind::List),
            Key::new("exclude", Kind::List),
            Key::new("tag", Kind::List),
            Key::new("one-file-system", Kind::Flag),
            Key::new("read-concurrency", Kind::Value),
        ],
        ..Section::default()
    };
    let forget = Section {
        keys: vec![Key::new("keep-daily", Kind::Value), Key::new("prune", Kind::Flag)],
        ..Section::default()
    };
    let mut backup = backup;
    backup.sections.push(("hooks".into(), hooks_section()));
    let env = Section { open: true, ..Section::default() };
    Schema {
        profile: Section {
            keys: vec![Key::new("repo", Kind::Value), Key::new("password-file", Kind::Value), password],
            sections: vec![
                ("backup".into(), backup),
                ("forget".into(), forget),
                ("env".into(), env),
                ("hooks".into(), hooks_section()),
            ],
            open: false,
        },
    }
}

fn parse(text: &str) -> Result<Config, Error> {
    Config::parse(text, Path::new("/etc/cairn/cairn.toml"), &schema())
}

fn err(text: &str) -> String {
    parse(text).expect_err("must be refused").to_string()
}

const GOOD: &str = r#"
[profile.base]
repo = "/srv/repo"
password-file = "/etc/cairn/pw"

[profile.base.forget]
keep-daily = 7

[profile.laptop]
inherit = "base"
repo = "sftp:nas:/r"
env.AWS_REGION = "eu-west-1"

[profile.laptop.backup]
paths = ["/home/me", "/etc"]
exclude = "/home/me/.cache"
one-file-system = true
read-concurrency = 4
"#;

#[test]
fn values_keep_their_line_and_inherit() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.names().collect::<Vec<_>>(), ["base", "laptop"]);
    let p = c.profile("laptop").unwrap();
    assert_eq!(p.chain, ["laptop", "base"]);
    let repo = p.get("", "repo").unwrap();
    assert_eq!(repo.value, Value::One("sftp:nas:/r".into()));
    assert_eq!(repo.origin.to_string(), "/etc/cairn/cairn.toml:11");
    let pw = p.get("", "password-file").unwrap();
    assert_eq!(pw.origin.line, 4, "inherited values keep the parent's line");
    assert_eq!(p.get("forget", "keep-daily").unwrap().value, Value::One("7".into()));
    assert_eq!(p.get("backup", "paths").unwrap().value, Value::List(vec!["/home/me".into(), "/etc".into()]));
    assert_eq!(p.get("backup", "exclude").unwrap().value, Value::List(vec!["/home/me/.cache".into()]));
    assert_eq!(p.get("backup", "one-file-system").unwrap().value, Value::Flag(true));
    assert_eq!(p.get("backup", "read-concurrency").unwrap().origin.line, 18);
    assert_eq!(p.get("env", "AWS_REGION").unwrap().origin.line, 12);
    assert_eq!(p.section("backup").count(), 4);
    assert!(c.profile("base").unwrap().get("backup", "paths").is_none());
    assert!(c.literal_secrets().is_empty());
}

#[test]
fn unknown_keys_name_file_line_and_the_closest_key() {
    assert_eq!(
        err("[profile.a.backup]\nexlude = [\"x\"]\n"),
        "/etc/cairn/cairn.toml:2: profile.a.backup.exlude: unknown key `exlude` (did you mean `exclude`?)"
    );
    assert_eq!(
        err("[profile.a]\n\nrepository = \"/r\"\n"),
        "/etc/cairn/cairn.toml:3: profile.a.repository: unknown key `repository`"
    );
    assert_eq!(
        err("[profile.a]\ninherits = \"b\"\n"),
        "/etc/cairn/cairn.toml:2: profile.a.inherits: unknown key `inherits` (did you mean `inherit`?)"
    );
    assert_eq!(err("[profiles.a]\nrepo = \"/r\"\n"), "/etc/cairn/cairn.toml:1: profiles: unknown key `profiles`: the file holds only [profile.NAME] tables (did you mean `profile`?)");
    assert_eq!(
        err("[profile.a.bakup]\n"),
        "/etc/cairn/cairn.toml:1: profile.a.bakup: unknown key `bakup` (did you mean `backup`?)"
    );
}

#[test]
fn wrong_types_say_what_is_expected() {
    assert_eq!(
        err("[profile.a.backup]\none-file-system = \"yes\"\n"),
        "/etc/cairn/cairn.toml:2: profile.a.backup.one-file-system: expected true or false, found a string"
    );
    assert_eq!(
        err("[profile.a]\nrepo = [\"/r\"]\n"),
        "/etc/cairn/cairn.toml:2: profile.a.repo: expected a string or a number, found an array"
    );
    assert_eq!(
        err("[profile.a]\nbackup = 3\n"),
        "/etc/cairn/cairn.toml:2: profile.a.backup: expected a table ([profile.a.backup]), found an integer"
    );
    assert_eq!(
        err("[profile.a.backup]\ntag = [\"x\",\n  { a = 1 }]\n"),
        "/etc/cairn/cairn.toml:3: profile.a.backup.tag: expected an array of strings, found an array holding a table"
    );
    assert_eq!(
        err("profile = 1\n"),
        "/etc/cairn/cairn.toml:1: profile: expected a table of profiles, found an integer"
    );
    assert_eq!(
        err("[profile.a]\ninherit = 1\n"),
        "/etc/cairn/cairn.toml:2: profile.a.inherit: expected a profile name (a string), found an integer"
    );
}

#[test]
fn syntax_errors_are_one_line_with_the_line() {
    let e = parse("[profile.a]\nrepo = \"/r\"\nrepo = \"/s\"\n").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    let shown = e.to_string();
    assert!(!shown.contains('\n') && shown.starts_with("/etc/cairn/cairn.toml:3: "), "{shown}");
    let e = parse("[profile.a\n").unwrap_err().to_string();
    assert!(e.starts_with("/etc/cairn/cairn.toml:1: ") && !e.contains('\n'), "{e}");
}

#[test]
fn inheritance_faults() {
    assert_eq!(
        err("[profile.a]\ninherit = \"bsae\"\n[profile.base]\n"),
        "/etc/cairn/cairn.toml:2: profile.a.inherit: no profile `bsae`: it holds a, base (did you mean `base`?)"
    );
    assert_eq!(
        err("[profile.a]\ninherit = \"b\"\n[profile.b]\ninherit = \"a\"\n"),
        "/etc/cairn/cairn.toml:4: profile.b.inherit: profiles inherit from each other in a circle: a -> b -> a"
    );
    let c = parse(GOOD).unwrap();
    assert_eq!(
        c.profile("lpatop").unwrap_err().to_string(),
        "/etc/cairn/cairn.toml: no profile `lpatop`: it holds base, laptop (did you mean `laptop`?)"
    );
}

#[test]
fn literal_secrets_are_listed() {
    let c = parse("[profile.a]\npassword = \"hunter2\"\n").unwrap();
    let s = c.literal_secrets();
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].0.as_str(), s[0].1.as_str(), s[0].2.line), ("a", "password", 2));
    assert!(c.profile("a").unwrap().get("", "password").unwrap().secret);
}

#[test]
fn hooks_of_the_profile_wrap_those_of_the_command() {
    let c = parse(
        r#"
[profile.base.hooks]
before = "mount /mnt/backup"
finally = ["umount /mnt/backup"]
timeout = "10m"
[profile.nas]
inherit = "base"
[profile.nas.backup.hooks]
before = ["pg_dump -f /tmp/db.sql"]
after = ["curl -fsS https://hc.example/ok"]
finally = ["rm /tmp/db.sql"]
before-failure = "continue"
timeout = 90
"#,
    )
    .unwrap();
    let nas = c.profile("nas").unwrap();
    assert_eq!(
        nas.hooks("backup"),
        HookSettings {
            before: vec!["mount /mnt/backup".into(), "pg_dump -f /tmp/db.sql".into()],
            after: vec!["curl -fsS https://hc.example/ok".into()],
            failure: vec![],
            finally: vec!["rm /tmp/db.sql".into(), "umount /mnt/backup".into()],
            timeout: Some(std::time::Duration::from_secs(90)),
            before_may_fail: true,
        }
    );
    let forget = nas.hooks("forget");
    assert_eq!((forget.before.len(), forget.timeout), (1, Some(std::time::Duration::from_secs(600))));
    assert!(!forget.before_may_fail);
    assert!(c.profile("base").unwrap().hooks("backup").after.is_empty());
}

#[test]
fn hook_values_are_checked_where_they_are_written() {
    assert_eq!(
        err("[profile.a.hooks]\nbefore-failure = \"go-on\"\n"),
        "/etc/cairn/cairn.toml:2: profile.a.hooks.before-failure: expected one of \"stop\", \"continue\", found \"go-on\""
    );
    assert_eq!(
        err("[profile.a.backup.hooks]\ntimeout = \"5 minutes\"\n"),
        "/etc/cairn/cairn.toml:2: profile.a.backup.hooks.timeout: expected a duration such as \"30s\", \"5m\" or \"1h\", \
         found \"5 minutes\""
    );
    assert_eq!(
        err("[profile.a.hooks]\nbefor = []\n"),
        "/etc/cairn/cairn.toml:2: profile.a.hooks.befor: unknown key `befor` (did you mean `before`?)"
    );
    assert!(err("[profile.a.hooks]\nbefore-failure = true\n").contains("expected one of"));
    assert!(err("[profile.a.hooks]\ntimeout = -1\n").contains("expected a duration"));
}

#[test]
fn durations() {
    use std::time::Duration;
    assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
    assert_eq!(parse_duration("1.5h"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("12"), Some(Duration::from_secs(12)));
    for bad in ["", "s", "-1s", "5 minutes", "1d", "NaN", "inf", "1e400"] {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
}

mod no_panic {
    use super::*;
    use proptest::prelude::*;

    /// Pieces a profile file is made of, good and bad, so the generator reaches deep.
    fn fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("[profile.a]\n".to_string()),
            Just("[profile.b.backup]\n".to_string()),
            Just("[profile.b]\ninherit = \"a\"\n".to_string()),
            Just("[profile.a]\ninherit = \"b\"\n".to_string()),
            Just("[profile.c.env]\n".to_string()),
            Just("[profile.a.hooks]\n".to_string()),
            Just("[profile.b.backup.hooks]\n".to_string()),
            Just("timeout = \"".to_string()),
            Just("before-failure = \"".to_string()),
            Just("before = [\"true\"]\n".to_string()),
            Just("[[profile.d]]\n".to_string()),
            "[a-z.\\-]{0,12} = ".boxed(),
            "\"[^\"\\\\]{0,8}\"\n".boxed(),
            "-?[0-9]{1,25}\n".boxed(),
            Just("[1, \"x\", {a = 1}, [2]]\n".to_string()),
            Just("true\n".to_string()),
            Just("1979-05-27T07:32:00Z\n".to_string()),
            Just("{ tag = [\"x\"], exclude = 3 }\n".to_string()),
            ".{0,16}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn any_bytes(text in ".{0,200}") {
            check(&text);
        }

        #[test]
        fn any_profile_like_file(parts in proptest::collection::vec(fragment(), 0..24)) {
            check(&parts.concat());
        }
    }

    /// Parsing never panics; an error is one line naming the file; a profile resolves.
    fn check(text: &str) {
        match parse(text) {
            Ok(c) => {
                let names: Vec<String> = c.names().map(str::to_string).collect();
                for n in names {
                    let p = c.profile(&n).expect("a parsed file's profiles resolve");
                    let _ = (p.hooks("backup"), p.hooks("forget"));
                    for (_, _, s) in p.iter() {
                        assert!(s.origin.line >= 1 && s.origin.line <= text.lines().count().max(1) + 1);
                    }
                }
            }
            Err(e) => {
                let shown = e.to_string();
                assert!(shown.starts_with("/etc/cairn/cairn.toml"), "{shown}");
                assert!(!shown.contains('\n'), "{shown}");
            }
        }
    }
}
