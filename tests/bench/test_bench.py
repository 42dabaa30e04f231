"""cyback.bench: the quick mode's code path on tiny sizes without peers, the
timing method, output checks, the report and --compare. No timing is asserted."""
import io
import json
import os

import numpy as np
import pytest

from cyback.bench import __main__ as cli
from cyback.bench import compare, machine, ops, timing


def test_check_close_passes_matching_and_raises_naming_the_peer():
    ref = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    assert timing.check_close("peer", ref + 1e-6, ref) <= 1e-4
    with pytest.raises(AssertionError, match="peer"):
        timing.check_close("peer", ref + 1e-2, ref)
    with pytest.raises(AssertionError, match="shape"):
        timing.check_close("peer", ref[:1], ref)
    # a NaN never passes
    with pytest.raises(AssertionError):
        timing.check_close("peer", np.full_like(ref, np.nan), ref)


def test_time_alternated_rotates_engines_and_keeps_latencies():
    order = []
    engines = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    stats = timing.time_alternated(engines, blocks=4, block_seconds=1e-4, warmup_seconds=0,
                                   keep_latencies=True, max_calls=3)
    assert set(stats) == {"a", "b"}
    for s in stats.values():
        assert s["blocks"] == 4 and 1 <= s["calls"] <= 3
        assert len(s["latencies_s"]) == 4 * s["calls"]
        assert s["p90_s"] >= s["median_s"] > 0
    # after the warm-up the blocks run a, b then b, a: the first engine alternates
    timed = order[-4 * (stats["a"]["calls"] + stats["b"]["calls"]):]
    firsts = [timed[0]]
    i = stats["a"]["calls"] + stats["b"]["calls"]
    firsts.append(timed[i])
    assert firsts == ["a", "b"]


def test_paired_ratio_takes_each_round_apart():
    # slow spells over both blocks of round 0 and over "a" alone in rounds
    # 1 and 4: the ratio of the two medians says 3, the rounds mostly 1
    stats = {"a": {"block_means_s": [3.0, 3.0, 1.0, 1.0, 3.0]},
             "b": {"block_means_s": [3.0, 1.0, 1.0, 1.0, 1.0]}}
    r = timing.paired_ratio(stats, "a", "b")
    assert r == {"median": 1.0, "q25": 1.0, "q75": 3.0, "rounds": 5}
    assert timing.paired_ratio(stats, "b", "a")["median"] == 1.0
    with pytest.raises(ValueError, match="same number of blocks"):
        timing.paired_ratio({"a": {"block_means_s": [1.0]}, "b": {"block_means_s": []}},
                            "a", "b")


def test_time_alternated_keeps_block_means_for_paired_ratios():
    stats = timing.time_alternated({"a": lambda: None, "b": lambda: None}, blocks=3,
                                   block_seconds=1e-4, warmup_seconds=0, max_calls=2,
                                   settle_seconds=0)
    for s in stats.values():
        assert len(s["block_means_s"]) == 3 and min(s["block_means_s"]) > 0
    assert timing.paired_ratio(stats, "a", "b")["rounds"] == 3


def test_percentile_and_summary():
    s = timing.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median_s"] == 3.0
    assert s["p90_s"] == pytest.approx(np.percentile([1, 2, 3, 4, 100], 90))
    assert s["q25_s"] == 2.0 and s["blocks"] == 5


@pytest.mark.parametrize("make", ops.CASES, ids=lambda f: f.__name__)
def test_op_cases_agree_with_numpy_on_tiny_sizes(make):
    case = make("tiny", None, 1)
    assert "cyback" in case.engines
    errors = ops.checked(case)
    assert all(e <= 1e-4 for e in errors.values())
    if case.family != "ctc":
        assert "numpy" in errors


