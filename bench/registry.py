"""What a suite is: scripts to run on which side, and how to judge the metrics they report.

A suite module (``bench/suites/<name>.py``) builds a `Suite` and calls `register()` on import.
A `Job` is one scenario script run as a subprocess; it prints one JSON line per metric it measured
(see ``bench/scenarios/_protocol.py``). A `Metric` tells the report how to label a metric and which
target, if any, applies to it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Side(enum.StrEnum):
    OURS = "ours"  # this checkout, under .venv
    PEER = "peer"  # ipybox 0.9.2 under .cache/peer-venv
    FLOOR = "floor"  # a physical lower bound (no ipybox at all), run under .venv


@dataclass(frozen=True)
class Target:
    """A speed target for the median of one of our metrics.

    Exactly one reference applies: ``max_peer_ratio`` (ours/peer), ``max_floor_ratio`` against the
    floor metric named by ``floor_metric``, or an absolute ``max_ms``.
    """

    max_peer_ratio: float | None = None
    max_floor_ratio: float | None = None
    floor_metric: str | None = None
    max_ms: float | None = None

    def __post_init__(self) -> None:
        given = [self.max_peer_ratio, self.max_floor_ratio, self.max_ms]
        if sum(value is not None for value in given) != 1:
            raise ValueError("a Target needs exactly one of max_peer_ratio, max_floor_ratio, max_ms")
        if (self.max_floor_ratio is None) != (self.floor_metric is None):
            raise ValueError("max_floor_ratio and floor_metric go together")

    def describe(self) -> str:
        if self.max_peer_ratio is not None:
            return f"<= {self.max_peer_ratio:g}x peer"
        if self.max_floor_ratio is not None:
            return f"<= {self.max_floor_ratio:g}x floor"
        return f"< {self.max_ms:g} ms"


@dataclass(frozen=True)
class Metric:
    name: str  # as printed by the scenario script, e.g. "kernel.execute_x1"
    label: str  # what the report shows
    target: Target | None = None
    # A floor the job measures itself, interleaved with ours: both see the same machine at the same time,
    # where a floor from a job of its own may meet a quieter or busier minute.
    floor: bool = False


@dataclass(frozen=True)
class Job:
    script: str  # file name under bench/scenarios/
    sides: tuple[Side, ...]
    runs: int  # default number of measured samples (warm-ups come on top)
    metrics: tuple[Metric, ...]
    args: tuple[str, ...] = ()
    # Extra arguments for one side only, e.g. measurements only our implementation can split out.
    side_args: dict[Side, tuple[str, ...]] = field(default_factory=dict)
    timeout_s: float = 1800.0

    @property
    def title(self) -> str:
        return " ".join((self.script, *self.args))


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    jobs: tuple[Job, ...]


_SUITES: dict[str, Suite] = {}


def register(suite: Suite) -> Suite:
    if suite.name in _SUITES:
        raise ValueError(f"suite {suite.name!r} registered twice")
    _SUITES[suite.name] = suite
    return suite


def suites() -> dict[str, Suite]:
    """All registered suites, importing every module of `bench.suites` first."""
    import bench.suites

    bench.suites.load_all()
    return dict(_SUITES)
