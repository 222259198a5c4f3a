"""The package map holds (docs/architecture.md): the import contracts of pyproject.toml
(import-linter), no torch when a stage, an equation or a shared module is imported, a reason
beside every function-local import, and modules and functions a reader can take in."""

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT

SRC = ROOT / "src" / "tula"
MAX_MODULE_LINES = 390
MAX_FUNCTION_LINES = 60
LONG_REASON = "Long because"  # a function over the limit says why in its docstring


def modules(*rooms: str, src: Path = SRC) -> list[str]:
    """Dotted names of the package's modules in the given rooms ('' = the shared top level);
    ``src``: the package's folder."""
    out = []
    for room in rooms:
        base = src / room if room else src
        for f in sorted(base.glob("*.py")):
            if not f.stem.startswith("__"):  # __init__, __main__
                out.append(".".join(["tula", *([room] if room else []), f.stem]))
        for f in sorted(base.glob("*/__init__.py")):  # a module grown into a package
            if room:  # (the top level's packages are the rooms themselves)
                out.append(".".join(["tula", room, f.parent.name]))
    return out


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package under ``root/src`` with this project's contracts."""
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "lint-imports"),
            "--config",
            str(ROOT / "pyproject.toml"),
            "--no-cache",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
    )


def test_the_import_contracts_are_kept():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.stdout.count(" KEPT") == len(contracts()) and "BROKEN" not in r.stdout


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def unnamed(package: Path, contracts: list[dict]) -> tuple[list[str], list[str]]:
    """The modules of ``package`` (the source tree of tula) that no contract names: (the top
    level's modules and rooms that no contract but the acyclic one names, by themselves or a
    parent; the stages that the stages' independence contract leaves out)."""
    named = set()
    for c in contracts:
        named.update(c.get("source_modules", []), c.get("modules", []), c.get("layers", []))
    rooms = {f"tula.{d.parent.name}" for d in package.glob("*/__init__.py")}
    tops = set(modules("", src=package)) | rooms
    (independent,) = [c["modules"] for c in contracts if c["type"] == "independence"]
    return sorted(tops - named), sorted(set(modules("stages", src=package)) - set(independent))


def test_every_module_of_the_package_is_named_by_a_contract():
    """A module that no contract names may import anything: every module at the top of the
    package and every room is named by a contract, and every stage by the stages'
    independence."""
    assert unnamed(SRC, contracts()) == ([], [])


def test_a_module_no_contract_names_is_found(tmp_path):
    package = tmp_path / "tula"
    (package / "stages").mkdir(parents=True)
    for f in ("__init__.py", "config.py", "stray.py", "stages/__init__.py", "stages/fit.py"):
        (package / f).write_text("")
    (package / "stages" / "late.py").write_text("")
    own = [
        {"type": "forbidden", "source_modules": ["tula.config"]},
        {"type": "independence", "modules": ["tula.stages.fit"]},
        {"type": "layers", "layers": ["tula.stages"]},
    ]
    assert unnamed(package, own) == (["tula.stray"], ["tula.stages.late"])


TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    "  # an import for types only


