"""Functions shipped by value keep their file name: a traceback from the executors or ranks points
to the user's file and line (cloudpickle alone writes ``<dynamic-code>``)."""

import subprocess
import sys


def test_a_function_shipped_by_value_names_its_file_in_tracebacks(tmp_path):
    (tmp_path / "user_train.py").write_text("def train():\n    x = 1\n    raise ValueError('boom')\n")
    blob = tmp_path / "fn.pkl"
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import user_train\n"
        "from sparkml_dist import serialization\n"
        "serialization.ship_by_value(user_train)\n"
        f"open({str(blob)!r}, 'wb').write(serialization.dumps(user_train.train))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    run = "import pickle, sys\nf = pickle.load(open(sys.argv[1], 'rb'))\nf()\n"  # no path to the module
    done = subprocess.run([sys.executable, "-c", run, str(blob)], capture_output=True, text=True)
    assert done.returncode == 1 and f'File "{tmp_path / "user_train.py"}", line 3, in train' in done.stderr
    assert "raise ValueError('boom')" in done.stderr and "<dynamic-code>" not in done.stderr
