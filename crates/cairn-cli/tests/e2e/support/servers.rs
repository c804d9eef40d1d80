//! Real servers on loopback for the remote-repository tests: MinIO (S3) and OpenSSH's sshd
//! (SFTP), started once per test binary on free ports with throwaway data directories, keys and
//! configuration, and killed when the test binary exits. If a server cannot start, the test
//! fails with the reason: nothing is skipped. `.ci/servers` installs both.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::support::Cairn;

/// MinIO's credentials (its root user).
pub const S3_USER: &str = "cairn-test";
pub const S3_SECRET: &str = "cairn-test-secret";
/// The bucket every S3 test repository lives in (as a prefix of its own).
pub const BUCKET: &str = "cairn";

/// The running servers.
pub struct Servers {
    /// `http://127.0.0.1:PORT`.
    pub s3_endpoint: String,
    /// sshd's port.
    pub ssh_port: u16,
    /// The private key sshd accepts.
    pub ssh_key: PathBuf,
    /// The login name (this user).
    pub ssh_user: String,
    /// Holds the servers' data, keys and configuration.
    pub dir: PathBuf,
}

/// Child processes and the directory to remove when the test binary exits.
static CLEANUP: Mutex<(Vec<Child>, Option<PathBuf>)> = Mutex::new((Vec::new(), None));

extern "C" fn cleanup() {
    if let Ok(mut c) = CLEANUP.lock() {
        for child in &mut c.0 {
            // SAFETY: signalling the process group this helper created for the child.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
        }
        if let Some(dir) = c.1.take() {
            kill_processes_naming(&dir);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Ends every process whose command line names `dir`: `ssh` connections of `cairn` processes
/// a test killed (which never got to close them) and the sshd sessions serving them.
fn kill_processes_naming(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) else { continue };
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        if pid != std::process::id() as libc::pid_t && String::from_utf8_lossy(&cmdline).contains(&needle) {
            // SAFETY: signalling one process by its ID.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Starts the servers on first use; every later call returns the same ones.
pub fn servers() -> &'static Servers {
    static SERVERS: OnceLock<Servers> = OnceLock::new();
    SERVERS.get_or_init(|| start().unwrap_or_else(|e| panic!("cannot start the test servers: {e}")))
}

fn start() -> Result<Servers, String> {
    let dir = tempfile::Builder::new().prefix("cairn-servers-").tempdir().map_err(|e| e.to_string())?.keep();
    CLEANUP.lock().unwrap().1 = Some(dir.clone());
    // SAFETY: registering a plain extern "C" function that takes no arguments.
    unsafe { libc::atexit(cleanup) };
    let s3_endpoint = start_minio(&dir)?;
    let (ssh_port, ssh_key) = start_sshd(&dir)?;
    Ok(Servers { s3_endpoint, ssh_port, ssh_key, ssh_user: whoami(), dir })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port").port()
}

/// Spawns a server, recording it for cleanup; its output goes to `log`.
fn spawn(cmd: Command, log: &Path) -> Result<(), String> {
    let child = spawn_child(cmd, log)?;
    CLEANUP.lock().unwrap().0.push(child);
    Ok(())
}

/// Spawns a server in its own process group (so that killing the group also ends the
/// per-connection processes it forks), its output appended to `log`.
fn spawn_child(mut cmd: Command, log: &Path) -> Result<Child, String> {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e} (run .ci/servers to install it)"))
}

/// Waits until `port` accepts connections, or fails showing the server's log.
fn wait_for(port: u16, what: &str, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let shown = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{what} did not listen on 127.0.0.1:{port} within 60 s; its log:\n{shown}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `minio` on PATH, or where `go install` puts it.
fn minio_binary() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("minio"));
    let gopath = Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("bin/minio"));
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/minio"));
    on_path
        .chain(gopath)
        .chain(home)
        .find(|p| p.is_file())
        .ok_or_else(|| "minio is not installed (not on PATH nor in $(go env GOPATH)/bin); run .ci/servers".into())
}

