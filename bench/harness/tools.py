"""The backup tools under test, each driven with its own commands and conventions: its own
password variable, its own repository and cache under the scratch directory. Every tool backs up
an absolute path and restores the whole snapshot into an empty or existing directory, where the
data lands at TARGET/<absolute source path>."""
import itertools, json, os, re, shutil, subprocess

PASSWORD = "bench"


class Tool:
    name = ""
    binary = ""
    note = ""

    def __init__(self, scratch, binary=None):
        self.path = binary or shutil.which(self.binary)
        self.scratch = scratch
        self.env = dict(os.environ, **self.extra_env())
        self.archives = {}  # repo -> name of its latest archive (tools that name them)

    def extra_env(self):
        return {}

    def available(self):
        return bool(self.path) and os.access(self.path, os.X_OK)

    def version(self):
        out = subprocess.run([self.path, "--version"], capture_output=True, text=True).stdout
        return out.strip().splitlines()[0] if out.strip() else "?"

    def restored(self, target, src):
        return os.path.join(target, src.lstrip("/"))

    def restore_cwd(self, target):
        return None

    def fetched(self, run):
        """Bytes the tool reports having fetched from the repository, when it reports them."""
        return None

    def init(self, repo):
        subprocess.run(self.init_cmd(repo), env=self.env, check=True, capture_output=True)

    # Tools that can check a repository define check_cmd(repo, options): options are restic's
    # spelling (--read-data, --read-data-subset P%), which Cairn shares.
    check_cmd = None

    # The lifecycle scenario (lifecycle.py): tools that can forget and prune define
    # forget_cmd(repo, keep) (keep the last `keep` snapshots) and prune_cmd(repo, watch) (delete
    # what no snapshot needs; with watch, print progress that repack_marker finds when the
    # repacking starts, else a summary the scenario can parse). state_vars: environment variables
    # naming the tool's cache or state directory, copied along with a repository (fork).
    forget_cmd = None
    prune_cmd = None
    repack_marker = None
    prune_lock = None  # a file the prune's exclusive lock creates in the repository, if it has one
    state_vars = ()

    def fork(self, repo, copy, tag):
        """Copies repo to copy, and the tool's cache and state directories beside theirs; returns
        the environment to run the tool on the copy with (the same state the original has)."""
        subprocess.run(["cp", "-a", repo, copy], check=True)
        env = dict(self.env)
        for var in self.state_vars:
            src = env.get(var)
            if src:
                env[var] = f"{src}-{tag}"
                shutil.rmtree(env[var], ignore_errors=True)
                if os.path.isdir(src):
                    subprocess.run(["cp", "-a", src, env[var]], check=True)
        return env


class Cairn(Tool):
    name, binary = "cairn", "cairn"
    max_memory = None  # set by bench/run: --max-memory for every restore

    def extra_env(self):
        return {"CAIRN_PASSWORD": PASSWORD}

    def init_cmd(self, repo):
        return [self.path, "-r", repo, "init"]

    def backup_cmd(self, repo, src):
        return [self.path, "-r", repo, "--json", "backup", src]

    def restore_cmd(self, repo, target, options=(), local_data=False):
        if self.max_memory and "--max-memory" not in options:
            options = [*options, "--max-memory", self.max_memory]
        # The source of every benchmark tree is still on disk, and Cairn would copy from it
        # (issue 18): a restore from the repository, as the peers do, says --no-local-data.
        # Only the local-data scenario asks for the default.
        if not local_data and not any(o.startswith(("--use-source", "--no-local-data")) for o in options):
            options = [*options, "--no-local-data"]
        return [self.path, "-r", repo, "--json", "restore", "latest", "--target", target, *options]

    def check_cmd(self, repo, options=()):
        return [self.path, "-r", repo, "--json", "check", *options]

    def forget_cmd(self, repo, keep):
        return [self.path, "-r", repo, "forget", "--keep-last", str(keep)]

    def prune_cmd(self, repo, watch=False):
        # --json prints the summary with the plan and per-phase seconds; without it the progress
        # lines ("repacking N packs") go to stderr and the last line names the phases.
        return [self.path, "-r", repo, "prune"] if watch else [self.path, "-r", repo, "--json", "prune"]

    repack_marker = re.compile(r"^repacking \d+ packs")

    def recompress_cmd(self, repo, to):
        return [self.path, "-r", repo, "--json", "recompress", "--to", to]

    def summary(self, run):
        for line in reversed(run.stdout.splitlines()):
            if line.startswith("{") and '"summary"' in line:
                return json.loads(line)
        return {}

    def fetched(self, run):
        s = self.summary(run)
        return s.get("bytes_fetched", s.get("bytes_read"))


