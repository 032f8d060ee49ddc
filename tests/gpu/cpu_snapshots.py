"""CPU time snapshots for tests/gpu/load.sh, one JSON line every INTERVAL
seconds until killed (one line, with INTERVAL 0): the monotonic clock, the machine's busy clock ticks
(/proc/stat), and for SERVER_PID (optional) its own ticks, its threads' ticks
by name (a trailing "-N" dropped: "tokenize-3" counts as "tokenize";
Linux keeps a thread's first 15 characters), and those of every process below it (engine processes).
Threads inherit their creator's name on Linux, so a runtime's own threads
count with the engine thread that started them.

Usage: cpu_snapshots.py INTERVAL [SERVER_PID]"""
import json
import os
import re
import sys
import time


def ticks(stat_path):
    try:
        # Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
        fields = open(stat_path).read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def snapshot(server):
    stat = open("/proc/stat").read().splitlines()
    cpu = [int(x) for x in stat[0].split()[1:9]]  # guest time is inside user already
    row = {"at": time.monotonic(), "wall": time.time(), "cores": sum(1 for line in stat if line.startswith("cpu") and line[3].isdigit()), "busy": sum(cpu) - cpu[3] - cpu[4]}
    if not server:
        return row
    groups = {}
    try:
        tasks = os.listdir(f"/proc/{server}/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            name = open(f"/proc/{server}/task/{tid}/comm").read().strip()
        except OSError:
            continue
        name = re.sub(r"-\d+$", "", name) or "?"
        groups[name] = groups.get(name, 0) + ticks(f"/proc/{server}/task/{tid}/stat")
    parent = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent[p] = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            pass

    def under(p):
        while p in parent and p != "1":
            p = parent[p]
            if p == server:
                return True
        return False

    row.update(server=ticks(f"/proc/{server}/stat"), threads=groups, engines=sum(ticks(f"/proc/{p}/stat") for p in parent if under(p)))
    return row


interval, server = float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ""
while True:
    print(json.dumps(snapshot(server)), flush=True)
    if interval <= 0:
        break
    time.sleep(interval)
