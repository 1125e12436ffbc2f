"""Starts a program as `torchrun --nproc_per_node 2 --no_python PROGRAM ARGS...` does: torch's
elastic agent with static rendezvous, which hosts the rendezvous store on MASTER_PORT itself.
Usage: torchrun_launch.py PORT PROGRAM [ARGS...]; MAX_RESTARTS in the environment as
torchrun's --max-restarts (default 0). (Through the launcher API rather than the
`torchrun` script: Debian's script mis-parses its own --redirects default under Python 3.11.)"""
import os
import sys

from torch.distributed.elastic.multiprocessing import Std
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

port, program, arguments = sys.argv[1], sys.argv[2], sys.argv[3:]
config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="pipetrain-test",
                      rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{port}",
                      rdzv_configs={"rank": 0},
                      max_restarts=int(os.environ.get("MAX_RESTARTS", "0")),
                      start_method="spawn", redirects=Std.NONE, tee=Std.NONE, monitor_interval=1)
elastic_launch(config, entrypoint=program)(*arguments)