/// MinIO on a free port, with the test bucket made as a directory of its data drive before
/// it starts (MinIO serves each top-level directory of a fresh drive as a bucket).
fn start_minio(dir: &Path) -> Result<String, String> {
    let data = dir.join("minio");
    std::fs::create_dir_all(data.join(BUCKET)).map_err(|e| e.to_string())?;
    let port = free_port();
    let log = dir.join("minio.log");
    spawn(minio_command(&data, port)?, &log)?;
    wait_for(port, "minio", &log)?;
    Ok(format!("http://127.0.0.1:{port}"))
}

/// `minio server DATA` on `port` with the test credentials.
fn minio_command(data: &Path, port: u16) -> Result<Command, String> {
    let mut cmd = Command::new(minio_binary()?);
    cmd.arg("server")
        .arg(data)
        .args(["--address", &format!("127.0.0.1:{port}"), "--console-address", &format!("127.0.0.1:{}", free_port())])
        .env("MINIO_ROOT_USER", S3_USER)
        .env("MINIO_ROOT_PASSWORD", S3_SECRET)
        .env("MINIO_BROWSER", "off")
        .env("MINIO_UPDATE", "off");
    Ok(cmd)
}

/// A MinIO of one test's own, which the test may stop and start again on the same port and
/// data (the shared one must stay up for the others), with the test bucket; killed when
/// dropped.
pub struct OwnMinio {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// Its data drive: `BUCKET/` holds the objects, `.minio.sys/multipart/` the uploads not
    /// yet completed.
    pub data: PathBuf,
    port: u16,
    log: PathBuf,
    child: Option<Child>,
}

impl OwnMinio {
    /// Starts one with its data and log in `dir`.
    pub fn start(dir: &Path) -> OwnMinio {
        let data = dir.join("minio");
        std::fs::create_dir_all(data.join(BUCKET)).unwrap();
        let port = free_port();
        let mut m = OwnMinio {
            endpoint: format!("http://127.0.0.1:{port}"),
            data,
            port,
            log: dir.join("minio.log"),
            child: None,
        };
        m.resume();
        m
    }