@pytest.mark.parametrize(
    "module, planted, broken",
    [
        ("model/grid.py", "from tula.stages import select", "The equations import no torch"),
        ("model/choice.py", "from tula.production import jobdir", "The equations import no torch"),
        (
            "stages/report/__init__.py",
            "from tula.stages import aggregate",
            "Stages import no other stage",
        ),
        ("production/confirm.py", "import torch", "launcher side imports no torch"),
        ("runtime/step/replica.py", "from tula.production import monitor", "One arrow down"),
        ("model/noise.py", "import torch", "The equations import no torch"),
        (
            "stages/fit.py",
            "from tula.runtime.step import replica",
            "Stages reach torch only through",
        ),
        ("runtime/input/data.py", "from tula.stages import fit", "One arrow down"),
        ("model/grid.py", "from tula.model import memory", "No import cycles"),
        (
            "runtime/step/evaluation.py",
            TYPE_ONLY + "from tula.runtime.step import replica",
            "No import cycles",
        ),
        (
            "production/ledger.py",
            TYPE_ONLY + "from tula.production import trainer",
            "No import cycles",
        ),
        ("runtime/timer/timing.py", "from tula.runtime.step import replica", "runtime's rooms"),
        ("runtime/input/loader.py", "from tula.runtime.train import recipe", "runtime's rooms"),
        ("io.py", "from tula.model import grid", "Shared modules"),
        ("figures.py", "from tula.production import jobdir", "Shared modules"),
    ],
)
def test_a_planted_import_breaks_its_contract(tmp_path, module, planted, broken):
    shutil.copytree(SRC, tmp_path / "src" / "tula", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "src" / "tula" / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    r = lint_imports(tmp_path)
    assert r.returncode != 0
    assert any(broken in line and "BROKEN" in line for line in r.stdout.splitlines()), r.stdout


LAUNCHER_SIDE = [
    "tula.production.launcher",
    "tula.production.relaunch",
    "tula.production.replan",
    "tula.production.confirm",
    "tula.production.jobdir",
    "tula.production.attempts",
    "tula.production.submission",
    "tula.production.job",
]


@pytest.mark.parametrize(
    "module", ["tula.cli", *modules("", "cli", "stages", "model"), *LAUNCHER_SIDE]
)
def test_importing_a_launcher_module_loads_no_torch(module):
    """Launchers (`tula probe`'s parent, `tula launch` and its job's class, Snakemake parsing the
    workflow) never pay for torch: only the workers import it."""
    code = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'torchvision') or m.startswith('tula.runtime')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"{module} loads {r.stdout.strip()}"


def _function_local_imports(tree: ast.AST):
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


