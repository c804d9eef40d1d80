//! `cairn nbd` with clients no one here wrote (Debian's `libnbd-bin`, `qemu-utils`, `fio`): a
//! sparse disk image backed up with fixed chunks, exported on a Unix socket; `nbdinfo` sees its
//! size and holes, `nbdcopy` copies it byte for byte as `cairn dump` writes it, `qemu-img map`
//! sees the same holes and `qemu-img compare` finds it equal to the source; fio reads it at
//! random (4 KiB, queue depth 16) and in order. Malformed requests get errors or a closed
//! connection and the server goes on; a damaged blob is EIO for the reads that need it only.
//! `--writable --overlay` keeps writes in the overlay (across restarts), and `--commit-to`
//! makes the plain image.

use crate::support;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{output_within_timeout, wait_within_timeout, Cairn, Fixture, Rng};

pub(crate) const MIB: u64 = 1 << 20;
/// The image: 8 MiB and one 4 KiB block more (a short last chunk).
pub(crate) const SIZE: u64 = 8 * MIB + 4096;
/// Where the image reads as zeros: a hole never written, and zeros written out.
const HOLES: [(u64, u64); 2] = [(2 * MIB, 4 * MIB), (5 * MIB, 6 * MIB)];

/// Random data, a 2 MiB hole, data, 1 MiB of written zeros, data to the end.
pub(crate) fn make_image(path: &Path) {
    let f = fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    let mut rng = Rng(37);
    f.write_all_at(&rng.bytes(2 * MIB as usize), 0).unwrap();
    f.write_all_at(&rng.bytes(MIB as usize), 4 * MIB).unwrap();
    f.write_all_at(&vec![0u8; MIB as usize], 5 * MIB).unwrap();
    f.write_all_at(&rng.bytes((SIZE - 6 * MIB) as usize), 6 * MIB).unwrap();
}

/// A repository holding `src/disk.img` in 64 KiB fixed chunks.
pub(crate) fn disk_fixture() -> Fixture {
    Fixture::backed_up(|src| make_image(&src.join("disk.img")), &[], &["--chunker", "fixed:64K"])
}

/// A running `cairn nbd` on a Unix socket: stopped with SIGTERM when dropped.
pub(crate) struct Export {
    child: Option<Child>,
    socket: PathBuf,
}

impl Export {
    /// Starts `cairn nbd SPEC --socket S extra…` and waits until it accepts connections.
    fn start(cairn: &Cairn, spec: &str, socket: &Path, extra: &[&str]) -> Export {
        let mut cmd = cairn.command();
        cmd.arg("nbd").arg(spec).arg("--socket").arg(socket).args(extra);
        Export::run(cmd, socket)
    }

    /// Starts `cmd` (a cairn command serving on `socket`) and waits until it accepts connections.
    pub(crate) fn run(mut cmd: Command, socket: &Path) -> Export {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("cannot start cairn nbd");
        let start = Instant::now();
        while UnixStream::connect(socket).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let out = child.wait_with_output().unwrap();
                panic!("cairn nbd exited ({status}) without serving: {}", String::from_utf8_lossy(&out.stderr));
            }
            assert!(start.elapsed() < Duration::from_secs(60), "cairn nbd did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Export { child: Some(child), socket: socket.to_path_buf() }
    }

    pub(crate) fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// Stops it with SIGTERM; returns its output (it must exit 0).
    pub(crate) fn stop(mut self) -> Output {
        let child = self.child.take().unwrap();
        // SAFETY: signalling our own child by its PID.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let out = wait_within_timeout(child, "cairn nbd");
        assert!(out.status.success(), "cairn: {}", String::from_utf8_lossy(&out.stderr));
        out
    }

    /// Kills it with SIGKILL.
    pub(crate) fn kill(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Whether the server is still running.
    fn alive(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child by its PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}

/// Runs a client tool; its output if it succeeded, else the test fails naming it.
pub(crate) fn tool(program: &str, args: &[&str]) -> String {
    let out = output_within_timeout(Command::new(program).args(args));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}); is Debian's libnbd-bin / qemu-utils / fio installed (.ci/run)?\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Merges touching ranges.
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if last.1 == s => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    out
}

