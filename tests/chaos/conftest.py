"""Chaos tier: ces2pg applies a transactional multi-table stream while random
faults hit it, one at a time; afterwards every guarantee is checked (see
chaos.py for the stream, the faults and the checks).

Run with Debian's interpreter, after building (scripts/chaos does both):

    CES2PG_BUILD=build-asan /usr/bin/python3 -m pytest tests/chaos -s \\
        -k mock_broker [--faults N] [--seed S] [--soak MINUTES]

The fixtures of every suite (PostgreSQL, the mock broker, the ces2pg daemon
factory, Apache Kafka and its topics) come from the test harness
(tests/harness, on sys.path through pytest.ini's pythonpath; harness.fixtures).

Options:
    --faults N        faults per run (default: 30 on the mock, 10 on Kafka)
    --seed S          the seed of the faults, their parameters and the stream
                      (default: a random one, printed)
    --profile P       small, streamed, rules or random (the default: small or
                      streamed; see chaos.PROFILES). test_chaos_rules_mock_broker
                      runs the rules profile beside the main run unless --profile
                      names one
    --soak MINUTES    stream for that long instead, faults coming all along,
                      and fail if ces2pg's resident memory keeps growing
"""

import random

import pytest

# Before the harness is imported, so that its asserts explain their failures.
pytest.register_assert_rewrite("harness")

from chaos import PROFILES  # noqa: E402

pytest_plugins = ("harness.fixtures",)


def pytest_addoption(parser):
    group = parser.getgroup("chaos", "ces2pg's chaos tier")
    group.addoption("--faults", type=int, default=None, metavar="N",
                    help="faults per run (default 30 on the mock broker, 10 on "
                         "Apache Kafka)")
    group.addoption("--seed", type=int, default=None, metavar="S",
                    help="seed of the faults and the stream (default: random)")
    group.addoption("--profile", default=None,
                    choices=sorted(PROFILES) + ["random"],
                    help="shape of the source transactions: small, streamed "
                         "(some larger than a batch), rules (small, ces2pg "
                         "with soft deletes and history tables) or random "
                         "(small or streamed, chosen by the seed: the "
                         "default)")
    group.addoption("--soak", type=float, default=0.0, metavar="MINUTES",
                    help="stream for MINUTES with faults all along and check "
                         "that ces2pg's memory does not keep growing")


class ChaosOptions:
    def __init__(self, config):
        self.faults = config.getoption("--faults")
        self.seed = config.getoption("--seed")
        if self.seed is None:
            self.seed = random.SystemRandom().randrange(1, 10**9)
        self.soak = config.getoption("--soak")
        self.profile = config.getoption("--profile")
        if self.faults is not None and self.faults < 1:
            raise pytest.UsageError("--faults must be at least 1")
        if self.soak and self.soak < 2:
            raise pytest.UsageError("--soak needs at least 2 minutes (RSS is "
                                    "sampled every 10 s and judged by thirds)")

    def faults_for(self, default):
        return self.faults if self.faults is not None else default


@pytest.fixture(scope="session")
def chaos_options(request):
    return ChaosOptions(request.config)
