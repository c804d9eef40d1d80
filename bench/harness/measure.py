"""Timing one command: wall time, user+sys CPU and peak RSS (GNU time), and the bytes the command
read (the kernel's per-process I/O accounting)."""
import os, subprocess, tempfile, time
from dataclasses import dataclass

# The shell reads its own /proc/PID/io after waiting for the command: the kernel folds a reaped
# child's I/O counters into its parent's, so this counts every byte the command and its children
# read through read(2)/pread(2), whether from disk or the page cache.
_WRAP = '"$@"; rc=$?; cat /proc/$$/io > "$BENCH_IO_FILE"; exit $rc'


class CommandFailed(RuntimeError):
    pass


@dataclass
class Run:
    wall: float  # seconds
    cpu: float  # user + system seconds
    rss_kib: int  # peak resident set size of the largest process
    read_bytes: int  # bytes read (rchar)
    stdout: str


def timed(cmd, env=None, cwd=None):
    """Runs cmd (a list) and measures it; raises CommandFailed naming the command on a non-zero exit."""
    with tempfile.TemporaryDirectory(prefix="bench-time-") as tmp:
        tfile, iofile = os.path.join(tmp, "time"), os.path.join(tmp, "io")
        full_env = dict(env or os.environ, BENCH_IO_FILE=iofile)
        start = time.monotonic()
        p = subprocess.run(["/usr/bin/time", "-o", tfile, "-f", "%U %S %M", "sh", "-c", _WRAP, "sh", *cmd],
                           text=True, capture_output=True, env=full_env, cwd=cwd)
        wall = time.monotonic() - start
        if p.returncode != 0:
            lines = [l for l in (p.stderr or p.stdout).splitlines() if l.strip()] or ["(no output)"]
            said = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
            raise CommandFailed(f"{os.path.basename(cmd[0])} exited {p.returncode}: {said}")
        user, sys_, rss = open(tfile).read().split()[-3:]
        io = dict(line.split(": ") for line in open(iofile).read().splitlines())
        return Run(wall, float(user) + float(sys_), int(rss), int(io["rchar"]), p.stdout)


def settle(pause=2.0):
    """Flushes dirty pages and lets the file system finish deferred work, so that deleting or
    writing a large tree does not slow the next timed step."""
    subprocess.run(["sync"], check=True)
    time.sleep(pause)
