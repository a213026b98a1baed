"""What this CPU is: physical cores (the default thread count), model name,
feature flags and last-level cache, as Linux reports them."""
import os
from pathlib import Path


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (SMT siblings count once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def _cpuinfo_field(name: str) -> str | None:
    """The first value of a /proc/cpuinfo field (None where there is no such file or field)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_model() -> str:
    """The CPU's model name, with family/model/stepping where the name is vague (e.g. 'AMD EPYC' in a VM)."""
    name = _cpuinfo_field("model name") or "unknown CPU"
    ids = [(k, _cpuinfo_field(k)) for k in ("cpu family", "model", "stepping")]
    if all(v is not None for _, v in ids):
        name += " (" + ", ".join(f"{k} {v}" for k, v in ids) + ")"
    return name


def cpu_flags() -> set[str]:
    """The feature flags Linux reports for this CPU (/proc/cpuinfo), e.g. 'avx2', 'avx512_bf16'."""
    return set((_cpuinfo_field("flags") or "").split())


def last_level_cache_bytes() -> int | None:
    """Size of CPU 0's largest cache (sysfs), None if not reported."""
    best = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best or 0, int(digits) * scale)
    return best
