"""The simulator against the real engine: one corpus of requests to both, every difference listed.

genrm-sim stands in for SGLang 0.5.23 in every other test, so whatever it answers differently from
SGLang could let a test pass that a real pod fails. Here the corpus (``corpus``) goes to the simulator
and to the real engine, each started with the served name, context length, KV pool and API key the
other has; their answers are compared by shape (``shapes``); and every difference must be listed in
``differences.toml`` as kept (with why) or it fails the test, as does a kept one that no longer occurs
or a fixed one that is back. The simulator runs with a 5 ms inter-token latency (not zero) so that
its long generations are in flight when a case acts on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from genrm_testing import realengine, run_sim

from .corpus import API_KEY, CASES, CONTEXT_LENGTH, SERVED, Engine, Observation, observe
from .differences import judge, load
from .lane import LANE
from .shapes import differences

pytestmark = pytest.mark.timeout(600)

KNOWN = load()
KV_POOL = realengine.CPU_ARGS[realengine.CPU_ARGS.index("--max-total-tokens") + 1]
"""The real engine's KV pool (the example pool's flag), which the simulator's gauges and loads report too."""


@pytest.fixture(scope="module")
def observed(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Observation,
                                                                                                  Observation]]]:
    """Each case's (real, simulator) observations: the simulator first, then one real engine (never two
    at once: each is 3.3 GB), both ended by the corpus's SIGTERM case."""
    with run_sim("--served-model-name", SERVED, "--context-length", str(CONTEXT_LENGTH),
                 "--max-total-tokens", KV_POOL, "--api-key", API_KEY, "--sim-itl-ms", "5",
                 model=str(models / SERVED)) as sim:
        simulated = observe(Engine(sim.url, sim.process))
    log = tmp_path_factory.mktemp("differential") / "engine.log"
    with realengine.run_engine(log, "--api-key", API_KEY) as real:
        LANE.replicas += 1
        seen = observe(Engine(real.url, real.process))
    yield {case: (seen[case], simulated[case]) for case in CASES}


def test_every_listed_difference_names_a_case_of_the_corpus() -> None:
    assert {case for d in KNOWN for case in d.cases} - set(CASES) == set()


@pytest.mark.parametrize("case", CASES)
def test_the_simulator_answers_as_the_real_engine(case: str,
                                                  observed: dict[str, tuple[Observation, Observation]]) -> None:
    real, sim = observed[case]
    found = differences(real, sim)
    verdict = judge(case, found, KNOWN)
    LANE.differences_listed += verdict.listed
    LANE.unlisted_differences += len(verdict.unlisted)
    assert verdict.holds, (
        f"{case}: unlisted differences {list(verdict.unlisted)}; listed as kept but gone "
        f"{[d.differs for d in verdict.stale]}; listed as fixed but back {[d.differs for d in verdict.regressed]}")
