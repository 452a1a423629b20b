"""Multi-process runs: :func:`initialize` for the script, :func:`launch` to start it on one host.

A multi-process JAX program runs the same script in every process; each process
calls ``jax.distributed.initialize`` with the coordinator's address, the process
count and its own id before anything else touches JAX, and ``jax.devices()``
then lists the devices of every process. :func:`initialize` reads those three
from the environment:

* ``GPUSTAT_COORDINATOR``: ``host:port`` of process 0, reachable from every process;
* ``GPUSTAT_NUM_PROCESSES``: the total process count;
* ``GPUSTAT_PROCESS_ID``: this process's id, 0 .. count - 1;
* ``GPUSTAT_LOCAL_DEVICE_IDS`` (optional): comma-separated ids of the local
  devices this process uses (e.g. one GPU each of a host shared by several processes).

With none of the first three set it calls ``jax.distributed.initialize()``
without arguments, which detects SLURM, Open MPI, Kubernetes and the TPU
environments itself. :func:`launch` (``python -m gpustat.distributed.launch``)
starts the processes of one host with those variables set; on several hosts
the same script runs with the variables set per host.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import jax

__all__ = ["ENV_COORDINATOR", "ENV_LOCAL_DEVICE_IDS", "ENV_NUM_PROCESSES", "ENV_PROCESS_ID",
           "initialize", "launch", "main"]

ENV_COORDINATOR = "GPUSTAT_COORDINATOR"
ENV_NUM_PROCESSES = "GPUSTAT_NUM_PROCESSES"
ENV_PROCESS_ID = "GPUSTAT_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "GPUSTAT_LOCAL_DEVICE_IDS"
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _env_int(name: str, low: int) -> int:
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {low}, got {text!r}") from None
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value}")
    return value


def initialize(**kwargs) -> None:
    """``jax.distributed.initialize`` from the ``GPUSTAT_*`` environment, or auto-detected.

    Call it first in every process of a multi-process run, before any other JAX
    call. With ``GPUSTAT_COORDINATOR``, ``GPUSTAT_NUM_PROCESSES`` and
    ``GPUSTAT_PROCESS_ID`` set (by :func:`launch`, or per host by hand or by a job
    script) it passes them, and ``GPUSTAT_LOCAL_DEVICE_IDS`` when set; with none of
    them set it calls ``jax.distributed.initialize()`` alone, whose cluster
    detection reads SLURM, Open MPI, Kubernetes JobSet and TPU environments.

    Args:
        **kwargs: further keyword arguments of ``jax.distributed.initialize``
            (e.g. ``initialization_timeout``).

    Raises:
        ValueError: only some of the three variables are set, or one is not a valid
            integer (the message names the variable).
    """
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
    present = [name for name in names if os.environ.get(name)]
    if not present:
        jax.distributed.initialize(**kwargs)
        return
    if len(present) != len(names):
        missing = [name for name in names if name not in present]
        raise ValueError(f"set all of {', '.join(names)} or none; missing {', '.join(missing)}")
    num_processes = _env_int(ENV_NUM_PROCESSES, 1)
    process_id = _env_int(ENV_PROCESS_ID, 0)
    if process_id >= num_processes:
        raise ValueError(f"{ENV_PROCESS_ID} must lie in [0, {num_processes - 1}] "
                         f"({ENV_NUM_PROCESSES}={num_processes}), got {process_id}")
    ids = os.environ.get(ENV_LOCAL_DEVICE_IDS)
    if ids:
        try:
            kwargs.setdefault("local_device_ids", [int(i) for i in ids.split(",")])
        except ValueError:
            raise ValueError(f"{ENV_LOCAL_DEVICE_IDS} must be comma-separated integers, "
                             f"got {ids!r}") from None
    jax.distributed.initialize(coordinator_address=os.environ[ENV_COORDINATOR],
                               num_processes=num_processes, process_id=process_id, **kwargs)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process_env(base: dict, coordinator: str, num_processes: int, process_id: int,
                 devices_per_process: int | None) -> dict:
    env = {**base, ENV_COORDINATOR: coordinator, ENV_NUM_PROCESSES: str(num_processes),
           ENV_PROCESS_ID: str(process_id)}
    if devices_per_process is not None:
        # CPU: every process makes its own k host devices (the CPU backend ignores
        # local_device_ids); accelerators: the host's are shared out, k per process
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith(_DEVICE_COUNT_FLAG)]
        env["XLA_FLAGS"] = " ".join([*flags, f"{_DEVICE_COUNT_FLAG}={devices_per_process}"])
        first = process_id * devices_per_process
        env[ENV_LOCAL_DEVICE_IDS] = ",".join(
            str(i) for i in range(first, first + devices_per_process))
    return env


def _stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(command: Sequence[str], num_processes: int, *, devices_per_process: int | None = None,
           port: int | None = None, timeout: float | None = None) -> int:
    """Run ``command`` as ``num_processes`` processes of one multi-process JAX job on this host.

    Each process gets ``GPUSTAT_COORDINATOR=127.0.0.1:<port>``,
    ``GPUSTAT_NUM_PROCESSES`` and its ``GPUSTAT_PROCESS_ID``; the command calls
    :func:`initialize`. When one process fails (or the timeout passes) the others
    are stopped (SIGTERM, then SIGKILL after 5 s).

    Args:
        command: the program and its arguments, e.g. ``["python", "my_script.py"]``.
        num_processes: how many processes (>= 1).
        devices_per_process: devices k each process uses: accelerators
            ``i*k .. i*k + k - 1`` of this host go to process i
            (``GPUSTAT_LOCAL_DEVICE_IDS``); on the CPU backend (``JAX_PLATFORMS=cpu``)
            each process gets k host devices (``--xla_force_host_platform_device_count``).
            Default: JAX's own choice.
        port: coordinator port on 127.0.0.1 (default: a free one).
        timeout: seconds after which every process is stopped (default: none).

    Returns:
        0 when every process exits 0; else the first non-zero exit status (124 on timeout).

    Raises:
        ValueError: ``num_processes`` < 1, ``devices_per_process`` < 1 or an empty command.
    """
    if not command:
        raise ValueError("command must name a program to run, got an empty command")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    if devices_per_process is not None and (
            isinstance(devices_per_process, bool) or not isinstance(devices_per_process, int)
            or devices_per_process < 1):
        raise ValueError(f"devices_per_process must be an integer >= 1, got "
                         f"{devices_per_process!r}")
    coordinator = f"127.0.0.1:{_free_port() if port is None else port}"
    procs = [subprocess.Popen(list(command), env=_process_env(
        dict(os.environ), coordinator, num_processes, i, devices_per_process))
        for i in range(num_processes)]
    deadline = None if timeout is None else time.monotonic() + timeout
    status = 0
    try:
        while None in [p.poll() for p in procs]:  # a list: every process is polled
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:
                status = failed[0]
                break
            if deadline is not None and time.monotonic() > deadline:
                status = 124
                break
            time.sleep(0.05)
    finally:
        _stop(procs)
    return status or next((p.returncode for p in procs if p.returncode), 0)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpustat.distributed.launch [options] -- command ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m gpustat.distributed.launch",
        description="Start N processes of one multi-process JAX job on this host; the "
                    "command calls gpustat.distributed.initialize().")
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--devices-per-process", type=int, default=None,
                        help="devices k per process: accelerators i*k .. i*k+k-1 to process "
                             "i, or k host devices each on the CPU backend")
    parser.add_argument("--port", type=int, default=None,
                        help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop every process after this many seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # a SIGTERM to the launcher stops its processes too (SystemExit runs launch's cleanup)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return launch(command, args.num_processes, devices_per_process=args.devices_per_process,
                      port=args.port, timeout=args.timeout)
    except ValueError as e:
        parser.error(str(e))
    finally:
        signal.signal(signal.SIGTERM, previous)
