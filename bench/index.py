"""Benchmark the docid indexes on a generated corpus: native FM-index vs prefix tree vs numpy oracle.

The corpus imitates triple docids over a 128K vocabulary: `<docid_start> head , relation , tail <docid_end>`
with Zipf-distributed token ids (a few relations are very frequent, heads/tails are long-tailed).

Per kind, in one process: build time, peak RSS during the build, index bytes per token, the per-step cost
of decoding (extend + next_tokens, p50/p99 over real docid walks) and locate of 100 matches. Timings are
printed as ratios against the oracle (or the trie) measured in the same run. The trie and the oracle are
skipped above sizes where they would take too long (said so in the output). A projection of the FM build
peak to 500M tokens is made from builds at two sizes.

    python bench/index.py --tokens 2000000
    python bench/index.py --tokens 50000000 --project

Against SEAL's index (issue #18): ``--sdsl`` builds, beside grtool's FM-index, a SEAL-equivalent sdsl-lite
``csa_wt_int<>`` over the same integer sequence (every docid occurrence fed, as SEAL feeds its corpus; grtool is
fed the same occurrences), each build in a fresh child process with its peak RSS read from the OS (the child's VmHWM), and
prints per size the grtool/sdsl ratios of build time, build peak RSS, index size, step + next-token list p50
with a cold cache (what the process memoized dropped before each docid walk; sdsl keeps no cache) and locate <= 100 + map to
documents. The sdsl side is a small C++ program compiled here with g++; it needs the sdsl headers:

    apt-get install -y libsdsl-dev        # Debian's sdsl-lite 2.1.1 (benchmarking only; grtool never uses it)
    nice python bench/index.py --sdsl --sizes 2M,10M,50M [--flips]

Without the headers the sdsl columns are skipped with a message. ``--flips`` adds each docid's tail-first
spelling (as `index build --flips` does) and projects both builds' peak RSS to 500M docid tokens.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VOCAB = 128_256
START, END = VOCAB, VOCAB + 1  # the two markers, after the vocabulary as `index build` adds them
COMMA = 11
TRIE_MAX_TOKENS = 2_000_000
ORACLE_MAX_TOKENS = 20_000_000


def generate(tokens: int, seed: int = 0, distinct: bool = True, flips: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(flat token ids, lengths) of triple-shaped docids totalling about `tokens` tokens: distinct ones (as
    `index build` indexes them) or every occurrence (as SEAL indexes its corpus); ``flips`` adds each
    triple's tail-first spelling after it."""
    rng = np.random.default_rng(seed)
    relations = rng.zipf(1.3, size=2000) % VOCAB
    rel_pool = [rng.zipf(1.4, size=rng.integers(1, 4)) % VOCAB for _ in range(2000)]
    seqs, total = [], 0
    batch = 200_000
    while total < tokens:
        head_len = rng.integers(1, 6, batch)
        tail_len = rng.integers(1, 8, batch)
        heads = (rng.zipf(1.15, size=int(head_len.sum())) + 100) % VOCAB
        tails = (rng.zipf(1.15, size=int(tail_len.sum())) + 100) % VOCAB
        rel_ids = rng.zipf(1.5, size=batch) % len(rel_pool)
        hp = tp = 0
        for i in range(batch):
            h = heads[hp : hp + head_len[i]]
            t = tails[tp : tp + tail_len[i]]
            hp += head_len[i]
            tp += tail_len[i]
            seq = np.concatenate([[START], h, [COMMA], rel_pool[rel_ids[i]], [COMMA], t, [END]])
            seqs.append(seq)
            total += len(seq)
            if flips:
                seqs.append(np.concatenate([[START], t, [COMMA], rel_pool[rel_ids[i]], [COMMA], h, [END]]))
                total += len(seq)
            if total >= tokens:
                break
    del relations
    # distinct docids only, as `index build` indexes them
    if distinct:
        keyed = {s.tobytes(): s for s in seqs}
        seqs = list(keyed.values())
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    return np.concatenate(seqs).astype(np.int64), lengths


