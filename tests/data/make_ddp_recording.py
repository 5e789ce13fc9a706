"""Makes tests/data/ddp: `fdtrace run --record` around a small gloo DDP job (2 ranks, 3 steps,
a checkpoint), in a network namespace with only loopback.

Run as root from the repository root, with torch==2.13.0 installed in .venv:
    .venv/bin/python tests/data/make_ddp_recording.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE / "ddp"
FDTRACE = str(Path(sys.executable).with_name("fdtrace"))


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    namespace = "fdtrace-fixture"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", namespace, FDTRACE, "run", "--record", str(OUT), "--",
                        sys.executable, str(HERE / "ddp_train.py"), "--steps", "3", "--checkpoint",
                        "/tmp/fdtrace-fixture-checkpoint.pt"], check=True)
    finally:
        subprocess.run(["ip", "netns", "delete", namespace], check=False)
    for path in OUT.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    OUT.chmod(0o755)
    print(f"recorded to {OUT}")


if __name__ == "__main__":
    main()
