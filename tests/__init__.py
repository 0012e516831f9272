"""popeval's tests, one folder per layer (tests/project/test_layers.py):

    environments/  the environments against their references, the registry, the suites' adapters
    engine/        popeval/: rollouts, policies, devices, sinks, signals, the command line
    strategies/    the algorithms, the run directory, the evolve loop, several processes
    experiments/   the experiments' scripts and the shipped controllers
    project/       the whole repository: docs, lint, layers, imports, packaging, flag style

Fixtures every folder uses are in conftest.py, helpers in helpers.py (`from tests.helpers import ...`).
"""
