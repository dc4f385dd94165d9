import os

import pytest

import tinynn

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "tinynn-models", "tests", "fixtures")


@pytest.fixture(scope="session")
def model():
    """The default model (SmolLM2-135M-Instruct Q4_1), 2 threads."""
    return tinynn.Model(n_ctx=1024, threads=2)


@pytest.fixture(scope="session")
def tnn_run():
    """`tnn run`'s greedy text for a prompt (the CLI built beside the package)."""
    import subprocess

    exe = os.environ.get("TINYNN_TNN", "tnn")

    def run(prompt, n):
        out = subprocess.run(
            [exe, "run", "-p", prompt, "-n", str(n), "--temp", "0", "--no-display-prompt", "-t", "2"],
            check=True, capture_output=True, text=True)
        # `tnn run` ends the text with one newline of its own.
        return out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout

    return run
