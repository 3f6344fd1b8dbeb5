"""`python -m kiln explain`: a script's make() function and a suite model, in a subprocess."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from child_env import ROOT, child_env


def _explain(*args: str, cwd: str = str(ROOT)) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "explain", *args], cwd=cwd,
                          env=child_env(), capture_output=True, text=True, timeout=120,
                          check=False)


SCRIPT = textwrap.dedent("""
    import torch

    def f(x, y):
        a = torch.sin(x) + y
        print("break here")
        return a.relu() * 2

    def make():
        return f, (torch.randn(4, 4), torch.randn(4, 4))
""")


def test_explain_a_script_function(tmp_path):
    script = tmp_path / "user_code.py"
    script.write_text(SCRIPT)
    done = _explain(f"{script}:make", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "Graph Count: 2" in done.stdout
    assert "Graph Break Count: 1" in done.stdout
    assert "print" in done.stdout  # the break reason names the call


def test_explain_a_suite_model():
    done = _explain("suite:mlp")
    assert done.returncode == 0, done.stderr
    assert "Graph Count: 1" in done.stdout
    assert "Graph Break Count: 0" in done.stdout


def test_explain_with_arg_shapes_and_a_module_target(tmp_path):
    (tmp_path / "mymod.py").write_text("import torch\n\ndef g(x):\n    return x.cos() + 1\n")
    done = _explain("mymod:g", "--arg-shapes", "3x5", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "Graph Count: 1" in done.stdout


def test_a_bad_target_names_the_expected_forms():
    done = _explain("no_colon_here")
    assert done.returncode != 0
    assert "script.py:function" in done.stderr


def test_explain_of_the_seed_block_is_short_and_names_ops_as_users_write_them():
    done = _explain("suite:seed_block")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 60, done.stdout
    assert "_VariableFunctionsClass" not in done.stdout and "_operator." not in done.stdout
    assert "torch.nn.functional.layer_norm" in done.stdout
    assert any(re.match(r"\s+\d+ shape\s+e\.g\. x\.shape == ", line) for line in lines), done.stdout
    verbose = _explain("suite:seed_block", "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert len(verbose.stdout.splitlines()) > len(lines) + 100  # every guard, one per line
