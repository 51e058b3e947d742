"""`dspark bench-serve`'s accepted-length histogram, read from the plugin's Prometheus buckets (no server here:
tests/integration/test_metrics.py checks those buckets against SGLang's own counts)."""
from dspark.ops.harness.bench_serve import accepted_counts, skipped_rounds

EXPOSITION = """# HELP dspark_accepted_length drafts accepted per request per round
# TYPE dspark_accepted_length histogram
dspark_accepted_length_bucket{le="0.0"} 7.0
dspark_accepted_length_bucket{le="1.0"} 10.0
dspark_accepted_length_bucket{le="2.0"} 10.0
dspark_accepted_length_bucket{le="3.0"} 14.0
dspark_accepted_length_bucket{le="4.0"} 15.0
dspark_accepted_length_bucket{le="5.0"} 15.0
dspark_accepted_length_bucket{le="+Inf"} 15.0
dspark_accepted_length_count 15.0
dspark_accepted_length_sum 19.0
dspark_verify_length_bucket{le="0.0"} 99.0
"""


def test_cumulative_buckets_become_counts_per_accepted_length():
    counts = accepted_counts(EXPOSITION, gamma=4)
    assert counts == [7, 3, 0, 4, 1]
    assert sum(counts) == 15 and sum(n * c for n, c in enumerate(counts)) == 19  # _count and _sum agree


def test_before_the_first_round_every_count_is_zero():
    assert accepted_counts("# no dspark metrics yet\n", gamma=3) == [0, 0, 0, 0]


def test_skipped_rounds_are_read_from_the_unlabelled_counter():
    exposition = EXPOSITION + "dspark_draft_skipped_rounds_total 12.0\ndspark_draft_skipped_rounds_created 1.7e9\n"
    assert skipped_rounds(exposition) == 12 and skipped_rounds(EXPOSITION) == 0
