"""A lane's venv in a clone, layered on a shared one that holds its heavy packages.

    python3.11 scripts/layered_venv.py DEST NAME [--pip "ARGS"]... [--check CODE]

The packages that ``--pip`` names (each a ``pip install`` line, run in order) are installed
once into ``$IDIST_VENV_CACHE/NAME-KEY`` (default ``~/.cache/idist/venvs``), KEY being a hash
of NAME, the lines and the Python version. ``DEST`` is then a small venv of this clone: its
site-packages reads the shared one's (a ``.pth`` file), its ``bin`` runs the shared console
scripts with its own python, and this clone's idist is installed editable into it alone. So a
fresh clone gets a lane's 7 GB of torch and torch_xla in a second instead of a minute and a
half of CPU, and clones never see each other's idist.

A second run with the same KEY does nothing. A shared venv is built under a lock (two runs
may start at once) and is used only once it is complete; the two most recently used per NAME
are kept, older ones are deleted. Prints DEST's python (relative when DEST is).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEEP = 2
#: what every shared venv gets first: setuptools new enough to install idist editable without
#: build isolation (its pyproject.toml needs 77 or later)
BASE = "--upgrade pip setuptools>=77"
#: the interpreter's name in a venv's bin and lib folders
PYTHON_NAME = f"python{sysconfig.get_python_version()}"
COMPLETE = ".idist-complete"
USED = ".idist-used"


def log(msg: str) -> None:
    print(f"layered_venv: {msg}", file=sys.stderr, flush=True)


def pip(python: Path, line: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", *shlex.split(line)], check=True)


def site_packages(venv: Path) -> Path:
    return venv / "lib" / PYTHON_NAME / "site-packages"


def short_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def build_shared(shared: Path, lines: list[str], check: str | None) -> None:
    """Make the shared venv once; ``shared`` is complete when its marker exists."""
    shared.parent.mkdir(parents=True, exist_ok=True)
    with open(shared.parent / f"{shared.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building it: wait for it
        if (shared / COMPLETE).exists():
            return
        if shared.exists():
            log(f"removing the incomplete {shared}")
            shutil.rmtree(shared)
        log(f"building {shared}")
        subprocess.run([sys.executable, "-m", "venv", str(shared)], check=True)
        python = shared / "bin" / "python"
        pip(python, BASE)
        for line in lines:
            pip(python, line)
        if check:
            subprocess.run([str(python), "-c", check], check=True)
        (shared / COMPLETE).write_text(" ;; ".join(lines) + "\n")


def prune(cache: Path, name: str, keep: Path) -> None:
    """Delete this NAME's shared venvs beyond the KEEP most recently used (never ``keep``)."""
    mine = [p for p in cache.glob(f"{name}-*") if p.is_dir() and (p / COMPLETE).exists()]
    mine.sort(key=lambda p: (p / USED).stat().st_mtime if (p / USED).exists() else 0.0, reverse=True)
    for old in [p for p in mine if p != keep][KEEP - 1 :]:
        log(f"deleting {old} (not among the {KEEP} most recently used)")
        shutil.rmtree(old, ignore_errors=True)
        old.with_name(f"{old.name}.lock").unlink(missing_ok=True)


def wrap_scripts(shared: Path, dest: Path) -> None:
    """DEST/bin runs each shared console script with DEST's python (so it sees DEST's idist)."""
    own = {"python", "python3", PYTHON_NAME}
    for script in (shared / "bin").iterdir():
        target = dest / "bin" / script.name
        if script.name in own or script.name.startswith(("activate", "Activate", "pip")) or target.exists():
            continue
        head = script.read_bytes()[:256]
        if head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0]:
            body = script.read_text().split("\n", 1)[1]
            target.write_text(f"#!{dest / 'bin' / 'python'}\n{body}")
            target.chmod(0o755)
        else:  # a binary (ruff) or a shell script: as it is
            target.symlink_to(script)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path)
    parser.add_argument("name")
    parser.add_argument("--pip", action="append", default=[], help="one pip install line for the shared venv")
    parser.add_argument("--check", help="Python code the shared venv must run without error once built")
    args = parser.parse_args()
    lines: list[str] = args.pip
    key = short_hash("\n".join([args.name, sysconfig.get_python_version(), BASE, *lines, args.check or ""]).encode())
    # DEST is remade (a second) when idist's metadata or this script's layout changes
    project = short_hash((ROOT / "pyproject.toml").read_bytes() + Path(__file__).read_bytes())
    cache = Path(os.environ.get("IDIST_VENV_CACHE", Path.home() / ".cache" / "idist" / "venvs"))
    shared = cache / f"{args.name}-{key}"
    dest: Path = args.dest if args.dest.is_absolute() else Path.cwd() / args.dest
    stamp = dest / f".idist-layered-{key}-{project}"
    python = dest / "bin" / "python"
    if not stamp.exists() or not (shared / COMPLETE).exists():
        build_shared(shared, lines, args.check)
        if dest.exists():
            shutil.rmtree(dest)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
        # the shared site-packages comes after DEST's own, so DEST's editable idist is the one found:
        # as a path line (what static tools such as pyright read), then as an import line that runs
        # at start-up and reads the shared venv's own .pth files
        shared_site = str(site_packages(shared))
        (site_packages(dest) / "_idist_layered.pth").write_text(
            f"{shared_site}\nimport site; site.addsitedir({shared_site!r})\n"
        )
        wrap_scripts(shared, dest)
        pip(python, f"--no-deps --no-build-isolation -e {shlex.quote(str(ROOT))}")
        stamp.touch()
    (shared / USED).touch()  # now, also when it exists: what prune() orders by
    prune(cache, args.name, shared)
    print(args.dest / "bin" / "python")  # as given: relative when DEST was
    return 0


if __name__ == "__main__":
    sys.exit(main())
