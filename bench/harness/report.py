"""Results as a CSV, the raw runs as a CSV, and a markdown report: one table per data set with
ratios to the baseline and to the best peer, the lead's restore targets as pass/fail, the
concurrency sweep, and the lifecycle's tables (forget and prune, backup during prune,
recompress; lifecycle.py)."""
import csv, os
from . import lifecycle
from .scenarios import (CHECK, CHECK_DATA, CHECK_DATA_LAT, CHECK_LAT, CHECK_SUBSET, CHECKS, FULL, IMG_RESTORE,
                        NOOP, PARTIAL, SERIAL)

RESTORES = (FULL, NOOP, PARTIAL, "metadata restore", IMG_RESTORE, SERIAL)
MIB = 2**20
# The restore targets of issue 3: full restore against tar -x, per data set.
FULL_VS_TAR = {"linux": 0.75, "small": 1.0}
CORES = os.cpu_count() or 1


def is_check(scenario):
    return scenario in CHECKS


def is_prune(scenario):
    return scenario in lifecycle.SCENARIOS


def floor_s(results, ds):
    """The --read-data floor as (cat s, decode s): the fastest `cat` of Cairn's pack files, plus
    the CPU that reading the data adds to a check (the least CPU of Cairn's --read-data minus the
    least of its structure check: decrypting, decompressing and hashing every blob, hashing every
    pack, the read calls) spread over every core. CPU, not wall time, so that the estimate holds on
    a loaded machine; None when a part is missing."""
    cat, full, plain = (results.get((ds, sc, tool)) for sc, tool in
                        ((CHECK_DATA, "cat packs"), (CHECK_DATA, "cairn"), (CHECK, "cairn")))
    if not all(r and r.runs for r in (cat, full, plain)):
        return None
    decode = min(r.cpu for r in full.runs) - min(r.cpu for r in plain.runs)
    return cat.min(), max(decode, 0.0) / CORES


def baseline_of(results, res):
    """The baseline result timed in the same rounds as res (None for baselines themselves)."""
    if res.baseline:
        return None
    return next((b for b in results.values() if b.baseline and b.dataset == res.dataset
                 and b.scenario == res.scenario and b.runs), None)


def best_peer(results, res):
    peers = [p for p in results.values() if not p.baseline and p.tool != "cairn" and p.dataset == res.dataset
             and p.scenario == res.scenario and p.runs and not p.error]
    return min(peers, key=lambda p: p.min(), default=None)


