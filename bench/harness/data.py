"""Data sets: the prepared ones (bench/datasets.sh), a tiny generated set for --quick, the
changes the in-place restore scenarios make to a restored tree, and the lifecycle's edits."""
import os, subprocess, sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Dataset:
    def __init__(self, name, path, kind, tar=None):
        self.name, self.path, self.kind, self.tar = name, path, kind, tar  # kind: "tree" or "image"


def prepare(data_dir, names, scratch):
    """Creates the named data sets under data_dir if missing (never changing existing ones)."""
    subprocess.run(["bash", os.path.join(HERE, "datasets.sh"), data_dir, *names], check=True,
                   stdout=subprocess.DEVNULL)
    sets = []
    for n in names:
        path = os.path.join(os.path.abspath(data_dir), n)
        if n == "disk.img":
            sets.append(Dataset(n, path, "image"))
            continue
        tar = path + ".tar"
        if not os.path.exists(tar):  # the tar -x baseline needs an uncompressed tar of the tree
            tar = os.path.join(scratch, n + ".tar")
            subprocess.run(["tar", "-cf", tar, "-C", os.path.dirname(path), n], check=True)
        sets.append(Dataset(n, path, "tree", tar))
    return sets


def quick(scratch):
    """A tiny tree (a few hundred files, symlinks, an empty directory) and a 64 MiB sparse image."""
    root = os.path.join(scratch, "data")
    tree, img = os.path.join(root, "quick"), os.path.join(root, "quick.img")
    gen = [sys.executable, os.path.join(HERE, "gen.py"), tree, "--files", "300", "--size", "8e6",
           "--max-file", "1e6", "--dup", "0.2", "--text", "0.3", "--seed", "3"]
    subprocess.run(gen, check=True, stdout=subprocess.DEVNULL)
    os.makedirs(os.path.join(tree, "empty-dir"))
    os.symlink("empty-dir", os.path.join(tree, "link-to-dir"))
    os.symlink("no-such-file", os.path.join(tree, "dangling-link"))
    os.chmod(os.path.join(tree, "empty-dir"), 0o750)
    subprocess.run([sys.executable, os.path.join(HERE, "image.py"), img, "--size", str(64 << 20), "--hole", "0.3",
                    "--text", "0.3", "--seed", "2"], check=True, stdout=subprocess.DEVNULL)
    tar = os.path.join(scratch, "quick.tar")
    subprocess.run(["tar", "-cf", tar, "-C", root, "quick"], check=True)
    return [Dataset("quick", tree, "tree", tar), Dataset("quick.img", img, "image")]


def regular_files(root):
    return sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
                  if os.path.isfile(os.path.join(dp, f)) and not os.path.islink(os.path.join(dp, f)))


def damage(root):
    """The partial-restore change: of the regular files sorted by path, every fourth deleted and the
    next one with 4 KiB overwritten in the middle (its mtime kept, so only content tells).
    Returns (files deleted, files overwritten)."""
    deleted = overwritten = 0
    for i, f in enumerate(regular_files(root)):
        if i % 4 == 0:
            os.unlink(f)
            deleted += 1
        elif i % 4 == 1:
            st = os.stat(f)
            if invert_middle(f):
                os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
                overwritten += 1
    return deleted, overwritten


def invert_middle(f):
    """Inverts up to 4 KiB in the middle of file f (every byte changes); False for an empty file."""
    size = os.stat(f).st_size
    if size == 0:
        return False
    n, off = min(4096, size), max(0, size // 2 - 2048)
    with open(f, "r+b") as fh:
        fh.seek(off)
        old = fh.read(n)
        fh.seek(off)
        fh.write(bytes(b ^ 0xFF for b in old))
    return True


def private_copy(home, path):
    """Makes the directory home and a copy of the tree at path inside it (cp -a, reflinks where the
    file system has them), for a scenario that changes its files; returns the copy's path."""
    os.mkdir(home)
    src = os.path.join(home, os.path.basename(path))
    subprocess.run(["cp", "-a", "--reflink=auto", path, src], check=True)
    return src


def mutate(files, k, every=10):
    """The lifecycle change (bench/harness/lifecycle.py): of files (regular files sorted by path,
    from regular_files), every tenth starting at the k-th gets damage()'s overwrite, 4 KiB in the
    middle inverted; here the mtime moves on, as an edit's would, so every tool sees the change.
    Each k from 0 to 9 changes a different 10% of the files. Returns the files changed."""
    return sum(invert_middle(f) for f in files[k::every])


def age(root):
    """The metadata-restore change: every mtime (files, directories, not symlinks) moved back a day."""
    for dp, ds, fs in os.walk(root, topdown=False):
        for n in fs + ds:
            p = os.path.join(dp, n)
            if not os.path.islink(p):
                st = os.lstat(p)
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - 86400 * 10**9))
    st = os.lstat(root)
    os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns - 86400 * 10**9))


def apparent_size(path):
    """Bytes of file data (apparent sizes of regular files) in a tree or one file."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.lstat(f).st_size for f in regular_files(path))
