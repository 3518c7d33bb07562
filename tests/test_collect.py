"""NodeCollector on real cgroups: one snapshot per tick, idle cgroups not re-read every tick."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from probes.collect import NodeCollector, parse_cpu_list

pytestmark = pytest.mark.root


def _rel(cg, controller: str = "cpu") -> str:
    h = cg.layout.hierarchy_for(controller)
    return "/" + str(cg.dirs[controller].relative_to(h.mount))


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list("") == ()
    assert parse_cpu_list("1,x,3") == (1, 3)


def test_idle_cgroup_keeps_its_reading_and_a_busy_one_is_read_again(make_cgroup):
    idle = make_cgroup("idle", controllers=("cpu", "cpuacct", "cpuset"))
    busy = make_cgroup("busy", controllers=("cpu", "cpuacct", "cpuset"))
    paths = [_rel(idle), _rel(busy)]
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend=time.monotonic()+20\nwhile time.monotonic()<end: pass"],
                           preexec_fn=busy.preexec)
    try:
        with NodeCollector(probes=(), cgroup_paths=lambda: paths) as c:
            first = c.collect()
            time.sleep(0.3)
            second = c.collect()
            # The idle cgroup's reading is the same object (not re-read); the busy one moved on.
            assert second.cgroup_cpu[paths[0]] is first.cgroup_cpu[paths[0]]
            assert second.cgroup_cpu[paths[1]].usage_ns > first.cgroup_cpu[paths[1]].usage_ns
            assert second.cgroup_cpus[paths[0]] == tuple(range(len(second.node_cpu_per_cpu)))
            # Past the refresh bound an idle cgroup is read again, and shows the same numbers.
            c.idle_refresh_s = 0.0
            third = c.collect()
            assert third.cgroup_cpu[paths[0]] is not first.cgroup_cpu[paths[0]]
            assert third.cgroup_cpu[paths[0]].usage_ns == first.cgroup_cpu[paths[0]].usage_ns
            # A cgroup that disappears drops out of the next snapshot.
            idle.remove()
            assert paths[0] not in c.collect().cgroup_cpu
    finally:
        hog.kill()
        hog.wait()
