"""CPU burst for throttled LS cgroups: CFS burst and cfs quota scaling, koordlet's rules.

A victim whose cause is ``self_throttling`` hit its own cfs quota: no neighbor is at fault, and the
first thing to try is letting it burst, before anyone is punished.

- CFS burst (``cpuBurstOnly`` / ``auto``): ``cpu.cfs_burst_us`` (v2 ``cpu.max.burst``) =
  limit cores * cpuBurstPercent % * period. The kernel refuses a burst larger than the quota
  (EINVAL; checked on this kernel), so the value is capped at the quota and the plan says so.
- Quota scaling (``cfsQuotaBurstOnly`` / ``auto``): :class:`CfsQuotaBurstController` keeps koordlet's
  loop per cgroup: x1.2 when it was throttled in the last sample and the token bucket allows it,
  x0.8 when the bucket refuses, clamped to [base, base * cfsQuotaBurstPercent %]; when the node's share
  pool usage reaches sharePoolThresholdPercent it stops and resets to the base quota.
  The token bucket holds at most ``cfs_quota_burst_period_seconds`` of running at the maximum scaled
  quota (-1 = unlimited): it fills while the cgroup uses less than its base quota and drains while it
  uses more.
- Never for LSR, LSE or BE targets (LSR/LSE have exclusive CPUs; BE must not get more).

The base quota is the one the cgroup had before we touched it (the journal's original), so
repeated scaling never compounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actuators.base import FileWrite, Plan, Refused
from actuators.cgroupfile import CgroupFiles, CgroupVanished, Resource
from actuators.journal import Journal, JournaledFileActuator
from detector.decisions import ActionKind, BurstAmount, Decision, Target
from detector.policy import CpuBurstStrategy

SCALE_UP = 1.2
SCALE_DOWN = 0.8
NO_BURST_QOS = frozenset({"LSR", "LSE", "BE"})


class BurstActuator(JournaledFileActuator):
    kind = ActionKind.BURST

    def __init__(self, files: CgroupFiles, journal: Journal, strategy: CpuBurstStrategy | None = None) -> None:
        super().__init__(journal)
        self.files = files
        self.strategy = strategy or CpuBurstStrategy(policy="auto")

    def base_quota_us(self, cgroup: str) -> tuple[int | None, int]:
        """(quota before we touched it or None if unlimited, period)."""
        current = self.files.read_cpu_max(cgroup)
        if self.files.version(Resource.CPU_QUOTA) == 1:
            original = self.journal.original(str(self.files.path(Resource.CPU_QUOTA, cgroup)))
            if original is not None:
                q = int(original)
                return (None if q < 0 else q), current.period_us
        else:
            original = self.journal.original(str(self.files.path(Resource.CPU_QUOTA, cgroup)))
            if original is not None:
                q_txt, p_txt = original.split()
                return (None if q_txt == "max" else int(q_txt)), int(p_txt)
        return current.quota_us, current.period_us

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
        try:
            return self._plan(decision, cgroup, amount, policy)
        except CgroupVanished as e:
            raise Refused(f"target is gone: {e}") from None

    def _plan(self, decision: Decision, cgroup: str, amount: BurstAmount, policy: str) -> Plan:
        base, period = self.base_quota_us(cgroup)
        if base is None:
            raise Refused(f"{decision.target.display} has no cfs quota: nothing throttles it")
        current = self.files.read_cpu_max(cgroup)
        cur_quota = current.quota_us if current.quota_us is not None else base
        new_quota = cur_quota
        parts: list[str] = []
        if amount.quota_scale is not None:
            if policy not in ("cfsQuotaBurstOnly", "auto"):
                raise Refused(f"quota scaling is off under policy {policy}")
            top = base * self.strategy.cfs_quota_burst_percent / 100.0
            new_quota = int(min(max(base * amount.quota_scale, base), top))
            parts.append(f"quota {cur_quota / period:.2f} -> {new_quota / period:.2f} cores")
        has_burst = self.files.exists(Resource.CPU_BURST, cgroup)
        cur_burst = self.files.read_burst_us(cgroup) if has_burst else 0
        new_burst = cur_burst
        if amount.burst_us is not None or (amount.quota_scale is None and policy in ("cpuBurstOnly", "auto")):
            if policy not in ("cpuBurstOnly", "auto"):
                raise Refused(f"cfs burst is off under policy {policy}")
            if not has_burst:
                raise Refused("this kernel has no CFS burst (cpu.cfs_burst_us / cpu.max.burst)")
            wanted = amount.burst_us if amount.burst_us is not None else \
                int(base / period * self.strategy.cpu_burst_percent / 100.0 * period)
            new_burst = min(wanted, new_quota)
            capped = " (capped at the quota: the kernel refuses more)" if new_burst < wanted else ""
            parts.append(f"burst {cur_burst} -> {new_burst} us{capped}")
        elif has_burst and cur_burst > new_quota:
            new_burst = new_quota  # a lower quota must not be below the burst
        writes: list[FileWrite] = []
        quota_writes = self.files.quota_writes(cgroup, new_quota) if new_quota != cur_quota else []
        burst_writes = [self.files.burst_write(cgroup, new_burst)] if has_burst and new_burst != cur_burst else []
        # order so that burst <= quota holds after every single write
        writes = quota_writes + burst_writes if new_quota >= cur_quota else burst_writes + quota_writes
        if not writes:
            raise Refused(f"{decision.target.display} already has quota {cur_quota} us, burst {cur_burst} us")
        return Plan(decision, f"burst {decision.target.display}: " + ", ".join(parts), tuple(writes),
                    details={"quota_us": new_quota, "base_quota_us": base, "burst_us": new_burst, "period_us": period})


@dataclass
class _BucketState:
    scale: float = 1.0
    tokens_core_s: float = 0.0
    throttled_last: bool = False


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
    ) -> Decision | None:
        if self.strategy.policy not in ("cfsQuotaBurstOnly", "auto"):
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
            st.scale, why = min(top, st.scale * SCALE_UP), "throttled last sample: scale up"
        else:
            why = ""
        st.throttled_last = throttled
        if abs(st.scale - old) < 1e-9:
            return None
        return Decision(ActionKind.BURST, target, BurstAmount(quota_scale=st.scale),
                        f"cfs quota burst x{st.scale:.2f}: {why}", victim=target, victim_signal="throttled_ratio")
