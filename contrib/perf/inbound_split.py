#!/usr/bin/env python3
"""Splits switchboard's inbound latency in a side-by-side run into its two halves.

Run the side-by-side harness (../shared/sidebyside) with PERF_TRACE=1 and PERF_KEEP=1,
then give this script the raw results (PERF_JSON):

    PERF_SYSTEMS=switchboard,anchor PERF_TRACE=1 PERF_KEEP=1 PERF_JSON=/tmp/sbs.json \
        ../shared/sidebyside/run.sh > /dev/null
    contrib/perf/inbound_split.py /tmp/sbs.json

For each of switchboard's messages it takes three moments: the fake Bot API storing the
message (the harness's trace), the daemon's `envelope recorded` line (logged once the
envelope is committed and handed to the session), and the MCP client receiving the
notification (the trace again). So inbound = daemon (poll, decode, commit) + hand-over
(the session stream to the plugin, the plugin, MCP to the client). The clocks are the
same machine's; the log's timestamps have microseconds.
"""
import datetime
import json
import re
import sys

RECORDED = re.compile(r"^(\S+?)Z?\s+INFO .*envelope recorded update_id=(\d+)")


def epoch_ms(stamp):
    moment = datetime.datetime.fromisoformat(stamp.rstrip("Z"))
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(path):
    results = json.load(open(path))["results"]
    for run in results:
        if run["system"] != "switchboard":
            continue
        recorded = {}
        with open(run["dir"] + "/daemon.stderr.log") as log:
            for line in log:
                match = RECORDED.match(line)
                if match:
                    recorded[int(match.group(2))] = epoch_ms(match.group(1))
        print(f"switchboard, repetition {run['rep']}")
        for phase in ("serial", "rate"):
            daemon, hand_over, inbound = [], [], []
            for message in run[phase].get("trace", []):
                at = recorded.get(message["update_id"])
                if at is None or not message["notified"]:
                    continue
                daemon.append(at - message["stored"])
                hand_over.append(message["notified"][0] - at)
                inbound.append(message["notified"][0] - message["stored"])
            if not inbound:
                print(f"  {phase}: no trace (run with PERF_TRACE=1 PERF_KEEP=1)")
                continue
            print(f"  {phase} ({len(inbound)} messages), ms:")
            for name, values in (("stored -> recorded (daemon)", daemon),
                                 ("recorded -> notified (hand-over)", hand_over),
                                 ("inbound", inbound)):
                print(f"    {name:34s} p50 {quantile(values, .5):5.2f}  p90 {quantile(values, .9):5.2f}"
                      f"  p99 {quantile(values, .99):5.2f}  max {max(values):5.2f}")
            worst = sorted(range(len(inbound)), key=lambda i: -inbound[i])[:3]
            print("    slowest three (inbound = daemon + hand-over): "
                  + ", ".join(f"{inbound[i]:.2f} = {daemon[i]:.2f} + {hand_over[i]:.2f}" for i in worst))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
