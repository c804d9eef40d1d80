#!/usr/bin/env python3
"""The memory of `cairn serve` while many clients upload at once (issue 34).

usage: bench/serve/uploads.py [--cairn BIN]... [--clients 16] [--object-mib 128] [--scratch DIR]

For each `cairn` binary given (default: target/release/cairn, else target/debug/cairn), starts
`cairn serve --plain-http` on loopback in front of a fresh storage directory, makes an append
token, and has CLIENTS processes (curl) each PUT one incompressible pack of OBJECT-MIB MiB under
its BLAKE3 name into their own repository, all at once. Reports the server's peak RSS (VmHWM),
the wall time and the upload rate, and checks that every object was stored whole. Give two
binaries (e.g. a build before a change and after) to see them side by side. Needs curl and
the Python package blake3.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def blake3_hex(path):
    import blake3  # pip install blake3
    h = blake3.blake3()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def run(cairn, clients, pack, name, scratch):
    work = tempfile.mkdtemp(dir=scratch, prefix="serve-bench-")
    storage, creds = os.path.join(work, "storage"), os.path.join(work, "credentials.json")
    os.mkdir(storage)
    made = subprocess.run([cairn, "--json", "serve", "token", "add", "--all", "--role", "append",
                           "--credentials", creds], capture_output=True, text=True, check=True)
    token = json.loads(made.stdout)["token"]
    server = subprocess.Popen([cairn, "serve", "--plain-http", "--listen", "127.0.0.1:0", "--storage", storage,
                               "--credentials", creds, "--log", os.path.join(work, "requests.log")],
                              stdout=subprocess.PIPE, text=True)
    address = server.stdout.readline().strip().rsplit("http://", 1)[-1]
    try:
        base = f"http://{address}/v1/repos"
        for i in range(clients):
            subprocess.run(["curl", "-sf", "-X", "POST", "-H", f"Authorization: Bearer {token}", f"{base}/r{i}"],
                           check=True)
        idle = peak_rss_kib(server.pid)
        start = time.monotonic()
        uploads = [subprocess.Popen(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-T", pack,
                                     "-H", f"Authorization: Bearer {token}",
                                     f"{base}/r{i}/objects/data/{name[:2]}/{name}"], stdout=subprocess.PIPE, text=True)
                   for i in range(clients)]
        codes = [u.communicate()[0] for u in uploads]
        took = time.monotonic() - start
        peak = peak_rss_kib(server.pid)
    finally:
        server.kill()
        server.wait()
    size = os.path.getsize(pack)
    whole = all(os.path.getsize(os.path.join(storage, f"r{i}", "data", name[:2], name)) == size
                for i in range(clients) if codes[i] == "201")
    shutil.rmtree(work)
    return {"codes": codes, "idle_mib": idle / 1024, "peak_mib": peak / 1024, "seconds": took,
            "mib_s": clients * size / 2**20 / took, "whole": whole and all(c == "201" for c in codes)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cairn", action="append")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--object-mib", type=int, default=128)
    p.add_argument("--scratch", default=tempfile.gettempdir())
    a = p.parse_args()
    bins = a.cairn or [next(b for b in (os.path.join(ROOT, "target", k, "cairn") for k in ("release", "debug"))
                            if os.path.exists(b))]
    pack = os.path.join(a.scratch, "serve-bench.pack")
    with open(pack, "wb") as f:
        for _ in range(a.object_mib):
            f.write(os.urandom(1 << 20))
    name = blake3_hex(pack)
    print(f"{a.clients} clients, each one PUT of a {a.object_mib} MiB pack, all at once, plain HTTP on loopback")
    print("| server binary | peak RSS | idle RSS | wall | upload rate | all stored whole |")
    print("| --- | --- | --- | --- | --- | --- |")
    failed = False
    for b in bins:
        r = run(b, a.clients, pack, name, a.scratch)
        failed |= not r["whole"]
        print(f"| {b} | {r['peak_mib']:.0f} MiB | {r['idle_mib']:.0f} MiB | {r['seconds']:.1f} s | "
              f"{r['mib_s']:.0f} MiB/s | {'yes' if r['whole'] else 'NO: ' + ' '.join(r['codes'])} |")
    os.remove(pack)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
