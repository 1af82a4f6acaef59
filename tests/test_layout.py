"""The package layout stays layered: imports run down the layers only, no files import each other
in a circle, and files and functions stay a size a reader can hold (the layout in README.md); rvqlm/
and codec/ keep their modules in rooms, and codec's rooms build on codec.core only; no code branches
on a codec part's type outside that part's own module (codec.core.parts)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each package and the packages it may import: nothing imports a layer above its own.
LAYERS = {
    "rvqlm_core": set(),
    "codec": {"rvqlm_core"},
    "lm": {"rvqlm_core"},
    "rvqlm": {"rvqlm_core", "codec", "lm"},
    "benchmarks": {"rvqlm_core", "codec", "lm", "rvqlm"},
}
LIBRARIES = ("rvqlm_core", "codec", "lm", "rvqlm")
FAMILY_REGISTRY = "lm/families.py"  # the one module that may tell LM families apart by name
MAX_FILE_LINES = 450
# The modules a package may keep at its top level; the rest lives in rooms (subpackages).
TOP_LEVEL = {"rvqlm": {"__init__.py", "__main__.py", "cli.py"},
             "codec": {"__init__.py", "loading.py"}}  # loading.py opens a folder of any codec family
# codec/'s rooms and the other codec rooms each may import (codec's top-level modules may import any).
# The core is the ground: it imports no other room; the codec families and tokenizing do not import each other.
CODEC_ROOMS = {"core": set(), "neural": {"core"}, "source_filter": {"core"}, "hf": {"core"}, "tokenize": {"core"}}
MAX_FUNCTION_LINES = 60


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The project modules that `path` imports anywhere: top level, inside functions, TYPE_CHECKING."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                keep = len(anchor) - node.level + (1 if path.name == "__init__.py" else 0)
                base = ".".join(anchor[:keep] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    known = _modules(root)
    return {name: _imports(path, name, known) for name, path in known.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        package = module.split(".")[0]
        wrong += [f"{module} imports {t}" for t in targets
                  if t.split(".")[0] != package and t.split(".")[0] not in LAYERS[package]]
    return sorted(wrong)


def circles(graph: dict[str, set[str]]) -> list[str]:
    """One cycle per back edge of a depth-first search, written a -> b -> a."""
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def oversized(root: Path) -> list[str]:
    found = []
    for package in LIBRARIES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            if text.count("\n") > MAX_FILE_LINES:
                found.append(f"{path.relative_to(root)}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}(): {length} lines")
    return found


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _sources(root: Path):
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def part_types(root: Path) -> dict[str, Path]:
    """The codec part classes (decorated with `register_part(role, kind, ConfigClass)`) and their
    config classes -> the module that defines them."""
    found = {}
    for path, tree in _sources(root):
        for node in ast.walk(tree):
            for deco in node.decorator_list if isinstance(node, ast.ClassDef) else ():
                if isinstance(deco, ast.Call) and _name(deco.func) == "register_part":
                    found.update({name: path for name in [node.name, *map(_name, deco.args[2:3])]})
    return found


def part_type_checks(root: Path) -> list[str]:
    """Every isinstance / issubclass on a codec part type outside the part's own module."""
    types, found = part_types(root), []
    for path, tree in _sources(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) in ("isinstance", "issubclass") and len(node.args) == 2:
                checked = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                found += [f"{path.relative_to(root)}:{node.lineno} {_name(node.func)}(..., {name})"
                          for name in map(_name, checked) if name in types and types[name] != path]
    return found


def stray_modules(root: Path) -> list[str]:
    """Modules at the top level of rvqlm/ or codec/ other than the few TOP_LEVEL names."""
    return sorted(f"{package}/{p.name}" for package, allowed in TOP_LEVEL.items()
                  for p in (root / package).glob("*.py") if p.name not in allowed)


def codec_room_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one codec room into another that CODEC_ROOMS does not allow (a room not listed there
    may import the core only), and from a room up into codec's top-level modules."""
    wrong = []
    for module, targets in graph.items():
        parts = module.split(".")
        if parts[0] != "codec" or len(parts) < 3:  # codec's top level: codec, codec.loading
            continue
        allowed = CODEC_ROOMS.get(parts[1], {"core"}) | {parts[1]}
        wrong += [f"{module} imports {t}" for t in sorted(targets)
                  if t.split(".")[0] == "codec" and (t.count(".") < 2 or t.split(".")[1] not in allowed)]
    return sorted(wrong)


def _names_a_family(node: ast.AST) -> bool:
    """`family`, `x.family`, `x["family"]`, `x.get("family")`: an expression that is an LM family's name."""
    if isinstance(node, ast.Name):
        return "family" in node.id
    if isinstance(node, ast.Attribute):
        return "family" in node.attr
    key = node.slice if isinstance(node, ast.Subscript) else (
        node.args[0] if isinstance(node, ast.Call) and node.args and getattr(node.func, "attr", "") == "get" else None)
    return isinstance(key, ast.Constant) and key.value == "family"