#[test]
fn nbdinfo_nbdcopy_and_qemu_img_see_the_snapshot_file_with_its_holes() {
    let fx = disk_fixture();
    let image = fx.src.join("disk.img");
    let spec = format!("latest:{}", image.display());
    let export = Export::start(&fx.cairn, &spec, &fx.path("nbd.sock"), &[]);
    let uri = export.uri();

    let info: serde_json::Value = serde_json::from_str(&tool("nbdinfo", &["--json", &uri])).unwrap();
    let first = &info["exports"][0];
    assert_eq!(first["export-size"].as_u64(), Some(SIZE), "{info}");
    assert_eq!(first["is_read_only"].as_bool(), Some(true), "{info}");

    // `nbdinfo --map`: "offset length type description" lines; type 3 is hole,zero.
    let map = tool("nbdinfo", &["--map", &uri]);
    let holes: Vec<(u64, u64)> = map
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (o, n): (u64, u64) = (f[0].parse().unwrap(), f[1].parse().unwrap());
            (f[2] == "3").then_some((o, o + n))
        })
        .collect();
    assert_eq!(merged(holes), HOLES, "{map}");

    // `nbdcopy` equals `cairn dump` equals the source.
    let copied = fx.path("copied.img");
    tool("nbdcopy", &[&uri, copied.to_str().unwrap()]);
    let dumped = fx.cairn.command().arg("dump").arg(&spec).output().unwrap();
    assert!(dumped.status.success());
    let source = fs::read(&image).unwrap();
    assert!(fs::read(&copied).unwrap() == source, "nbdcopy's copy differs from the source");
    assert!(dumped.stdout == source, "cairn dump differs from the source");

    // `qemu-img map` sees the same holes; `qemu-img compare` finds the export equal.
    let qmap: serde_json::Value =
        serde_json::from_str(&tool("qemu-img", &["map", "--output=json", "-f", "raw", &uri])).unwrap();
    let not_data = qmap
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == false)
        .map(|e| (e["start"].as_u64().unwrap(), e["start"].as_u64().unwrap() + e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(merged(not_data), HOLES, "{qmap}");
    tool("qemu-img", &["compare", "-f", "raw", "-F", "raw", &uri, image.to_str().unwrap()]);
    export.stop();
}

#[test]
fn fio_reads_at_random_with_16_in_flight_and_in_order() {
    let fx = disk_fixture();
    let spec = format!("latest:{}", fx.src.join("disk.img").display());
    let export = Export::start(&fx.cairn, &spec, &fx.path("nbd.sock"), &[]);
    let uri = export.uri();
    for (name, rw, bs, depth) in [("random", "randread", "4k", "16"), ("sequential", "read", "1m", "4")] {
        let out = tool(
            "fio",
            &[
                &format!("--name={name}"),
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                &format!("--rw={rw}"),
                &format!("--bs={bs}"),
                &format!("--iodepth={depth}"),
                "--size=8m",
                "--output-format=json",
            ],
        );
        let json: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
        let job = &json["jobs"][0];
        assert_eq!(job["error"].as_u64(), Some(0), "{job}");
        assert_eq!(job["read"]["io_bytes"].as_u64(), Some(8 * MIB), "{name}: {job}");
    }
    export.stop();
}

/// A raw client of the protocol, enough to send what no well-behaved client sends.
struct Raw(UnixStream);

impl Raw {
    /// Connects and negotiates `NBD_OPT_GO` for the default export (simple replies).
    fn go(socket: &Path) -> Raw {
        let mut s = UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        s.write_all(&3u32.to_be_bytes()).unwrap();
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&7u32.to_be_bytes());
        opt.extend_from_slice(&6u32.to_be_bytes());
        opt.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        s.write_all(&opt).unwrap();
        // Option replies until the ACK.
        loop {
            let mut head = [0u8; 20];
            s.read_exact(&mut head).unwrap();
            let kind = u32::from_be_bytes(head[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
            let mut data = vec![0u8; len];
            s.read_exact(&mut data).unwrap();
            if kind == 1 {
                return Raw(s);
            }
            assert_eq!(kind, 3, "an info reply");
        }
    }

    fn send(&mut self, command: u16, cookie: u64, offset: u64, length: u32) {
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&command.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&length.to_be_bytes());
        self.0.write_all(&b).unwrap();
    }

    /// A simple reply's error, and `len` bytes of data when there is no error.
    fn reply(&mut self, cookie: u64, len: usize) -> (u32, Vec<u8>) {
        let mut head = [0u8; 16];
        self.0.read_exact(&mut head).unwrap();
        assert_eq!(u64::from_be_bytes(head[8..16].try_into().unwrap()), cookie);
        let error = u32::from_be_bytes(head[4..8].try_into().unwrap());
        let mut data = vec![0u8; if error == 0 { len } else { 0 }];
        self.0.read_exact(&mut data).unwrap();
        (error, data)
    }

    /// Reads `len` bytes at `offset`.
    fn read(&mut self, cookie: u64, offset: u64, len: u32) -> (u32, Vec<u8>) {
        self.send(0, cookie, offset, len);
        self.reply(cookie, len as usize)
    }

    /// Whether the server closed the connection.
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.0.read(&mut b), Ok(0) | Err(_))
    }
}

