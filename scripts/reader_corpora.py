"""Reads every Arrow IPC and Parquet file under the given folders with chute and with pyarrow,
each file in a subprocess of its own (a time limit, an address-space limit), and reports:
files pyarrow reads that chute does not read whole (every row), files pyarrow refuses that
chute reads, and any file that made chute's process crash, hang or print a panic.

    python scripts/reader_corpora.py DIR... [--timeout 60] [--memory-gb 4] [--show 20]

The reader test corpora this was written for are Apache's own: `arrow-testing` (its
`data/arrow-ipc-stream/integration/*/*.arrow_file` and `*.stream`, written by the C++, Java,
Go, JavaScript and Rust implementations, and its fuzzing corpora of corrupt files) and
`parquet-testing` (`data/`, `bad_data/`). A file is Parquet when its name ends in `.parquet`
or it lies under a folder named `parquet`; every other file is tried as an Arrow IPC file,
then as a stream. Needs pyarrow and chute.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ONE = r"""
import json, resource, sys
limit = int(sys.argv[2]) << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
path, parquet = sys.argv[1], sys.argv[3] == "1"
import pyarrow.ipc as ipc, pyarrow.parquet as pq
out = {}
try:
    if parquet:
        out["pyarrow"] = pq.read_table(path).num_rows
    else:
        try:
            out["pyarrow"] = ipc.open_file(path).read_all().num_rows
        except Exception:
            out["pyarrow"] = ipc.open_stream(path).read_all().num_rows
except Exception as e:
    out["pyarrow"] = f"{type(e).__name__}: {str(e)[:160]}"
import chute
try:
    src = chute.parquet(path) if parquet else chute.arrow(path)
    rows = 0
    for batch in chute.Loader(src, batch_size=256, num_workers=2):
        first = next((k for k in batch if not k.endswith("_valid")), None)
        rows += len(batch[first]) if first is not None else 0
    out["chute"] = rows
except Exception as e:
    out["chute"] = f"{type(e).__name__}: {str(e)[:300]}"
print(json.dumps(out))
"""


def files(folders):
    for folder in folders:
        for p in sorted(Path(folder).rglob("*")):
            if p.is_file() and not p.name.endswith((".json", ".md", ".gz", ".py", ".txt")):
                yield p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--memory-gb", type=int, default=4)
    ap.add_argument("--show", type=int, default=20)
    a = ap.parse_args()
    counts = {"files": 0, "pyarrow reads": 0, "chute reads whole": 0, "both refuse": 0}
    problems = []
    for p in files(a.folders):
        parquet = p.suffix == ".parquet" or "parquet" in p.parts
        counts["files"] += 1
        try:
            r = subprocess.run([sys.executable, "-c", ONE, str(p), str(a.memory_gb),
                                "1" if parquet else "0"], capture_output=True, text=True,
                               timeout=a.timeout, env={**os.environ, "RUST_BACKTRACE": "0"})
        except subprocess.TimeoutExpired:
            problems.append(("hang", p, f"no answer in {a.timeout} s"))
            continue
        if "panicked" in r.stderr:
            problems.append(("panic printed", p, r.stderr.strip().splitlines()[0][:200]))
        if r.returncode != 0:
            problems.append(("crash", p, f"exit {r.returncode}: {r.stderr.strip()[-200:]}"))
            continue
        out = json.loads(r.stdout.strip().splitlines()[-1])
        ok_pa, ok_ch = isinstance(out["pyarrow"], int), isinstance(out["chute"], int)
        if ok_pa:
            counts["pyarrow reads"] += 1
            if out["chute"] == out["pyarrow"]:
                counts["chute reads whole"] += 1
            else:
                problems.append(("not read", p, f"pyarrow {out['pyarrow']} rows, chute "
                                 f"{out['chute']}"))
        elif ok_ch:
            problems.append(("pyarrow refuses, chute reads", p,
                             f"{out['pyarrow']}; chute {out['chute']} rows"))
        else:
            counts["both refuse"] += 1
    print(json.dumps(counts))
    for kind, p, why in problems[: a.show]:
        print(f"{kind}: {p}: {why}")
    sys.exit(1 if any(k in ("hang", "crash", "panic printed") for k, _, _ in problems) else 0)


if __name__ == "__main__":
    main()
