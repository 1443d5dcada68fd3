"""Summaries of a GPU run, on the GPU machine (it has Python, not Node): bench/gpu/device-run.sh.

  summary.py gtest-json WORK          the per-suite gtest JSON files of WORK merged into one
  summary.py bench-json WORK          the per-kernel-set bench JSON files of WORK merged into one,
                                      with llama.cpp's figures when the run measured them ("llama")
  summary.py summary WORK OUT LLAMA   summary.md: each suite's result and first failure, our
                                      figures beside llama.cpp's: measured in this run when it
                                      did, else LLAMA (its recorded figures)
"""
import glob
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def gtest_json(work):
    suites = []
    for path in sorted(glob.glob(os.path.join(work, "gtest-*.json"))):
        doc = load(path)
        if doc:
            suites.extend(doc.get("testsuites", []))
    return {"testsuites": suites}


def bench_json(work):
    runs = []
    for path in sorted(glob.glob(os.path.join(work, "bench-*.json"))):
        doc = load(path)
        if doc:
            runs.append(doc)
    out = {"runs": runs}
    llama = llama_json(work)
    if llama:
        out["llama"] = llama
    return out


def json_lines(path):
    """The JSON objects of a file's lines (llama.cpp's jsonl output; other lines skipped)."""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return []
    docs = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def llama_json(work):
    """llama.cpp's figures measured in this run (device-run.sh's llama phase: llama-bench and
    llama-batched-bench --output-format jsonl), in llama-h100.json's shape; the best of the flash
    attention settings run at each point. None if nothing was measured."""
    decode, prefill, batched = {}, {}, {}
    gpus = set()
    for doc in json_lines(os.path.join(work, "llama-decode.out")) + json_lines(os.path.join(work, "llama-prefill.out")):
        gpus.add(doc.get("gpu_info") or "")
        ts = float(doc.get("avg_ts") or 0)
        if ts <= 0:
            continue
        if doc.get("n_gen", 0) > 0 and doc.get("n_prompt", 0) == 0:
            key = str(doc.get("n_depth", 0))
            decode[key] = round(min(decode.get(key, float("inf")), 1000.0 / ts), 3)
        elif doc.get("n_prompt", 0) > 0 and doc.get("n_gen", 0) == 0:
            key = str(doc["n_prompt"])
            prefill[key] = round(max(prefill.get(key, 0), ts))
    for doc in json_lines(os.path.join(work, "llama-batched.out")):
        if doc.get("pp") == 4096 and float(doc.get("speed_tg") or 0) > 0:
            key = str(doc["pl"])
            batched[key] = round(max(batched.get(key, 0), float(doc["speed_tg"])))
    if not (decode or prefill or batched):
        return None
    try:
        rev = open(os.path.join(work, "llama", "llama-cpp-revision.txt")).read().strip()
    except OSError:
        rev = "?"
    # llama-bench names the GPU it ran on; none means it found no usable GPU and ran on the CPU
    where = ", ".join(sorted(g for g in gpus if g)) or "NO GPU FOUND: it ran on the CPU"
    return {
        "about": "llama.cpp measured in this run, beside ours, on %s (revision %s, the llama.cpp node-llama-cpp bundles, "
        "built with CUDA for sm_90a by bench/gpu/build-llama.sh); the faster of flash attention on and off where both ran"
        % (where, rev[:12]),
        "decode_ms_per_token": decode,
        "prefill_tokens_per_second": prefill,
        "batched_tokens_per_second_at_4096": batched,
    }


def suite_rows(work, gtest_log):
    """(filter, status, seconds, tests passed/failed/skipped, first failure) per suite run."""
    rows = []
    try:
        lines = open(os.path.join(work, "suites.tsv")).read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        name, rc, seconds = line.split("\t")
        # device-run.sh names each run's JSON after its filter
        doc = load(os.path.join(work, "gtest-" + re.sub(r"[^A-Za-z0-9_]", "_", name) + ".json")) or {}
        passed = failed = skipped = 0
        first = ""
        for suite in doc.get("testsuites", []):
            for t in suite.get("testsuite", []):
                    if t.get("failures"):
                        failed += 1
                        if not first:
                            msg = t["failures"][0].get("failure", "").strip().splitlines()
                            first = t["name"] + ": " + " / ".join(msg[:3])
                    elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                        skipped += 1
                    else:
                        passed += 1
        if rc == "not run":
            status = "not run (time)"
        elif rc == "0":
            status = "passed"
        elif rc == "1":
            status = "FAILED"
        elif rc in ("124", "137"):
            status = "TIMED OUT"
        else:
            status = "CRASHED (exit %s)" % rc
        if status.startswith(("CRASHED", "TIMED")) and not first:
            first = "last test started: " + last_started(gtest_log, name)
        rows.append((name, status, seconds, passed, failed, skipped, first[:300]))
    return rows


