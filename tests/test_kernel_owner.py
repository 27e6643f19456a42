"""A cluster dies with the kernel that launched it, unless it was launched --detach."""

import os
import signal

import pytest
from jupyter_client import KernelManager

from tests.conftest import wait_for
from tfk8s_magics.backends import Phase
from tfk8s_magics.backends.local import LocalBackend
from tfk8s_magics.lifeline import pid_alive

pytestmark = pytest.mark.slow

SLEEP = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def test_killing_the_kernel_leaves_no_task_processes(state_dir, workdir):
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, "TFK8S_STATE_DIR": str(state_dir)}, cwd=str(workdir))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        for code in (
            "%load_ext tfk8s_magics",
            f"%%tfcluster launch owned --workers 2 --ps 1 --no-follow\n{SLEEP}",
            f"%%tfcluster launch kept --workers 1 --ps 0 --no-follow --detach\n{SLEEP}",
        ):
            reply = kc.execute_interactive(code, timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
        be = LocalBackend(state_dir)
        wait_for(lambda: be.status("owned").ready and be.status("kept").ready, 180, "both clusters ready")
        owned = be.status("owned")
        pids = [t.pid for t in owned.tasks]
        assert len(pids) == 3 and all(pid_alive(p) for p in pids)
        kernel_pid = km.provisioner.process.pid
        os.kill(kernel_pid, signal.SIGKILL)
        wait_for(lambda: not any(pid_alive(p) for p in pids), 20, "the owned cluster's tasks to end")
        st = wait_for(lambda: (s := be.status("owned")).terminal and s, 20, "the owned cluster to stop")
        assert st.phase == Phase.STOPPED
        assert f"owner (pid {kernel_pid}) exited" in st.reason
        # The detached cluster was asked to outlive its kernel, and does.
        kept = be.status("kept")
        assert kept.phase == Phase.RUNNING and pid_alive(kept.tasks[0].pid)
        # Its logs and status are still there for a new kernel.
        assert "up" in "\n".join(line.text for line in be.read_logs("kept", "worker-0"))
        be.stop("kept")
        assert not pid_alive(kept.tasks[0].pid)
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
        else:
            km.cleanup_resources()
