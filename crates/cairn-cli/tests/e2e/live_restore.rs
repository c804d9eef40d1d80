//! `cairn restore --live` with clients no one here wrote (`nbdcopy`, `qemu-io`, QEMU): the
//! target is served while the restore fills it in the background (held back by
//! `CAIRN_INJECT_WRITE_LATENCY` or `--limit-download`); the export reads as the snapshot with the writes applied, the writes
//! are never overwritten by the restore, a restore killed with SIGKILL is resumed by the same
//! command without losing them, and a VM boots from the export, writes, and its write is in the
//! target next to the snapshot's files; under `--limit-download` a client's read does not wait
//! behind the background restore's traffic; what a client's reads brought into the target is
//! not fetched again by the background restore.

use crate::nbd::{boot_guest, disk_fixture, ext4_cat, tool, Export, Vm, MIB, SIZE};
use crate::support;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::{Fixture, Rng};

/// `cairn restore --live SPEC --target TARGET --socket SOCKET extra…`, serving; each write of
/// the background restore waits `write_wait` first (`CAIRN_INJECT_WRITE_LATENCY`: the restore
/// is slow, the client's reads are not).
pub(crate) fn live(fx: &Fixture, spec: &str, target: &Path, socket: &Path, write_wait: &str, extra: &[&str]) -> Export {
    let mut cmd = fx.cairn.command();
    cmd.env("CAIRN_INJECT_WRITE_LATENCY", write_wait);
    cmd.args(["restore", "--live", spec, "--no-local-data", "--target"]).arg(target).arg("--socket").arg(socket);
    cmd.args(extra);
    Export::run(cmd, socket)
}

/// The disk image of [`disk_fixture`] `fx`, its spec (`latest:IMAGE`) and a live restore's target.
pub(crate) fn image_spec_target(fx: &Fixture) -> (PathBuf, String, PathBuf) {
    let image = fx.src.join("disk.img");
    let spec = format!("latest:{}", image.display());
    (image, spec, fx.path("restored.img"))
}

/// The state file of a live restore into `target`.
fn state_of(target: &Path) -> PathBuf {
    PathBuf::from(format!("{}.cairn-live", target.display()))
}