def test_numpy_conv_reference_matches_a_direct_loop(rng):
    x = rng.standard_normal((2, 5, 4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)
    got = ops.numpy_conv(x, w, (2, 1), "valid")
    want = np.zeros((2, 2, 3, 4), np.float32)
    for i in range(2):
        for j in range(3):
            want[:, i, j] = np.tensordot(x[:, 2 * i:2 * i + 3, j:j + 2], w, axes=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_quick_run_writes_json_and_report(tmp_path):
    args = cli.parse_args(["--quick", "--suites", "ops", "--peers", "numpy", "--threads", "1",
                           "--cases", "dot,conv2d,overhead", "--out", str(tmp_path)])
    stream = io.StringIO()
    doc = cli.run(args, stream)
    with open(tmp_path / "results.json") as f:
        saved = json.load(f)
    assert saved["threads"] == 1 and saved["sgemm_gflops"] > 0
    cases = {r["case"] for r in saved["rows"]}
    assert len(cases) == 3
    assert {r["engine"] for r in saved["rows"]} == {"cyback", "numpy"}
    for r in saved["rows"]:
        assert r["p90_us"] >= r["median_us"] > 0
        if r["engine"] == "cyback":
            assert r["cyback_speedup"] == 1.0
    assert any(r.get("gflops") for r in saved["rows"])
    assert any(r.get("latencies_us") for r in saved["rows"])
    report = open(doc["report"]).read()
    assert "## Method" in report and "## Machine" in report and "dot " in report
    assert "100%" in stream.getvalue()  # the progress bar reached its end


def test_bad_suite_and_threads_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        cli.run(cli.parse_args(["--quick", "--suites", "nope", "--out", str(tmp_path)]),
                io.StringIO())
    with pytest.raises(SystemExit):
        cli.parse_args(["--threads", "0"])


def _doc(path, rows):
    with open(path, "w") as f:
        json.dump({"rows": rows}, f)
    return str(path)


def test_compare_reports_changes_beyond_noise_only(tmp_path):
    def row(case, med, p90):
        return {"suite": "ops", "case": case, "engine": "cyback", "median_us": med, "p90_us": p90}
    old = _doc(tmp_path / "old.json", [row("a", 100, 105), row("b", 100, 105), row("c", 100, 160),
                                       row("d", 100, 105)])
    new = _doc(tmp_path / "new.json", [row("a", 150, 155), row("b", 50, 52), row("c", 140, 150),
                                       row("d", 104, 108)])
    slower, faster, same = compare.compare(old, new, threshold=0.10)
    assert [k[1] for k, *_ in slower] == ["a"]
    assert [k[1] for k, *_ in faster] == ["b"]
    assert sorted(k[1] for k, *_ in same) == ["c", "d"]  # c moved within its own 60% spread
    text = compare.format_comparison(old, new)
    assert "1 slower, 1 faster" in text
    assert cli.main(["--compare", old, new]) == 0


def test_progress_bar_plain_lines():
    out = io.StringIO()
    bar = cli.Progress(2, out)
    bar.step("first")
    bar.step("second")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "50%" in lines[0] and "100%" in lines[1]


def test_machine_description():
    d = machine.describe(threads=2)
    assert d["logical_cores"] >= 1 and d["threads"] == 2
    assert "numpy" in d["versions"] and len(d["load"]) == 3


def test_model_suite_mlp_without_peers():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "cyback":
        pytest.skip("Keras was imported with another backend")
    from cyback.bench import models
    rows = models.run_models(["mlp", "resnet"], [1], threads=1, quick=True, peers={}, blocks=2)
    engines = {(r["model"], r["engine"]) for r in rows}
    assert ("mlp", "cyback K.function") in engines
    assert ("resnet", "cyback predict_on_batch") in engines
    assert "mlp_b1_kfunction_us" in models.summary(rows)


def test_model_peers_match_cyback_when_installed():
    torch = pytest.importorskip("torch")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "cyback":
        pytest.skip("Keras was imported with another backend")
    from cyback.bench import models
    peers = {"torch": torch}
    for name in models.MODELS:
        # model_engines raises if a peer's output differs from cyback's
        engines, errors, skipped = models.model_engines(name, 2, peers, wanted=("torch",))
        assert not skipped and errors["torch"] <= 1e-4


def test_kernel_scripts_are_found_in_a_checkout():
    from cyback.bench import scripts
    if scripts.benchmarks_dir() is None:
        pytest.skip("cyback installed without its benchmarks/ folder")
    names = scripts.script_names()
    assert "bench_conv.py" in names and "bench_models.py" not in names
    # every script's smoke command line is one it accepts
    assert set(scripts.QUICK_ARGS) <= set(names)


class _FakeClock:
    """time for timing.settle: sleep advances the wall clock; the process
    uses a whole core during each of its first ``busy_steps`` sleeps (a
    peer's worker spinning on after its last call), none after."""

    def __init__(self, busy_steps):
        self.now = self.cpu = 0.0
        self.busy_steps = busy_steps

    def perf_counter(self):
        return self.now

    def process_time(self):
        return self.cpu

    def sleep(self, seconds):
        self.now += seconds
        if self.busy_steps > 0:
            self.busy_steps -= 1
            self.cpu += seconds


def test_settle_waits_for_a_spinning_thread_to_stop(monkeypatch):
    # no real time: a fake clock says when the process spins, so the test
    # holds on a loaded machine
    clock = _FakeClock(busy_steps=1 + 12)      # the first sleep, then 12 steps
    monkeypatch.setattr(timing, "time", clock)
    assert timing.settle(0.01, step=0.01, most=2.0)
    assert clock.now == pytest.approx(0.01 + 13 * 0.01)
    # an idle process settles after one step; one that never stops hits the bound
    clock = _FakeClock(busy_steps=0)
    monkeypatch.setattr(timing, "time", clock)
    assert timing.settle(0.0, step=0.01)
    assert clock.now == pytest.approx(0.01)
    clock = _FakeClock(busy_steps=10 ** 6)
    monkeypatch.setattr(timing, "time", clock)
    assert not timing.settle(0.0, step=0.01, most=0.2)
    assert clock.now == pytest.approx(0.2, abs=0.011)


# ------------------------------------------------------------ what the run says

def test_availability_says_what_was_found_and_what_not(monkeypatch):
    from cyback.bench import found
    versions = {"numpy": "2.0", "torch": None, "onnxruntime": None, "onnx": None,
                "tensorflow": "2.17", "tf_keras": "2.17", "keras": "2.3.1",
                "matplotlib": None, "openvino": None}
    monkeypatch.setattr(found, "_version", lambda module, dist: versions[module])
    rows = found.availability(wanted={"numpy", "torch"})
    assert [r["name"] for r in rows][-1] == "openvino" and rows[-1]["other"]
    assert not found.have(rows, "matplotlib") and found.have(rows, "numpy")
    text = "\n".join(found.format_availability(rows))
    assert "numpy 2.0: reference implementations" in text
    assert "tensorflow 2.17: TensorFlow peer (needs tf_keras) (installed, left out: " \
           "not in --peers)" in text
    missing = text.split("not found")[1]
    for name in ("torch", "onnxruntime", "matplotlib"):
        assert "\n  %s: " % name in missing
    assert "openvino not found: benchmarks/bench_applications.py only" in text


def test_availability_finds_what_is_installed():
    from cyback.bench import found
    rows = {r["name"]: r for r in found.availability()}
    assert rows["numpy"]["version"] == np.__version__
    assert found._version("no_such_module_here", "no-such-module-here") is None


def test_summary_keys_get_human_labels():
    from cyback.bench.report import summary_rows
    rows = dict(summary_rows({"geomean_vs_ort_b1": 1.07, "mlp_b1_kfunction_us": 5.239,
                              "geomean_vs_torch.jit_b32": 0.5}))
    assert rows["cyback speed-up over ONNX Runtime, batch 1 (geometric mean over the "
                "models)"] == "1.07x"
    assert rows["MLP 32-64-64-10 at batch 1, one K.function call"] == "5.2 us"
    assert rows["cyback speed-up over TorchScript, batch 32 (geometric mean over the "
                "models)"] == "0.50x"
    assert not any("_" in label for label in rows)


def test_a_case_no_peer_ran_gets_no_empty_slot_in_the_chart():
    from cyback.bench.report import speedup_series
    rows = [{"case": "dot", "engine": "cyback", "cyback_speedup": 1.0},
            {"case": "dot", "engine": "numpy", "cyback_speedup": 2.0},
            {"case": "ctc_batch_cost", "engine": "cyback", "cyback_speedup": 1.0},
            {"case": "conv", "engine": "cyback", "cyback_speedup": 1.0},
            {"case": "conv", "engine": "torch", "cyback_speedup": 3.0}]
    labels, series, alone = speedup_series(rows, lambda r: r["case"])
    assert labels == ["dot", "conv"] and alone == ["ctc_batch_cost"]
    assert series == {"numpy": [2.0, None], "torch": [None, 3.0]}


def test_the_roofline_legend_keeps_small_values():
    from cyback.bench.charts import roofline_label
    assert roofline_label(0.41) == "sgemm roofline (0.41 GFLOPS)"
    assert roofline_label(119.34) == "sgemm roofline (119 GFLOPS)"


def test_the_command_says_what_it_found_and_lists_the_files_it_wrote(tmp_path, capsys):
    assert cli.main(["--quick", "--suites", "ops", "--peers", "numpy", "--threads", "1",
                     "--cases", "dot,ctc", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "peers and tools" in captured.err and "found:" in captured.err
    out = captured.out
    assert "case" in out and "cyback speed-up" in out
    assert "_us" not in out and "geomean_vs" not in out       # labels, not keys
    listed = out.split("wrote:\n")[1].split()
    assert str(tmp_path / "results.json") in listed and str(tmp_path / "report.md") in listed
    assert all(os.path.exists(p) for p in listed)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in listed)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["command"].startswith("python -m cyback.bench --quick")
    assert any(r["name"] == "numpy" for r in doc["found"])
    report = (tmp_path / "report.md").read_text()
    assert "## Peers and tools" in report


def test_no_charts_still_writes_the_report(tmp_path):
    args = cli.parse_args(["--quick", "--suites", "ops", "--peers", "numpy", "--threads", "1",
                           "--cases", "dot", "--out", str(tmp_path), "--no-charts"])
    doc = cli.run(args, io.StringIO())
    assert doc["files"] == [str(tmp_path / "results.json"), str(tmp_path / "report.md")]
