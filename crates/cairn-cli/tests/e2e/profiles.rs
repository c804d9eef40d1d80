//! Running unattended (issue 35): profiles from the configuration file, their precedence,
//! `config show`, password commands, `--repository-file`, `backup --stdin-from-command` (with a
//! PostgreSQL round trip against a real server) and restic's exit codes 10, 11 and 12.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::support::{self as common, ok, output_within_timeout, Cairn, KDF_ARGS, PASSWORD};

/// `cairn ARGS` in `dir` with no CAIRN_* variables and a private XDG_CONFIG_HOME and HOME, so
/// no configuration file of the machine is found.
fn cairn(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CAIRN_") {
            c.env_remove(k);
        }
    }
    c.current_dir(dir).env("XDG_CONFIG_HOME", dir.join("xdg")).env("HOME", dir.join("home"));
    c.envs(env.iter().copied()).args(args);
    output_within_timeout(&mut c)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A directory with a source tree and a configuration file for a repository in it (not yet
/// created): profiles `base` (repository, password command, init's cheap KDF) and `laptop`.
struct Fx {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    repo: PathBuf,
    config: PathBuf,
}

fn fixture(extra: &str) -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let repo = dir.join("repo");
    fs::create_dir_all(dir.join("src/sub")).unwrap();
    fs::write(dir.join("src/a.txt"), "alpha").unwrap();
    fs::write(dir.join("src/sub/b.log"), "beta").unwrap();
    let config = dir.join("cairn.toml");
    let body = format!(
        r#"[profile.base]
repo = "{repo}"
password-command = "echo '{PASSWORD}'"
[profile.base.init]
kdf-memory = {mem}
kdf-iterations = 1

[profile.laptop]
inherit = "base"
[profile.laptop.backup]
paths = ["{src}"]
tag = ["from-profile"]
exclude = ["*.log"]
[profile.laptop.forget]
keep-last = 1
{extra}"#,
        repo = repo.display(),
        src = dir.join("src").display(),
        mem = KDF_ARGS[1],
    );
    fs::write(&config, body).unwrap();
    fs::set_permissions(&config, fs::Permissions::from_mode(0o600)).unwrap();
    Fx { _tmp: tmp, dir, repo, config }
}

impl Fx {
    fn run(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut all = vec!["--config", self.config.to_str().unwrap()];
        all.extend(args);
        cairn(&self.dir, env, &all)
    }

    fn snapshots(&self) -> serde_json::Value {
        serde_json::from_str(&ok(&self.run(&[], &["-p", "base", "snapshots", "--json"]))).unwrap()
    }
}

#[test]
fn a_profile_runs_init_backup_and_forget_with_no_other_argument() {
    let fx = fixture("");
    ok(&fx.run(&[], &["-p", "laptop", "init"]));
    ok(&fx.run(&[], &["-p", "laptop", "backup"]));
    ok(&fx.run(&[], &["-p", "laptop", "backup"]));
    let snaps = fx.snapshots();
    assert_eq!(snaps.as_array().unwrap().len(), 2, "{snaps}");
    assert_eq!(snaps[0]["tags"], serde_json::json!(["from-profile"]));
    let listing = ok(&fx.run(&[], &["-p", "laptop", "ls", "latest"]));
    assert!(listing.contains("a.txt") && !listing.contains("b.log"), "the profile's exclude applies: {listing}");
    ok(&fx.run(&[], &["-p", "laptop", "forget"]));
    assert_eq!(fx.snapshots().as_array().unwrap().len(), 1, "the profile's keep-last applies");
}

#[test]
fn a_flag_beats_the_environment_which_beats_the_profile() {
    let fx = fixture("");
    ok(&fx.run(&[], &["-p", "laptop", "init"]));
    // A flag replaces the profile's list (tags), the environment its repository.
    ok(&fx.run(&[], &["-p", "laptop", "backup", "--tag", "from-flag"]));
    assert_eq!(fx.snapshots()[0]["tags"], serde_json::json!(["from-flag"]));
    let elsewhere = fx.dir.join("other");
    let env = [("CAIRN_REPOSITORY", elsewhere.to_str().unwrap())];
    let out = fx.run(&env, &["-p", "laptop", "snapshots"]);
    assert_eq!(out.status.code(), Some(10), "the environment's repository is used: {}", text(&out.stderr));
    // The flag beats both.
    ok(&fx.run(&env, &["-p", "laptop", "-r", fx.repo.to_str().unwrap(), "snapshots"]));
    // A password from the environment beats the profile's command.
    let out = fx.run(&[("CAIRN_PASSWORD", "not it")], &["-p", "laptop", "snapshots"]);
    assert_eq!(out.status.code(), Some(12), "{}", text(&out.stderr));
    // A password file given by flag beats the profile's password command (one source).
    let pw = fx.dir.join("pw");
    fs::write(&pw, "not it either\n").unwrap();
    let out = fx.run(&[], &["-p", "laptop", "--password-file", pw.to_str().unwrap(), "snapshots"]);
    assert_eq!(out.status.code(), Some(12), "{}", text(&out.stderr));
}

