"""Command line: ``python -m gpustat info | demo | bench <module>`` (also ``gpustat-jax ...``).

The import name ``gpustat`` is shared with NVIDIA's GPU monitor (distribution ``gpustat``);
``python -m gpustat info`` names this library and its distribution, ``gpustat-jax``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import jax

from gpustat._backend import (
    BackendUnavailableError,
    available_backends,
    cuda_gpu_available,
    resolve_backend,
)
from gpustat.demos import demo_modules, demo_names

_PACKAGES = ("jax", "jaxlib", "numpy", "scipy", "optax", "jaxtyping", "triton", "jax-triton")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _kernel_modules() -> list[str]:
    import pkgutil

    import gpustat.pallas

    return sorted(m.name for m in pkgutil.iter_modules(gpustat.pallas.__path__)
                  if not m.name.startswith("_"))


def info() -> str:
    """What this machine runs: versions, devices, backends, kernels."""
    import gpustat

    lines = [f"gpustat {gpustat.__version__}: JAX GPU kernels for statistical computation "
             f"(distribution gpustat-jax {_version('gpustat-jax')}, python "
             f"{platform.python_version()}, {Path(gpustat.__file__).parent})"]
    lines += [f"  {name:<10} {_version(name)}" for name in _PACKAGES]
    lines.append(f"JAX default backend: {jax.default_backend()}")
    for device in jax.devices():
        lines.append(f"  device {device.id}: {device.platform} {device.device_kind}")
    lines.append(f"float64 enabled: {jax.config.jax_enable_x64}")
    lines.append(f"available backends: {', '.join(available_backends())}")
    mode = "compiled on the GPU" if cuda_gpu_available() else "interpret mode only (no CUDA GPU)"
    lines.append(f"Pallas kernels ({mode}): {', '.join(_kernel_modules())}")
    return "\n".join(lines)


_HEADER = ("capability", "case", "backend", "max error", "time (ms)", "note")
_WIDTHS = (13, 34, 9, 9, 10, 0)


def _format_row(cells) -> str:
    return "  ".join(f"{c:<{w}}" if w else str(c) for c, w in zip(cells, _WIDTHS, strict=True))


def _row_cells(r) -> tuple:
    return (r.capability, r.case, r.backend, f"{r.max_error:.2e}", f"{r.seconds * 1e3:.2f}",
            r.note)


def _table_head() -> str:
    return "\n".join([_format_row(_HEADER), _format_row(["-" * max(w, 4) for w in _WIDTHS])])


def demo(backend: str, only: list[str] | None, small: bool, stream: bool = False) -> list:
    """Run the demos of ``only`` (default: all) through ``backend`` ("auto": the kernels
    on a GPU, the reference and interpret mode elsewhere) and return the rows; with
    ``stream`` each row is printed as a table line when it completes."""
    from tqdm import tqdm

    if backend == "auto":
        # the Pallas kernels (compiled, or interpreted on a CPU) where JAX still has their
        # lowering; else "auto" on a GPU (the jax-triton and Mosaic GPU kernels), the
        # reference alone on a CPU
        kernels = ["pallas"] if cuda_gpu_available() else ["reference", "interpret"]
        backends = [b for b in kernels if b in available_backends()] or ["auto"]
    else:
        resolve_backend(backend, op="demo")
        backends = [backend]
    runs = []
    for module in demo_modules(only):
        if getattr(module, "FLOAT64_ONLY", False) and not jax.config.jax_enable_x64:
            print(f"skipping {module.CAPABILITY}: float64 only, and 64-bit types are off "
                  "(GPUSTAT_X32=1)", file=sys.stderr, flush=True)
            continue
        runs += [(module, name) for name in backends]
    rows = []
    with tqdm(runs, desc="demo", unit="run", file=sys.stderr, leave=False) as progress:
        for module, name in progress:
            progress.set_postfix_str(f"{module.CAPABILITY} [{name}]")
            for row in module.run(name, small):
                rows.append(row)
                if stream:
                    progress.write(_format_row(_row_cells(row)), file=sys.stdout)
    return rows


def _benchmark_modules(root: Path) -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in (root / "benchmarks").glob("bench_*.py"))


def _require_cuda_gpu(modules: list[str]) -> None:
    """Exit unless JAX runs on a CUDA GPU: elsewhere the benchmarks would time
    something other than the compiled kernels and record it as results."""
    if not cuda_gpu_available():
        devices = sorted({f"{d.platform}:{d.device_kind}" for d in jax.devices()})
        raise SystemExit(
            f"error: benchmarks of {modules} need a CUDA GPU, but JAX's default backend is "
            f"{jax.default_backend()!r} with devices {devices}; nothing was run or recorded. "
            "`python -m gpustat demo` runs the reference and interpret mode here (some "
            "benchmarks/bench_<module>.py scripts document a CPU smoke run).")


def bench(modules: list[str], quick: bool, out: Path | None) -> None:
    """Run ``benchmarks/bench_<module>.py`` of a source checkout."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "harness.py").exists():
        raise SystemExit("gpustat bench needs a source checkout (benchmarks/ beside gpustat/)")
    known = _benchmark_modules(root)
    names = known if modules == ["all"] else modules
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"no benchmarks for {unknown}; known modules: {known}")
    _require_cuda_gpu(names)
    sys.path.insert(0, str(root))
    failed = []
    for name in names:
        print(f"== bench {name}", flush=True)
        module = importlib.import_module(f"benchmarks.bench_{name}")
        try:
            module.run(quick=quick, out=out)
        except Exception as exc:  # one module's failure must not hide the others' numbers
            print(f"bench {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
            failed.append(name)
    if failed:
        raise SystemExit(f"benchmarks failed: {failed}")


def main(argv: list[str] | None = None) -> int:
    epilog = ("64-bit types are on unless GPUSTAT_X32=1 (the demo then skips the "
              "float64-only bms and border).")
    parser = argparse.ArgumentParser(prog="python -m gpustat", description=__doc__,
                                     epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, devices, backends, which kernels run here")
    p_demo = sub.add_parser("demo", help="every capability end to end on small synthetic data")
    p_demo.add_argument("--backend", default="auto",
                        choices=["auto", "pallas", "reference", "interpret"],
                        help="auto (default): the kernels on a CUDA GPU, else the reference "
                             "and interpret mode")
    p_demo.add_argument("--only", nargs="+", metavar="MODULE", choices=demo_names(),
                        help=f"run these capabilities: {', '.join(demo_names())}")
    p_demo.add_argument("--full", action="store_true", help="larger sizes")
    p_bench = sub.add_parser("bench", help="benchmarks of one module (or 'all')")
    p_bench.add_argument("modules", nargs="+", metavar="module")
    p_bench.add_argument("--quick", action="store_true", help="acceptance cases only")
    p_bench.add_argument("--out", type=Path, default=None, help="folder for <module>.jsonl")
    args = parser.parse_args(argv)

    if os.environ.get("GPUSTAT_X32") != "1":
        jax.config.update("jax_enable_x64", True)
    if args.command == "info":
        print(info())
    elif args.command == "demo":
        try:
            resolve_backend(args.backend, op="demo")
            print(_table_head(), flush=True)
            rows = demo(args.backend, args.only, small=not args.full, stream=True)
        except BackendUnavailableError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if any(r.max_error != r.max_error for r in rows):  # NaN error: a demo failed
            return 1
    else:
        bench(args.modules, args.quick, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