def _reason_given(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's own lines, or above the block of imports it belongs to."""
    if any("#" in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    k = node.lineno - 2
    while (
        k >= 0
        and lines[k].strip().startswith(("from ", "import ", ")"))
        or (k >= 0 and lines[k].startswith(" ") and lines[k].strip().endswith(","))
    ):
        k -= 1
    return k >= 0 and lines[k].strip().startswith("#")


def test_every_function_local_import_says_why():
    """Function-local imports only where start-up time needs them, each with its reason: a
    comment on (or just above) the import, or a module comment that names the rule for the
    file."""
    missing = []
    for f in sorted(SRC.rglob("*.py")):
        text = f.read_text()
        lines = text.splitlines()
        file_reason = (
            "# torch is imported inside" in text
            or "# Each dataset's library" in text
            or ("# Each command imports its stage's module" in text)
        )
        for node in _function_local_imports(ast.parse(text)):
            if not _reason_given(lines, node) and not file_reason:
                missing.append(
                    f"{f.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                )
    assert not missing, "function-local imports without a reason:\n" + "\n".join(missing)


def test_no_module_over_the_limit():
    big = {
        str(f.relative_to(ROOT)): n
        for f in SRC.rglob("*.py")
        if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


def test_no_function_over_the_limit_without_a_reason():
    long = []
    for f in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and LONG_REASON not in (ast.get_docstring(node) or ""):
                    long.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} lines with no '{LONG_REASON} ...' in the docstring: "
        f"{long}"
    )


# another project's tracker, cited for why its behaviour is kept
UPSTREAM_REFERENCES = ("kneed issue",)


def test_code_says_why_not_when():
    """No issue numbers of this project in code, docstrings or comments: the history lives in
    git and docs/benchmarks-log/, the code says why."""
    cited = re.compile(r"\b[Ii]ssues? #?[0-9]+")
    found = []
    for f in sorted(
        [
            *SRC.rglob("*.py"),
            *(ROOT / "tests").rglob("*.py"),
            *(ROOT / "bench").rglob("*.py"),
            *(ROOT / "rules").glob("*.smk"),
            ROOT / "Snakefile",
        ]
    ):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if cited.search(line) and not any(u in line for u in UPSTREAM_REFERENCES):
                found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "issue numbers in code:\n" + "\n".join(found)


def test_the_formatter_decides_the_layout():
    """`ruff format` lays out src, tests and bench (line length 100, pyproject.toml) and `ruff
    check` finds nothing; a `# fmt: skip` only where a table reads better aligned."""
    ruff = str(Path(sys.executable).parent / "ruff")
    dirs = ["src", "tests", "bench"]
    fmt = subprocess.run(
        [ruff, "format", "--check", *dirs], cwd=ROOT, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout[-3000:] + fmt.stderr[-2000:]
    lint = subprocess.run([ruff, "check", *dirs], cwd=ROOT, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr[-2000:]
    skips = [
        f"{f.relative_to(ROOT)}:{n}"
        for d in dirs
        for f in sorted((ROOT / d).rglob("*.py"))
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if re.search(r"#\s*fmt:\s*(skip|off)\s*$", line)
    ]
    assert len(skips) <= 5, f"hand-laid-out code, more than a few tables: {skips}"


# Objects that are not Tula's own, whose fields their library's interface is to set, and the
# one class whose module sets its field beside it: (module, the assignment's target) -> why.
FOREIGN_FIELDS = {
    ("runtime/input/builtin_sets.py", "args.num_samples"): "mnist1d's settings object",
    ("runtime/input/builtin_sets.py", "args.seed"): "mnist1d's settings object",
    ("runtime/group/dist.py", "torch.backends.cudnn.benchmark"): "torch's global switch",
    (
        "runtime/train/methods.py",
        "ddp.tula_polo_state",
    ): "torch's DDP keeps no comm hook state itself",
    ("runtime/train/methods.py", "state.iter"): "torch's PostLocalSGDState counts in its own field",
    ("runtime/step/nets.py", "setattr(cfg, ...)"): "torch._dynamo's config module",
    ("runtime/train/optim.py", "p.grad"): "a torch Parameter's gradient",
    (
        "runtime/train/optim_state.py",
        "opt.param_groups",
    ): "torch's Optimizer, relinked after loading",
    ("runtime/train/refresh.py", "p.grad"): "a torch Parameter's gradient",
    (
        "runtime/train/optim.py",
        "self.optim.found_inf",
    ): "torch's optimizer, as its GradScaler sets it",
    ("runtime/step/replica.py", "self.ddp.require_forward_param_sync"): "torch's DDP's own switch",
    ("runtime/step/epoch_walk.py", "self.pos.step"): "the walk's own Position record",
    ("runtime/step/epoch_walk.py", "self.pos.offset"): "the walk's own Position record",
    ("runtime/step/epoch_walk.py", "self.pos.epoch"): "the walk's own Position record",
    ("slurm/plugin_patch.py", "plugin.get_submit_command"): "the SLURM plugin's submit "
    "builder, narrowed until its failed-node exclusion is fixed upstream",
    ("workers/script_run.py", "sys.argv"): "the user's script's own arguments, as `python "
    "script.py args` sets them",
}


def field_assignments(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, target) of every assignment to an attribute of anything but ``self``/``cls``
    itself (``self.x.y = ...`` sets the field of another object), and of every ``setattr`` on
    anything but ``self``/``cls``."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr":
            if getattr(node.args[0], "id", "") not in ("self", "cls"):  # its own, by name
                found.append((node.lineno, f"setattr({ast.unparse(node.args[0])}, ...)"))
        flat = [
            e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
        ]
        for t in flat:
            own = isinstance(t, ast.Attribute) and getattr(t.value, "id", "") in ("self", "cls")
            if isinstance(t, ast.Attribute) and not own:
                found.append((node.lineno, ast.unparse(t)))
    return found


def test_no_module_assigns_another_objects_fields():
    """State is changed by the object that owns it, through its methods (seven modules once
    assigned the replica's fields, and the trainer attached hooks by assigning lambdas)."""
    outside = [
        f"{rel}:{line}: {target}"
        for f in sorted(SRC.rglob("*.py"))
        for line, target in field_assignments(ast.parse(f.read_text()))
        if ((rel := str(f.relative_to(SRC))), target) not in FOREIGN_FIELDS
    ]
    assert not outside, "fields assigned from outside their object:\n" + "\n".join(outside)


REPLICA_INSIDES = ("pos", "opt", "stream")  # the replica's position, optimizer and data stream


def _replica_names(tree: ast.AST) -> set[str]:
    """The names a module holds a replica under: ``replica``, and any name bound to one (``r =
    self.replica``, ``r = Replica(...)``) or a parameter annotated ``Replica``."""
    names = {"replica"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            src = value.func if isinstance(value, ast.Call) else value
            bound = getattr(src, "attr", None) or getattr(src, "id", None)
            if isinstance(target, ast.Name) and bound in ("replica", "Replica"):
                names.add(target.id)
        if isinstance(node, ast.arg) and node.annotation is not None:
            if ast.unparse(node.annotation).split(".")[-1].strip("'\"") == "Replica":
                names.add(node.arg)
    return names


def replica_insides_read(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, expression) of every read of a replica's insides: ``<...>replica.pos`` (or
    ``.opt``, ``.stream``) reached through a name or attribute called ``replica``, or a name
    the module holds a replica under (:func:`_replica_names`), directly or through one of its
    parts (``replica.walk.pos``, ``replica.update.opt``)."""
    found, names = [], _replica_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in REPLICA_INSIDES:
            chain, owner = [], node.value
            while isinstance(owner, ast.Attribute):
                chain, owner = chain + [owner.attr], owner.value
            chain += [owner.id] if isinstance(owner, ast.Name) else []
            if names & set(chain):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_outside_the_runtime_the_replica_is_read_through_its_views():
    """The production job, the stages and the shared modules read where training stands, the
    LR, the loader and AGS's counters through the replica's read-only views
    (``steps_done``, ``epoch``, ``epoch_offset``, ``loader_workers``, ``decode``,
    ``on_device``) and its parts' (``update.lr``, ``update.ags_counters()``...), never its
    position, optimizer or stream."""
    outside = [
        f"{f.relative_to(SRC)}:{line}: {expr}"
        for f in sorted(SRC.rglob("*.py"))
        if f.relative_to(SRC).parts[0] != "runtime"
        for line, expr in replica_insides_read(ast.parse(f.read_text()))
    ]
    assert not outside, "the replica's insides read outside the runtime:\n" + "\n".join(outside)


@pytest.mark.parametrize(
    "code, found",
    [
        ("x = replica.pos.step", 1),
        ("f(self.replica.opt)", 1),
        ("for b in replica.stream.batches(1): pass", 1),
        ("x = replica.steps_done + replica.epoch", 0),
        ("x = position.pos", 0),
        ("r = self.replica\nx = r.pos.offset", 1),  # under another name
        ("def f(rep: Replica):\n    return rep.opt", 1),
        ("x = replica.walk.pos.step", 1),  # through one of its parts
        ("f(self.replica.update.opt)", 1),
        ("x = replica.walk.global_batch + replica.update.lr", 0),
        ("r = Replica(cfg)\nr.stream.forget()", 1),
    ],
)
def test_a_read_of_the_replicas_insides_is_found(code, found):
    assert len(replica_insides_read(ast.parse(code))) == found


@pytest.mark.parametrize(
    "code",
    [
        "replica.force_refresh = True",
        "r.pos, r.stats = p, s",
        "self.replica.stop_code = lambda: 0",
        "tr.epoch_time += 1",
        "replica.pos.offset = 0",
        "setattr(replica, 'phase', 'eval')",
    ],
)
def test_an_outside_assignment_is_found(code):
    assert field_assignments(ast.parse(code))


@pytest.mark.parametrize("code", ["self.phase = 'eval'", "setattr(self, name, value)"])
def test_an_objects_own_fields_are_its_own_to_set(code):
    assert not field_assignments(ast.parse(code))


# Methods that change the object they are called on: reached through another object's field
# (``replica.opt.zero_grad()``, ``self.history.attempts.append(a)``) they change that
# object's state from outside it.
MUTATORS = {
    "load_state_dict", "zero_grad", "backward", "step", "no_sync", "forget", "forget_parked",
    "restore", "resume", "append", "extend", "insert", "pop", "clear", "update", "setdefault",
    "add", "remove", "discard", "register_comm_hook", "register_forward_hook", "unscale_",
}  # fmt: skip
# (module, the call) -> why it is not another Tula object's state changed from outside
FOREIGN_CALLS = {
    ("config_rules.py", "jsonschema.validators.extend"): "jsonschema's factory: makes a new class",
    ("production/job.py", "os.environ.update"): "the process's own environment",
    ("production/job.py", "os.environ.setdefault"): "the process's own environment",
    ("runtime/group/dist.py", "os.environ.update"): "the process's own environment",
    ("runtime/group/dist.py", "os.environ.setdefault"): "the process's own environment",
    ("runtime/step/replica.py", "self.ddp.module.load_state_dict"): "torch's DDP's module: "
    "the replica's own model",
    ("workers/script_run.py", "os.environ.update"): "the process's own environment",
    ("workers/script_run.py", "sys.path.insert"): "the interpreter's own path: the script's "
    "folder first, as `python script.py` puts it",
}


def method_mutations(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of every :data:`MUTATORS` method called on a field of another object:
    ``x.y.m()`` for any ``x`` but ``self``/``cls``, and ``self.x.y.m()``."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in MUTATORS or not isinstance(node.func.value, ast.Attribute):
            continue
        chain, e = 0, node.func.value
        while isinstance(e, ast.Attribute):
            chain, e = chain + 1, e.value
        own = isinstance(e, ast.Name) and e.id in ("self", "cls")
        if chain >= (2 if own else 1):
            found.append((node.lineno, ast.unparse(node.func)))
    return found


def test_no_module_changes_another_objects_fields_through_their_methods():
    """The replica's model, optimizer, scheduler, scaler, evaluator and feed change only through
    the replica's own methods and its parts' (:meth:`Replica.load_state_dict`, :meth:`Update.apply`,
    :meth:`Replica.no_sync` ...), and a job's attempts only through its History."""
    outside = [
        f"{rel}:{line}: {call}"
        for f in sorted(SRC.rglob("*.py"))
        for line, call in method_mutations(ast.parse(f.read_text()))
        if ((rel := str(f.relative_to(SRC))), call) not in FOREIGN_CALLS
    ]
    assert not outside, "another object's state changed from outside:\n" + "\n".join(outside)


@pytest.mark.parametrize(
    "code",
    [
        "replica.opt.zero_grad(set_to_none=True)",
        "replica.ddp.module.load_state_dict(state)",
        "self.history.attempts.append(att)",
        "r.stream.forget()",
        "with replica.ddp.no_sync():\n    pass",
    ],
)
def test_an_outside_mutation_through_a_method_is_found(code):
    assert method_mutations(ast.parse(code))


@pytest.mark.parametrize(
    "code", ["self.opt.zero_grad()", "replica.step(x, y)", "replica.update.take_noise_pairs()"]
)
def test_a_call_on_an_objects_own_field_or_method_is_not_flagged(code):
    assert not method_mutations(ast.parse(code))


def test_every_module_of_the_package_is_on_the_map():
    """docs/architecture.md names every module of the package (a newcomer's map is whole)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        str(f.relative_to(ROOT / "src"))
        for f in sorted((ROOT / "src" / "tula").rglob("*.py"))
        if f.name != "__init__.py" and not re.search(rf"`{re.escape(f.stem)}`|\b{f.stem}\.py", text)
    ]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_every_column_tula_writes_is_in_results_readme():
    """results/README.md, the results' public contract, is there and names every column of
    measurements.csv, train/metrics.csv, train/steps.csv and compare/accuracy.csv."""
    from tula.model.measurements import OPTIONAL, REQUIRED
    from tula.production.monitor import COLUMNS as STEPS
    from tula.production.trainer import METRIC_COLUMNS
    from tula.stages.compare.collect import COLUMNS as ACCURACY

    text = (ROOT / "results" / "README.md").read_text()
    columns = [*REQUIRED, *OPTIONAL, *METRIC_COLUMNS, *STEPS, *ACCURACY]
    missing = sorted({c for c in columns if not re.search(rf"\b{re.escape(c)}\b", text)})
    assert not missing, f"results/README.md does not name: {', '.join(missing)}"


def test_every_key_of_the_probe_record_is_in_results_readme():
    """The probe record's type lists every key its JSON may hold; results/README.md, the
    results' public contract, names each one."""
    from tula.model.probe_record import json_keys

    text = (ROOT / "results" / "README.md").read_text()
    missing = sorted({k for k in json_keys() if not re.search(rf"\b{re.escape(k)}\b", text)})
    assert not missing, f"results/README.md does not name: {', '.join(missing)}"


def probe_record_writes(tree: ast.AST, keys: set[str]) -> list[tuple[int, str]]:
    """Where a module sets a probe record's field by name: a subscript store of one of its
    keys (``record["status"] = ...``), ``setattr`` or ``dataclasses.replace``."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets += [node.target] if isinstance(node, ast.AugAssign) else []
        for t in targets:
            key = t.slice if isinstance(t, ast.Subscript) else None
            if isinstance(key, ast.Constant) and key.value in keys:
                found.append((node.lineno, f"[{key.value!r}] = ..."))
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in ("setattr", "__setattr__", "replace") and not isinstance(
                getattr(f, "value", None),
                ast.Constant,  # "a b".replace(...) is a string's
            ):
                found.append((node.lineno, f"{name}(...)"))
    return found


def test_no_code_outside_its_module_sets_a_probe_records_field():
    """A probe record changes only through its own methods (tula.model.probe_record): no
    module that handles one (imports its type) sets a field by name."""
    from tula.model.probe_record import json_keys

    keys, bad = set(json_keys()), []
    for f in sorted(SRC.rglob("*.py")):
        text = f.read_text()
        if f.name == "probe_record.py" or not re.search(
            r"tula\.model\.probe_(record|measured)", text
        ):
            continue
        bad += [
            f"{f.relative_to(SRC)}:{n}: {w}" for n, w in probe_record_writes(ast.parse(text), keys)
        ]
    assert not bad, "a probe record's field set outside its module:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "code",
    [
        'record["status"] = "ok"',
        'rec["wall_s"] += 1.0',
        "setattr(rec, 'status', 'ok')",
        "dataclasses.replace(rec, status='ok')",
    ],
)
def test_a_probe_record_field_set_by_name_is_found(code):
    assert probe_record_writes(ast.parse(code), {"status", "wall_s"})


NEAR_CAP = 20  # lines: a module this close to MAX_MODULE_LINES is one idea, said on the map


def test_a_module_near_the_cap_is_one_idea_named_on_the_map():
    """docs/architecture.md's "Modules near the cap" names every module within NEAR_CAP lines
    of the cap: a module grown there is split by what belongs together, or said to be one idea."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Modules near the cap", 1)[1].split("\n### ", 1)[0]
    named = set(re.findall(r"^- `(\w+)`", section, flags=re.M))
    near = {
        f.stem
        for f in SRC.rglob("*.py")
        if len(f.read_text().splitlines()) > MAX_MODULE_LINES - NEAR_CAP
    }
    assert near <= named, f"near the {MAX_MODULE_LINES}-line cap, not on the map: {near - named}"