#[test]
fn malformed_requests_get_errors_or_a_closed_connection_and_a_damaged_blob_is_eio_for_its_reads() {
    let fx = disk_fixture();
    let image = fx.src.join("disk.img");
    let source = fs::read(&image).unwrap();
    let spec = format!("latest:{}", image.display());
    let socket = fx.path("nbd.sock");
    // Damage the blob of the chunk at 6 MiB (its ciphertext, in its pack) before serving (read-ahead
    // would have it cached otherwise).
    {
        let (repo, _) = fx.cairn.open();
        repo.load_index().unwrap();
        let (_, snap) = repo.find_snapshot("latest").unwrap();
        let node = cairn_core::engine::trees::resolve(&repo, &snap.tree, &image, "latest").unwrap().unwrap();
        let mut at = 0;
        let id = node
            .content
            .iter()
            .find_map(|ch| {
                let here = at;
                at += ch.len();
                match ch {
                    cairn_format::tree::Chunk::Data { id, .. } if here == 6 * MIB => Some(*id),
                    _ => None,
                }
            })
            .expect("a data chunk at 6 MiB");
        let loc = repo.index().get(&id).unwrap();
        let pack = fx.repo().join(cairn_format::layout::pack_path(&loc.pack));
        let f = fs::OpenOptions::new().read(true).write(true).open(&pack).unwrap();
        let mut b = [0u8; 1];
        let pos = u64::from(loc.entry.offset) + 100;
        f.read_exact_at(&mut b, pos).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], pos).unwrap();
    }
    let mut export = Export::start(&fx.cairn, &spec, &socket, &[]);

    // A handshake that stops half-way, and one that is not NBD at all.
    let mut half = UnixStream::connect(&socket).unwrap();
    let mut hello = [0u8; 18];
    half.read_exact(&mut hello).unwrap();
    half.write_all(&[0, 0]).unwrap();
    drop(half);
    let mut junk = UnixStream::connect(&socket).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    drop(junk);

    let mut c = Raw::go(&socket);
    let (err, data) = c.read(1, 4096, 100);
    assert_eq!((err, &data[..]), (0, &source[4096..4196]));
    assert_eq!(c.read(2, SIZE - 10, 20).0, 22, "beyond the end: EINVAL");
    assert_eq!(c.read(3, u64::MAX - 5, 20).0, 22, "an offset whose end overflows: EINVAL");
    assert_eq!(c.read(4, 0, u32::MAX).0, 22, "4 GiB at once: EINVAL");
    c.send(42, 5, 0, 0);
    assert_eq!(c.reply(5, 0).0, 22, "an unknown command: EINVAL");
    c.send(7, 6, 0, 4096);
    assert_eq!(c.reply(6, 0).0, 22, "block status without negotiating it: EINVAL");
    c.send(1, 7, 0, 1);
    c.0.write_all(&[1]).unwrap();
    assert_eq!(c.reply(7, 0).0, 1, "a write to a read-only export: EPERM");
    // A write of 4 GiB: its data cannot be skipped, the connection closes.
    c.send(1, 8, 0, u32::MAX);
    assert!(c.closed(), "the connection of a 4 GiB write is closed");
    assert!(export.alive(), "the server goes on");

    let mut c = Raw::go(&socket);
    assert_eq!(c.read(1, 6 * MIB + 10, 4096).0, 5, "a read of the damaged blob: EIO");
    assert_eq!(c.read(2, 6 * MIB - 10, 20).0, 5, "a read across it: EIO");
    let (err, data) = c.read(3, 6 * MIB + 64 * 1024, 4096);
    assert_eq!((err, &data[..]), (0, &source[(6 * MIB + 65_536) as usize..(6 * MIB + 69_632) as usize]));
    let (err, data) = c.read(4, 0, 8192);
    assert_eq!((err, &data[..]), (0, &source[..8192]), "the rest is served");
    let out = export.stop();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("cairn nbd: reading 4096 bytes at 6291466"), "the log names the read: {log}");
}