def _strings(node: ast.AST) -> bool:
    """A string constant, or a tuple / list / set of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_strings(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def family_branches(root: Path) -> list[str]:
    """Comparisons of a family's name with a string (`family == "masked"`, `cfg.family != "ar"`, `family in
    ("a", "b")`) outside the family registry: a switch on the family that belongs in the registry."""
    found = []
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            if path.relative_to(root).as_posix() == FAMILY_REGISTRY:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                family = any(_names_a_family(x) or isinstance(x, ast.Tuple) and any(map(_names_a_family, x.elts))
                             for x in sides)
                if family and any(_strings(x) for x in sides):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_imports_run_down_the_layers_only():
    assert upward_imports(import_graph(REPO)) == []


def test_no_files_import_each_other_in_a_circle():
    assert circles(import_graph(REPO)) == []


def test_files_and_functions_stay_small():
    assert oversized(REPO) == []


def test_no_code_checks_a_codec_parts_type_outside_its_module():
    assert {"SEANetEncoder", "ISTFTDecoder", "ISTFTDecoderConfig"} <= set(part_types(REPO))
    assert part_type_checks(REPO) == []


def test_the_part_type_check_finds_a_planted_one(tmp_path):
    """isinstance on a registered part (or its config) is reported outside the part's module only."""
    files = {"codec/wave.py": "@register_part('decoder', 'wave', WaveConfig)\nclass Wave:\n"
                              "    def f(self, x):\n        return isinstance(x, Wave)\n",
             "codec/model.py": "import codec.wave as w\n\n\ndef g(d, c):\n"
                               "    return isinstance(d, w.Wave) or issubclass(c, (int, WaveConfig))\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert part_type_checks(tmp_path) == ["codec/model.py:5 isinstance(..., Wave)",
                                          "codec/model.py:5 issubclass(..., WaveConfig)"]


def test_the_application_and_the_codec_keep_their_modules_in_rooms():
    assert stray_modules(REPO) == []
    assert {p.name for p in (REPO / "codec").iterdir() if (p / "__init__.py").is_file()} == set(CODEC_ROOMS)


def test_codec_rooms_build_on_the_core_only():
    assert codec_room_imports(import_graph(REPO)) == []


def test_no_family_string_branch_outside_the_family_registry():
    assert family_branches(REPO) == []


def test_the_checks_find_what_they_look_for(tmp_path):
    """A planted upward import, a planted circle (one of them lazy, one relative), a long function, a
    module at rvqlm/'s and codec/'s top level, imports between codec rooms and family string branches are
    each reported: the checks above can fail."""
    files = {
        "rvqlm_core/__init__.py": "",
        "codec/__init__.py": "",
        "codec/data.py": "def f():\n    from rvqlm.corpus import corpus_files\n",
        "lm/__init__.py": "",
        "lm/model.py": "from lm.generate import generate\n",
        "lm/generate.py": "def g():\n    from .model import M\n",
        "lm/families.py": "def f(cfg):\n    return cfg.family == 'ar'\n",
        "rvqlm/commands/generate.py": "def f(m, c):\n    return m.config.family != 'masked' or c['family'] in ('a', 'b')\n",
        "rvqlm/__init__.py": "",
        "rvqlm/corpus.py": "import codec\n\n\ndef h():\n" + "    x = 1\n" * 70,
        "codec/core/__init__.py": "",
        "codec/core/model.py": "def f():\n    from codec.neural.seanet import S\n",
        "codec/neural/__init__.py": "",
        "codec/neural/seanet.py": "from codec.core.model import f\n",
        "codec/hf/__init__.py": "",
        "codec/hf/mimi.py": "from codec.source_filter import synthesis\nfrom codec import loading\n",
        "codec/source_filter/__init__.py": "",
        "codec/source_filter/synthesis.py": "from codec.core import model\n",
        "codec/loading.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == ["codec.data imports rvqlm.corpus"]
    assert circles(graph) == ["codec.core.model -> codec.neural.seanet -> codec.core.model",
                              "lm.generate -> lm.model -> lm.generate"]
    assert oversized(tmp_path) == ["rvqlm/corpus.py:4 h(): 71 lines"]
    assert stray_modules(tmp_path) == ["codec/data.py", "rvqlm/corpus.py"]
    assert codec_room_imports(graph) == ["codec.core.model imports codec.neural.seanet",
                                         "codec.hf.mimi imports codec.loading",
                                         "codec.hf.mimi imports codec.source_filter.synthesis"]
    assert family_branches(tmp_path) == ["rvqlm/commands/generate.py:2", "rvqlm/commands/generate.py:2"]


def test_the_readme_stays_short():
    """A newcomer reads the README whole: at most 160 lines (details go to docs/ and the model cards)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 160, f"README.md has {lines} lines"


def test_no_test_file_defines_a_test_twice():
    """A second `def test_x` in one file replaces the first, which then never runs."""
    doubled = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        names = [n.name for n in ast.parse(path.read_text(encoding="utf-8")).body
                 if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        doubled += [f"{path.name}: {name}" for name in sorted(set(names)) if names.count(name) > 1]
    assert doubled == []
