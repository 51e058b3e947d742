"""`dspark bench-trace`'s summary: means per server, traced/untraced ratios, output identity."""
import argparse

from dspark.ops.harness.bench_trace import markdown, summarize


def test_summary_averages_each_server_and_compares_them():
    runs = [{"repeat": r, "mode": mode, "goodput_tok_s": speed, "tau": 2.0, "rounds": 10, "round_ms": ms,
             "outputs": [[1, 2, 3]]}
            for r in range(2) for mode, speed, ms in (("traced", 98.0 + r, 10.2), ("traced, no round spans", 99.0 + r, 10.1),
                                                      ("untraced", 100.0 + r, 10.0))]
    args = argparse.Namespace(target="t", drafter="d", limit=8, max_new_tokens=48, concurrency=4, repeats=2)
    report = summarize(runs, args, spans=40, cpu=True)
    assert report["mean"]["traced"]["goodput_tok_s"] == 98.5 and report["mean"]["untraced"]["goodput_tok_s"] == 100.5
    assert abs(report["goodput_ratio"] - 98.5 / 100.5) < 1e-12 and abs(report["round_cost_ratio"] - 1.02) < 1e-12
    assert report["identical_outputs"] and report["trace_round_ratio"] == 0.1
    assert abs(report["round_spans_goodput_ratio"] - 98.5 / 99.5) < 1e-12
    assert "goodput 0.980x, round cost 1.020x; dspark's round spans alone: goodput 0.990x; 40 spans" in markdown(report)
    runs[1]["outputs"] = [[9]]
    assert not summarize(runs, args, spans=0, cpu=True)["identical_outputs"]