#[test]
fn writes_go_to_the_overlay_survive_a_restart_and_commit_to_a_plain_image() {
    let fx = disk_fixture();
    let image = fx.src.join("disk.img");
    let mut want = fs::read(&image).unwrap();
    let spec = format!("latest:{}", image.display());
    let (socket, overlay) = (fx.path("nbd.sock"), fx.path("disk.overlay"));
    let ovl = overlay.to_str().unwrap();
    let export = Export::start(&fx.cairn, &spec, &socket, &["--writable", "--overlay", ovl]);
    // One write inside the data, one unaligned across the end of the hole at 4 MiB.
    tool("qemu-io", &["-f", "raw", "-c", "write -P 0xab 1m 64k", "-c", "write -P 0xcd 4194000 1000", &export.uri()]);
    want[MIB as usize..(MIB + 65_536) as usize].fill(0xab);
    want[4_194_000..4_195_000].fill(0xcd);
    let copied = fx.path("copied.img");
    tool("nbdcopy", &[&export.uri(), copied.to_str().unwrap()]);
    assert!(fs::read(&copied).unwrap() == want, "the export reads the writes");
    export.stop();
    // The overlay holds the written blocks, not the disk.
    let used = fs::metadata(&overlay).unwrap().blocks() * 512;
    assert!(used < 512 * 1024, "the overlay takes {used} bytes on disk");
    assert!(fs::read(&image).unwrap() != want, "the source is untouched (a sanity check of the test)");

    // A restart over the same overlay reads the writes.
    let export = Export::start(&fx.cairn, &spec, &socket, &["--writable", "--overlay", ovl]);
    let again = fx.path("again.img");
    tool("nbdcopy", &[&export.uri(), again.to_str().unwrap()]);
    assert!(fs::read(&again).unwrap() == want, "the writes survived the restart");
    export.stop();

    // Commit: a plain image with the writes, the untouched hole still a hole.
    let committed = fx.path("committed.img");
    let out =
        fx.cairn.command().args(["nbd", &spec, "--overlay", ovl, "--commit-to"]).arg(&committed).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(fs::read(&committed).unwrap() == want, "the committed image");
    let on_disk = fs::metadata(&committed).unwrap().blocks() * 512;
    assert!(on_disk <= SIZE - 2 * MIB, "{on_disk} bytes on disk: the holes stayed holes");

    // An overlay made for another file is refused with one line.
    fs::write(fx.src.join("other.img"), vec![1u8; 4096]).unwrap();
    fx.cairn.backup(&[&fx.src], &["--chunker", "fixed:64K"]);
    let other = format!("latest:{}", fx.src.join("other.img").display());
    let out =
        fx.cairn.command().args(["nbd", &other, "--overlay", ovl, "--commit-to"]).arg(fx.path("x")).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("made for an export of another size"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// The modules a Debian kernel needs to mount an ext4 file system on a virtio disk, in the
/// order they load.
const MODULES: [&str; 11] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "virtio_blk",
    "crc16",
    "mbcache",
    "jbd2",
    "crc32c_generic",
    "ext4",
];

/// What the guest runs: mount the disk (the NBD export), print its marker, write a file, power
/// off.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in MODULES; do insmod /lib/$m.ko; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
mount -t ext4 /dev/vda /mnt && echo "CAIRN-BOOT: $(cat /mnt/marker)"
echo "written by the guest" > /mnt/guest.txt
umount /mnt
sync
echo CAIRN-DONE
poweroff -f
"#;

/// Finds `name` below `dir`.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if e.file_name() == name {
            return Some(p);
        }
    }
    None
}

