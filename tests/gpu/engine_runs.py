#!/usr/bin/env python3
"""How busy the sessions of a GPU model were, from a server log with each
run of the ONNX Runtime engine at debug level (EEANE_LOG=info,
eeane_backend_onnxruntime=debug): session-seconds inside a run per wall
second in bulk (runs of 128 rows and more, after every shape has warmed),
and what a run took by its rows, then every run a line per second. Usage: engine_runs.py SERVER_LOG"""
import re, sys, datetime, collections
runs = []
for line in open(sys.argv[1], errors="replace"):
    if "every GPU batch shape has run once" in line:
        # The shapes' own runs (warm_next) come before: only what follows counts.
        runs.clear()
        continue
    if "session run" not in line:
        continue
    m = re.search(r"^(\S+Z).*rows=(\d+) seq=(\d+) real=(\d+).*run_ms=([\d.]+)", line)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        runs.append((t, int(m.group(2)), int(m.group(3)), int(m.group(4)), float(m.group(5))))
bulk = [r for r in runs if r[1] >= 128]
print(f"{len(runs)} runs, {len(bulk)} of 128 rows or more")
if bulk:
    # The densest stretch: runs between the first and last bulk run, one-text runs excluded.
    start, end = bulk[0][0] - bulk[0][4] / 1e3, bulk[-1][0]
    busy = sum(r[4] for r in bulk) / 1e3
    texts = sum(r[3] for r in bulk)
    print(f"bulk: {end - start:.2f} s, {texts} texts ({texts / (end - start):.0f}/s), session-seconds in run {busy:.2f}: {busy / (end - start):.2f} sessions inside a run on average")
    by = collections.defaultdict(list)
    for r in bulk:
        by[r[1]].append(r)
    for rows in sorted(by):
        rs = by[rows]
        ms = sorted(x[4] for x in rs)
        tok = sum(x[1] * x[2] for x in rs) / len(rs)
        print(f"  rows {rows}: {len(rs)} runs, run_ms p50 {ms[len(ms)//2]:.2f} p90 {ms[int(len(ms)*0.9)]:.2f}, mean tokens as run {tok:.0f}, us a token-row {1e3 * sum(ms) / sum(x[1]*x[2] for x in rs):.4f}")
    # Gaps: per-second sums of run time, to see whether busy dips.
    sec = collections.Counter()
    for r in bulk:
        sec[int(r[0])] += r[4] / 1e3
    print("  session-seconds busy per wall second:", [round(sec[k], 2) for k in sorted(sec)])
# Every run after the warm-up, a line per wall second: one text a request
# shows here as runs of few rows. "inside" is session-seconds in a run per
# wall second: about the session count when the sessions never wait for a
# batch, and run_ms then holds what a call costs (the card's kernels, the
# host's launches and copies, and the wait behind other sessions' kernels).
if runs:
    print("per second: runs, texts, mean rows (real / run), sessions inside a run, run_ms p50 / p90")
    per = collections.defaultdict(list)
    for r in runs:
        per[int(r[0])].append(r)
    for second in sorted(per):
        rs = per[second]
        ms = sorted(x[4] for x in rs)
        texts = sum(x[3] for x in rs)
        print(f"  {datetime.datetime.fromtimestamp(second, datetime.timezone.utc):%H:%M:%S} {len(rs):5d} {texts:6d}"
              f" {texts / len(rs):6.1f} / {sum(x[1] for x in rs) / len(rs):6.1f} {sum(ms) / 1e3:5.2f}"
              f" {ms[len(ms) // 2]:6.2f} / {ms[int(len(ms) * 0.9)]:6.2f}")
