# SPDX-License-Identifier: Apache-2.0
"""CPU burst for throttled LS cgroups: CFS burst and cfs quota scaling, koordlet's rules.

A victim whose cause is ``self_throttling`` hit its own cfs quota: no neighbor is at fault, and the
first thing to try is letting it burst, before anyone is punished.

- CFS burst (``cpuBurstOnly`` / ``auto``): ``cpu.cfs_burst_us`` (v2 ``cpu.max.burst``) =
  limit cores * cpuBurstPercent % * period. The kernel refuses a burst larger than the quota
  (EINVAL; checked on this kernel), so the value is capped at the quota and the plan says so. Under
  ``auto`` the burst is static, as koordlet's is: written once, on every level with a quota, when the pod
  is taken under burst (its first quota step), at cpuBurstPercent of that level's *base* quota capped at
  the base (so it is at most the quota at every scale the loop can reach, in either write order), and
  kept across the quota's steps and its resets to the base; it goes back only with the whole chain (the
  action reverted, the pod out of the policy, the agent stopped). koordlet
  (pkg/koordlet/qosmanager/plugins/cpuburst/cpu_burst.go): ``cpuBurst.start`` calls ``applyCPUBurst``
  (``calcStaticCPUBurstVal``: limit * cpuBurstPercent * period) every round whatever the node's state, and
  ``applyCFSQuotaBurst`` separately, where ``changeOperationByNode`` turns an overloaded share pool into
  ``cfsReset``: the quota goes back to its base, the burst is not touched.
- Quota scaling (``cfsQuotaBurstOnly`` / ``auto``): :class:`CfsQuotaBurstController` keeps koordlet's
  loop per cgroup: x1.2 when it was throttled in the last sample and the token bucket allows it (more
  when its throttled periods asked for more, see :class:`QuotaBurstLoop`), x0.8 when the bucket refuses,
  clamped to [base, base * cfsQuotaBurstPercent %]; when the node's share pool usage (averaged over the
  last intervals, as koordlet averages it) reaches sharePoolThresholdPercent it stops and resets to the
  base quota.
  The token bucket holds at most ``cfs_quota_burst_period_seconds`` of running at the maximum scaled
  quota (-1 = unlimited): it fills while the cgroup uses less than its base quota and drains while it
  uses more.
- Never for LSR, LSE or BE targets (LSR/LSE have exclusive CPUs; BE must not get more).

The base quota is the one the cgroup had before we touched it (the journal's original), so
repeated scaling never compounds.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from actuators.base import FileWrite, Plan, Refused
from actuators.cgroupfile import CgroupFileError, CgroupFiles, CgroupVanished
from actuators.journal import Journal, JournaledFileActuator
from detector.decisions import ActionKind, BurstAmount, Decision, Target
from detector.policy import CpuBurstStrategy
from probes.cgroupfiles import CPU_BURST, CPU_MAX
from probes.cpuacct import read_cgroup_cpu
from probes.procstat import ProcStatReader

SCALE_UP = 1.2
SCALE_DOWN = 0.8
NO_BURST_QOS = frozenset({"LSR", "LSE", "BE"})


class BurstActuator(JournaledFileActuator):
    kind = ActionKind.BURST

    def __init__(self, files: CgroupFiles, journal: Journal, strategy: CpuBurstStrategy | None = None,
                 *, closed_loop: bool = True, proc_stat: ProcStatReader | None = None) -> None:
        super().__init__(journal)
        self.files = files
        self.strategy = strategy or CpuBurstStrategy(policy="auto")
        # koordlet's per-tick quota scaling for the targets this actuator scaled (the manager drives it);
        # proc_stat: the collector's reader (the agent's), whose reading of this tick the loop takes
        self.loop: QuotaBurstLoop | None = QuotaBurstLoop(self, proc_stat=proc_stat) if closed_loop else None

    def base_quota_us(self, cgroup: str) -> tuple[int | None, int]:
        """(quota before we touched it or None if unlimited, period)."""
        current = self.files.read_cpu_max(cgroup)
        if self.files.version(CPU_MAX) == 1:
            original = self.journal.original(str(self.files.path(CPU_MAX, cgroup)))
            if original is not None:
                q = int(original)
                return (None if q < 0 else q), current.period_us
        else:
            original = self.journal.original(str(self.files.path(CPU_MAX, cgroup)))
            if original is not None:
                q_txt, p_txt = original.split()
                return (None if q_txt == "max" else int(q_txt)), int(p_txt)
        return current.quota_us, current.period_us

    def quota_levels(self, cgroup: str) -> list[QuotaLevel]:
        """The cgroup and every cgroup below it that has (or had, before us) a cfs quota, parents first.

        Kubelet puts a quota on the pod cgroup *and* on each container cgroup below it, and the
        kernel throttles at whichever level runs out first: scaling the pod's quota alone leaves the
        container at its own limit (measured: tests/test_burst.py, container level). So every level
        with a quota is scaled by the same factor (which keeps child <= parent, as cgroup v1 demands).
        """
        levels: list[QuotaLevel] = []
        for cg in self.files.descendants(CPU_MAX, cgroup):
            base, period = self.base_quota_us(cg)
            if base is None:
                continue
            current = self.files.read_cpu_max(cg)
            cur = current.quota_us if current.quota_us is not None else base
            has_burst = self.files.exists(CPU_BURST, cg)
            levels.append(QuotaLevel(cg, base, period, cur, self.files.read_burst_us(cg) if has_burst else None))
        return levels

    def static_burst_us(self, level: QuotaLevel) -> int:
        """The CFS burst ``auto`` keeps on a level: cpuBurstPercent of its base quota (koordlet's
        ``calcStaticCPUBurstVal``), capped at the base, which the loop never goes below: the kernel refuses
        a burst above the quota, and a burst capped at a scaled quota would have to go at the next reset."""
        return min(int(level.base_us * self.strategy.cpu_burst_percent / 100.0), level.base_us)

    def plan(self, decision: Decision) -> Plan:
        amount = decision.amount
        if not isinstance(amount, BurstAmount):
            raise Refused(f"burst needs a BurstAmount, got {type(amount).__name__}")
        qos = (decision.target.qos or "").upper()
        if qos in NO_BURST_QOS:
            raise Refused(f"burst is not for {qos} targets")
        policy = self.strategy.policy
        if policy == "none":
            raise Refused("cpu burst policy is none")
        cgroup = decision.target.cgroup.strip("/")
        verdict = self.loop.verdict(cgroup) if self.loop is not None else None
        if verdict is not None and not decision.follow_up:
            raise Refused(f"{decision.target.display}: {verdict}")
        try:
            return self._plan(decision, cgroup, amount, policy)
        except CgroupVanished as e:
            raise Refused(f"target is gone: {e}") from None

    def _plan(self, decision: Decision, cgroup: str, amount: BurstAmount, policy: str) -> Plan:
        levels = self.quota_levels(cgroup)
        if not levels:
            raise Refused(f"{decision.target.display} has no cfs quota at any level: nothing throttles it")
        if amount.quota_scale is not None and not self.strategy.cfs_quota_burst_enabled:
            raise Refused(f"quota scaling is off under policy {policy}")
        # A burst asked for (its burst_us, or no quota scale: a burst alone) is refused where it cannot be had.
        asked_burst = amount.burst_us is not None or (amount.quota_scale is None and self.strategy.cpu_burst_enabled)
        if asked_burst and not self.strategy.cpu_burst_enabled:
            raise Refused(f"cfs burst is off under policy {policy}")
        if asked_burst and all(lv.burst_us is None for lv in levels):
            raise Refused("this kernel has no CFS burst (cpu.cfs_burst_us / cpu.max.burst)")
        # Under auto a quota step sets the CFS burst too, as koordlet's auto does (its static burst beside the
        # scaled quota), on the levels whose kernel has it; cfsQuotaBurstOnly scales the quota alone.
        want_burst = asked_burst or (amount.quota_scale is not None and self.strategy.cpu_burst_enabled)
        top_factor = self.strategy.cfs_quota_burst_percent / 100.0
        per_level: list[tuple[QuotaLevel, int, int | None]] = []
        for lv in levels:
            new_quota = lv.current_us
            if amount.quota_scale is not None:
                new_quota = int(min(max(lv.base_us * amount.quota_scale, lv.base_us), lv.base_us * top_factor))
            new_burst = lv.burst_us
            if lv.burst_us is not None:
                if want_burst:
                    wanted = amount.burst_us if amount.burst_us is not None and lv.cgroup == levels[0].cgroup else \
                        self.static_burst_us(lv)
                    new_burst = min(wanted, new_quota)
                elif lv.burst_us > new_quota:
                    new_burst = new_quota  # a lower quota must not be below the burst
            per_level.append((lv, new_quota, new_burst))
        first, q0, b0 = per_level[0]
        parts: list[str] = []
        if amount.quota_scale is not None:
            parts.append(f"quota {first.current_us / first.period_us:.2f} -> {q0 / first.period_us:.2f} cores")
            if len(per_level) > 1:
                parts.append(f"x{q0 / first.base_us:.2f} of the base on {len(per_level)} levels (pod and containers)")
        if want_burst and b0 is not None:
            wanted0 = amount.burst_us if amount.burst_us is not None else \
                int(first.base_us * self.strategy.cpu_burst_percent / 100.0)
            capped = " (capped at the quota: the kernel refuses more)" if b0 < wanted0 else ""
            # a step that leaves the burst as it is says so (auto's later steps): "burst 50000 -> 50000 us" read
            # as a write in the VM lane's audit lines
            parts.append(f"burst {b0} us kept" if b0 == first.burst_us else f"burst {first.burst_us} -> {b0} us{capped}")
        growing = any(q > lv.current_us for lv, q, _ in per_level)
        writes: list[FileWrite] = []
        # cgroup v1 refuses a child quota above its parent's and the kernel a burst above the quota:
        # growing, parents first and quota before burst; shrinking, children first and burst first.
        for lv, new_quota, new_burst in (per_level if growing else reversed(per_level)):
            qw = self.files.quota_writes(lv.cgroup, new_quota) if new_quota != lv.current_us else []
            bw = [self.files.burst_write(lv.cgroup, new_burst)] \
                if new_burst is not None and new_burst != lv.burst_us else []
            writes.extend(qw + bw if new_quota >= lv.current_us else bw + qw)
        if not writes:
            raise Refused(f"{decision.target.display} already has quota {first.current_us} us, burst {first.burst_us} us")
        return Plan(decision, f"burst {decision.target.display}: " + ", ".join(parts), tuple(writes),
                    details={"quota_us": q0, "base_quota_us": first.base_us, "burst_us": b0 or 0,
                             "period_us": first.period_us, "levels": len(per_level),
                             "scale": round(q0 / first.base_us, 3)})


@dataclass(frozen=True, slots=True)
class QuotaLevel:
    cgroup: str
    base_us: int  # the quota before we touched it
    period_us: int
    current_us: int
    burst_us: int | None  # None: no CFS burst file on this kernel


@dataclass
class _BucketState:
    scale: float = 1.0
    tokens_core_s: float = 0.0


@dataclass
class CfsQuotaBurstController:
    """koordlet's per-cgroup cfs quota burst loop; feed one sample per interval, get a decision or None."""

    strategy: CpuBurstStrategy
    states: dict[str, _BucketState] = field(default_factory=dict)

    def capacity_core_s(self, base_cores: float) -> float | None:
        if self.strategy.cfs_quota_burst_period_seconds < 0:
            return None  # unlimited
        extra = base_cores * (self.strategy.cfs_quota_burst_percent / 100.0 - 1.0)
        return extra * self.strategy.cfs_quota_burst_period_seconds

    def step(
        self,
        target: Target,
        *,
        base_cores: float,
        usage_cores: float,
        throttled: bool,
        share_pool_usage_percent: float,
        interval_s: float,
        need_scale: float | None = None,
    ) -> Decision | None:
        """``need_scale``: the scale its throttled periods asked for (:meth:`QuotaBurstLoop.step`); a
        throttled sample scales up to it when it is more than koordlet's x1.2."""
        if not self.strategy.cfs_quota_burst_enabled:
            return None
        st = self.states.setdefault(target.cgroup, _BucketState())
        cap = self.capacity_core_s(base_cores)
        st.tokens_core_s += (base_cores - usage_cores) * interval_s  # fills below base, drains above
        if cap is not None:
            st.tokens_core_s = min(max(st.tokens_core_s, 0.0), cap)
        top = self.strategy.cfs_quota_burst_percent / 100.0
        old = st.scale
        if share_pool_usage_percent >= self.strategy.share_pool_threshold_percent:
            limit = self.strategy.share_pool_threshold_percent
            st.scale, why = 1.0, f"share pool {share_pool_usage_percent:.0f} % >= {limit} %: reset"
        elif cap is not None and st.tokens_core_s <= 0.0:
            st.scale, why = max(1.0, st.scale * SCALE_DOWN), "token bucket empty: scale down"
        elif throttled:
            up = st.scale * SCALE_UP
            if need_scale is not None and need_scale > up:
                st.scale, why = min(top, need_scale), "throttled last sample: scale up to what its throttled periods asked"
            else:
                st.scale, why = min(top, up), "throttled last sample: scale up"
        else:
            why = ""
        if abs(st.scale - old) < 1e-9:
            return None
        return Decision(ActionKind.BURST, target, BurstAmount(quota_scale=st.scale),
                        f"cfs quota burst x{st.scale:.2f}: {why}", victim=target, victim_signal="throttled_ratio")


