//! `cairn mount`: browse every snapshot as a read-only file system (FUSE) until Ctrl-C,
//! SIGTERM or `fusermount3 -u MOUNTPOINT`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cairn_format::lock::LockKind;
use clap::Args as ClapArgs;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use cairn_mount::Unmounted;

use super::{open_locked, parse_size, plural, Global, SnapshotArgs};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Existing directory to mount the repository on
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
    #[command(flatten)]
    snapshots: SnapshotArgs,
    /// Let other users use the mount (as root, or with `user_allow_other` in /etc/fuse.conf)
    #[arg(long)]
    allow_other: bool,
    /// Requests in flight while reading a file ahead [default: 4 for a local repository, 32
    /// for S3, 8 for SFTP]
    #[arg(long, value_name = "N")]
    fetch_concurrency: Option<usize>,
    /// Cap on decoded data held: half caches file content, half is read ahead, e.g. 512M
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    max_memory: String,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let max_memory = parse_size(&a.max_memory)?;
    cairn_mount::check_mountpoint(&a.mountpoint)?;
    // The lock is shared with the signal watcher, which may have to end the process itself.
    let (repo, held) = open_locked(g, LockKind::Shared)?;
    let held = std::sync::Arc::new(std::sync::Mutex::new(Some(held)));
    let opts = cairn_mount::MountOptions {
        max_memory,
        fetch_concurrency: a.fetch_concurrency,
        decode_threads: None,
        fuse_threads: None,
        allow_other: a.allow_other,
    };
    // Signals are caught from before the mount, so none can end the process with the file
    // system still mounted.
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("cannot install the signal handlers")?;
    let signals_handle = signals.handle();
    let mut mounted = cairn_mount::mount(repo, &a.snapshots.filter(), &a.mountpoint, &opts)?;
    let mut unmounter = mounted.unmounter();
    let (point, lock_of_watcher) = (a.mountpoint.clone(), held.clone());
    let watcher = std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            match unmounter.unmount() {
                Ok(Unmounted::Done) => {}
                // Files open in the mount keep the session alive; the mount point is free
                // already, and those files fail once this process is gone.
                Ok(Unmounted::Detached) => {
                    drop(lock_of_watcher.lock().expect("lock holder").take());
                    eprintln!("cairn: unmounted {} (files still open in it now fail)", point.display());
                    std::process::exit(0);
                }
                Err(e) => eprintln!("cairn: {e}"),
            }
        }
    });
    eprintln!(
        "cairn: {} mounted at {}; Ctrl-C (or `fusermount3 -u {}`) unmounts",
        plural(mounted.snapshot_count(), "snapshot"),
        a.mountpoint.display(),
        a.mountpoint.display()
    );
    let served = mounted.serve();
    signals_handle.close();
    let _ = watcher.join();
    served?;
    drop(held.lock().expect("lock holder").take());
    eprintln!("cairn: unmounted {}", a.mountpoint.display());
    Ok(ExitCode::SUCCESS)
}