def _peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss it does not inherit the parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _build_child(kind: str, flat_path: str, lengths_path: str, out: str, memory_limit: str | None) -> None:
    """`python bench/index.py --child-build ...`: build in a fresh process so its peak RSS is the build's alone."""
    from grtool.index.kinds import KINDS

    flat = np.load(flat_path, mmap_mode="r")
    lengths = np.load(lengths_path)
    t = time.perf_counter()
    Path(out).mkdir(parents=True, exist_ok=True)
    extra = {"memory_limit": memory_limit} if memory_limit and kind == "fm" else {}
    params = KINDS[kind].write(Path(out), flat, lengths, **extra)
    (Path(out) / "params.json").write_text(json.dumps(params))
    print(json.dumps({"seconds": time.perf_counter() - t, "peak_rss_mb_self": _peak_rss_mb()}))


def _run_measured(argv: list[str]) -> tuple[dict, float]:
    """Run a child process; (its last stdout line as JSON, its peak RSS in MB as the OS accounts it: the VmHWM
    the child reads from /proc when its build is done. wait4's ru_maxrss is not used: it also counts the
    parent's pages the forked child held before exec)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(f"{argv[:3]} failed with exit code {proc.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    return result, result["peak_rss_mb_self"]


def build(kind: str, workdir: Path, flat_path: Path, lengths_path: Path, memory_limit: str | None = None) -> dict:
    out = workdir / kind
    argv = [sys.executable, __file__, "--child-build", kind, str(flat_path), str(lengths_path), str(out)]
    if memory_limit:
        argv += ["--memory-limit", memory_limit]
    result, peak = _run_measured(argv)
    result["peak_rss_mb"] = peak
    files = [f for f in out.iterdir() if f.name.startswith(("fm_", "trie_", "oracle_"))]
    result["bytes"] = sum(f.stat().st_size for f in files)
    return result


def walk_timings(index, walks: list[np.ndarray]) -> np.ndarray:
    """Seconds per decoding step (extend + next_tokens) over complete docid walks."""
    extend, next_tokens = index.extend, index.next_tokens
    times = []
    clock = time.perf_counter_ns
    for ids in walks:
        state = index.start()
        for t in ids:
            t0 = clock()
            state = extend(state, int(t))
            next_tokens(state)
            times.append(clock() - t0)
    return np.array(times) / 1e9


def locate_timing(index, prefixes: list[np.ndarray]) -> float:
    """Mean seconds to locate 100 matches of a frequent prefix."""
    t = []
    for ids in prefixes:
        state = index.start()
        for x in ids:
            state = index.extend(state, int(x))
        t0 = time.perf_counter()
        got = index.locate(state, 100)
        t.append(time.perf_counter() - t0)
        assert len(got) == min(100, index.count(state))
    return float(np.mean(t))


def run(tokens: int, workdir: Path, kinds: list[str]) -> dict:
    t = time.perf_counter()
    flat, lengths = generate(tokens)
    gen_s = time.perf_counter() - t
    np.save(workdir / "flat.npy", flat.astype(np.uint32))
    np.save(workdir / "lengths.npy", lengths.astype(np.uint32))  # as sdsl reads them
    n_tokens = int(flat.size)
    print(f"corpus: {n_tokens:,} tokens, {len(lengths):,} distinct docids, generated in {gen_s:.1f} s", file=sys.stderr)
    rng = np.random.default_rng(1)
    ends = np.cumsum(lengths)
    picks = rng.choice(len(lengths), size=min(2000, len(lengths)), replace=False)
    walks = [flat[ends[i] - lengths[i] : ends[i]] for i in picks]
    # frequent prefixes for locate: <docid_start> + the most common first head tokens
    first = flat[ends - lengths + 1]
    common = np.argsort(-np.bincount(first))[:20]
    loc_prefixes = [np.array([START, c]) for c in common if (first == c).sum() >= 100][:10] or [np.array([START])]
    del flat
    gc.collect()
    results = {"tokens": n_tokens, "docids": int(len(lengths))}
    for kind in kinds:
        if kind == "trie" and n_tokens > TRIE_MAX_TOKENS:
            print(f"trie: skipped above {TRIE_MAX_TOKENS:,} tokens (pure-Python build of every prefix is too slow)", file=sys.stderr)
            continue
        if kind == "numpy" and n_tokens > ORACLE_MAX_TOKENS:
            print(f"numpy oracle: skipped above {ORACLE_MAX_TOKENS:,} tokens (every step scans all matches)", file=sys.stderr)
            continue
        r = build(kind, workdir, workdir / "flat.npy", workdir / "lengths.npy")
        index = _load(kind, workdir, r)
        sample = walks if kind != "numpy" else walks[:200]
        steps = walk_timings(index, sample)
        r.update(
            bits_per_token=8 * r["bytes"] / n_tokens,
            step_p50_us=float(np.percentile(steps, 50) * 1e6),
            step_p99_us=float(np.percentile(steps, 99) * 1e6),
            steps=int(len(steps)),
            locate100_us=locate_timing(index, loc_prefixes) * 1e6,
        )
        results[kind] = r
        del index
        gc.collect()
    return results


def _load(kind: str, workdir: Path, built: dict):
    from grtool.index.kinds import KINDS

    out = workdir / kind
    return KINDS[kind].load(out, {"params": json.loads((out / "params.json").read_text())})


def report(res: dict) -> None:
    n = res["tokens"]
    print(f"\n== {n:,} tokens, {res['docids']:,} docids ==")
    base_kind = "numpy" if "numpy" in res else "trie" if "trie" in res else None
    header = f"{'kind':6} {'build s':>9} {'peak RSS MB':>12} {'bits/token':>11} {'step p50 us':>12} {'step p99 us':>12} {'locate100 us':>13}"
    print(header)
    for kind in ("fm", "trie", "numpy"):
        if kind in res:
            r = res[kind]
            print(f"{kind:6} {r['seconds']:9.2f} {r['peak_rss_mb']:12.0f} {r['bits_per_token']:11.2f} {r['step_p50_us']:12.2f} {r['step_p99_us']:12.2f} {r['locate100_us']:13.1f}")
    if base_kind and "fm" in res:
        b, f = res[base_kind], res["fm"]
        print(f"fm vs {base_kind}: step p50 {b['step_p50_us'] / f['step_p50_us']:.1f}x faster, "
              f"locate {b['locate100_us'] / f['locate100_us']:.1f}x, size {b['bytes'] / f['bytes']:.2f}x smaller")  # fmt: skip
    if "fm" in res and n >= 40_000_000:  # the targets are stated for 50M tokens
        f = res["fm"]
        ok = lambda c: "ok" if c else "MISSED"  # noqa: E731
        print(f"targets (at 50M tokens): step p50 <= 10 us {ok(f['step_p50_us'] <= 10)}, "
              f"<= 24 bits/token {ok(f['bits_per_token'] <= 24)}, build <= 60 s {ok(f['seconds'] <= 60)}")  # fmt: skip


# ------------------------------------------------------------------------------- against SEAL's sdsl index

SDSL_SOURCE = r"""
// SEAL-equivalent baseline: sdsl-lite csa_wt_int<> over the reversed integer text (compiled by bench/index.py).
#include <sdsl/suffix_arrays.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>
using namespace sdsl;
using clk = std::chrono::steady_clock;
static double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }
static std::vector<uint32_t> read_u32(const std::string& p) {
    std::ifstream f(p, std::ios::binary | std::ios::ate);
    size_t n = f.tellg() / 4;
    std::vector<uint32_t> v(n);
    f.seekg(0);
    f.read(reinterpret_cast<char*>(v.data()), n * 4);
    return v;
}
static long vm_hwm_kb() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}
static std::vector<std::vector<uint32_t>> read_lists(const std::string& p) {  // [count][len, ids...]...
    auto v = read_u32(p);
    std::vector<std::vector<uint32_t>> out;
    size_t i = 1;
    for (uint32_t k = 0; k < v[0]; ++k) {
        uint32_t len = v[i++];
        out.emplace_back(v.begin() + i, v.begin() + i + len);
        i += len;
    }
    return out;
}
static double pct(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(q / 100.0 * (v.size() - 1) + 0.5))];
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const std::string dir = argv[1];
    typedef csa_wt_int<> csa_t;
    csa_t csa;
    auto t0 = clk::now();
    {
        // Stream the reversed text (token id + 2, separator 1) into sdsl's int_vector file, then build
        // semi-externally (sdsl's construct spills its temporaries to the cache directory).
        std::ifstream f(dir + "/sdsl_text.u32", std::ios::binary);
        int_vector_buffer<> buf(dir + "/sdsl_text.sdsl", std::ios::out, 1 << 20, 32);
        std::vector<uint32_t> chunk(1 << 20);
        while (f) {
            f.read(reinterpret_cast<char*>(chunk.data()), chunk.size() * 4);
            size_t got = f.gcount() / 4;
            for (size_t i = 0; i < got; ++i) buf.push_back(chunk[i]);
        }
        buf.close();
        cache_config cfg(true, dir, "sdsl");
        construct(csa, dir + "/sdsl_text.sdsl", cfg, 0);
    }
    auto t1 = clk::now();
    const double build_s = secs(t0, t1);
    const long peak_kb = vm_hwm_kb();
    const uint64_t bytes = size_in_bytes(csa);
    const uint64_t n = csa.size() - 1;  // without sdsl's sentinel
    auto lengths = read_u32(dir + "/lengths.u32");
    auto seq2doc = read_u32(dir + "/seq2doc.u32");
    std::vector<uint64_t> seps(lengths.size());
    uint64_t pos = 0;
    for (size_t i = 0; i < lengths.size(); ++i) { seps[i] = pos; pos += lengths[i] + 1; }
    auto walks = read_lists(dir + "/walks.u32");
    auto locs = read_lists(dir + "/locate.u32");

    const uint64_t sigma = csa.sigma;
    std::vector<uint64_t> cs(sigma), ri(sigma), rj(sigma);
    std::vector<uint32_t> ids;
    std::vector<uint64_t> counts;
    uint64_t checksum = 0;
    auto walk_pass = [&](std::vector<double>& times) {
        for (auto& w : walks) {
            uint64_t l = 0, r = csa.size() - 1;
            backward_search(csa, l, r, (uint64_t)1, l, r);  // anchored at a separator
            for (uint32_t t : w) {
                auto a = clk::now();
                uint64_t l2, r2;
                auto cnt = backward_search(csa, l, r, (uint64_t)t + 2, l2, r2);
                ids.clear();
                counts.clear();
                if (cnt) {
                    uint64_t k = 0;
                    interval_symbols(csa.wavelet_tree, l2, r2 + 1, k, cs, ri, rj);
                    for (uint64_t x = 0; x < k; ++x)
                        if (cs[x] > 1) { ids.push_back((uint32_t)(cs[x] - 2)); counts.push_back(rj[x] - ri[x]); }
                }
                auto b = clk::now();
                times.push_back(secs(a, b));
                checksum += ids.size();
                l = l2; r = r2;
                if (!cnt) break;
            }
        }
    };
    std::vector<double> cold, warm;
    walk_pass(cold);
    walk_pass(warm);
    std::vector<double> loc_t;
    uint64_t loc_docs = 0;
    for (auto& p : locs) {
        uint64_t l = 0, r = csa.size() - 1;
        backward_search(csa, l, r, (uint64_t)1, l, r);
        for (uint32_t t : p) backward_search(csa, l, r, (uint64_t)t + 2, l, r);
        const uint64_t m = p.size() + 1;
        auto a = clk::now();
        std::vector<uint32_t> docs;
        const uint64_t take = std::min<uint64_t>(100, r + 1 - l);
        for (uint64_t i = l; i < l + take; ++i) {
            const uint64_t q = csa[i];
            const uint64_t j = n - q - m;  // the prefix's separator in T
            const uint64_t seq = std::upper_bound(seps.begin(), seps.end(), j) - seps.begin() - 1;
            docs.push_back(seq2doc[seq]);
        }
        std::sort(docs.begin(), docs.end());
        docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
        auto b = clk::now();
        loc_t.push_back(secs(a, b));
        loc_docs += docs.size();
    }
    double loc_mean = 0;
    for (double x : loc_t) loc_mean += x;
    loc_mean /= std::max<size_t>(1, loc_t.size());
    printf("{\"seconds\": %.4f, \"peak_rss_mb_self\": %.1f, \"bytes\": %llu, \"step_cold_p50_us\": %.3f, \"step_cold_p99_us\": %.3f, "
           "\"step_warm_p50_us\": %.3f, \"step_warm_p99_us\": %.3f, \"locate100_us\": %.3f, \"locate_docs\": %llu, \"checksum\": %llu, \"n\": %llu}\n",
           build_s, peak_kb / 1024.0, (unsigned long long)bytes, pct(cold, 50) * 1e6, pct(cold, 99) * 1e6, pct(warm, 50) * 1e6,
           pct(warm, 99) * 1e6, loc_mean * 1e6, (unsigned long long)loc_docs, (unsigned long long)checksum, (unsigned long long)n);
    return 0;
}
"""

GOALS = {"build_s": 0.25, "peak_rss": 1.0, "bytes": 0.8, "step_cold_p50": 0.5, "locate": 0.3}
FIGURES = {
    "build_s": "build time",
    "peak_rss": "build peak RSS",
    "bytes": "index size",
    "step_cold_p50": "step + next-token list p50, cache cold",
    "locate": "locate <= 100 + map to documents",
}


def sdsl_program(workdir: Path) -> Path | None:
    """Compile the sdsl baseline; None (with a message) when g++ or the sdsl headers are missing."""
    if not Path("/usr/include/sdsl/suffix_arrays.hpp").is_file():
        print("sdsl: the sdsl columns are skipped: the sdsl-lite headers are missing (/usr/include/sdsl); "
              "install them for benchmarking with `apt-get install -y libsdsl-dev`", file=sys.stderr)  # fmt: skip
        return None
    src, exe = workdir / "sdsl_bench.cpp", workdir / "sdsl_bench"
    src.write_text(SDSL_SOURCE)
    cmd = ["g++", "-O3", "-march=native", "-std=c++14", "-DNDEBUG", str(src), "-o", str(exe), "-lsdsl", "-ldivsufsort", "-ldivsufsort64"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        print("sdsl: skipped (no g++ to compile the baseline)", file=sys.stderr)
        return None
    if done.returncode != 0:
        print("sdsl: skipped: the baseline does not compile; the sdsl-lite headers and library are needed "
              "(apt-get install -y libsdsl-dev)\n" + done.stderr[-800:], file=sys.stderr)  # fmt: skip
        return None
    return exe


def _write_lists(path: Path, lists: list[np.ndarray]) -> None:
    out = [len(lists)]
    for ids in lists:
        out += [len(ids), *map(int, ids)]
    np.asarray(out, dtype=np.uint32).tofile(path)


def _grtool_queries(workdir: Path, walks: list[np.ndarray], loc_prefixes: list[np.ndarray], seq2doc: np.ndarray) -> dict:
    from grtool.index.kinds import FMIndex

    out = workdir / "fm"
    params = json.loads((out / "params.json").read_text())
    clock = time.perf_counter_ns
    cold, checksum = [], 0
    index = FMIndex.load(out, {"params": params})
    extend, next_tokens = index.extend, index.next_tokens
    for ids in walks:  # cold: what the process memoized is dropped before each walk (what the index persists stays)
        if hasattr(index.native, "clear_cache"):
            index.native.clear_cache()
        state = index.start()
        for t in ids:
            t0 = clock()
            state = extend(state, int(t))
            got = next_tokens(state)
            cold.append(clock() - t0)
            checksum += len(got[0])
    walk_timings(index, walks)  # warm up
    warm = walk_timings(index, walks)

    def located_docs(state) -> np.ndarray:
        return np.unique(seq2doc[index.locate(state, 100)[:, 0]])

    loc = []
    for ids in loc_prefixes:  # one untimed pass: page faults of the memory maps, numpy's first-call setup
        located_docs(index.walk(ids))
    for ids in loc_prefixes:
        state = index.walk(ids)
        t0 = clock()
        docs = located_docs(state)
        loc.append(clock() - t0)
        assert len(docs) >= 1
    cold_s = np.array(cold) / 1e9
    return {
        "step_cold_p50_us": float(np.percentile(cold_s, 50) * 1e6), "step_cold_p99_us": float(np.percentile(cold_s, 99) * 1e6),
        "step_warm_p50_us": float(np.percentile(warm, 50) * 1e6), "step_warm_p99_us": float(np.percentile(warm, 99) * 1e6),
        "locate100_us": float(np.mean(loc) / 1e3), "checksum": checksum,
    }  # fmt: skip


def compare_sdsl(tokens: int, workdir: Path, exe: Path | None, flips: bool, memory_limit: str | None, n_walks: int = 1000) -> dict:
    """grtool vs sdsl on every occurrence of a generated corpus of `tokens` tokens (see the module docstring)."""
    flat, lengths = generate(tokens, distinct=False, flips=flips)
    per_doc = 16 if flips else 8  # triples per document: sequence i is in document i // per_doc
    seq2doc = (np.arange(len(lengths)) // per_doc).astype(np.uint32)
    flat32 = flat.astype(np.uint32)
    np.save(workdir / "flat.npy", flat32)
    np.save(workdir / "lengths.npy", lengths.astype(np.uint32))  # as sdsl reads them
    n_tokens = int(flat.size)
    rng = np.random.default_rng(1)
    ends = np.cumsum(lengths)
    picks = rng.choice(len(lengths), size=min(n_walks, len(lengths)), replace=False)
    walks = [flat32[ends[i] - lengths[i] : ends[i]] for i in picks]
    first = flat[ends - lengths + 1]
    common = np.argsort(-np.bincount(first))[:20]
    loc_prefixes = [np.array([START, c]) for c in common if (first == c).sum() >= 100][:10] or [np.array([START])]
    res: dict = {"tokens": n_tokens, "sequences": int(len(lengths))}
    print(f"corpus: {n_tokens:,} tokens, {len(lengths):,} docid occurrences{' (with flips)' if flips else ''}", file=sys.stderr)
    try:
        g = build("fm", workdir, workdir / "flat.npy", workdir / "lengths.npy", memory_limit)
    except RuntimeError:
        print(f"grtool: the build was refused or failed under --memory-limit {memory_limit}", file=sys.stderr)
        raise
    if memory_limit:
        from grtool.index.kinds import parse_bytes

        within = g["peak_rss_mb"] <= parse_bytes(memory_limit) / 2**20
        print(f"grtool build peak {g['peak_rss_mb']:.0f} MB, --memory-limit {memory_limit}: {'within' if within else 'OVER'}", file=sys.stderr)
    g.update(_grtool_queries(workdir, walks, loc_prefixes, seq2doc))
    res["grtool"] = g
    shutil.rmtree(workdir / "fm", ignore_errors=True)
    if exe is not None:
        seps = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1] + 1, out=seps[1:])
        text = np.ones(n_tokens + len(lengths), dtype=np.uint32)  # separator = 1, token t = t + 2 (0 is sdsl's)
        mask = np.ones(len(text), bool)
        mask[seps] = False
        text[mask] = flat32 + 2
        del mask
        text[::-1].tofile(workdir / "sdsl_text.u32")
        del text
        lengths.astype(np.uint32).tofile(workdir / "lengths.u32")
        seq2doc.tofile(workdir / "seq2doc.u32")
        _write_lists(workdir / "walks.u32", walks)
        _write_lists(workdir / "locate.u32", loc_prefixes)
        sd, peak = _run_measured([str(exe), str(workdir)])
        sd["peak_rss_mb"] = peak
        if sd["checksum"] != 2 * g["checksum"]:
            print(f"WARNING: next-token lists differ (sdsl {sd['checksum'] // 2}, grtool {g['checksum']} entries)", file=sys.stderr)
        res["sdsl"] = sd
        for f in workdir.glob("sdsl_*"):
            f.unlink()
    del flat, flat32
    gc.collect()
    return res


def _ratios(r: dict) -> dict:
    g, s = r["grtool"], r["sdsl"]
    return {
        "build_s": g["seconds"] / s["seconds"],
        "peak_rss": g["peak_rss_mb"] / s["peak_rss_mb"],
        "bytes": g["bytes"] / s["bytes"],
        "step_cold_p50": g["step_cold_p50_us"] / s["step_cold_p50_us"],
        "step_warm_p50": g["step_warm_p50_us"] / s["step_warm_p50_us"],
        "locate": g["locate100_us"] / s["locate100_us"],
    }


def report_sdsl(results: list[dict], flips: bool) -> None:
    print("\n== build memory and cold steps (fresh child processes; peak RSS from the OS) ==")
    print(f"{'tokens':>12} {'side':7} {'build s':>9} {'peak MB':>9} {'bits/tok':>9} {'cold p50':>9} {'cold p99':>9} {'warm p50':>9} {'locate us':>10}")
    for r in results:
        for side in ("grtool", "sdsl"):
            if side in r:
                x = r[side]
                print(f"{r['tokens']:12,} {side:7} {x['seconds']:9.2f} {x['peak_rss_mb']:9.0f} {8 * x['bytes'] / r['tokens']:9.2f} "
                      f"{x['step_cold_p50_us']:9.2f} {x['step_cold_p99_us']:9.2f} {x['step_warm_p50_us']:9.2f} {x['locate100_us']:10.1f}")  # fmt: skip
    both = [r for r in results if "sdsl" in r]
    if not both:
        print("(no sdsl columns: the baseline was skipped)")
        return
    ratios = [_ratios(r) for r in both]
    print("\n| figure (grtool / sdsl, all occurrences) | " + " | ".join(f"{r['tokens'] / 1e6:.0f}M tokens" for r in both) + " | goal |")
    print("|---|" + "---|" * len(both) + "---|")
    for key, label in FIGURES.items():
        cells = [f"{x[key]:.2f}{'' if x[key] <= GOALS[key] else ' ✗'}" for x in ratios]
        print(f"| {label} | " + " | ".join(cells) + f" | ≤ {GOALS[key]} |")
    print("| (step p50, cache warm) | " + " | ".join(f"{x['step_warm_p50']:.2f}" for x in ratios) + " | |")
    if len(both) >= 2:
        (a, b) = both[-2], both[-1]
        target = 500_000_000 * (2 if flips else 1)
        line = []
        for side in ("grtool", "sdsl"):
            slope = (b[side]["peak_rss_mb"] - a[side]["peak_rss_mb"]) / (b["tokens"] - a["tokens"])
            proj = b[side]["peak_rss_mb"] + slope * (target - b["tokens"])
            line.append(f"{side} {proj / 1024:.1f} GB, {b[side]['seconds'] * target / b['tokens'] / 60:.0f} min, index {b[side]['bytes'] * target / b['tokens'] / 2**30:.2f} GB")
        print(f"\nprojection to 500M docid tokens{' with --flips (~1G indexed tokens)' if flips else ''} (linear from "
              f"{a['tokens']:,} and {b['tokens']:,}): build peak / time / size: " + "; ".join(line))  # fmt: skip


def _size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_000_000, help="corpus size in tokens (default 1M)")
    ap.add_argument("--kinds", default="fm,trie,numpy")
    ap.add_argument("--project", action="store_true", help="also build the FM-index at tokens/4 and project the build peak to 500M tokens")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sdsl", action="store_true", help="compare with a SEAL-equivalent sdsl csa_wt_int<> index (needs libsdsl-dev)")
    ap.add_argument("--sizes", default="2M,10M,50M", help="with --sdsl: corpus sizes, run one at a time (default 2M,10M,50M)")
    ap.add_argument("--flips", action="store_true", help="with --sdsl: add tail-first spellings; project to 500M docid tokens")
    ap.add_argument("--memory-limit", default=None, help="passed to grtool's FM build (e.g. 2G): refused when it would not fit; the peak is checked")
    ap.add_argument("--child-build", nargs=4, metavar=("KIND", "FLAT", "LENGTHS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_build:
        _build_child(*args.child_build, args.memory_limit)
        return
    if args.sdsl:
        results = []
        with tempfile.TemporaryDirectory(prefix="grtool-bench-") as tmp:
            exe = sdsl_program(Path(tmp))
            for size in args.sizes.split(","):
                work = Path(tmp) / f"size-{size}"
                work.mkdir()
                results.append(compare_sdsl(_size(size), work, exe, args.flips, args.memory_limit))
                shutil.rmtree(work, ignore_errors=True)
                report_sdsl(results[-1:], args.flips)
        report_sdsl(results, args.flips)
        if args.json:
            print(json.dumps(results))
        return
    kinds = args.kinds.split(",")
    with tempfile.TemporaryDirectory(prefix="grtool-bench-") as tmp:
        res = run(args.tokens, Path(tmp), kinds)
    report(res)
    if args.project and "fm" in res:
        with tempfile.TemporaryDirectory(prefix="grtool-bench-") as tmp:
            small = run(args.tokens // 4, Path(tmp), ["fm"])
        report(small)
        (n1, m1), (n2, m2) = (small["tokens"], small["fm"]["peak_rss_mb"]), (res["tokens"], res["fm"]["peak_rss_mb"])
        slope = (m2 - m1) / (n2 - n1)
        proj = m2 + slope * (500_000_000 - n2)
        secs = res["fm"]["seconds"] * 500_000_000 / n2
        print(f"\nprojection to 500M tokens (linear in peak RSS from {n1:,} and {n2:,}): {slope * 1e6:.1f} MB per 1M tokens "
              f"-> peak {proj / 1024:.1f} GB ({'within' if proj < 24 * 1024 else 'OVER'} 24 GB), build ~{secs / 60:.0f} min "
              f"(linear; suffix sorting is slightly superlinear), index {res['fm']['bits_per_token'] * 5e8 / 8 / 2**30:.2f} GB")  # fmt: skip
        res["projection_500M"] = {"peak_rss_gb": proj / 1024, "build_minutes": secs / 60}
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
