//! The configuration file (crates/cairn-profile): any text is parsed against a schema shaped like
//! the `cairn` binary's (hooks tables included) without panicking; an error is one line naming the file; every profile of
//! a file that parses resolves (inheritance ends), and every value's line is in the file.
#![no_main]

use std::path::Path;

use cairn_profile::{hooks_section, Config, Key, Kind, Schema, Section};
use libfuzzer_sys::fuzz_target;

fn schema() -> Schema {
    let mut password = Key::new("password", Kind::Value);
    password.secret = true;
    let backup = Section {
        keys: vec![
            Key::new("paths", Kind::List),
            Key::new("exclude", Kind::List),
            Key::new("one-file-system", Kind::Flag),
            Key::new("read-concurrency", Kind::Value),
        ],
        sections: vec![("hooks".into(), hooks_section())],
        ..Section::default()
    };
    let index = Section { keys: vec![Key::new("read-all-packs", Kind::Flag)], ..Section::default() };
    let repair = Section { sections: vec![("index".into(), index)], ..Section::default() };
    let env = Section { open: true, ..Section::default() };
    Schema {
        profile: Section {
            keys: vec![Key::new("repo", Kind::Value), Key::new("password-command", Kind::Value), password],
            sections: vec![
                ("backup".into(), backup),
                ("repair".into(), repair),
                ("env".into(), env),
                ("hooks".into(), hooks_section()),
            ],
            open: false,
        },
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let file = Path::new("cairn.toml");
    match Config::parse(text, file, &schema()) {
        Ok(config) => {
            let lines = text.split('\n').count();
            for name in config.names() {
                let profile = config.profile(name).expect("the profiles of a parsed file resolve");
                assert_eq!(profile.chain[0], name);
                // Hook settings are read out of any parsed profile (their values were checked).
                let hooks = profile.hooks("backup");
                if let Some(t) = hooks.timeout {
                    assert!(t.as_secs_f64().is_finite());
                }
                for (_, _, setting) in profile.iter() {
                    assert!((1..=lines).contains(&setting.origin.line), "line {} of {lines}", setting.origin.line);
                }
            }
            for (_, _, origin) in config.literal_secrets() {
                assert!((1..=lines).contains(&origin.line));
            }
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(shown.starts_with("cairn.toml"), "{shown}");
            assert!(!shown.contains('\n'), "{shown}");
        }
    }
});
