"""tasks/trace.py: spans written only when KFORGE_TRACE names a file, labelled with their problem."""

import threading
import time

from tasks import trace


def test_spans_are_written_only_when_asked_and_carry_their_problem(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.delenv(trace.TRACE_ENV, raising=False)
    with trace.span("slot", mode="time"):
        pass
    assert not path.exists()

    monkeypatch.setenv(trace.TRACE_ENV, str(path))
    with trace.for_problem("19_ReLU"):
        with trace.span("stage", mode="time"):
            time.sleep(0.05)
        thread = threading.Thread(target=lambda: trace.record("slot-wait", time.time(), 0.5, mode="verify"))
        thread.start()
        thread.join()
    path.write_text(path.read_text() + '{"span": "cut sh')  # a run killed mid-line
    spans = trace.read(path)
    assert [s["span"] for s in spans] == ["stage", "slot-wait"]
    assert spans[0]["problem"] == "19_ReLU" and spans[0]["s"] >= 0.05 and spans[0]["mode"] == "time"
    assert spans[1]["problem"] is None  # a plain thread does not inherit the label

    table = trace.summary(spans, wall_s=1.0)
    lines = table.splitlines()
    assert lines[1].startswith("slot-wait verify") and "50.0%" in lines[1]  # largest total first
    assert lines[2].startswith("stage time")
