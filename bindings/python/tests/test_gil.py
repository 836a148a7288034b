"""Calls that read the host release the GIL: a discovery blocked on a file lets other Python
threads run. The file is a FIFO that the main thread feeds, which it can only do while the
discovery (in another thread) does not hold the GIL; a binding that held it would deadlock, which
the subprocess timeout turns into a failure."""

import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent

SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, tempfile
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import gpuslice
    from hosttree import two_gpu_host

    tree = two_gpu_host(Path(tempfile.mkdtemp()) / "host")
    fifo = tree.root / "sys/devices/pci0000:00/0000:af:00.0/{file}"
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    result = {{}}
    worker = threading.Thread(target=lambda: result.update(out={call}))
    worker.start()
    with open(fifo, "w") as f:  # returns once the worker's Rust code opens the file
        f.write({content!r})
    worker.join()
    print(len(result["out"]{items}))
    """
)


def run(file, call, content, items=""):
    script = SCRIPT.format(tests=str(HERE), file=file, call=call, content=content, items=items)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


def test_discover_lets_other_threads_run_while_it_reads_the_host():
    out = run("vendor", 'gpuslice.discover(str(tree.root), node="n")', "0x1002\n", '["gpus"]')

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"


def test_health_lets_other_threads_run_while_it_reads_the_host():
    out = run("aer_dev_fatal", "gpuslice.health(str(tree.root))", "TOTAL_ERR_FATAL 0\n")

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