def last_started(gtest_log, suite):
    """The last test a crashed suite started (its JSON is never written)."""
    try:
        text = open(gtest_log, errors="replace").read()
    except OSError:
        return "?"
    section = text.split("===== " + suite + "\n")[-1].split("\n===== ")[0]
    runs = re.findall(r"\[ RUN      \] (\S+)", section)
    tail = [l for l in section.splitlines() if l.strip()][-3:]
    return (runs[-1] if runs else "?") + " | " + " / ".join(tail)


def fmt(x, digits=0):
    return "-" if x is None else ("{:,.%df}" % digits).format(x)


def summary(work, out, llama_path):
    llama = llama_json(work) or load(llama_path) or {}
    rows = suite_rows(work, os.path.join(out, "gtest.log"))
    lines = ["# GPU run summary", ""]
    env = open(os.path.join(out, "env.txt"), errors="replace").read() if os.path.exists(os.path.join(out, "env.txt")) else ""
    gpu = re.search(r"\|\s+\d+\s+(NVIDIA[^|]*?)\s{2,}", env)
    rev = re.search(r"^revision (.*)$", env, re.M)
    lines += ["- GPU: %s" % (gpu.group(1).strip() if gpu else "none found"), "- build: %s" % (rev.group(1) if rev else "?"), ""]
    lines += ["## CUDA test suites", "", "| suite | result | s | passed | failed | skipped | first failure |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %s | %d | %d | %d | %s |" % (r[0], r[1], r[2], r[3], r[4], r[5], r[6].replace("|", "\\|")))
    lines.append("")

    runs = bench_json(work)["runs"]
    points = [p for run in runs for p in run.get("points", [])]

    def ours(test, kernels, graphs=None, **key):
        for p in points:
            if p["test"] == test and p["kernels"] == kernels and (graphs is None or p.get("graphs") == graphs):
                if all(p.get(k) == v for k, v in key.items()):
                    return p
        return None

    sets = []
    for p in points:
        if p["kernels"] not in sets:
            sets.append(p["kernels"])
    lines += ["## Speed (zero-weight SmolLM2-135M Q4_1, full size)", ""]
    lines += ["llama.cpp: " + llama.get("about", "(no recorded figures)"), ""]
    ll_dec = llama.get("decode_ms_per_token", {})
    ll_pre = llama.get("prefill_tokens_per_second", {})
    ll_bat = llama.get("batched_tokens_per_second_at_4096", {})
    head = "| test | llama.cpp | " + " | ".join("%s (graphs off / on)" % k for k in sets) + " |"
    lines += [head, "|---|---|" + "---|" * len(sets)]
    def measured(test, key, standard):
        return sorted(set(standard) | {p[key] for p in points if p["test"] == test})

    for ctx in measured("decode", "context", (0, 4096, 8192, 32768, 131072)):
        cells = []
        for k in sets:
            a, b = ours("decode", k, False, context=ctx), ours("decode", k, True, context=ctx)
            cells.append("%s / %s" % (fmt(a and a["ms_per_token"], 3), fmt(b and b["ms_per_token"], 3)))
        lines.append("| decode ms/token, context %d | %s | %s |" % (ctx, fmt(ll_dec.get(str(ctx)), 2), " | ".join(cells)))
    for n in measured("prefill", "tokens", (512, 8192)):
        cells = [fmt((ours("prefill", k, tokens=n) or {}).get("tokens_per_second")) for k in sets]
        lines.append("| prefill tok/s, %d tokens | %s | %s |" % (n, fmt(ll_pre.get(str(n))), " | ".join(cells)))
    for b in measured("batched", "batch", (1, 8, 32, 128)):
        cells = []
        for k in sets:
            x, y = ours("batched", k, False, batch=b), ours("batched", k, True, batch=b)
            cells.append("%s / %s" % (fmt(x and x["tokens_per_second"]), fmt(y and y["tokens_per_second"])))
        ctx = next((p["context"] for p in points if p["test"] == "batched"), 4096)
        lines.append("| batched tok/s, B %d at %d | %s | %s |" % (b, ctx, fmt(ll_bat.get(str(b))), " | ".join(cells)))
    lines += ["", "Lower is better for ms/token, higher for tok/s. '-' = not measured (time, crash, or not in the set's subset)."]
    unfinished = [r.get("kernels", "?") for r in runs if not r.get("finished")]
    if unfinished:
        lines.append("Bench runs cut short: " + ", ".join(unfinished) + ".")
    return "\n".join(lines) + "\n"


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "gtest-json":
        print(json.dumps(gtest_json(sys.argv[2]), indent=1))
    elif cmd == "bench-json":
        print(json.dumps(bench_json(sys.argv[2]), indent=1))
    elif cmd == "summary":
        sys.stdout.write(summary(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
