"""deploy/facts/inline.py without_comments: what an inline program ships compiles to the very code objects
its source does (marshalled byte for byte: code, constants, docstrings, line and column tables), for every
module deployctl bundles and for generated sources full of '#' that is not a comment."""

from __future__ import annotations

import io
import marshal
import random
import tokenize
from pathlib import Path

import pytest

from deploy.facts.inline import without_comments

REMOTE = Path(__file__).resolve().parents[2] / "deploy" / "remote"


def same_code(a: str, b: str) -> bool:
    return marshal.dumps(compile(a, "<inline m>", "exec")) == marshal.dumps(compile(b, "<inline m>", "exec"))


def comments(source: str) -> list:
    return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]


@pytest.mark.parametrize("path", sorted(REMOTE.rglob("*.py")), ids=lambda p: str(p.relative_to(REMOTE)))
def test_every_bundled_module_ships_the_same_code(path):
    source = path.read_text()
    shipped = without_comments(source)
    assert same_code(source, shipped)
    assert shipped.count("\n") == source.count("\n") and not comments(shipped)
    if comments(source):
        assert len(shipped) < len(source)


PIECES = [
    'x = "# not a comment"  # a comment\n',
    "y = '#'  # '#' in a comment\n",
    's = """\n# inside a docstring\n"""  # after it\n',
    "f = f'{x!r} # {y}'  # f-string\n",
    "g = f\"{'#'}\"\n",
    "# a line that is only a comment\n",
    "    \n",
    "z = (1,  # inside brackets\n     2)  # closing\n",
    "w = [\n    # a comment line inside a list\n    3,\n]\n",
    "b = rb'\\#' + b'#'  # bytes\n",
    "def h():\n    \"\"\"Docstring # kept.\"\"\"\n    return 1  # return\n",
    "t = 1 + \\\n    2  # after a continuation\n",
    "u = '''a\n#b\n'''\n",
    "if True:  # block\n    pass  # body\n# dedented comment\n",
    "class C:  # class\n    a: int = 0  # annotated\n",
    "v = '\\\\'  # a backslash string then a comment\n",
    "q = 1;  r = 2  # two statements\n",
    "\x0c# a form feed before a comment\n",
    "e = 'é'  # non-ASCII: ü\n",
]


@pytest.mark.parametrize("seed", range(60))
def test_generated_sources_ship_the_same_code(seed):
    rng = random.Random(seed)
    source = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
    if rng.random() < 0.3:
        source = source.replace("\n", "\r\n")
    shipped = without_comments(source)
    assert same_code(source, shipped), source
    assert shipped.count("\n") == source.count("\n")
    assert not comments(shipped), shipped


@pytest.mark.parametrize("source", ["def (:\n", "x = '''unterminated\n", "a = 1\rb = 2  # lone CR\n"])
def test_what_it_cannot_read_as_python_ships_unchanged(source):
    assert without_comments(source) == source