def evaluate_targets(results, max_memory_mib):
    """Sets res.extra['target'] / ['target_pass'] on Cairn's results; returns the list of targets."""
    out = []
    for res in results.values():  # judged afresh each time the outputs are written
        res.extra.pop("target", None)
        res.extra.pop("target_pass", None)

    def judge(res, text, ok):
        ok = bool(ok) and not res.error
        prev = res.extra.get("target")
        res.extra["target"] = (prev + "; " if prev else "") + text
        res.extra["target_pass"] = ok and res.extra.get("target_pass", True)
        out.append((res.dataset, res.scenario, text, ok))

    def get(ds, scenario, tool):
        r = results.get((ds, scenario, tool))
        return r if r and r.runs else None

    for (ds, scenario, tool), res in sorted(results.items()):
        if tool != "cairn" or not res.runs:
            continue
        if scenario == FULL and ds in FULL_VS_TAR and get(ds, FULL, "tar -x"):
            r = res.min() / get(ds, FULL, "tar -x").min()
            judge(res, f"≤ {FULL_VS_TAR[ds]}× tar -x: {r:.2f}×", r <= FULL_VS_TAR[ds])
        if scenario == IMG_RESTORE and get(ds, IMG_RESTORE, "cp --sparse=always"):
            r = res.min() / get(ds, IMG_RESTORE, "cp --sparse=always").min()
            judge(res, f"≤ 1.0× cp --sparse=always: {r:.2f}×", r <= 1.0)
        if scenario == NOOP and get(ds, FULL, "cairn"):
            r = res.min() / get(ds, FULL, "cairn").min()
            judge(res, f"≤ 0.25× full restore: {r:.2f}×", r <= 0.25)
        if scenario == PARTIAL and res.extra.get("changed_stored") and res.fetched:
            r = max(res.fetched) / res.extra["changed_stored"]
            judge(res, f"fetched ≤ 1.2× stored changed chunks: {r:.2f}×", r <= 1.2)
        if scenario == SERIAL:
            full = get(ds, FULL, "cairn") or get(ds, IMG_RESTORE, "cairn")
            if full:
                r = res.min() / full.min()
                judge(res, f"defaults ≥ 1.7× faster than 1/1/1: {r:.2f}×", r >= 1.7)
        if scenario in RESTORES and scenario != SERIAL:
            rss = max(r.rss_kib for r in res.runs) / 1024
            judge(res, f"RSS ≤ max-memory + 64 MiB: {rss:.0f} MiB", rss <= max_memory_mib + 64)
        # The check targets of issue 13.
        restic = get(ds, scenario, "restic")
        if scenario in (CHECK, CHECK_DATA) and restic:
            r = res.min() / restic.min()
            judge(res, f"≤ 0.5× restic: {r:.2f}×", r <= 0.5)
        if scenario == CHECK_DATA and floor_s(results, ds):
            cat, decode = floor_s(results, ds)
            r = res.min() / (cat + decode)
            judge(res, f"≤ 1.5× floor (cat {cat:.2f} s + decode {decode:.2f} s on {CORES} cores): {r:.2f}×", r <= 1.5)
        if scenario == CHECK_SUBSET and get(ds, CHECK_DATA, "cairn"):
            r = res.min() / get(ds, CHECK_DATA, "cairn").min()
            judge(res, f"≤ 0.15× full --read-data: {r:.2f}×", r <= 0.15)
        if scenario in (CHECK, CHECK_DATA, CHECK_SUBSET) and restic:
            rss, theirs = (max(r.rss_kib for r in x.runs) / 1024 for x in (res, restic))
            judge(res, f"peak RSS ≤ restic's: {rss:.0f} vs {theirs:.0f} MiB", rss <= theirs)
        if scenario in (CHECK_LAT, CHECK_DATA_LAT):
            fast = get(ds, CHECK if scenario == CHECK_LAT else CHECK_DATA, "cairn")
            if fast:
                r = fast.min() / res.min()  # the same work: throughput ratio = inverse time ratio
                judge(res, f"≥ 70% of the 0 ms throughput: {r:.0%}", r >= 0.7)
    # The prune targets of issue 14.
    for ds, scenario, text, ok in lifecycle.targets(results):
        res = results[(ds, scenario, "cairn")]
        judge(res, text, ok)
    return out


def ordered(results):
    """Data sets and scenarios in the order they ran, each scenario's baseline first."""
    ds_order, sc_order = {}, {}
    for res in results.values():
        ds_order.setdefault(res.dataset, len(ds_order))
        sc_order.setdefault((res.dataset, res.scenario), len(sc_order))
    return sorted(results.values(), key=lambda r: (ds_order[r.dataset], sc_order[r.dataset, r.scenario], not r.baseline))


def rows(results):
    for res in ordered(results):
        if is_prune(res.scenario):
            continue
        base, peer = baseline_of(results, res), (best_peer(results, res) if res.tool == "cairn" else None)
        runs = res.runs
        yield {
            "dataset": res.dataset, "scenario": res.scenario, "tool": res.tool, "baseline": res.baseline,
            "rounds": len(runs), "min_s": res.min(), "median_s": res.median(),
            "cpu_s": min(r.cpu for r in runs) if runs else None,
            "cpu_use": min(r.cpu for r in runs) / res.min() if runs and res.min() else None,
            "peak_rss_mib": max(r.rss_kib for r in runs) / 1024 if runs else None,
            "read_mib": min(r.read_bytes for r in runs) / MIB if runs else None,
            "fetched_mib": min(res.fetched) / MIB if res.fetched and None not in res.fetched else None,
            "changed_stored_mib": res.extra["changed_stored"] / MIB if "changed_stored" in res.extra else None,
            "vs": base.tool if base else "",
            "ratio_baseline": res.min() / base.min() if base and runs else None,
            "best_peer": peer.tool if peer else "",
            "ratio_best_peer": res.min() / peer.min() if peer and runs else None,
            "check": res.error or ("ok" if runs and not res.baseline else ""),
            "target": res.extra.get("target", ""),
            "target_pass": res.extra.get("target_pass", ""),
            "repo_mib": None, "detail": "",
            # Every restore row of the main run reads from the repository: Cairn's with
            # --no-local-data (tools.py), as the peers do; local data is timed by --only-local-data.
            "data_from": "repo" if res.scenario in RESTORES else "",
        }
    for row in lifecycle.rows(results):
        res = results[(row["dataset"], row["scenario"], row["tool"])]
        row["target"], row["target_pass"] = res.extra.get("target", ""), res.extra.get("target_pass", "")
        yield row