    /// Kills it (SIGKILL, as a crash or a pulled cable would end it) and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling the process group spawn_child made for it.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data, and waits until it listens.
    pub fn resume(&mut self) {
        let cmd = minio_command(&self.data, self.port).unwrap_or_else(|e| panic!("{e}"));
        self.child = Some(spawn_child(cmd, &self.log).unwrap_or_else(|e| panic!("{e}")));
        wait_for(self.port, "minio", &self.log).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The uploads it holds that were neither completed nor aborted.
    pub fn incomplete_uploads(&self) -> usize {
        let Ok(objects) = std::fs::read_dir(self.data.join(".minio.sys/multipart")) else { return 0 };
        objects.flatten().map(|o| std::fs::read_dir(o.path()).map_or(0, |u| u.count())).sum()
    }
}

impl Drop for OwnMinio {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

fn whoami() -> String {
    let out = Command::new("id").arg("-un").output().expect("running id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A private sshd (`sshd -f CONFIG -D`, never the system's configuration) on a free port, with
/// a fresh host key and one authorized client key.
fn start_sshd(dir: &Path) -> Result<(u16, PathBuf), String> {
    let ssh = dir.join("ssh");
    std::fs::create_dir_all(&ssh).map_err(|e| e.to_string())?;
    let (host_key, client_key) = (ssh.join("host_key"), ssh.join("client_key"));
    for key in [&host_key, &client_key] {
        run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(key))?;
    }
    std::fs::copy(ssh.join("client_key.pub"), ssh.join("authorized_keys")).map_err(|e| e.to_string())?;
    // sshd refuses to start without its privilege separation directory.
    let _ = std::fs::create_dir_all("/run/sshd");
    let port = free_port();
    let config = ssh.join("sshd_config");
    let text = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\nPidFile {}\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
         PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\nMaxStartups 100\nMaxSessions 100\n\
         Subsystem sftp internal-sftp\nLogLevel ERROR\n",
        host_key.display(),
        ssh.join("authorized_keys").display(),
        ssh.join("sshd.pid").display(),
    );
    std::fs::write(&config, text).map_err(|e| e.to_string())?;
    let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("sshd is not installed (Debian: openssh-server); run .ci/servers")?;
    let mut cmd = Command::new(sshd);
    cmd.arg("-f").arg(&config).arg("-D").arg("-e");
    let log = dir.join("sshd.log");
    spawn(cmd, &log)?;
    wait_for(port, "sshd", &log)?;
    Ok((port, client_key))
}

/// A fresh S3 repository location (its own prefix in the test bucket).
pub fn s3_repo(name: &str) -> String {
    format!("s3:{}/{BUCKET}/{name}-{}", servers().s3_endpoint, unique())
}

/// A fresh SFTP repository location (a new directory below the servers' directory).
pub fn sftp_repo(name: &str) -> String {
    let s = servers();
    format!("sftp:{}@127.0.0.1:{}:{}/sftp/{name}-{}", s.ssh_user, s.ssh_port, s.dir.display(), unique())
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A runner for `location` with the credentials its server needs and a private cache.
pub fn cairn(location: &str, cache: &Path) -> Cairn {
    let s = servers();
    Cairn::new(Path::new(location), crate::support::PASSWORD)
        .with_env("AWS_ACCESS_KEY_ID", S3_USER)
        .with_env("AWS_SECRET_ACCESS_KEY", S3_SECRET)
        .with_env("AWS_DEFAULT_REGION", "us-east-1")
        .with_env("CAIRN_SFTP_KEY", &s.ssh_key.to_string_lossy())
        // The host key is new on every run; known_hosts cannot know it.
        .with_env("CAIRN_SFTP_KNOWN_HOSTS", "accept")
        .with_env("CAIRN_CACHE_DIR", &cache.to_string_lossy())
}

/// Runs this test binary's [`storage_helper`] in a child process that has `cairn`'s
/// environment (the servers' credentials), so that this process's own environment is never
/// changed while other tests run beside it. `op` is `delete` (of `path`), `list` (of `path`'s
/// objects), `exists` (of `path`: one row if it does) or `flip` (one bit in the middle of
/// `path`, written back in place: bit rot); returns the objects as (path, size).
pub fn remote_storage(cairn: &Cairn, op: &str, path: &str) -> Vec<(String, u64)> {
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new(exe);
    c.args(["--exact", "support::servers::storage_helper", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(HELPER_ENV, format!("{op}|{}|{path}", cairn.repo.to_str().unwrap()))
        .envs(cairn.env.iter().map(|(k, v)| (k, v)));
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "storage helper {op} {path}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<(String, u64)> = stdout
        .lines()
        // libtest prints `test support::servers::storage_helper ... ` before the test's own
        // output, on its line.
        .filter_map(|l| l.find("OBJ ").map(|at| &l[at + 4..]))
        .map(|l| {
            let (p, size) = l.rsplit_once(' ').unwrap();
            (p.to_string(), size.parse().unwrap())
        })
        .collect();
    assert!(stdout.contains("1 passed"), "the storage helper did not run: {stdout}");
    rows
}

const HELPER_ENV: &str = "CAIRN_TEST_STORAGE";

/// Not a test: lists, tests or deletes objects of a remote repository through the library, in
/// a child process that has the server's credentials in its environment (see
/// [`remote_storage`]).
#[test]
#[ignore = "a helper that the remote tests run in a child process"]
fn storage_helper() {
    use crate::support::library::storage::{Location, OpendalStorage, RemoteOptions, Storage};
    let Ok(spec) = std::env::var(HELPER_ENV) else { return };
    let mut parts = spec.splitn(3, '|');
    let (op, location, path) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let remote = RemoteOptions {
        sftp_key: std::env::var("CAIRN_SFTP_KEY").ok(),
        sftp_known_hosts: std::env::var("CAIRN_SFTP_KNOWN_HOSTS").ok(),
        ..RemoteOptions::default()
    };
    let storage = OpendalStorage::open(&Location::parse(location).unwrap(), &remote).unwrap();
    match op {
        "delete" => storage.delete(path).unwrap(),
        "list" => {
            for obj in storage.list(path).unwrap() {
                println!("OBJ {} {}", obj.path, obj.size);
            }
        }
        "exists" => {
            if storage.exists(path).unwrap() {
                println!("OBJ {path} 0");
            }
        }
        "flip" => {
            let mut bytes = storage.read(path).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x10;
            storage.write(path, bytes).unwrap();
        }
        other => panic!("unknown helper operation {other}"),
    }
}