/// Waits until the background restore into `target` is complete (its state file is gone).
pub(crate) fn wait_complete(target: &Path) -> Duration {
    let started = Instant::now();
    while state_of(target).exists() {
        assert!(started.elapsed() < Duration::from_secs(120), "the live restore did not complete within 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// `qemu-io -c "write -P BYTE OFFSET LENGTH" -c flush` against the export.
fn write_pattern(uri: &str, byte: u8, offset: u64, length: u64) {
    tool("qemu-io", &["-f", "raw", "-c", &format!("write -P {byte} {offset} {length}"), "-c", "flush", uri]);
}

/// The writes of the tests: unaligned inside data (the blocks around it are filled from the
/// snapshot first), a whole 64 KiB chunk, and unaligned inside a hole.
const WRITES: [(u8, u64, u64); 3] = [(0xab, 1000, 5000), (0xcd, 7 * MIB, 65536), (0xef, 3 * MIB + 123, 10_000)];

/// The source image with [`WRITES`] applied.
fn expected(image: &Path) -> Vec<u8> {
    let mut want = fs::read(image).unwrap();
    for (byte, offset, length) in WRITES {
        want[offset as usize..(offset + length) as usize].fill(byte);
    }
    want
}

#[test]
fn the_target_is_served_while_it_restores_and_the_restore_never_overwrites_a_write() {
    let fx = disk_fixture();
    let (image, spec, target) = image_spec_target(&fx);
    // 6 MiB of data in 64 KiB chunks written one at a time, each after 150 ms: about 15 s, so
    // the writes and the copy below (process starts, each write flushed) come well within it
    // on a loaded machine.
    let export = live(&fx, &spec, &target, &fx.path("live.sock"), "150ms", &["--write-threads", "1"]);
    let uri = export.uri();
    assert!(state_of(&target).exists(), "the state file is made before serving");
    let started = Instant::now();
    for (byte, offset, length) in WRITES {
        write_pattern(&uri, byte, offset, length);
    }
    // nbdcopy of the export: the snapshot with the writes, while the restore still runs.
    let copied = fx.path("copied.img");
    tool("nbdcopy", &[&uri, copied.to_str().unwrap()]);
    let still_running = state_of(&target).exists();
    let want = expected(&image);
    assert!(fs::read(&copied).unwrap() == want, "nbdcopy of the live export differs from the snapshot + writes");
    assert!(still_running, "the restore ended before the reads ({:?}): nothing was read live", started.elapsed());
    // The dump of the snapshot is the source: the export differs only by the writes.
    let dumped = fx.cairn.command().arg("dump").arg(&spec).output().unwrap();
    assert!(dumped.status.success() && dumped.stdout == fs::read(&image).unwrap());
    let took = wait_complete(&target);
    eprintln!("the background restore completed {took:?} after the copy");
    // The target holds the snapshot with every write; the export still serves it.
    assert!(fs::read(&target).unwrap() == want, "the target differs from the snapshot + writes");
    let again = fx.path("again.img");
    tool("nbdcopy", &[&uri, again.to_str().unwrap()]);
    assert!(fs::read(&again).unwrap() == want, "the export after completion differs");
    let out = export.stop();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("restore complete"), "{err}");
    assert_eq!(fs::metadata(&target).unwrap().len(), SIZE);
}

#[test]
fn killed_midway_a_second_live_restore_resumes_and_the_writes_survive() {
    let fx = disk_fixture();
    let (image, spec, target) = image_spec_target(&fx);
    // 100 ms before each of its ~100 chunk writes: 10 s, killed after 2.5 s.
    let slow = live(&fx, &spec, &target, &fx.path("a.sock"), "100ms", &["--write-threads", "1"]);
    for (byte, offset, length) in WRITES {
        write_pattern(&slow.uri(), byte, offset, length);
    }
    // A second's restore (and a checkpoint of its state) in, killed.
    std::thread::sleep(Duration::from_millis(2500));
    slow.kill();
    let state = fs::read(state_of(&target)).unwrap();
    let present: u32 = state[4096..].iter().map(|b| b.count_ones()).sum();
    let blocks = SIZE.div_ceil(4096) as u32;
    assert!(present > 0 && present < blocks, "{present} of {blocks} blocks present when killed");
    // The same command resumes (without the limit) and completes: the writes are there.
    let resumed = live(&fx, &spec, &target, &fx.path("b.sock"), "", &[]);
    wait_complete(&target);
    let out = resumed.stop();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(fs::read(&target).unwrap() == expected(&image), "the resumed target differs from the snapshot + writes");
    // It fetched less than the whole image's data: what the first run restored stayed.
    let fetched: u64 = err
        .split_once("applied (")
        .and_then(|(_, rest)| rest.split_once(" bytes fetched"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no fetched bytes in: {err}"));
    assert!(fetched < 6 * MIB, "the resumed restore fetched {fetched} bytes: {err}");
}

#[test]
fn a_vm_boots_from_a_live_restore_and_its_write_is_in_the_target() {
    let fx = Fixture::new();
    let Vm { image, spec, kernel, initrd } = Vm::backed_up(&fx);
    let target = fx.path("vm.img");
    // 17 MiB of data at 2 MiB/s: the guest boots while the restore runs.
    let export = live(&fx, &spec, &target, &fx.path("vm.sock"), "", &["--limit-download", "2M"]);
    let started = Instant::now();
    boot_guest(&kernel, &initrd, &export.uri());
    eprintln!("the guest booted, wrote and powered off in {:?}", started.elapsed());
    wait_complete(&target);
    export.stop();
    assert_eq!(ext4_cat(&target, "/guest.txt"), b"written by the guest\n");
    assert_eq!(ext4_cat(&target, "/marker"), b"hello from the snapshot");
    assert!(ext4_cat(&target, "/filler") == Rng(5).bytes(16 * MIB as usize), "the filler survived");
    // Few blocks differ from the snapshot: the guest's file and its file system's metadata.
    let (source, after) = (fs::read(&image).unwrap(), fs::read(&target).unwrap());
    let changed = source.chunks(4096).zip(after.chunks(4096)).filter(|(s, a)| s != a).count();
    assert!(changed > 0 && changed < 1024, "{changed} blocks differ from the snapshot");
}

#[test]
fn under_a_download_limit_a_clients_read_goes_ahead_of_the_background_restore() {
    let fx = disk_fixture();
    let (image, spec, target) = image_spec_target(&fx);
    // About 6 MiB to fetch at 1 MiB/s, 16 ranged reads in flight: without a lane of its own the
    // client's read would queue behind most of the restore's traffic, paid for ahead of it.
    let export =
        live(&fx, &spec, &target, &fx.path("lane.sock"), "", &["--limit-download", "1M", "--fetch-concurrency", "16"]);
    let started = Instant::now();
    // The restore's reads are in flight; then the last 64 KiB chunk of the image, what the
    // restore fetches last.
    std::thread::sleep(Duration::from_millis(300));
    let read = Instant::now();
    let out = tool("qemu-io", &["-f", "raw", "-c", &format!("read -v {} 16", SIZE - 4096), &export.uri()]);
    let read_took = read.elapsed();
    let still_running = state_of(&target).exists();
    let total = started.elapsed() + wait_complete(&target);
    export.stop();
    let want = &fs::read(&image).unwrap()[(SIZE - 4096) as usize..(SIZE - 4096 + 16) as usize];
    let hex: String = want.iter().map(|b| format!("{b:02x} ")).collect();
    assert!(out.contains(hex.trim_end()), "qemu-io read {out:?}, the snapshot holds {hex}");
    eprintln!("the client's read took {read_took:?}; the background restore {total:?}");
    assert!(still_running, "the restore ended before the client's read returned ({read_took:?} of {total:?})");
    assert!(
        read_took * 4 < total,
        "the client's read took {read_took:?} of the background restore's {total:?}: it waited behind it"
    );
}

#[test]
fn what_a_client_brought_in_is_not_fetched_again_by_the_background_restore() {
    let fx = disk_fixture();
    let (image, spec, target) = image_spec_target(&fx);
    // One write at a time, each after 150 ms, one read in flight and a small budget: the
    // restore fetches only a read or two ahead of its writer, and would take about 15 s (the
    // client's copy, a process start and 6 MiB decrypted, must come well within it).
    let slow = ["--write-threads", "1", "--fetch-concurrency", "1", "--max-memory", "4M", "--json"];
    let export = live(&fx, &spec, &target, &fx.path("live.sock"), "150ms", &slow);
    // The client reads everything at once: every chunk is in the target long before the
    // background restore would have reached it.
    let copied = fx.path("copied.img");
    tool("nbdcopy", &[&export.uri(), copied.to_str().unwrap()]);
    assert!(state_of(&target).exists(), "the restore ended before the client's copy");
    let took = wait_complete(&target);
    let out = support::stdout(&export.stop());
    let summary: serde_json::Value = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["message_type"] == "summary")
        .unwrap_or_else(|| panic!("no summary: {out}"));
    let fetched = summary["bytes_fetched"].as_u64().unwrap();
    eprintln!("the background restore fetched {fetched} bytes and completed {took:?} after the copy");
    // Without the check it fetches all 6 MiB; with it, what it had in flight before the copy.
    assert!(fetched < 4 * MIB, "the background restore fetched {fetched} bytes of 6 MiB the client had brought in");
    let source = fs::read(&image).unwrap();
    assert!(fs::read(&copied).unwrap() == source && fs::read(&target).unwrap() == source);
}
