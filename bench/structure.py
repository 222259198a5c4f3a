"""The package's structure, measured: rooms and their modules, the import arrows between rooms
and between stages, where the production job lives, and the sizes the architecture test
caps (modules over 400 lines, functions over 60, lines over 100, `# fmt: skip`). Read from
the source with ast only (nothing is imported), for this checkout and, with ``--against``,
another one (a worktree of an older commit), side by side.

    .venv/bin/python bench/structure.py [--against /tmp/before]
"""

from __future__ import annotations

import argparse
import ast
import re
from collections import Counter
from pathlib import Path

ROOMS = ("cli", "stages", "production", "runtime", "model")
# what the production job is, by what it does (the launcher, its history, the job's body,
# the trainer, stops, monitoring), wherever a checkout keeps it
PRODUCTION = re.compile(
    r"(^|\.)(launch|launcher|jobs|history|jobdir|attempts|submission|job|trainer|stops|monitor"
    r"|relaunch|replan|records"
    r"|confirm)$"
)


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ROOMS else "shared"


def modules(src: Path) -> dict[str, Path]:
    out = {}
    for f in sorted((src / "tula").rglob("*.py")):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules ``name`` imports (at any depth of the file)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative
                pkg = name.split(".")[: -node.level] if path.stem != "__init__" else name.split(".")
                base = ".".join(pkg + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("tula."):
                out.add(t)
    return out


def measure(root: Path) -> dict:
    src = root / "src"
    mods = modules(src)
    known = set(mods)
    edges = {(a, b) for a, p in mods.items() for b in imports(a, p, known)}
    cross = Counter((room(a), room(b)) for a, b in edges if room(a) != room(b))
    stage_to_stage = sorted(
        f"{a} -> {b}"
        for a, b in edges
        if room(a) == room(b) == "stages" and a.split(".")[2] != b.split(".")[2]
    )
    prod = sorted(m for m in mods if PRODUCTION.search(m) and room(m) != "cli")
    long_fns, lines_over, skips = 0, 0, 0
    big = []
    for f in mods.values():
        text = f.read_text()
        n = len(text.splitlines())
        if n > 400:
            big.append(f"{f.relative_to(src)} ({n})")
        lines_over += sum(len(line) > 100 for line in text.splitlines())
        skips += len(re.findall(r"#\s*fmt:\s*(skip|off)", text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                long_fns += node.end_lineno - node.lineno + 1 > 60
    return {
        "modules": len(mods),
        "per room": dict(Counter(room(m) for m in mods)),
        "arrows between rooms": sum(cross.values()),
        "arrows up (against cli > stages > production > runtime > model)": sum(
            v
            for (a, b), v in cross.items()
            if a in ROOMS and b in ROOMS and ROOMS.index(b) < ROOMS.index(a)
        ),
        "stage -> stage imports": stage_to_stage,
        "production job: modules": prod,
        "production job: rooms": sorted({room(m) for m in prod}),
        "modules over 400 lines": big,
        "functions over 60 lines": long_fns,
        "lines over 100 characters (src)": lines_over,
        "fmt: skip (src)": skips,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="another checkout's root (e.g. a worktree of an old commit)")
    a = ap.parse_args()
    now = measure(Path(__file__).resolve().parents[1])
    before = measure(Path(a.against)) if a.against else None
    for key, value in now.items():
        print(f"- {key}:")
        if before is not None:
            print(f"    before: {before[key]}")
        print(f"    now:    {value}")


if __name__ == "__main__":
    main()
