"""The thread policy: free cores from the affinity and the load average, a passive wait after a short spin, what a
user set wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from copynce_hf.modeling.errors import ConfigError
from copynce_hf.threads import SPIN_COUNT, apply_thread_policy, choose_threads, usable_cores

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("cores", "busy", "threads"), [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.0, 1), (2, 7.5, 1), (16, 3.2, 13), (1, 0.0, 1),
])
def test_threads_are_the_free_cores_and_at_least_one(cores, busy, threads):
    assert choose_threads(cores, busy) == threads


def test_zero_cores_is_refused():
    with pytest.raises(ValueError, match="cores must be >= 1"):
        choose_threads(0, 0.0)


def test_the_policy_sets_the_runtimes_variables_and_a_passive_wait():
    environ = {}
    policy = apply_thread_policy(environ)
    assert 1 <= policy.threads <= usable_cores()
    assert environ["OMP_NUM_THREADS"] == environ["MKL_NUM_THREADS"] == str(policy.threads)
    assert environ["OMP_WAIT_POLICY"] == "PASSIVE" and "usable cores" in policy.describe()
    assert environ["GOMP_SPINCOUNT"] == str(SPIN_COUNT) and policy.describe().endswith(f"after {SPIN_COUNT} spins")


def test_what_the_user_set_wins():
    environ = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    policy = apply_thread_policy(environ)
    assert (policy.threads, policy.wait_policy, environ["OMP_NUM_THREADS"]) == (3, "ACTIVE", "3")
    assert "GOMP_SPINCOUNT" not in environ  # a spin count would override the user's wait policy
    environ = {"GOMP_SPINCOUNT": "500"}
    assert apply_thread_policy(environ).spin_count == "500" and environ["OMP_WAIT_POLICY"] == "PASSIVE"
    environ = {"COPYNCE_THREADS": "1", "OMP_NUM_THREADS": "4"}
    assert apply_thread_policy(environ).threads == 1 and environ["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_thread_count_names_the_variable(value):
    with pytest.raises(ConfigError, match=f"COPYNCE_THREADS={value!r}: a positive whole number"):
        apply_thread_policy({"COPYNCE_THREADS": value})


def test_torch_started_after_the_policy_runs_with_its_threads():
    """In a fresh process: the policy before ``import torch`` gives torch that many threads."""
    code = ("import os\nfrom copynce_hf.threads import apply_thread_policy\n"
            "policy = apply_thread_policy()\nimport torch\n"
            "print(policy.threads, torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'])\n")
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "COPYNCE_THREADS",
                                                                          "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    chosen, torch_threads, wait = out.stdout.split()
    assert chosen == torch_threads and wait == "PASSIVE"


def test_busy_cores_counts_processes_running_beside_this_one():
    """Two processes spinning beside this one are counted at once (no load-average lag): in rounds that alternate
    them waiting and spinning, the reading rises with them, whatever else runs on the machine. Two is expected; the
    bound is one on the mean of ten rounds, as the other processes of a busy machine move each reading by about one
    and a CPU quota that throttles this container takes its runnable processes off the count for a while; a reading
    blind to them (a load average, or a constant) adds nothing."""
    import multiprocessing
    import statistics
    import time

    from copynce_hf.threads import busy_cores

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat: the policy falls back to the load average")
    # flags read without a lock: two spinners contending for an Event's lock would take turns asleep on it
    go, stop = multiprocessing.Value("b", 0, lock=False), multiprocessing.Value("b", 0, lock=False)
    spinners = [multiprocessing.Process(target=_spin, args=(go, stop), daemon=True) for _ in range(2)]
    for process in spinners:
        process.start()
    added = []
    try:
        for _ in range(10):
            go.value = 0
            time.sleep(0.03)  # the spinners nap
            waiting = busy_cores(samples=20, interval=0.005)
            go.value = 1
            time.sleep(0.03)
            added.append(busy_cores(samples=20, interval=0.005) - waiting)
    finally:
        stop.value = 1
        for process in spinners:
            process.join()
    assert statistics.mean(added) >= 1.0, added


def _spin(go, stop) -> None:
    """Runnable while ``go`` holds 1, asleep otherwise (a 10 ms nap between looks), until ``stop`` holds 1."""
    import time

    while not stop.value:
        if go.value:
            sum(range(10_000))
        else:
            time.sleep(0.01)
