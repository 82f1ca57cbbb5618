from ced.v41.testsuite import *  # noqa: F401,F403 -- the gate, the CED properties, the generation verdict