#[test]
fn config_show_names_where_each_setting_came_from() {
    let fx = fixture(
        "[profile.shown]\ninherit = \"laptop\"\npassword = \"hunter2\"\nenv.AWS_SECRET_ACCESS_KEY = \"s3cr3t\"\n",
    );
    let env = [("CAIRN_CACHE_DIR", "/tmp/cache-from-env")];
    let out = ok(&fx.run(&env, &["-p", "shown", "--no-cache", "config", "show"]));
    let file = fx.config.display().to_string();
    let line = |key: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key}:\n{out}"))
            .to_string()
    };
    assert!(out.starts_with(&format!("# profile shown from {file} (inherits: laptop -> base)")), "{out}");
    assert!(line("repo").ends_with(&format!("# {file}:2")), "{out}");
    assert!(line("password-command").ends_with(&format!("# {file}:3")), "{out}");
    assert!(line("cache-dir").ends_with("# environment CAIRN_CACHE_DIR"), "{out}");
    assert!(line("no-cache").ends_with("# flag"), "{out}");
    assert!(line("sftp-known-hosts").ends_with("# default"), "{out}");
    assert!(
        line("backup.exclude").contains("[\"*.log\"]") && line("backup.exclude").ends_with(&format!("{file}:13")),
        "{out}"
    );
    assert!(line("forget.keep-last").ends_with(&format!("{file}:15")), "{out}");
    assert!(line("password").starts_with("password = ***"), "{out}");
    assert!(line("env.AWS_SECRET_ACCESS_KEY").starts_with("env.AWS_SECRET_ACCESS_KEY = ***"), "{out}");
    assert!(!out.contains("hunter2") && !out.contains("s3cr3t"), "secrets are masked:\n{out}");
    assert!(out.contains("# password: password-command"), "{out}");
}