# A tick counts as throttled when at least this share of its CFS periods was (one stray period is not a
# reason to give CPU). A pod is "steadily above its limit" when, scaled to the cap, it is still
# throttled in at least STEADY_THROTTLED_RATIO of its periods and uses >= STEADY_USAGE_SHARE of the
# capped quota for STEADY_TICKS ticks in a row: burst cannot help it, only a higher limit can.
THROTTLED_RATIO = 0.05
STEADY_THROTTLED_RATIO = 0.5
STEADY_USAGE_SHARE = 0.9
STEADY_TICKS = 3
VERDICT_TTL_S = 300.0
# The share pool is judged on the node's CPU use over the last SHARE_POOL_INTERVALS ticks, at most
# SHARE_POOL_WINDOW_S back: koordlet averages it over min(5 reconcile intervals, 10 s)
# (getNodeStateForBurst). On one tick's reading, the pod catching up on the work it was throttled on
# (0.82 cores of a 0.50 base, right after a step) put the 2-CPU VM lane's node at 52 % for one tick
# between ticks at 39 % and 28 %, and the loop reset the pod to its base quota: throttled again for the
# next 2 s (self-throttle-bursty, 2026-11-29 13:07 UTC, issue 41).
SHARE_POOL_INTERVALS = 5
SHARE_POOL_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class _Reading:
    """One tick's reading of a bursted target: its usage and the CFS counts of the level that throttles most."""

    usage_ns: int
    periods: int
    throttled: int
    throttled_ns: int
    quota_us: int  # that level's quota now


