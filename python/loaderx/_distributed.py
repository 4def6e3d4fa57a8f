"""Which slice of the global batch this process reads: ``distributed_shard``.

Read from the framework when one is initialised, else from what the launcher
put in the environment, so that a call made before
``init_process_group`` still gives every rank its own slice; a mismatch, or
a launcher that says "several processes" without saying which one this is,
is reported instead of silently reading the whole batch on every rank.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["distributed_shard"]

# (rank variable, world-size variable), in the order they are trusted:
# torchrun and torch.distributed launchers, SLURM's srun, Open MPI's mpirun,
# MPICH / Intel MPI (PMI).
LAUNCHERS = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)


def launcher_shard() -> tuple[int, int, str] | None:
    """``(rank, world, source)`` from the first launcher whose two variables
    are both set, else None. Malformed values are a ValueError."""
    for rank_var, world_var in LAUNCHERS:
        rank, world = os.environ.get(rank_var), os.environ.get(world_var)
        if rank is None or world is None:
            continue
        try:
            r, w = int(rank), int(world)
        except ValueError:
            raise ValueError(f"{rank_var}={rank!r} and {world_var}={world!r} must be integers") from None
        if not 0 <= r < w:
            raise ValueError(f"{rank_var}={r} is not a rank of {world_var}={w}")
        return r, w, f"{rank_var}/{world_var}"
    return None


def framework_shard() -> tuple[int, int] | None:
    """``(rank, world)`` from torch.distributed or a multi-process JAX, when
    one of them is imported and initialised (neither is imported here)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            count = int(jax.process_count())
            if count > 1:
                return int(jax.process_index()), count
        except Exception:  # JAX not initialised for multi-process use
            pass
    return None


def _local_world() -> str | None:
    """What says this node runs several processes, when nothing says which
    rank this is (a launcher that sets only the local variables)."""
    size = os.environ.get("LOCAL_WORLD_SIZE")
    if size is not None and size.strip().isdigit() and int(size) > 1:
        return f"LOCAL_WORLD_SIZE={size}"
    if os.environ.get("LOCAL_RANK") is not None:
        return f"LOCAL_RANK={os.environ['LOCAL_RANK']}"
    return None


def distributed_shard() -> tuple[int, int]:
    """``(shard_index, shard_count)`` of this process: from ``torch.distributed``
    or JAX when either is initialised, else from the launcher's environment
    (``RANK``/``WORLD_SIZE`` as torchrun sets them, SLURM's
    ``SLURM_PROCID``/``SLURM_NTASKS``, Open MPI's ``OMPI_COMM_WORLD_RANK``/
    ``OMPI_COMM_WORLD_SIZE``, or PMI's ``PMI_RANK``/``PMI_SIZE``), else
    ``(0, 1)``. Pass them to ``DataLoader(..., shard_index=..., shard_count=...)``.

    Reading the environment means a call made before
    ``init_process_group`` still gives every rank its own slice. A RuntimeWarning
    says when that would go wrong: a framework that reports another world
    than the environment (some ranks would read the same records; the
    framework's answer is used), or a node-local variable (``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE`` > 1) with no global rank anywhere (every process
    would read the whole batch)."""
    env = launcher_shard()
    found = framework_shard()
    if found is not None:
        if env is not None and env[:2] != found:
            warnings.warn(
                f"the framework reports rank {found[0]} of {found[1]}, but {env[2]} say rank "
                f"{env[0]} of {env[1]}: using the framework's",
                RuntimeWarning,
                stacklevel=2,
            )
        return found
    if env is not None:
        return env[0], env[1]
    local = _local_world()
    if local is not None:
        warnings.warn(
            f"{local} is set but no global rank is (no RANK/WORLD_SIZE, no initialised "
            "torch.distributed or JAX): treating this process as the only one, so it reads "
            "the whole global batch; call distributed_shard() after init_process_group, or "
            "pass shard_index/shard_count",
            RuntimeWarning,
            stacklevel=2,
        )
    return 0, 1