/// Boots the TCG guest of [`boot_kit`] from the NBD export at `uri` and waits until it powers off:
/// it must print the snapshot's boot marker and finish its write.
pub(crate) fn boot_guest(kernel: &Path, initrd: &Path, uri: &str) {
    let qemu = output_within_timeout(
        Command::new("qemu-system-x86_64")
            .args(["-machine", "q35", "-accel", "tcg", "-cpu", "max", "-m", "256", "-nographic", "-no-reboot"])
            .args(["-nic", "none", "-kernel", kernel.to_str().unwrap(), "-initrd", initrd.to_str().unwrap()])
            .args(["-append", "console=ttyS0 panic=-1 quiet mitigations=off"])
            .arg("-drive")
            .arg(format!("file={uri},format=raw,if=virtio,cache=none")),
    );
    let console = String::from_utf8_lossy(&qemu.stdout);
    assert!(console.contains("CAIRN-BOOT: hello from the snapshot"), "no boot marker: {console}");
    assert!(console.contains("CAIRN-DONE"), "the guest did not finish: {console}");
}

/// Debian's kernel (`/boot/vmlinuz-*`, package linux-image-amd64; see [`guest_kernel`]) and an
/// initramfs of busybox-static, the modules and [`INIT`], made in `dir`.
pub(crate) fn boot_kit(dir: &Path) -> (PathBuf, PathBuf) {
    let kernel = fs::read_dir("/boot")
        .expect("/boot")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("vmlinuz-"))
        .expect("no kernel in /boot: install linux-image-amd64 (.ci/run)");
    let version = kernel.file_name().unwrap().to_str().unwrap().trim_start_matches("vmlinuz-").to_string();
    let kernel = guest_kernel(&kernel, &version, dir);
    let modules = PathBuf::from(format!("/lib/modules/{version}/kernel"));
    let root = dir.join("initramfs");
    for d in ["bin", "lib", "proc", "sys", "dev", "mnt"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox: install busybox-static (.ci/run)");
    for m in MODULES {
        let ko = find_file(&modules, &format!("{m}.ko")).unwrap_or_else(|| panic!("module {m} of kernel {version}"));
        fs::copy(ko, root.join(format!("lib/{m}.ko"))).unwrap();
    }
    let init = root.join("init");
    fs::write(&init, INIT.replace("MODULES", &MODULES.join(" "))).unwrap();
    fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let initrd = dir.join("initrd.cpio");
    let list = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && find . | /bin/busybox cpio -o -H newc > {}", root.display(), initrd.display()))
        .status()
        .unwrap();
    assert!(list.success(), "cannot make the initramfs");
    (kernel, initrd)
}

/// The kernel the guest boots: the compressed kernel `bz` unpacked into an ELF `vmlinux` in
/// `dir`, which QEMU starts at its PVH entry point. Under TCG, decompressing the kernel in the
/// guest took about 6 of the 10 s to the boot marker (docs/BENCHMARKS.md, "NBD exports"). A
/// kernel built without PVH, or not compressed with xz, is booted as it is.
fn guest_kernel(bz: &Path, version: &str, dir: &Path) -> PathBuf {
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\0";
    let pvh =
        fs::read_to_string(format!("/boot/config-{version}")).is_ok_and(|c| c.lines().any(|l| l == "CONFIG_PVH=y"));
    let image = fs::read(bz).unwrap();
    let Some(at) = image.windows(XZ_MAGIC.len()).position(|w| w == XZ_MAGIC).filter(|_| pvh) else {
        return bz.to_path_buf();
    };
    let vmlinux = dir.join("vmlinux");
    let mut xz = Command::new("xz")
        .args(["-dc", "--single-stream"])
        .stdin(Stdio::piped())
        .stdout(fs::File::create(&vmlinux).unwrap())
        .spawn()
        .expect("xz: install xz-utils (.ci/run)");
    // xz stops reading after the kernel's stream: the bytes after it may meet a closed pipe.
    let _ = xz.stdin.take().unwrap().write_all(&image[at..]);
    assert!(xz.wait().unwrap().success(), "xz could not unpack {}", bz.display());
    assert!(fs::read(&vmlinux).unwrap().starts_with(b"\x7fELF"), "{} did not unpack into an ELF kernel", bz.display());
    vmlinux
}