def write_csv(path, records):
    records = list(records)
    if not records:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)


def raw_runs(results):
    for res in ordered(results):
        for i, r in enumerate(res.runs):
            yield {"dataset": res.dataset, "scenario": res.scenario, "tool": res.tool, "round": i + 1,
                   "wall_s": round(r.wall, 3), "cpu_s": round(r.cpu, 3), "peak_rss_kib": r.rss_kib,
                   "read_bytes": r.read_bytes}


def fmt(v, spec=".2f", suffix=""):
    return "" if v is None or v == "" else f"{v:{spec}}{suffix}"


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")[:160]


def table(records):
    lines = ["| scenario | data from | tool | min s | median s | CPU s | CPU use | peak RSS MiB | read MiB | fetched MiB "
             "| × baseline | × best peer | check | target |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- |"]
    for r in records:
        vs = f"{fmt(r['ratio_baseline'])}× {r['vs']}" if r["ratio_baseline"] is not None else ""
        bp = f"{fmt(r['ratio_best_peer'])}× {r['best_peer']}" if r["ratio_best_peer"] is not None else ""
        check = "ok" if r["check"] == "ok" else (f"**FAIL** {r['check']}" if r["check"] else "")
        target = ""
        if r["target"]:
            target = ("**PASS** " if r["target_pass"] else "**FAIL** ") + r["target"]
        tool = f"*{r['tool']}* (baseline)" if r["baseline"] else r["tool"]
        lines.append(f"| {r['scenario']} | {r.get('data_from', '')} | {cell(tool)} | {fmt(r['min_s'])} | {fmt(r['median_s'])} | {fmt(r['cpu_s'])} "
                     f"| {fmt(r['cpu_use'], '.0%')} | {fmt(r['peak_rss_mib'], '.0f')} | {fmt(r['read_mib'], '.1f')} "
                     f"| {fmt(r['fetched_mib'], '.1f')} | {cell(vs)} | {cell(bp)} | {cell(check)} | {cell(target)} |")
    return "\n".join(lines)


def sweep_table(sweep):
    lines = ["| data set | fetch concurrency | decode threads | wall s | MB/s | CPU s | CPU use (cores) | peak RSS MiB | check |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in sweep:
        lines.append(f"| {s['dataset']} | {s['fetch_concurrency']} | {s['decode_threads']} | {fmt(s['wall_s'])} "
                     f"| {fmt(s['mb_per_s'], '.0f')} | {fmt(s['cpu_s'])} | {fmt(s['cpu_use'])} "
                     f"| {fmt(s['peak_rss_mib'], '.0f')} | {cell(s['check'])} |")
    return "\n".join(lines)


def markdown(path, header, results, targets, sweep, charts):
    records = list(rows(results))
    order = {}
    for r in records:
        if not is_prune(r["scenario"]):
            order.setdefault(r["dataset"], []).append(r)
    parts = [header]
    for ds, recs in order.items():
        parts.append(f"### {ds}\n\n{table(recs)}\n")
    prune_tables = lifecycle.markdown(results)
    if prune_tables:
        parts.append(prune_tables)
    for title, mine in (("Restore targets (issue 3)", [t for t in targets if not is_check(t[1]) and not is_prune(t[1])]),
                        ("Check targets (issue 13)", [t for t in targets if is_check(t[1])]),
                        ("Prune targets (issue 14)", [t for t in targets if is_prune(t[1])])):
        if mine:
            parts.append(f"### {title}\n\n| data set | scenario | target | result |\n| --- | --- | --- | --- |\n"
                         + "\n".join(f"| {d} | {s} | {cell(t)} | {'**PASS**' if ok else '**FAIL**'} |"
                                      for d, s, t, ok in mine) + "\n")
    if sweep:
        parts.append("### Concurrency sweep (Cairn restore, default write threads)\n\n" + sweep_table(sweep) + "\n")
    if charts:
        parts.append("### Charts\n\n" + "\n\n".join(f"![{os.path.splitext(os.path.basename(c))[0]}]({os.path.basename(c)})"
                                                    for c in charts) + "\n")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    return records