#[test]
fn a_bad_profile_file_is_one_line_naming_file_line_key_and_the_closest_key() {
    let fx = fixture("[profile.laptop.check]\nread-data-subst = \"10%\"\n");
    let out = fx.run(&[], &["-p", "laptop", "snapshots"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(
        err.trim(),
        format!(
            "cairn: {}:17: profile.laptop.check.read-data-subst: unknown key `read-data-subst` (did you mean `read-data-subset`?)",
            fx.config.display()
        )
    );
    // A wrong type, and a value the option's own parser refuses.
    let fx = fixture("[profile.laptop.restore]\nverify = \"yes\"\n");
    let err = text(&fx.run(&[], &["-p", "laptop", "snapshots"]).stderr);
    assert!(err.contains(":17: profile.laptop.restore.verify: expected true or false, found a string"), "{err}");
    let fx = fixture("[profile.laptop.backup.x]\n");
    let err = text(&fx.run(&[], &["-p", "laptop", "snapshots"]).stderr);
    assert!(err.contains(":16: profile.laptop.backup.x: unknown key `x`"), "{err}");
    let fx = fixture("");
    fs::write(&fx.config, fs::read_to_string(&fx.config).unwrap().replace("keep-last = 1", "keep-last = \"many\""))
        .unwrap();
    let out = fx.run(&[], &["-p", "laptop", "forget"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(":15: profile.laptop.forget.keep-last: invalid value 'many'"), "{err}");
    // An unknown profile.
    let err = text(&fx.run(&[], &["-p", "lpatop", "snapshots"]).stderr);
    assert!(err.contains("no profile `lpatop`") && err.contains("did you mean `laptop`"), "{err}");
}

/// The README's profiles: `db` and `vmhost` share one repository through `base`; `db`'s dump
/// section narrows `latest` to its own snapshots, so a vmhost backup made since does not hide
/// them.
#[test]
fn a_profile_command_section_narrows_latest() {
    let fx = fixture(
        r#"[profile.db]
inherit = "base"
[profile.db.backup]
tag = ["postgres"]
[profile.db.dump]
tag = ["postgres"]
[profile.vmhost]
inherit = "base"
[profile.vmhost.backup]
host = "vmhost"
"#,
    );
    let db = fx.dir.join("src/a.txt");
    ok(&fx.run(&[], &["-p", "base", "init"]));
    ok(&fx.run(&[], &["-p", "db", "backup", db.to_str().unwrap()]));
    ok(&fx.run(&[], &["-p", "vmhost", "backup", fx.dir.join("src/sub").to_str().unwrap()]));
    let spec = format!("latest:{}", db.display());
    let out = fx.run(&[], &["-p", "db", "dump", &spec]);
    assert_eq!(text(&out.stdout), "alpha", "{}", text(&out.stderr));
    // Without the section, `latest` is vmhost's snapshot, which lacks the file.
    let out = fx.run(&[], &["-p", "base", "dump", &spec]);
    assert!(!out.status.success() && text(&out.stderr).contains("which \"latest\" chose (host vmhost"));
}

#[test]
fn the_file_is_found_in_xdg_config_home_and_default_applies_without_p() {
    let fx = fixture("[profile.default]\ninherit = \"laptop\"\n");
    let xdg = fx.dir.join("xdg/cairn");
    fs::create_dir_all(&xdg).unwrap();
    fs::rename(&fx.config, xdg.join("cairn.toml")).unwrap();
    ok(&cairn(&fx.dir, &[], &["init"]));
    ok(&cairn(&fx.dir, &[], &["backup"]));
    let shown = ok(&cairn(&fx.dir, &[], &["config", "show"]));
    assert!(shown.starts_with("# profile default from ") && shown.contains("xdg/cairn/cairn.toml"), "{shown}");
    // -p with no file anywhere is an error that says where it looked.
    let empty = tempfile::tempdir().unwrap();
    let err = text(&cairn(empty.path(), &[], &["-p", "x", "snapshots"]).stderr);
    assert!(err.contains("no configuration file for profile \"x\""), "{err}");
}

#[test]
fn a_literal_password_in_a_file_others_can_read_is_warned_about() {
    let fx = fixture("[profile.plain]\ninherit = \"base\"\npassword-command = \"false\"\npassword = \"hunter2\"\n");
    let out = fx.run(&[], &["-p", "laptop", "init"]);
    ok(&out);
    assert!(text(&out.stderr).is_empty(), "mode 600: no warning: {}", text(&out.stderr));
    fs::set_permissions(&fx.config, fs::Permissions::from_mode(0o644)).unwrap();
    let out = fx.run(&[], &["-p", "laptop", "snapshots"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("warning:")
            && err.contains(
                ":19: profile.plain.password is a password written in a file that others can read (mode 644)"
            ),
        "{err}"
    );
}

#[test]
fn password_command_first_line_and_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    let mut init = vec!["-r", r, "--password-command", "printf 'pw one\\nignored\\n'", "init"];
    init.extend(KDF_ARGS);
    ok(&cairn(tmp.path(), &[], &init));
    ok(&cairn(tmp.path(), &[("CAIRN_PASSWORD", "pw one")], &["-r", r, "snapshots"]));
    ok(&cairn(tmp.path(), &[("CAIRN_PASSWORD_COMMAND", "echo 'pw one'")], &["-r", r, "snapshots"]));
    let out = cairn(tmp.path(), &[], &["-r", r, "--password-command", "echo oops >&2; exit 7", "snapshots"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("oops"), "the command's stderr reaches the user: {err}");
    assert!(
        err.trim_end().ends_with("cairn: password command `echo oops >&2; exit 7` failed (exit status 7)"),
        "{err}"
    );
    let err = text(&cairn(tmp.path(), &[], &["-r", r, "--password-command", "true", "snapshots"]).stderr);
    assert_eq!(err.trim(), "cairn: password command `true` printed no password");
    let out = cairn(tmp.path(), &[], &["-r", r, "--password-command", "echo wrong", "snapshots"]);
    assert_eq!(out.status.code(), Some(12), "{}", text(&out.stderr));
}

#[test]
fn repository_file_names_the_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    Cairn::new(&repo, PASSWORD).init(&[]);
    let file = tmp.path().join("where");
    fs::write(&file, format!("{}\n", repo.display())).unwrap();
    let env = [("CAIRN_PASSWORD", PASSWORD)];
    ok(&cairn(tmp.path(), &env, &["--repository-file", file.to_str().unwrap(), "snapshots"]));
    ok(&cairn(
        tmp.path(),
        &[("CAIRN_PASSWORD", PASSWORD), ("CAIRN_REPOSITORY_FILE", file.to_str().unwrap())],
        &["snapshots"],
    ));
    fs::write(&file, "").unwrap();
    let err = text(&cairn(tmp.path(), &env, &["--repository-file", file.to_str().unwrap(), "snapshots"]).stderr);
    assert!(err.contains("repository file") && err.contains("is empty"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// backup --stdin-from-command

fn snapshot_count(c: &Cairn) -> usize {
    let v: serde_json::Value = serde_json::from_str(&c.ok(["snapshots", "--json"])).unwrap();
    v.as_array().unwrap().len()
}

#[test]
fn stdin_from_command_saves_the_output_only_when_the_command_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cairn::new(&tmp.path().join("repo"), PASSWORD);
    c.init(&[]);
    c.ok([
        "backup",
        "--stdin-from-command",
        "--stdin-filename",
        "out.txt",
        "--",
        "sh",
        "-c",
        "printf 'line %s\\n' 1 2 3",
    ]);
    assert_eq!(c.ok(["dump", "latest:/out.txt"]), "line 1\nline 2\nline 3\n");
    // The command does not see cairn's password.
    c.ok(["backup", "--stdin-from-command", "--stdin-filename", "env", "--", "sh", "-c", "echo \"[$CAIRN_PASSWORD]\""]);
    assert_eq!(c.ok(["dump", "latest:/env"]), "[]\n");
    assert_eq!(snapshot_count(&c), 2);
    let cases: [(&[&str], &str); 4] = [
        (&["sh", "-c", "echo partial; echo 'pg_dump: error: connection failed' >&2; exit 3"], "exited with status 3"),
        (&["sh", "-c", "echo partial; kill -9 $$"], "was killed by signal 9"),
        // Its stdout closed early, then a failure.
        (&["sh", "-c", "echo partial; exec 1>&-; sleep 0.2; echo 'gave up' >&2; exit 1"], "exited with status 1"),
        (&["/nonexistent/dumper"], "could not be started"),
    ];
    for (cmd, how) in cases {
        let mut args = vec!["backup", "--stdin-from-command", "--"];
        args.extend(cmd);
        let out = c.run(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        // The command's own standard error first, as it came, then cairn's one line.
        assert_eq!(err.lines().filter(|l| l.starts_with("cairn:")).count(), 1, "{err}");
        let err = err.trim_end().lines().last().unwrap_or_default().to_string();
        let shown = cmd.join(" ");
        assert!(err.contains(&format!("the command `{shown}` {how}")) && err.contains(": no snapshot saved"), "{err}");
        assert_eq!(snapshot_count(&c), 2, "no snapshot after {cmd:?}");
    }
    let err = text(
        &c.run([
            "backup",
            "--stdin-from-command",
            "--",
            "sh",
            "-c",
            "echo 'pg_dump: error: connection failed' >&2; exit 3",
        ])
        .stderr,
    );
    assert!(err.trim_end().ends_with("its standard error ended with: pg_dump: error: connection failed"), "{err}");
    assert!(err.starts_with("pg_dump: error: connection failed\n"), "passed on as it came: {err}");
    // On success too, what the command says on its standard error reaches the user's: as it
    // runs, and after it exits, from a child that closed the output and holds the standard
    // error a little longer (waited for up to a second).
    let said = [
        (
            "echo data; echo 'pg_dump: warning: there are circular foreign-key constraints' >&2",
            "there are circular foreign-key constraints",
        ),
        ("echo data; (exec >&-; sleep 0.3; echo 'pg_dump: warning: written late' >&2) &", "written late"),
    ];
    for (n, (script, warning)) in said.into_iter().enumerate() {
        let out = c.run(["backup", "--stdin-from-command", "--", "sh", "-c", script]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stderr), format!("pg_dump: warning: {warning}\n"));
        assert_eq!(snapshot_count(&c), 3 + n);
    }
    // Arguments: the command is required, and excludes paths and --stdin.
    assert_eq!(c.run(["backup", "--stdin-from-command"]).status.code(), Some(2));
    assert_eq!(c.run(["backup", "--stdin", "--stdin-from-command", "--", "true"]).status.code(), Some(2));
    assert_eq!(c.run(["backup", "/tmp", "--stdin-from-command", "--", "true"]).status.code(), Some(2));
}

#[test]
fn a_profile_can_name_the_command_to_back_up() {
    let fx = fixture("[profile.db]\ninherit = \"base\"\n[profile.db.backup]\nstdin-from-command = true\nstdin-filename = \"db.sql\"\ncommand = [\"sh\", \"-c\", \"echo dumped\"]\n");
    ok(&fx.run(&[], &["-p", "db", "init"]));
    ok(&fx.run(&[], &["-p", "db", "backup"]));
    assert_eq!(ok(&fx.run(&[], &["-p", "db", "dump", "latest:/db.sql"])), "dumped\n");
    // A command on the command line replaces the profile's.
    ok(&fx.run(&[], &["-p", "db", "backup", "--", "echo", "other"]));
    assert_eq!(ok(&fx.run(&[], &["-p", "db", "dump", "latest:/db.sql"])), "other\n");
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: dump → backup → drop → dump | psql → compare

/// A PostgreSQL server on a private port and socket directory, stopped on drop.
struct Postgres {
    bin: PathBuf,
    _tmp: tempfile::TempDir,
    data: PathBuf,
    sock: PathBuf,
    port: u16,
    as_user: Option<&'static str>,
}

impl Postgres {
    fn start() -> Option<Postgres> {
        let bin = fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .find(|b| b.join("initdb").exists())?;
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let (data, sock) = (tmp.path().join("data"), tmp.path().join("sock"));
        fs::create_dir(&sock).unwrap();
        // initdb refuses root: run the server as `postgres` then.
        let as_user = common::is_root().then_some("postgres");
        if as_user.is_some() {
            let st = Command::new("chown").arg("postgres").arg(tmp.path()).arg(&sock).status().unwrap();
            assert!(st.success());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pg = Postgres { bin, _tmp: tmp, data, sock, port, as_user };
        pg.server(&["initdb", "-D", pg.data.to_str().unwrap(), "-U", "postgres", "--auth=trust", "-E", "UTF8"]);
        let opts = format!("-p {} -k {} -c listen_addresses=''", pg.port, pg.sock.display());
        let log = pg.sock.join("log");
        pg.server(&[
            "pg_ctl",
            "-D",
            pg.data.to_str().unwrap(),
            "-o",
            &opts,
            "-l",
            log.to_str().unwrap(),
            "-w",
            "start",
        ]);
        Some(pg)
    }

    fn server(&self, args: &[&str]) {
        let prog = self.bin.join(args[0]);
        let mut c = match self.as_user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(&prog);
                c
            }
            None => Command::new(&prog),
        };
        let out = c.args(&args[1..]).stdin(Stdio::null()).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}{}", text(&out.stdout), text(&out.stderr));
    }

    /// A client program's argument list: the program, then the connection.
    fn client(&self, prog: &str) -> Vec<String> {
        let p = self.bin.join(prog).display().to_string();
        vec![
            p,
            "-h".into(),
            self.sock.display().to_string(),
            "-p".into(),
            self.port.to_string(),
            "-U".into(),
            "postgres".into(),
        ]
    }

    fn psql(&self, db: &str, sql: &str) -> String {
        let c = self.client("psql");
        let out = Command::new(&c[0])
            .args(&c[1..])
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", db, "-c", sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sql}: {}", text(&out.stderr));
        text(&out.stdout)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.server(&["pg_ctl", "-D", self.data.to_str().unwrap(), "-m", "immediate", "stop"]);
    }
}

#[test]
fn postgres_round_trip_through_stdin_from_command() {
    let Some(pg) = Postgres::start() else {
        assert!(std::env::var_os("CI").is_none(), "PostgreSQL is not installed (.ci/run installs it)");
        eprintln!("skipped: PostgreSQL is not installed (apt-get install postgresql)");
        return;
    };
    pg.psql("postgres", "CREATE DATABASE shop");
    pg.psql(
        "shop",
        "CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL, joined date);
         CREATE TABLE orders (id serial PRIMARY KEY, customer int REFERENCES customers, total numeric(10,2), note text);
         CREATE TABLE blobs (k text PRIMARY KEY, v bytea);
         INSERT INTO customers (name, joined) SELECT 'customer ' || i, DATE '2020-01-01' + i FROM generate_series(1, 500) i;
         INSERT INTO orders (customer, total, note) SELECT 1 + i % 500, i * 1.25, CASE WHEN i % 7 = 0 THEN NULL ELSE 'tab\tand ''quote'' ' || i END FROM generate_series(1, 5000) i;
         INSERT INTO blobs SELECT 'b' || i, decode(md5(i::text) || md5((i*3)::text), 'hex') FROM generate_series(1, 200) i;",
    );
    let tables = ["customers", "orders", "blobs"];
    let snapshot = |db: &str| -> Vec<String> {
        tables.iter().map(|t| pg.psql(db, &format!("SELECT * FROM {t} ORDER BY 1"))).collect()
    };
    let before = snapshot("shop");
    assert_eq!(before[1].lines().count(), 5000);

    let tmp = tempfile::tempdir().unwrap();
    let c = Cairn::new(&tmp.path().join("repo"), PASSWORD);
    c.init(&[]);
    let mut args: Vec<String> =
        ["backup", "--tag", "postgres", "--stdin-from-command", "--stdin-filename", "shop.sql", "--"]
            .map(String::from)
            .to_vec();
    args.extend(pg.client("pg_dump"));
    args.push("shop".into());
    c.ok(&args);
    // A dump that fails (no such database) saves nothing.
    let mut bad = args.clone();
    *bad.last_mut().unwrap() = "no_such_db".into();
    let out = c.run(&bad);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("exited with status 1") && text(&out.stderr).contains("no_such_db"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(snapshot_count(&c), 1);

    pg.psql("postgres", "DROP DATABASE shop");
    pg.psql("postgres", "CREATE DATABASE shop");
    // cairn dump --tag postgres latest:/shop.sql | psql shop
    let mut dump =
        c.command().args(["dump", "--tag", "postgres", "latest:/shop.sql"]).stdout(Stdio::piped()).spawn().unwrap();
    let psql = pg.client("psql");
    let restore = Command::new(&psql[0])
        .args(&psql[1..])
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", "shop"])
        .stdin(dump.stdout.take().unwrap())
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(restore.status.success(), "{}", text(&restore.stderr));
    assert!(dump.wait().unwrap().success());
    assert_eq!(snapshot("shop"), before);
}

// ---------------------------------------------------------------------------------------------
// Exit codes

#[test]
fn exit_code_10_when_no_repository_is_at_the_location() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Cairn::new(&tmp.path().join("nothing"), PASSWORD).run(["snapshots"]);
    assert_eq!(out.status.code(), Some(10), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no repository at"));
}

/// Without a password given, a missing repository is said before one is asked for (restic's
/// order), and so is one whose password file is missing; a repository that exists still needs
/// its password.
#[test]
fn exit_code_10_before_a_password_is_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nothing");
    let no_password = |repo: &Path, extra: &[&str]| {
        let mut args = vec!["-r", repo.to_str().unwrap()];
        args.extend(extra);
        args.push("snapshots");
        cairn(tmp.path(), &[], &args)
    };
    for extra in [&[][..], &["--password-file", tmp.path().join("no-such-file").to_str().unwrap()]] {
        let out = no_password(&missing, extra);
        assert_eq!(out.status.code(), Some(10), "{extra:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("no repository at"), "{}", text(&out.stderr));
    }
    let repo = tmp.path().join("repo");
    Cairn::new(&repo, PASSWORD).init(&[]);
    let out = no_password(&repo, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no repository password"), "{}", text(&out.stderr));
}

#[test]
fn exit_code_11_when_the_lock_cannot_be_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cairn::new(&tmp.path().join("repo"), PASSWORD);
    c.init(&[]);
    // An exclusive lock of a live process on this host: this test's own.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let info = serde_json::json!({
        "version": 1, "exclusive": true, "hostname": cairn_core::engine::platform::hostname(),
        "username": "tester", "pid": std::process::id(), "created": now, "refreshed": now,
    });
    let planted = c.repo.join("locks").join(format!("{:032x}", 0xfeed_u64));
    fs::create_dir_all(planted.parent().unwrap()).unwrap();
    fs::write(&planted, info.to_string()).unwrap();
    let out = c.run(["backup", tmp.path().join("repo/config").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(11), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is locked"));
}

#[test]
fn exit_code_12_for_a_wrong_password() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    Cairn::new(&repo, PASSWORD).init(&[]);
    let out = Cairn::new(&repo, "not the password").run(["snapshots"]);
    assert_eq!(out.status.code(), Some(12), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("wrong password"));
}

#[test]
fn exit_codes_are_in_the_help_and_the_manual() {
    let tmp = tempfile::tempdir().unwrap();
    let help = ok(&cairn(tmp.path(), &[], &["--help"]));
    let man = ok(&cairn(tmp.path(), &[], &["man"]));
    for want in ["10 no repository at the location", "11 the lock could not be taken", "12\nwrong password"] {
        let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat(&help).contains(&flat(want)), "help lacks {want:?}");
        assert!(flat(&man).contains(&flat(want)), "man page lacks {want:?}");
    }
}

/// The hook log a test's hooks append to: `STAGE VAR=VALUE…` lines.
fn hook_log(fx: &Fx) -> Vec<String> {
    fs::read_to_string(fx.dir.join("hooks.log")).unwrap_or_default().lines().map(str::to_string).collect()
}

/// A hook command that appends its stage and the outcome's variables to `$HOOK_LOG`.
fn logging_hook(tag: &str) -> String {
    format!(
        "echo \"{tag} $CAIRN_HOOK profile=$CAIRN_PROFILE command=$CAIRN_COMMAND code=$CAIRN_EXIT_CODE \
         snapshot=$CAIRN_SNAPSHOT_ID added=$CAIRN_BYTES_ADDED duration=$CAIRN_DURATION error=$CAIRN_ERROR\" >> \"$HOOK_LOG\""
    )
}

impl Fx {
    /// [`Fx::run`] with `HOOK_LOG` naming `hooks.log` in the test's directory.
    fn run_logged(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let log = self.dir.join("hooks.log");
        let mut all = vec![("HOOK_LOG", log.to_str().unwrap())];
        all.extend(env);
        self.run(&all, args)
    }
}

#[test]
fn hooks_run_around_a_command_and_are_told_its_outcome() {
    let (profile_hook, backup_hook) = (logging_hook("profile"), logging_hook("backup"));
    let fx = fixture(&format!(
        r#"[profile.laptop.hooks]
before = [{profile_hook:?}]
finally = [{profile_hook:?}]
[profile.laptop.backup.hooks]
before = [{backup_hook:?}, "echo 'said by a hook'; echo 'and on its stderr' >&2"]
after = [{backup_hook:?}]
failure = [{backup_hook:?}]
finally = [{backup_hook:?}]
"#
    ));
    ok(&fx.run_logged(&[], &["-p", "laptop", "init"]));
    let log = hook_log(&fx);
    assert_eq!(log.len(), 2, "init runs the profile's hooks only: {log:?}");
    assert!(log[0].starts_with("profile before profile=laptop command=init code= "), "{log:?}");
    assert!(log[1].starts_with("profile finally profile=laptop command=init code=0 "), "{log:?}");
    fs::remove_file(fx.dir.join("hooks.log")).unwrap();

    let out = fx.run_logged(&[], &["-p", "laptop", "--json", "backup"]);
    let stdout = ok(&out);
    let summary = common::last_json(&stdout);
    assert!(!stdout.contains("said by a hook"), "hook output stays off stdout: {stdout}");
    let mut stderr: Vec<String> = text(&out.stderr).lines().map(str::to_string).collect();
    stderr.sort();
    assert_eq!(stderr, ["cairn: before hook: and on its stderr", "cairn: before hook: said by a hook"], "to stderr");
    let id = summary["snapshot_id"].as_str().unwrap();
    let added = summary["bytes_added"].as_u64().unwrap();
    let log = hook_log(&fx);
    let stages: Vec<String> = log.iter().map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    // The profile's before hooks first, its after hooks last.
    assert_eq!(
        stages,
        ["profile before", "backup before", "backup after", "backup finally", "profile finally"],
        "{log:?}"
    );
    let after = &log[2];
    assert!(after.contains(&format!("command=backup code=0 snapshot={id} added={added} duration=")), "{after}");
    assert!(after.ends_with("error="), "{after}");
    let duration: f64 = after.split("duration=").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(duration > 0.0 && duration < 60.0, "{after}");
    fs::remove_file(fx.dir.join("hooks.log")).unwrap();

    // A failed command: the failure hooks, told its exit code and error.
    let out = fx.run_logged(&[("CAIRN_PASSWORD", "wrong")], &["-p", "laptop", "backup"]);
    assert_eq!(out.status.code(), Some(12), "{}", text(&out.stderr));
    let log = hook_log(&fx);
    let failure = log.iter().find(|l| l.starts_with("backup failure")).expect("a failure hook ran");
    assert!(failure.contains("code=12 snapshot= added= "), "{failure}");
    assert!(failure.contains("error=wrong password: no key in"), "{failure}");
    assert!(!log.iter().any(|l| l.starts_with("backup after")), "{log:?}");
    assert!(log.last().unwrap().starts_with("profile finally profile=laptop command=backup code=12"), "{log:?}");
}

#[test]
fn a_failing_before_hook_stops_the_command_unless_the_profile_goes_on() {
    let hook = logging_hook("hook");
    let fx = fixture(&format!(
        r#"[profile.laptop.backup.hooks]
before = ["echo 'volume not mounted' >&2; exit 4"]
failure = [{hook:?}]
finally = [{hook:?}]

[profile.lenient]
inherit = "laptop"
[profile.lenient.backup.hooks]
before = ["exit 4"]
before-failure = "continue"
"#
    ));
    ok(&fx.run_logged(&[], &["-p", "laptop", "init"]));
    let out = fx.run_logged(&[], &["-p", "laptop", "backup"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "cairn: before hook: volume not mounted\n\
         cairn: the before hook `echo 'volume not mounted' >&2; exit 4` exited with status 4\n"
    );
    assert_eq!(fx.snapshots().as_array().unwrap().len(), 0, "nothing stored");
    let log = hook_log(&fx);
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[0].starts_with("hook failure profile=laptop command=backup code=1 "), "{log:?}");
    assert!(
        log[0].ends_with("error=the before hook `echo 'volume not mounted' >&2; exit 4` exited with status 4"),
        "{log:?}"
    );

    let out = fx.run_logged(&[], &["-p", "lenient", "backup"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cairn: before hook: the before hook `exit 4` exited with status 4; going on"));
    assert_eq!(fx.snapshots().as_array().unwrap().len(), 1);
}

#[test]
fn a_hook_that_hangs_is_stopped_after_its_timeout() {
    let fx = fixture(
        "[profile.laptop.backup.hooks]\nbefore = [\"sleep 60\"]\ntimeout = \"1s\"\n\
         [profile.laptop.hooks]\nfinally = [\"sleep 60\"]\ntimeout = \"500ms\"\n",
    );
    ok(&fx.run_logged(&[], &["-p", "laptop", "init"]));
    let start = std::time::Instant::now();
    let out = fx.run(&[], &["-p", "laptop", "backup"]);
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // The command's timeout (1 s) for both its own and the profile's hooks.
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    assert_eq!(
        text(&out.stderr),
        "cairn: finally hook: the finally hook `sleep 60` was stopped after its timeout of 1s\n\
         cairn: the before hook `sleep 60` was stopped after its timeout of 1s\n"
    );
}

#[test]
fn bad_hook_settings_name_their_line() {
    let fx = fixture("[profile.laptop.backup.hooks]\nbefore-failure = \"contine\"\n");
    let err = text(&fx.run(&[], &["-p", "laptop", "snapshots"]).stderr);
    let want = format!(
        "cairn: {}:17: profile.laptop.backup.hooks.before-failure: expected one of \"stop\", \"continue\", found \
         \"contine\" (did you mean `continue`?)\n",
        fx.config.display()
    );
    assert_eq!(err, want);
    let fx = fixture("[profile.laptop.hooks]\ntimeout = \"soon\"\n");
    let err = text(&fx.run(&[], &["-p", "laptop", "snapshots"]).stderr);
    assert!(err.contains(":17: profile.laptop.hooks.timeout: expected a duration such as \"30s\""), "{err}");
}

/// With `--json`, a fatal error is one JSON object on stderr: restic's `message_type`, the exit
/// code and the message.
#[test]
fn with_json_a_fatal_error_is_one_json_line() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nothing-here");
    let out =
        cairn(tmp.path(), &[("CAIRN_PASSWORD", PASSWORD)], &["--json", "-r", missing.to_str().unwrap(), "snapshots"]);
    assert_eq!(out.status.code(), Some(10));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&err).expect("stderr is JSON");
    assert_eq!(v["message_type"], "error");
    assert_eq!(v["code"], 10);
    let want = format!(
        "no repository at {}: check the location, or create a repository there with `cairn init` (the location comes \
         from -r/--repo or CAIRN_REPOSITORY)",
        missing.display()
    );
    assert_eq!(v["message"], want.as_str());
    assert!(out.stdout.is_empty());
    // A configuration file that cannot be used: code 2, as JSON too.
    let fx = fixture("[profile.other.backup]\nexclud = []\n");
    let out = fx.run(&[], &["-p", "other", "--json", "snapshots"]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_str(&text(&out.stderr)).expect("stderr is JSON");
    assert_eq!((v["message_type"].as_str(), v["code"].as_u64()), (Some("error"), Some(2)), "{v}");
    assert!(v["message"].as_str().unwrap().contains("unknown key `exclud` (did you mean `exclude`?)"), "{v}");
    // Without --json, the same error is a line of text.
    let out = cairn(tmp.path(), &[("CAIRN_PASSWORD", PASSWORD)], &["-r", missing.to_str().unwrap(), "snapshots"]);
    assert_eq!(text(&out.stderr), format!("cairn: {want}\n"));
}