/// A guest to boot: its disk (an ext4 file system holding a marker and 16 MiB of random data,
/// `vm.img` in `fx`'s source) backed up into `fx`'s new repository with fixed 64 KiB chunks.
pub(crate) struct Vm {
    /// The disk image as backed up.
    pub image: PathBuf,
    /// `latest:IMAGE`.
    pub spec: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl Vm {
    pub(crate) fn backed_up(fx: &Fixture) -> Vm {
        let scratch = fx.path("scratch");
        let root = scratch.join("rootfs");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&fx.src).unwrap();
        fs::write(root.join("marker"), "hello from the snapshot").unwrap();
        fs::write(root.join("filler"), Rng(5).bytes(16 * MIB as usize)).unwrap();
        let image = fx.src.join("vm.img");
        tool("mkfs.ext4", &["-q", "-F", "-d", root.to_str().unwrap(), image.to_str().unwrap(), "64M"]);
        fx.cairn.init(&[]);
        fx.cairn.backup(&[&fx.src], &["--chunker", "fixed:64K"]);
        let (kernel, initrd) = boot_kit(&scratch);
        Vm { spec: format!("latest:{}", image.display()), image, kernel, initrd }
    }
}

/// `debugfs -R "cat PATH" IMAGE`: a file of an ext4 image, without mounting it.
pub(crate) fn ext4_cat(image: &Path, path: &str) -> Vec<u8> {
    let out = output_within_timeout(Command::new("debugfs").args(["-R", &format!("cat {path}")]).arg(image));
    assert!(out.status.success());
    out.stdout
}

#[test]
fn a_vm_boots_from_the_export_and_its_write_lands_in_the_overlay() {
    let fx = Fixture::new();
    let Vm { image, spec, kernel, initrd } = Vm::backed_up(&fx);
    let overlay = fx.path("vm.overlay");
    let ovl = overlay.to_str().unwrap();
    let export = Export::start(&fx.cairn, &spec, &fx.path("nbd.sock"), &["--writable", "--overlay", ovl]);
    // TCG: it boots everywhere (a nested /dev/kvm may exist and hang in the option ROM).
    let started = Instant::now();
    boot_guest(&kernel, &initrd, &export.uri());
    eprintln!("the guest booted, wrote and powered off in {:?}", started.elapsed());
    export.stop();

    // The plain image: the guest's file, the snapshot's files as they were.
    let committed = fx.path("committed.img");
    let out =
        fx.cairn.command().args(["nbd", &spec, "--overlay", ovl, "--commit-to"]).arg(&committed).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ext4_cat(&committed, "/guest.txt"), b"written by the guest\n");
    assert_eq!(ext4_cat(&committed, "/marker"), b"hello from the snapshot");
    assert!(ext4_cat(&committed, "/filler") == Rng(5).bytes(16 * MIB as usize), "the filler survived");
    // Every block the overlay does not hold is the snapshot's (FORMAT.md §16.2: the bitmap at 4096).
    let (source, after) = (fs::read(&image).unwrap(), fs::read(&committed).unwrap());
    let map = fs::read(&overlay).unwrap()[4096..4096 + source.len() / 4096 / 8].to_vec();
    let mut written = 0;
    for (b, (s, a)) in source.chunks(4096).zip(after.chunks(4096)).enumerate() {
        if map[b / 8] & (1 << (b % 8)) != 0 {
            written += 1;
        } else {
            assert!(s == a, "block {b} changed without being written to the overlay");
        }
    }
    assert!(written > 0 && written < 1024, "{written} blocks written by the guest");
}

#[test]
fn bad_arguments_get_one_line_naming_what_is_wrong() {
    let fx = disk_fixture();
    fs::create_dir_all(fx.src.join("dir")).unwrap();
    fx.cairn.backup(&[&fx.src], &["--chunker", "fixed:64K"]);
    let image = fx.snap_path("disk.img");
    let dir = fx.snap_path("dir");
    let busy = fx.path("busy.sock");
    let _export = Export::start(&fx.cairn, &format!("latest:{image}"), &busy, &[]);
    let cases: [(Vec<String>, &str); 6] = [
        (vec!["latest".into()], "give the file to export as SNAPSHOT:PATH"),
        (vec!["latest:/no/such/file".into()], "not found in snapshot"),
        (vec![format!("latest:{dir}")], "is not a regular file of snapshot"),
        (vec!["nosuch:/x".into()], "no snapshot matches"),
        (vec![format!("latest:{image}"), "--overlay".into(), "o".into()], "add --writable"),
        (vec![format!("latest:{image}"), "--socket".into(), busy.to_str().unwrap().into()], "a server already listens"),
    ];
    for (args, want) in cases {
        let out = fx.cairn.command().arg("nbd").args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