class Restic(Tool):
    name, binary = "restic", "restic"

    def extra_env(self):
        return {"RESTIC_PASSWORD": PASSWORD, "RESTIC_CACHE_DIR": os.path.join(self.scratch, "cache-restic")}

    def version(self):
        v = subprocess.run([self.path, "version"], capture_output=True, text=True).stdout.strip()
        m = re.match(r"restic (\d+)\.(\d+)", v)
        if m and (int(m.group(1)), int(m.group(2))) < (0, 19):
            v += " (older than restic 0.19, which issue 13 compares against)"
        return v

    def init_cmd(self, repo):
        return [self.path, "-r", repo, "init"]

    def backup_cmd(self, repo, src):
        return [self.path, "-r", repo, "backup", "--quiet", src]

    def restore_cmd(self, repo, target, options=()):
        return [self.path, "-r", repo, "restore", "latest", "--target", target, *options]

    def check_cmd(self, repo, options=()):
        return [self.path, "-r", repo, "check", *options]

    def forget_cmd(self, repo, keep):
        return [self.path, "-r", repo, "forget", "--keep-last", str(keep)]

    def prune_cmd(self, repo, watch=False):
        return [self.path, "-r", repo, "prune"]

    repack_marker = re.compile(r"^repacking packs")
    state_vars = ("RESTIC_CACHE_DIR",)


class Rustic(Tool):
    name, binary = "rustic", "rustic"

    def extra_env(self):
        return {"RUSTIC_PASSWORD": PASSWORD, "RUSTIC_NO_PROGRESS": "true",
                "RUSTIC_CACHE_DIR": os.path.join(self.scratch, "cache-rustic")}

    def init_cmd(self, repo):
        return [self.path, "-r", repo, "init"]

    def backup_cmd(self, repo, src):
        return [self.path, "-r", repo, "backup", src]

    def restore_cmd(self, repo, target, options=()):
        return [self.path, "-r", repo, "restore", "latest", target, *options]

    def forget_cmd(self, repo, keep):
        return [self.path, "-r", repo, "forget", "--keep-last", str(keep)]

    def prune_cmd(self, repo, watch=False):
        return [self.path, "-r", repo, "prune"]

    state_vars = ("RUSTIC_CACHE_DIR",)


class Borg(Tool):
    name, binary = "borg", "borg"
    counter = itertools.count(1)

    def extra_env(self):
        return {"BORG_PASSPHRASE": PASSWORD, "BORG_BASE_DIR": os.path.join(self.scratch, "borg-base"),
                "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes"}

    def init_cmd(self, repo):
        return [self.path, "init", "--encryption=repokey-blake2", repo]

    def backup_cmd(self, repo, src):
        # Archive names must be unique within a repository; restores extract the latest one.
        name = f"snapshot-{next(self.counter)}"
        self.archives[repo] = name
        return [self.path, "create", f"{repo}::{name}", src]

    def restore_cwd(self, target):
        # borg extract writes into the current directory.
        os.makedirs(target, exist_ok=True)
        return target

    def restore_cmd(self, repo, target, options=()):
        return [self.path, "extract", "--sparse", f"{repo}::{self.archives[repo]}", *options]

    # borg's forget is `prune` (it removes archives), and its prune is `compact` (it frees the
    # space); both take the repository's exclusive lock.
    def forget_cmd(self, repo, keep):
        return [self.path, "prune", "--keep-last", str(keep), repo]

    def prune_cmd(self, repo, watch=False):
        return [self.path, "compact", repo]

    prune_lock = "lock.exclusive"
    state_vars = ("BORG_BASE_DIR",)


ALL = [Cairn, Rustic, Restic, Borg]
KNOWN = [t.name for t in ALL] + ["kopia"]


def select(names, scratch, cairn_binary):
    """The requested tools that are installed, and a note for each requested one that is not."""
    tools, missing = [], {}
    for cls in ALL:
        if names is not None and cls.name not in names:
            continue
        t = cls(scratch, cairn_binary if cls is Cairn else None)
        if t.available():
            tools.append(t)
        elif names is not None or cls is not Cairn:
            missing[cls.name] = f"`{cls.binary}` not found on PATH"
    for n in names or []:
        if n not in KNOWN:
            raise SystemExit(f"bench/run: unknown tool '{n}' (known: {', '.join(KNOWN)})")
        if n == "kopia":
            missing[n] = "no driver in bench/harness/tools.py yet"
    return tools, missing
