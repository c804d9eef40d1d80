"""Checks that a restore is right: content (diff -r), metadata (rsync -ain) and holes (du).
Each returns None when the restore is right, or a one-line reason when it is not."""
import os, subprocess


def _first_lines(text, n=3):
    lines = [l for l in text.splitlines() if l.strip()]
    more = f" (+{len(lines) - n} more)" if len(lines) > n else ""
    return "; ".join(lines[:n]) + more


def content(src, dst):
    if not os.path.exists(dst):
        return f"nothing restored at {dst}"
    p = subprocess.run(["diff", "-r", "--no-dereference", "-q", src, dst], capture_output=True, text=True)
    if p.returncode != 0:
        return "content differs: " + _first_lines(p.stdout + p.stderr)
    return None


def metadata(src, dst):
    """Modes, mtimes, owners, symlinks and the set of names, as rsync's itemized dry run sees them."""
    p = subprocess.run(["rsync", "-ain", "--delete", src.rstrip("/") + "/", dst.rstrip("/") + "/"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return f"rsync failed: {p.stderr.strip()[-300:]}"
    if p.stdout.strip():
        return "metadata differs: " + _first_lines(p.stdout)
    return None


def summary(s):
    """A `cairn restore --json` summary that reports no failure and every byte restored
    (written, a hole, or already in place)."""
    restored = s.get("bytes_written", 0) + s.get("bytes_zero", 0) + s.get("bytes_in_place", 0)
    if s.get("failed") == 0 and restored == s.get("bytes_total"):
        return None
    return f"summary says failed={s.get('failed')}, bytes {s}"


def tree(src, dst):
    return content(src, dst) or metadata(src, dst)


def du_kib(path):
    return int(subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=True).stdout.split()[0])


def image(src, dst):
    """Same bytes and no more allocated blocks than the source (1% + 64 KiB slack): holes kept."""
    if not os.path.exists(dst):
        return f"nothing restored at {dst}"
    if subprocess.run(["cmp", "-s", src, dst]).returncode != 0:
        return "content differs (cmp)"
    a, b = du_kib(src), du_kib(dst)
    if b > a * 1.01 + 64:
        return f"holes lost: restored image allocates {b} KiB, source {a} KiB"
    if os.stat(src).st_mtime_ns // 10**9 != os.stat(dst).st_mtime_ns // 10**9:
        return "mtime differs"
    return None


def self_test(scratch):
    """Proves the checks can fail: a faithful copy passes, and each kind of wrong copy is caught.
    Returns a list of the wrong copies that were not caught (empty when the checks work)."""
    src, img = os.path.join(scratch, "check-src"), os.path.join(scratch, "check.img")
    os.makedirs(os.path.join(src, "d"))
    for name, body in (("a", b"alpha\n" * 1000), ("d/b", b"beta\n")):
        with open(os.path.join(src, name), "wb") as f:
            f.write(body)
    os.symlink("a", os.path.join(src, "link"))
    with open(img, "wb") as f:
        f.write(b"head")
        f.truncate(8 << 20)  # a hole after the first block

    def copy(tag):
        dst = os.path.join(scratch, f"check-{tag}")
        subprocess.run(["cp", "-a", src, dst], check=True)
        return dst

    def sparse_copy(tag, sparse):
        dst = os.path.join(scratch, f"check-{tag}.img")
        subprocess.run(["cp", "-p", f"--sparse={sparse}", img, dst], check=True)
        return dst

    missed = []
    if tree(src, copy("same")):
        missed.append("a faithful copy was reported wrong")
    if image(img, sparse_copy("same", "always")):
        missed.append("a faithful sparse copy was reported wrong")
    wrong = {"changed byte": lambda d: open(os.path.join(d, "a"), "r+b").write(b"A"),
             "missing file": lambda d: os.unlink(os.path.join(d, "d", "b")),
             "extra file": lambda d: open(os.path.join(d, "extra"), "w").close(),
             "mtime a day off": lambda d: os.utime(os.path.join(d, "d", "b"), (0, os.stat(os.path.join(d, "d", "b")).st_mtime - 86400)),
             "mode changed": lambda d: os.chmod(os.path.join(d, "a"), 0o600)}
    for i, (what, damage) in enumerate(wrong.items()):
        d = copy(f"wrong{i}")
        st = os.stat(os.path.join(d, "a"))
        damage(d)
        if what == "changed byte":  # same size and mtime: only the content tells
            os.utime(os.path.join(d, "a"), ns=(st.st_atime_ns, st.st_mtime_ns))
        if not tree(src, d):
            missed.append(what)
    if not image(img, sparse_copy("filled", "never")):
        missed.append("holes lost")
    return missed
