"""The stage suite's model revision rollouts alone (issue 42): per run, a config-only change
(the baseline) and a new model revision staged and warmed, then the same with the warm off,
on the stage suite's routed 3-host testbed under load (``bench/stage.py``: its model, its CPU
limit per host). Its figures replace the stage suite's revision figures
(``bench/run_all.py --only stagerev --update RESULTS``) without rerunning the release
rollouts."""

from __future__ import annotations

import uuid
from pathlib import Path

from bench import stage
from bench.common import Figure


def one_run(url: str, key: str, folder: Path) -> dict:
    env = f'sglang_env={{"BENCH_STAGE": "{uuid.uuid4().hex[:6]}"}}'
    stage.cpu_limit(stage.HOST_CORES)
    got = {"config": stage.rollout(url, key, folder, [env])}
    got.update(stage.revision_rollouts(url, key, folder))
    stage.say(got)
    return got


def run(cfg) -> list[Figure]:
    return stage.revision_figures(stage.measure(cfg, one_run))
