"""How a failure record reads: the one headline, the waiting frame, the bounded comment blocks.

Pure functions over ``FailureRecord``s (the real records' shapes: ``runners/profile``'s
supervisor writes them; the stacks are Python's ``faulthandler`` format, taken from a real dump).
"""

from __future__ import annotations

from analyzers.failure import failure_headline, failure_of, rank_stacks, waiting_frame
from analyzers.manifest import FailureRecord
from pr_bot.comment import LOG_TAIL_LINES, failure_lines

DUMP = """\
Thread 0x00007f1e4d0e46c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/worker.py", line 88 in _loop

Current thread 0x00007f1e4de48b80 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d.py", line 4166 in barrier
  File "train.py", line 30 in step
  File "train.py", line 52 in <module>
"""


def test_the_waiting_frame_is_the_users_line_of_the_dumping_thread() -> None:
    frame = waiting_frame(DUMP)
    assert frame is not None and frame.where() == "train.py:30 in step"
    only_library = DUMP.replace('File "train.py"', 'File "/opt/venv/lib/python3.11/x.py"')
    inner = waiting_frame(only_library)
    assert inner is not None and inner.function == "barrier"  # nothing of the user's: innermost
    assert waiting_frame("no frames here") is None


def test_one_headline_for_each_way_a_job_ends_badly() -> None:
    raised = FailureRecord(
        failed_rank=1,
        exception={"type": "ValueError", "message": "8190 is not a multiple of 8",
                   "where": {"file": "train.py", "line": 41, "function": "pack"}},
        ranks={"0": {"state": "waiting", "collective": "all_reduce"}, "1": {"state": "failed"}},
    )  # fmt: skip
    assert failure_headline(raised) == (
        "rank 1 raised ValueError: 8190 is not a multiple of 8 at train.py:41 in pack; "
        "rank 0 was waiting in all_reduce"
    )
    hung = FailureRecord(stopped_by_watchdog=True, watchdog_s=60, stacks={"1": DUMP, "0": DUMP})
    assert failure_headline(hung) == (
        "the job hung and the watchdog stopped it after 60 s; rank 0 waiting at train.py:30 "
        "in step; rank 1 waiting at train.py:30 in step"
    )
    assert [s.rank for s in rank_stacks(hung)] == ["0", "1"]
    assert failure_headline(FailureRecord(summary="  exited\n early ")) == "exited early"
    assert failure_headline(FailureRecord(exit_status=3)) == "the job failed (exit status 3)"
    assert failure_headline(FailureRecord()) == "the job failed (no failure summary recorded)"


def test_a_record_that_does_not_fit_still_says_failed() -> None:
    assert failure_of({"run": {}}) is None
    odd = failure_of({"failure": {"stacks": ["not", "a", "mapping"]}})
    assert odd is not None and odd.summary.startswith("the failure record is unreadable (stacks:")


def test_comment_blocks_are_bounded_and_cannot_break_out_of_their_fence() -> None:
    tail = [f"line {i}" for i in range(100)] + ["``` </details> <script>alert(1)</script>"]
    hostile = DUMP + '  File "x```y<b>.py", line 1 in <lambda>\n'
    record = FailureRecord(stopped_by_watchdog=True, stacks={"0": hostile}, log_tail=tail)
    text = "\n".join(failure_lines(record))
    assert f"<summary>log tail (last {LOG_TAIL_LINES} of 101 lines)</summary>" in text
    assert "line 60" not in text.split("log tail", 1)[1] and "line 61" in text
    assert text.count("```") == 4  # two blocks, each opened and closed once: nothing escapes
    assert "'''" in text  # the fences inside were defused