@dataclass
class _Tracked:
    decision: Decision  # the step that started the loop for this target (incident, victim, signal)
    prev: tuple[float, _Reading] | None = None  # (monotonic s, the reading then)
    pinned: int = 0  # ticks in a row at the cap and still throttled
    last: dict[str, float] = field(default_factory=dict)  # the last tick's numbers, for reasons and tests


class QuotaBurstLoop:
    """The closed loop that was missing: koordlet's quota scaling, one step per tick, per bursted target.

    Why the victim stayed at 35 ms (measured, bench self-throttle): the detector asked once for
    x1.2 (0.25 -> 0.30 cores) and never again (one decision per incident and cause), while the worker
    needs 0.40: it stayed throttled in most periods. Here, after the first step, every tick reads
    the target's cpu.stat (pod + container levels) and /proc/stat and feeds
    :class:`CfsQuotaBurstController`: x1.2 while throttled (up to cfsQuotaBurstPercent), back to the
    base when the share pool is busy, down when the token bucket is empty. When the pod is
    steadily above its limit even at the cap, the loop puts the base back, says so, and refuses
    further bursts of it for :data:`VERDICT_TTL_S` (raising the limit is the owner's call).
    """

    def __init__(self, actuator: BurstActuator, clock: Callable[[], float] = time.monotonic,
                 read_node: Callable[[], tuple[int, int, int]] | None = None,
                 proc_stat: ProcStatReader | None = None) -> None:
        self.actuator = actuator
        self.controller = CfsQuotaBurstController(actuator.strategy)
        self.tracked: dict[str, _Tracked] = {}
        self._verdicts: dict[str, tuple[float, str]] = {}
        self._clock = clock
        # /proc/stat once a tick: given the collector's reader, its reading of this tick (the manager
        # steps the loop after the collector read it); else a reader of its own, read at each step
        reader = proc_stat or ProcStatReader(actuator.files.paths)
        self._read_node = read_node or partial(reader.node_ticks, read_now=proc_stat is None)
        # (monotonic s, busy ticks, total ticks) of the last readings: the share pool's window. The manager
        # steps the loop every tick, with nothing tracked too, so the window holds the ticks before a first
        # step: read only from it on, the VM lane's reset came on an average of 2 ticks (43 % and 61 %,
        # the pod catching up right after the step; self-throttle-bursty, 2026-11-29 13:39 UTC).
        self._node_readings: deque[tuple[float, int, int]] = deque()
        self.share_pool_percent: float | None = None  # the last step's figure

    def track(self, decision: Decision, scale: float) -> None:
        cg = decision.target.cgroup.strip("/")
        if cg not in self.tracked:
            self.tracked[cg] = _Tracked(decision)
        self.controller.states.setdefault(cg, _BucketState()).scale = scale

    def forget(self, cgroup: str) -> None:
        cg = cgroup.strip("/")
        self.tracked.pop(cg, None)
        self.controller.states.pop(cg, None)

    def verdict(self, cgroup: str) -> str | None:
        v = self._verdicts.get(cgroup.strip("/"))
        if v is None or self._clock() - v[0] > VERDICT_TTL_S:
            return None
        return v[1]

    def _share_pool_percent(self, now: float | None = None) -> float | None:
        """The node's CPU use in percent over its last readings (SHARE_POOL_INTERVALS intervals, at most
        SHARE_POOL_WINDOW_S back); None without a new reading since the last."""
        now = self._clock() if now is None else now
        try:
            node = self._read_node()
        except (OSError, ValueError):
            return None
        readings = self._node_readings
        if readings and node[1] < readings[-1][2]:
            readings.clear()  # the counters went back: start over
        if readings and node[1] == readings[-1][2]:
            return None  # no new reading (the collector's reader not read since)
        readings.append((now, node[0], node[1]))
        while len(readings) > SHARE_POOL_INTERVALS + 1 or (
                len(readings) > 2 and now - readings[0][0] > SHARE_POOL_WINDOW_S):
            readings.popleft()
        if len(readings) < 2:
            return None
        (_, busy0, total0), (_, busy1, total1) = readings[0], readings[-1]
        return 100.0 * (busy1 - busy0) / (total1 - total0)

    def _read(self, levels: list[QuotaLevel]) -> _Reading | None:
        layout = self.actuator.files.layout
        usage = 0
        worst: tuple[float, int, int, int, int] | None = None  # (ratio, periods, throttled, throttled ns, quota)
        for i, lv in enumerate(levels):
            st = read_cgroup_cpu(layout, "/" + lv.cgroup)
            if st is None:
                return None
            if i == 0:
                usage = st.usage_ns
            # the level that throttles most is the one that limits (a container at its own quota)
            ratio = st.nr_throttled / st.nr_periods if st.nr_periods else 0.0
            if worst is None or ratio >= worst[0]:
                worst = (ratio, st.nr_periods, st.nr_throttled, st.throttled_ns, lv.current_us)
        if worst is None:
            return None
        return _Reading(usage, worst[1], worst[2], worst[3], worst[4])

    def step(self, now: float | None = None) -> list[Decision]:
        now = self._clock() if now is None else now
        pool = self.share_pool_percent = self._share_pool_percent(now)
        out: list[Decision] = []
        for cg, tr in list(self.tracked.items()):
            try:
                levels = self.actuator.quota_levels(cg)
                reading = self._read(levels) if levels else None
            except (CgroupVanished, CgroupFileError, OSError):
                self.forget(cg)
                continue
            if reading is None:
                self.forget(cg)
                continue
            prev, tr.prev = tr.prev, (now, reading)
            if prev is None or pool is None or now <= prev[0]:
                continue
            dt, was = now - prev[0], prev[1]
            usage_cores = max(0, reading.usage_ns - was.usage_ns) / 1e9 / dt
            d_periods = reading.periods - was.periods
            d_throttled = reading.throttled - was.throttled
            ratio = d_throttled / d_periods if d_periods > 0 else 0.0
            base = levels[0]
            base_cores = base.base_us / base.period_us
            top = self.actuator.strategy.cfs_quota_burst_percent / 100.0
            st = self.controller.states.setdefault(cg, _BucketState())
            need = need_scale(st.scale, reading.quota_us, d_throttled, reading.throttled_ns - was.throttled_ns)
            tr.last = {"usage_cores": usage_cores, "throttled_ratio": ratio, "share_pool_percent": pool,
                       "scale": st.scale, "base_cores": base_cores, "need_scale": need or 0.0}
            at_cap = st.scale >= top - 1e-6
            if at_cap and ratio >= STEADY_THROTTLED_RATIO and usage_cores >= STEADY_USAGE_SHARE * top * base_cores:
                tr.pinned += 1
            else:
                tr.pinned = 0
            if tr.pinned >= STEADY_TICKS:
                why = (f"steadily above its limit: at x{top:.2f} of its {base_cores:.2f}-core quota it still used "
                       f"{usage_cores:.2f} cores and was throttled in {ratio:.0%} of periods for {STEADY_TICKS} ticks; "
                       f"burst cannot help, raise its CPU limit (no neighbour action)")
                self._verdicts[cg] = (self._clock(), why)
                out.append(self._follow(tr, 1.0, why))
                self.forget(cg)
                continue
            # the controller's state is keyed by the stripped path, as track()/forget() key it
            d = self.controller.step(dataclasses.replace(tr.decision.target, cgroup=cg), base_cores=base_cores,
                                     usage_cores=usage_cores,
                                     throttled=ratio >= THROTTLED_RATIO, share_pool_usage_percent=pool, interval_s=dt,
                                     need_scale=need)
            if d is not None and isinstance(d.amount, BurstAmount) and d.amount.quota_scale is not None:
                out.append(self._follow(tr, d.amount.quota_scale,
                                        f"{d.reason} (used {usage_cores:.2f} of {base_cores:.2f} cores base, "
                                        f"throttled {ratio:.0%}, share pool {pool:.0f} %)", self._kept_burst(base)))
        return out

    def _kept_burst(self, top: QuotaLevel) -> int | None:
        """The static burst a quota step under ``auto`` keeps on the pod (None: no burst to keep). A step
        that names it is not a step back to the base for the manager: a reset or a scale-down to the base
        moves the quota alone, the burst stays (koordlet's cfsReset). Only the verdict and a revert take
        it back. Before, a share-pool reset reverted the whole chain, burst with it: the VM lane's bursty
        pod went unbursted for the next ticks (self-throttle-bursty, 2026-11-29, issue 41)."""
        if not self.actuator.strategy.cpu_burst_enabled or top.burst_us is None:
            return None
        return self.actuator.static_burst_us(top)

    @staticmethod
    def _follow(tr: _Tracked, scale: float, why: str, burst_us: int | None = None) -> Decision:
        first = tr.decision
        return dataclasses.replace(first, amount=BurstAmount(burst_us=burst_us, quota_scale=scale), reason=why,
                                   follow_up=True, created_at=time.time())


def need_scale(scale: float, quota_us: int, throttled_periods: int, throttled_ns: int) -> float | None:
    """The scale (of the base) the throttled periods of a tick asked for: in each, the group ran its quota
    and then sat throttled, its tasks runnable, for the rest of the period; it would have run for about
    that much more (at most: a task that had less left to do counts the whole of the rest). So the quota
    it asked for is ``quota + throttled time per throttled period``, ``scale`` times that over the quota.
    None without a throttled period or a quota.

    An upper bound: a pod throttled in every period asks for a CPU's worth, and the cap bounds it.
    koordlet's x1.2 a step needs four ticks to reach x2, the pod throttled in each: under TCG the VM lane's
    bursty pod (60 ms bursts on top of 0.44 cores against 0.50) was throttled until x1.73-x2.07, reached
    6 s after the first step, and 11 of its throttled periods fell in the 8 s judged after it
    (self-throttle-bursty, 2026-11-29 13:07 UTC, issue 41)."""
    if throttled_periods <= 0 or quota_us <= 0 or throttled_ns <= 0:
        return None
    per_period_us = throttled_ns / 1e3 / throttled_periods
    return scale * (quota_us + per_period_us) / quota_us
