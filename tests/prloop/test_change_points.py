"""Change points of main's history: the method, and the marker on the history page."""

from __future__ import annotations

import random

from fastapi.testclient import TestClient
from web_fake_store import demo_store, make_app

from analyzers.changepoint import change_points
from service.store import HistoryPoint


def _noisy(level: float, n: int, rng: random.Random, sigma: float = 0.15) -> list[float]:
    return [level + rng.gauss(0, sigma) for _ in range(n)]


def test_a_step_is_found_where_it_happened() -> None:
    rng = random.Random(7)
    values = _noisy(20.0, 12, rng) + _noisy(21.6, 10, rng)
    (cp,) = change_points(values)
    assert cp.index == 12 and 7.0 < cp.shift_pct < 9.0 and cp.p_value < 0.01


def test_noise_one_outlier_and_a_negligible_drift_are_not_change_points() -> None:
    rng = random.Random(3)
    assert change_points(_noisy(20.0, 40, rng)) == []
    assert change_points([*_noisy(20.0, 10, rng), 35.0, *_noisy(20.0, 10, rng)]) == []
    # significant but 1% < min_shift_pct: not a regression worth marking
    assert change_points(_noisy(20.0, 15, rng, 0.02) + _noisy(20.2, 15, rng, 0.02)) == []
    assert change_points([1.0, 2.0, 3.0]) == []  # too short to split


def test_two_steps_are_both_found() -> None:
    rng = random.Random(11)
    values = _noisy(20.0, 10, rng) + _noisy(23.0, 10, rng) + _noisy(20.5, 10, rng)
    assert [cp.index for cp in change_points(values)] == [10, 20]


def test_history_page_marks_main_change_points_only() -> None:
    rng = random.Random(5)
    main = _noisy(21.0, 8, rng) + _noisy(23.5, 8, rng)
    points, run = [], 0
    for i, value in enumerate(main):
        run += 1
        points.append(HistoryPoint(run_id=run, created_at=f"2026-11-01T10:{run:02d}:00Z",
                                   name=f"r{run}", branch="main", commit=f"{run:02d}ab",
                                   label="", value=value))  # fmt: skip
        if i % 3 == 0:  # a pull request's much slower run in between must not count
            run += 1
            points.append(HistoryPoint(run_id=run, created_at=f"2026-11-01T10:{run:02d}:00Z",
                                       name=f"pr{run}", branch="topic", commit=f"{run:02d}cd",
                                       label="", value=40.0))  # fmt: skip
    store = demo_store()
    store.history = points
    client = TestClient(make_app(store))
    twin = client.get("/history.json?config_key=ref-2xh200").json()
    marked = [r for r in twin["points"] if r["change_point"]]
    assert len(marked) == 1
    first_new = [p for p in points if p.branch == "main"][8]
    assert marked[0]["point"]["run_id"] == first_new.run_id
    assert marked[0]["change_point"].startswith("+")
    layout = twin["figures"]["history"]["layout"]
    (shape,) = layout["shapes"]
    index = [r["point"]["run_id"] for r in twin["points"]].index(first_new.run_id)
    assert shape["x0"] == twin["figures"]["history"]["data"][-1]["x"][index]
    assert layout["annotations"][0]["text"].startswith("change +")
    html = client.get("/history?config_key=ref-2xh200").text
    assert "change point +" in html and "Mann-Whitney" in html
