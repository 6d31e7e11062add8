"""Start-up cost: `import packtool`, `packtool --help` and `packtool pack --help`, as whole
processes, against a bare interpreter (`python -c pass`) run in the same rounds.

Each round runs every command once, in turn, so that a machine whose speed drifts moves all of
them alike; the table gives the median, minimum and maximum wall and CPU (user + system)
seconds over the rounds, and each command's median ratio to the bare interpreter taken round
by round. Issue 16's target: `import packtool` and `packtool --help` under 0.3 s.

    python benchmarks/bench_startup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import packtool": [sys.executable, "-c", "import packtool"],
    "packtool --help": [sys.executable, "-m", "packtool", "--help"],
    "packtool pack --help": [sys.executable, "-m", "packtool", "pack", "--help"],
}


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode
    for argv_ in COMMANDS.values():  # warm the file cache and write the bytecode
        run_once(argv_, env)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, argv_ in COMMANDS.items():
            runs[name].append(run_once(argv_, env))
    print(
        f"start-up: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
        f"{os.getloadavg()[0]:.1f}, {args.rounds} rounds"
    )
    header = f"{'command':<22} {'wall s (min-max)':>22} {'cpu s (min-max)':>22} {'cpu / bare':>11}"
    print(header)
    print("-" * len(header))
    bare = runs["python -c pass"]
    for name, results in runs.items():
        walls, cpus = [w for w, _ in results], [c for _, c in results]
        ratio = statistics.median(c / b[1] for (_, c), b in zip(results, bare, strict=True))
        print(
            f"{name:<22} {_spread(walls):>22} {_spread(cpus):>22} {ratio:>10.2f}x",
        )
    sys.stdout.flush()


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


if __name__ == "__main__":
    main()
